"""What agents that stop reading cost the server: resident memory with many gateway streams that
HELLO, SUBSCRIBE to a large Group with every credit and never read, against the same number of idle
streams in the same run, and a quiet Group's command latency meanwhile (issue 40 item 1).

    PYTHONPATH=. .venv/bin/python bench/slow_readers.py                  # 200 and 2,000 streams, a 16 MB Group
    PYTHONPATH=. .venv/bin/python bench/slow_readers.py --streams 50 --messages 500 --hold 40   # quicker

The mesh is a ``mwp serve`` subprocess on a temporary data directory, a fresh one for each count
of streams; its RSS is read from /proc/<pid>/status. The streams live in this process, each on its own connection (a real agent's),
with the client's default HTTP/2 settings. Per count of streams, two phases on the same server:

* **idle** (the anchor): the streams HELLO and SUBSCRIBE to a quiet Group with 1 credit, then read
  nothing more: what a connected, caught-up agent costs;
* **not reading**: the streams HELLO and SUBSCRIBE to the large Group (``--messages`` posts of
  8 KB) with 65,536 credits and never read. RSS is sampled every few seconds for ``--hold``
  seconds after the last one opened (past the gateway's 30 s stall timeout,
  MWP_GATEWAY_STALL_TIMEOUT_S, which closes them), from the first HELLO on, while a message is
  posted to the quiet Group at each sample and its latency taken. A HELLO the server is too busy to
  check in time (PEER_UNAVAILABLE) is retried after its retry_after_ms, as an agent does.

Printed per count: RSS growth per stream of each phase, their ratio (not reading / idle), the peak,
what is left after the stall timeout closed the streams, how many the server closed (its log), and
the quiet Group's command latency (median and worst).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from nacl.signing import SigningKey  # noqa: E402

from missionweave.kernel.clock import SystemClock, to_timestamp  # noqa: E402
from missionweave.kernel.signing import HELLO_PROOF_TYPE, read_key, session_key_id, sign_envelope  # noqa: E402
from missionweave.sdk.client import MeshClient, SessionSigner  # noqa: E402
from missionweave.v1 import common_pb2  # noqa: E402
from missionweave.v1 import gateway_service_pb2 as pb  # noqa: E402
from missionweave.v1 import gateway_service_pb2_grpc as pb_grpc  # noqa: E402
from tests import builders  # noqa: E402

BIG, QUIET = "grp_bench_big", "grp_bench_quiet"
MESSAGE_TEXT = "x" * 8_000
STALL_CLOSE_LOG = "closing a gateway stream that stopped reading"


def log(line: str) -> None:
    print(line, flush=True)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.target = f"127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: MeshClient | None = None
        self.owner: SessionSigner | None = None
        self.conversations: dict[str, str] = {}
        self.hello_retries = (
            0  # HELLOs refused PEER_UNAVAILABLE (the server too busy to check them) and retried
        )
        self.quiet_refused = 0  # quiet-Group posts the mesh did not answer in time

    def start_server(self) -> None:
        env = {
            **os.environ,
            "MWP_DATA_DIR": str(self.work / "data"),
            "MWP_METRICS_LISTEN": "",
            "MWP_GROUP_RATE": "0",
            "MWP_GATEWAY_MAX_STREAMS": str(max(10_000, 4 * max(self.args.streams))),
            "MWP_GATEWAY_MAX_STREAMS_PER_IDENTITY": str(4 * max(self.args.streams)),
            "PYTHONPATH": str(ROOT),
        }
        self.stderr = open(self.work / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "missionweave.cli", "serve", "--listen", self.target],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.stderr.close()

    def server_rss(self) -> float:
        assert self.proc is not None
        return rss_mb(self.proc.pid)

    def stall_closes(self) -> int:
        return (self.work / "server.log").read_text(errors="replace").count(STALL_CLOSE_LOG)

    async def setup(self) -> None:
        admin_key = self.work / "data" / "keys" / "admin.key"
        self.client = client = MeshClient(self.target)
        owner_key = SigningKey.generate()
        deadline = time.monotonic() + 60
        while True:
            try:
                await client.register_identity(
                    "admin",
                    read_key(admin_key),
                    "alice",
                    common_pb2.IDENTITY_KIND_HUMAN,
                    bytes(owner_key.verify_key),
                )
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await client.register_identity(
            "admin",
            read_key(admin_key),
            "coord",
            common_pb2.IDENTITY_KIND_AGENT,
            bytes(SigningKey.generate().verify_key),
        )
        self.owner = owner = await client.open_session("alice", owner_key)
        for group in (BIG, QUIET):
            created = builders.mission_create("alice", "coord", SystemClock().now())
            await client.execute(owner.sign(owner.command(group, "mission_create", created)))
            self.conversations[group] = (await client.group_state(group)).mission.planning_conversation_id
        started = time.perf_counter()
        for first in range(0, self.args.messages, 50):
            await asyncio.gather(
                *(self.post(BIG, i) for i in range(first, min(first + 50, self.args.messages)))
            )
        log(
            f"  filled {BIG} with {self.args.messages:,} messages of 8 KB in {time.perf_counter() - started:.1f} s; "
            f"server RSS {self.server_rss():.0f} MB"
        )

    async def post(self, group: str, i: int) -> float:
        assert self.client is not None and self.owner is not None
        body = builders.message(self.conversations[group], f"{i} {MESSAGE_TEXT if group == BIG else 'quiet'}")
        started = time.perf_counter()
        await self.client.execute(
            self.owner.sign(self.owner.command(group, "message_post", body, membership_epoch=1))
        )
        return (time.perf_counter() - started) * 1000

    async def open_streams(self, count: int, group: str, credits: int) -> list[tuple[Any, Any]]:
        """``count`` streams, each on a connection of its own, past WELCOME and subscribed."""
        assert self.owner is not None
        owner = self.owner

        async def one() -> tuple[Any, Any]:
            for _attempt in range(20):  # a HELLO the server could not check in time is retried, as agents do
                channel = grpc.aio.insecure_channel(self.target)
                call = pb_grpc.GatewayServiceStub(channel).Connect()
                proof = pb.HelloProof(
                    agent_id=owner.identity_id,
                    session_epoch=owner.session_epoch,
                    issued_at=to_timestamp(SystemClock().now()),
                    nonce=os.urandom(16),
                    audience=self.target,
                )
                envelope = sign_envelope(
                    proof.SerializeToString(),
                    HELLO_PROOF_TYPE,
                    owner.key,
                    session_key_id(owner.identity_id, owner.session_epoch),
                )
                hello = pb.HelloFrame(
                    agent_id=owner.identity_id, session_epoch=owner.session_epoch, proof=envelope
                )
                await call.write(pb.ConnectRequest(frame=pb.ClientFrame(hello=hello)))
                first: Any = await call.read()
                if first is not grpc.aio.EOF and first.frame.WhichOneof("frame") == "welcome":
                    subscribe = pb.SubscribeFrame(
                        subscription_id="s", group_id=group, initial_credits=credits
                    )
                    await call.write(pb.ConnectRequest(frame=pb.ClientFrame(subscribe=subscribe)))
                    return channel, call
                retry = (
                    first is not grpc.aio.EOF
                    and first.frame.error.code == pb.GATEWAY_ERROR_CODE_PEER_UNAVAILABLE
                )
                if not retry:
                    status = (
                        f"{(await call.code()).name}: {await call.details()}"
                        if first is grpc.aio.EOF
                        else first
                    )
                    raise RuntimeError(f"no WELCOME: {status}")
                self.hello_retries += 1
                call.cancel()
                await channel.close()
                await asyncio.sleep(
                    int(first.frame.error.rejection.metadata.get("retry_after_ms", "500")) / 1000
                )
            raise RuntimeError("no WELCOME after 20 attempts")

        opened: list[tuple[Any, Any]] = []
        for first in range(0, count, 50):
            opened += await asyncio.gather(*(one() for _ in range(first, min(first + 50, count))))
        return opened

    @staticmethod
    async def close_streams(streams: list[tuple[Any, Any]]) -> None:
        for channel, call in streams:
            call.cancel()
            await channel.close()

    async def settle(self) -> float:
        """RSS once it stops moving (at most ~10 s)."""
        last = self.server_rss()
        for _ in range(20):
            await asyncio.sleep(0.5)
            now = self.server_rss()
            if abs(now - last) < 1:
                return now
            last = now
        return last

    async def measure(self, count: int) -> dict[str, float]:
        log(f"\n{count:,} streams")
        before = await self.settle()
        idle = await self.open_streams(count, QUIET, 1)
        idle_rss = await self.settle()
        await self.close_streams(idle)
        idle_mb = (idle_rss - before) / count
        log(f"  idle (anchor): +{idle_rss - before:,.0f} MB, {idle_mb * 1024:,.0f} KB a stream")
        base = await self.settle()
        closed_before = self.stall_closes()
        started = time.monotonic()
        samples: list[tuple[float, float]] = []
        latencies: list[float] = []
        opened_at: list[float] = []

        async def sample() -> None:  # from the first HELLO until --hold seconds after the last stream opened
            while not opened_at or time.monotonic() - opened_at[0] < self.args.hold:
                await asyncio.sleep(self.args.every)
                elapsed, grown = time.monotonic() - started, self.server_rss() - base
                samples.append((elapsed, grown))
                try:
                    latencies.append(await self.post(QUIET, -1))
                    posted = f"{latencies[-1]:,.0f} ms"
                except grpc.aio.AioRpcError as refused:  # the mesh too busy to answer in time: a figure too
                    self.quiet_refused += 1
                    posted = f"refused {refused.code().name}"
                log(
                    f"  t={elapsed:4.0f} s  +{grown:,.0f} MB  quiet post {posted}  "
                    f"closed by the stall timeout: {self.stall_closes() - closed_before}"
                    + ("" if opened_at else "  (opening)")
                )

        sampler = asyncio.create_task(sample())
        stalled = await self.open_streams(count, BIG, 65_536)
        opened_at.append(time.monotonic())
        log(
            f"  {count:,} streams open after {opened_at[0] - started:.0f} s; "
            f"HELLOs retried after PEER_UNAVAILABLE: {self.hello_retries:,}"
        )
        await sampler
        closed = self.stall_closes() - closed_before
        await self.close_streams(stalled)
        peak = max(grown for _, grown in samples)
        at_10 = next((grown for t, grown in samples if t >= 10), samples[-1][1])
        not_reading_mb = peak / count
        log(
            f"  not reading: peak +{peak:,.0f} MB ({not_reading_mb * 1024:,.0f} KB a stream), +{at_10:,.0f} MB at 10 s, "
            f"+{samples[-1][1]:,.0f} MB at the end; {closed:,} of {count:,} closed by the stall timeout"
        )
        log(
            f"  ratio not reading / idle, per stream: {not_reading_mb / idle_mb if idle_mb > 0 else float('inf'):.1f}x; "
            f"quiet Group post: median {statistics.median(latencies):,.0f} ms, worst {max(latencies):,.0f} ms, "
            f"{self.quiet_refused} refused"
        )
        return {"idle_kb": idle_mb * 1024, "not_reading_kb": not_reading_mb * 1024, "closed": closed}


async def main() -> int:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--streams", default="200,2000", help="counts of streams, one phase each (default 200,2000)"
    )
    p.add_argument(
        "--messages", type=int, default=2_000, help="8 KB messages in the large Group (default 2,000: 16 MB)"
    )
    p.add_argument(
        "--hold", type=float, default=45.0, help="seconds the non-reading streams are held (default 45)"
    )
    p.add_argument("--every", type=float, default=5.0, help="seconds between samples (default 5)")
    args = p.parse_args()
    args.streams = [int(n) for n in args.streams.split(",")]
    results: dict[int, dict[str, float]] = {}
    for count in args.streams:  # each count on a server of its own: what one phase freed skews no other
        with tempfile.TemporaryDirectory(prefix="mwp-slow-readers-") as scratch:
            bench = Bench(args, Path(scratch))
            bench.start_server()
            try:
                await bench.setup()
                results[count] = await bench.measure(count)
            except BaseException:
                notable = [
                    line
                    for line in (Path(scratch) / "server.log").read_text(errors="replace").splitlines()
                    if '"level": "info"' not in line
                ]
                log("server log, all but info lines (the last 20):\n" + "\n".join(notable[-20:]))
                raise
            finally:
                bench.stop()
    log("\nsummary (KB a stream: not reading / idle anchor, ratio; closed by the stall timeout)")
    for count, r in results.items():
        ratio = r["not_reading_kb"] / r["idle_kb"] if r["idle_kb"] > 0 else float("inf")
        log(
            f"  {count:>6,} streams: {r['not_reading_kb']:,.0f} / {r['idle_kb']:,.0f} KB, {ratio:.1f}x; {r['closed']:,.0f} closed"
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
