"""Delivery benchmark: events/s from append to ACK, append-to-delivery latency, the noisy neighbour, per
mesh topology, and NATS JetStream doing the same publish -> consume -> ack work in the same run (issue #6,
issue 12 item 7).

    PYTHONPATH=. .venv/bin/python bench/delivery.py            # default: 40 Groups x 5 subscribers, 5 topologies (~4.5-6 min)
    PYTHONPATH=. .venv/bin/python bench/delivery.py --quick    # smoke run: 20 Groups x 4 subscribers (~2.5 min)
    PYTHONPATH=. .venv/bin/python bench/delivery.py --groups 100 --subscribers 10 --events 3000   # the issue's scale
    PYTHONPATH=. .venv/bin/python bench/delivery.py --client raw   # bare gateway streams instead of the SDK
    PYTHONPATH=. .venv/bin/python bench/delivery.py --topologies single   # the single process on SQLite only

What it measures, for MissionWeave on each topology and then for NATS JetStream, with the same workload:

1. throughput - ``--events`` events published round-robin over ``--groups`` Groups, at most ``--window``
                events in flight end to end (published but not yet seen by every subscriber of their
                Group). Every Group has ``--subscribers`` subscribers; each sees every event of its
                Group, handles it and ACKs it. Reported: deliveries/s (events x subscribers) from the
                first publish until every subscription has handled the last event (its ACK due), and
                until the server's stored ACK state (gateway cursor table, consumer ack floor) reached
                every head; events appended/s; p50/p99 append-to-delivery latency. After each phase the
                benchmark waits (``--ack-seconds``) for that ACK state, so phases start drained.
2. half load - paced, open-loop publishing for ``--noisy-seconds``: every Group at the same rate,
                together half of the deliveries/s MissionWeave measured on the first topology (every
                other topology and NATS get the same absolute rate). Reported: p50/p99
                append-to-delivery (target: p99 <= 50 ms).
3. noisy neighbour - paced, open-loop publishing for ``--noisy-seconds``: every quiet Group at
                ``--quiet-rate`` events/s, once without and once with one extra Group publishing 100x
                that rate (same subscribers). Reported: the quiet Groups' p50/p99 both ways and the ratio
                (target: with/without <= 1.5x), the noisy Group's own latency and any refused publishes.
                The default quiet rate makes quiet + noisy offer ``--noisy-load`` (half) of the
                deliveries/s MissionWeave measured on the first topology; every other topology and NATS
                get the same absolute rates (the report shows that load as a share of each one's own
                throughput).

Topologies (issue 12, ``--topologies``, the same syntax and defaults as ``bench/authority.py``, whose
``parse_topologies``, ``TopologyStores``, ``SplitMesh`` and ``ProcTree`` this uses): ``single`` (every
service in one process, ``bench/authority.py``'s ``--role mesh`` child) and ``split-N`` (``mwp serve
--topology split --shards N``: each service in its own process, the client talking to the gateway,
which forwards commands to the Group's Authority shard and follows each subscription's Group from it).
More than one shard needs PostgreSQL (``--database-url``, ``MWP_BENCH_POSTGRES_URL``, or the machine's
PostgreSQL 15 with a throw-away role and a fresh database per topology); beside a split-N on
PostgreSQL, single and split-1 run on PostgreSQL too, so that they differ only in topology. Each
topology gets its own server, store, identities, Groups and subscribers, one after the other; the
NATS anchor runs once, after them. Server CPU sums every process of the topology (signature workers,
SQLite writers, and in split the launcher, gateway, shards, membership, artifacts and scheduling),
named per process, with the PostgreSQL backends serving its database apart; the report compares the
topologies on the same store (the extra hop: single -> split-1; a second shard: split-1 -> split-2)
and projects the per-process CPU to more cores (``bench/authority.py``'s ``projection``).

MissionWeave: the human owner creates each Group with mission_create, grants every subscriber identity an
OBSERVER Membership, and publishes = signed ``message_post`` commands (pre-signed before each timed phase)
through ``AuthorityService.ExecuteCommandStream`` (``--publish stream``, default: each command a message
on a stream that stays open, as NATS's publisher sends each message on its one connection; one stream
per Group, on one channel, since a stream bounds the commands it has in flight, 256, whatever their
Groups: a hot Group's backlog on a shared stream would hold the quiet Groups' commands behind it) or
unary ``ExecuteCommand`` (``--publish unary``: a new HTTP/2 stream per command), each awaiting its answer.
Subscribers (``--client``): ``sdk`` (default) = one
``missionweave.sdk.agent.Agent`` per subscriber identity, each subscribed to every Group on its one gateway
stream (what users run: Authority-signature check of every event, in-order handler, the agent's fsynced
cursor file written in rounds (D143), batched ACKs and batched responses); ``raw`` = one bare ``GatewayService.Connect`` stream per identity that parses each
event and ACKs each frame (no signature check, no cursor file): the gateway's own cost with the least
client work. The stored ACK state is read from the gateway's ``gateway_cursors`` table, in the
topology's one database (every split process gets the same data dir and database URL): the SQLite file
opened read-only, or a read-only transaction on PostgreSQL.

NATS anchor: ``nats-server -js`` (Debian's package, installed with apt-get when missing and running as
root) on a free loopback port with file storage in the temp dir; one stream per Group, one durable push
consumer per (subscriber, Group) with explicit ACK and ``max_ack_pending`` = ``--credits``, one nats-py
connection per subscriber; the publisher awaits each PubAck (as ours awaits each CommandResult); the
payload has the size of our stored event envelope.

Latency is measured in this process with ``time.perf_counter`` (monotonic): from just before the publish
call to the subscriber's handler seeing the event (keyed by command id / message id).

Every MissionWeave phase also reports the Authority's group commits during it, from the
``mwp_group_commit_latency_seconds`` histogram on its processes' /metrics (on ports the bench picks):
how many, how many took over 100 ms and the bucket of the slowest. A commit is on every command's
path, so a phase with a commit over 100 ms (a disk that stalled its fsync, D157) has its p99 set by
that, not by the service: compare such phases with care.

This process hosts every subscriber (ours and NATS's), as an agent host would, so it runs the garbage
collector's policy for long-running processes that ``mwp serve`` and ``mwp worker run`` use
(``missionweave/kernel/gc_policy.py``, D155); ``--default-gc`` keeps CPython's defaults instead.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from unittest import mock

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for _p in (str(ROOT), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import grpc  # noqa: E402
from authority import (  # noqa: E402
    Child,
    CpuMeter,
    ProcTree,
    SplitMesh,
    Topology,
    TopologyStores,
    _table,
    comparisons,
    database_name,
    log,
    parse_topologies,
    process_rows,
    projection,
    spawn_mesh,
)

from missionweave.kernel import gc_policy  # noqa: E402
from missionweave.kernel.transport import open_channel  # noqa: E402
from missionweave_server.edge.command_stream import CommandStream  # noqa: E402
from missionweave_server.mesh.topology import metrics_addresses  # noqa: E402

NOISY_FACTOR = 100  # the noisy Group publishes this many times the rate of each quiet Group
FAIRNESS_TARGET = 1.5  # quiet p99 with the noisy Group / without, at most
HALF_LOAD_P99_MS = 50.0  # p99 append -> delivery at half of the measured throughput, at most
PAUSED_CAP = 4096  # open-loop publisher: most publishes in flight before it waits (and falls behind)
KEY_BYTES = 20  # NATS payloads start with the message key
STALL_SECONDS = 20.0  # a wait with no progress for this long is reported as a stall and ends

perf = time.perf_counter


class Missing(Exception):
    """A dependency of the benchmark is missing (exit code 2 with this message)."""


# ====================================================================== recording


@dataclass
class Phase:
    """One timed phase of one system."""

    name: str
    events: int  # publishes attempted
    expected: int = 0  # deliveries expected from the accepted publishes
    published: int = 0  # accepted appends
    refused: dict[str, int] = field(default_factory=dict)  # refused publishes by reason
    errors: int = 0
    first_error: str = ""
    deliveries: int = 0
    seconds: float = 0.0  # first publish -> every subscription handled its head (its ACK due)
    publish_seconds: float = 0.0  # first publish -> last publish answered
    complete: bool = False
    acked_seconds: float = 0.0  # first publish -> the server's stored ACK state at every head
    acked_complete: bool = False
    behind_max: float = 0.0  # paced phases: how late the publisher got against its schedule
    latencies: dict[str, list[float]] = field(default_factory=dict)  # by class: all / quiet / noisy
    # publish -> its answer (the append durable), accepted publishes only; under "answered" in pct()
    # First publish -> handled (authority.py's CpuMeter fills these in): server CPU seconds summed over
    # every process of the topology, and by process name; the PostgreSQL backends serving the
    # topology's database apart (None on SQLite and for NATS); the whole machine's busy CPU, in cores.
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    server_cpu_by: dict[str, float] = field(default_factory=dict)
    pg_cpu: float | None = None
    machine_cores: float | None = None
    # MissionWeave: the Authority's group commits during the phase, from its /metrics histogram
    # (mwp_group_commit_latency_seconds): how many, how many took over 100 ms, and the upper bound
    # of the slowest one's bucket. A phase whose p99 follows a disk stall shows it here (D157).
    commits: int | None = None
    slow_commits: int = 0
    slowest_commit_s: float = 0.0

    @property
    def done(self) -> int:
        """Deliveries: the unit of ``us`` (and of authority.py's projection)."""
        return self.deliveries

    def us(self, cpu: float) -> float:
        """CPU seconds as microseconds per delivery."""
        return cpu / max(1, self.deliveries) * 1e6

    @property
    def rate(self) -> float:
        return self.deliveries / self.seconds if self.seconds else 0.0

    @property
    def acked_rate(self) -> float:
        return self.deliveries / self.acked_seconds if self.acked_seconds else 0.0

    @property
    def append_rate(self) -> float:
        return self.published / self.seconds if self.seconds else 0.0

    def pct(self, cls: str, p: float) -> float:
        xs = sorted(self.latencies.get(cls, []))
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] * 1000.0

    def count(self, cls: str) -> int:
        return len(self.latencies.get(cls, []))

    def line(self, cls: str = "all") -> str:
        refused = sum(self.refused.values())
        return (
            f"{self.name}: {self.deliveries:,}/{self.expected:,} deliveries in {self.seconds:.2f}s = "
            f"{self.rate:,.0f}/s ({self.published:,} events appended, {self.append_rate:,.0f}/s), "
            f"{cls} p50 {self.pct(cls, 50):.1f} ms, p99 {self.pct(cls, 99):.1f} ms"
            + (f", {refused:,} publishes refused {dict(self.refused)}" if refused else "")
            + (f", {self.errors} errors" if self.errors else "")
            + ("" if self.complete else " [INCOMPLETE]")
            + f"; server-side ACK state at the heads after {self.acked_seconds:.2f}s"
            + ("" if self.acked_complete else " [NOT REACHED]")
            + (f"; {self.commit_line()}" if self.commits is not None else "")
            # The append leg of the latency (publish -> durable); the rest is the fan-out to the agents.
            + (
                f"; publish answered p50 {self.pct('answered', 50):.1f} ms, p99 {self.pct('answered', 99):.1f} ms"
                if self.count("answered")
                else ""
            )
        )

    def commit_line(self) -> str:
        return f"group commits {self.commits:,}, over 100 ms {self.slow_commits} (slowest <= {self.slowest_commit_s:g} s)"


@dataclass
class _Pending:
    t0: float
    cls: str
    remaining: int


class Recorder:
    """Publish timestamps by key; every subscriber's first sight of the key records one latency."""

    def __init__(self, phase: Phase, subscribers: int, window: asyncio.Semaphore | None) -> None:
        self.phase = phase
        self.subscribers = subscribers
        self.window = window
        self.pending: dict[str, _Pending] = {}

    def start(self, key: str, cls: str) -> None:
        self.pending[key] = _Pending(perf(), cls, self.subscribers)

    def cancel(self, key: str) -> None:
        """The publish was refused or failed: nobody will see it."""
        if self.pending.pop(key, None) is not None and self.window is not None:
            self.window.release()

    def delivered(self, key: str) -> None:
        pending = self.pending.get(key)
        if pending is None:
            return  # setup events, or a redelivery after every subscriber saw it
        self.phase.latencies.setdefault(pending.cls, []).append(perf() - pending.t0)
        self.phase.deliveries += 1
        pending.remaining -= 1
        if pending.remaining == 0:
            del self.pending[key]
            if self.window is not None:
                self.window.release()


@dataclass
class Item:
    """One prepared publish: its key (command id / message id), Group index, latency class, payload."""

    key: str
    group: int
    cls: str
    payload: Any


# ====================================================================== the systems


class System(abc.ABC):
    """What a phase needs from MissionWeave or NATS."""

    name = ""
    subscriber_kind = ""
    tree: ProcTree | None = None  # every process of the server, for its CPU

    def __init__(self, groups: int, subscribers: int) -> None:
        self.groups = groups  # quiet Groups; index ``groups`` is the noisy one
        self.subscribers = subscribers
        self.heads: dict[int, int] = {}  # Group index -> last sequence published
        self.recorder: Recorder | None = None

    def on_delivery(self, key: str) -> None:
        if self.recorder is not None:
            self.recorder.delivered(key)

    @abc.abstractmethod
    def prepare(self, plan: list[tuple[int, str]], tag: str) -> list[Item]:
        """The phase's items (Group index, payload), made ready to publish (signed ahead for MissionWeave)."""

    @abc.abstractmethod
    async def publish(self, item: Item) -> str:
        """Publishes; returns "" when accepted, else the refusal reason. Raises on transport errors."""

    @abc.abstractmethod
    def lagging(self) -> int:
        """Subscriptions that have not yet handled their Group's head (SDK: cursor written; raw: ACK queued;
        NATS: msg.ack() sent)."""

    @abc.abstractmethod
    async def server_behind(self) -> tuple[int, int]:
        """(subscriptions whose ACK state on the server, stored cursor or ack floor, is short of the head;
        the events they are short by, summed)."""

    async def commit_histogram(self) -> dict[float, float] | None:
        """The server's group-commit latency histogram (cumulative count per bucket bound, +inf
        included), summed over its Authority processes; None when it has none (NATS)."""
        return None

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop subscribers, clients and the server."""


# ---------------------------------------------------------------------- MissionWeave


class RawSubscriber:
    """One bare ``GatewayService.Connect`` stream: HELLO (reading batched responses), SUBSCRIBE every Group,
    parse, ACK each frame."""

    def __init__(
        self, target: str, signer: Any, group_ids: list[str], credits: int, on_event: Callable[[Any], None]
    ) -> None:
        self.target = target
        self.signer = signer
        self.group_ids = group_ids
        self.credits = credits
        self.on_event = on_event
        self.cursors: dict[str, int] = dict.fromkeys(group_ids, 0)  # processed and ACKed
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.writer: asyncio.Task[None] | None = None
        self.outgoing: asyncio.Queue[Any] = (
            asyncio.Queue()
        )  # ACKs: written by their own task, so reading never waits on a write
        self.errors: list[str] = []

    async def start(self) -> None:
        from missionweave.kernel.clock import SystemClock, to_timestamp
        from missionweave.kernel.signing import HELLO_PROOF_TYPE, session_key_id, sign_envelope
        from missionweave.v1 import gateway_service_pb2 as gpb
        from missionweave.v1 import gateway_service_pb2_grpc as gpb_grpc

        s = self.signer
        proof = gpb.HelloProof(
            agent_id=s.identity_id,
            session_epoch=s.session_epoch,
            issued_at=to_timestamp(SystemClock().now()),
            nonce=os.urandom(16),
            audience=self.target,
        )
        envelope = sign_envelope(
            proof.SerializeToString(), HELLO_PROOF_TYPE, s.key, session_key_id(s.identity_id, s.session_epoch)
        )
        self.channel = open_channel(self.target)
        self.call = gpb_grpc.GatewayServiceStub(self.channel).Connect()
        hello = gpb.HelloFrame(
            agent_id=s.identity_id, session_epoch=s.session_epoch, proof=envelope, accepts_frame_batches=True
        )
        await self.call.write(gpb.ConnectRequest(frame=gpb.ClientFrame(hello=hello)))
        first = await self.call.read()
        if first is grpc.aio.EOF or not first.frame.HasField("welcome"):
            raise RuntimeError(f"{s.identity_id}: no WELCOME: {first}")
        for i, gid in enumerate(self.group_ids):
            sub = gpb.SubscribeFrame(subscription_id=f"s{i}", group_id=gid, initial_credits=self.credits)
            await self.call.write(gpb.ConnectRequest(frame=gpb.ClientFrame(subscribe=sub)))
        self.reader = asyncio.create_task(self._read())
        self.writer = asyncio.create_task(self._write())

    async def _write(self) -> None:
        while (request := await self.outgoing.get()) is not None:
            await self.call.write(request)

    async def _read(self) -> None:
        by_sid = {f"s{i}": gid for i, gid in enumerate(self.group_ids)}
        while True:
            response = await self.call.read()
            if response is grpc.aio.EOF:
                return
            for frame in (response.frame, *response.more_frames):
                self._on_frame(frame, by_sid)

    def _on_frame(self, frame: Any, by_sid: dict[str, str]) -> None:
        from missionweave.v1 import event_pb2
        from missionweave.v1 import gateway_service_pb2 as gpb

        kind = frame.WhichOneof("frame")
        if kind == "event":
            ev = frame.event
            gid = by_sid[ev.subscription_id]
            cursor = self.cursors[gid]
            for envelope in ev.events:
                event = event_pb2.Event.FromString(envelope.payload)
                if event.sequence > cursor:
                    self.on_event(event)
            ack = gpb.CursorAck(
                subscription_id=ev.subscription_id,
                group_id=gid,
                cursor=ev.last_sequence,
                credits=ev.last_sequence - ev.first_sequence + 1,
            )
            self.outgoing.put_nowait(
                gpb.ConnectRequest(frame=gpb.ClientFrame(ack=gpb.AckFrame(cursors=[ack])))
            )
            self.cursors[gid] = max(cursor, ev.last_sequence)
        elif kind == "flow" and frame.flow.reason == gpb.FLOW_REASON_SUBSCRIBED:
            gid = by_sid[frame.flow.subscription_id]
            self.cursors[gid] = max(self.cursors[gid], frame.flow.effective_after_sequence)
        elif kind == "error":
            self.errors.append(f"{frame.error.code}: {frame.error.rejection.message}")
            log(f"  {self.signer.identity_id}: gateway error {self.errors[-1]}")

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        if self.writer is not None:
            with contextlib.suppress(asyncio.TimeoutError, grpc.aio.AioRpcError, asyncio.CancelledError):
                await asyncio.wait_for(self.writer, 5)
        if self.call is not None:
            with contextlib.suppress(Exception):
                await self.call.done_writing()
        if self.reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, grpc.aio.AioRpcError, asyncio.CancelledError):
                await asyncio.wait_for(self.reader, 5)
        if self.channel is not None:
            await self.channel.close()


class MissionWeave(System):
    def __init__(
        self,
        args: argparse.Namespace,
        work: Path,
        topo: Topology,
        data_dir: Path,
        database_url: str,
        fresh: bool,
    ) -> None:
        super().__init__(args.groups, args.subscribers)
        self.args = args
        self.work = work  # this topology's own directory (stderr, cursor files)
        self.topo = topo
        self.name = f"[{topo.label}] MissionWeave"  # tags every progress line with the topology
        self.data_dir = data_dir
        self.database_url = database_url
        self.fresh = fresh  # a new store: nobody registered yet (else names get this run's suffix)
        self.mesh: Child | None = None
        self.split: SplitMesh | None = None
        self.processes: list[str] = []
        self.engine: Any = None  # PostgreSQL: read-only engine for the gateway's cursor table
        self.client: Any = None
        self.owner: Any = None
        self.run_id = ""
        self.sub_ids: list[str] = []
        self.group_ids: list[str] = []
        self.conv: dict[int, str] = {}
        self.agents: list[Any] = []  # sdk: Agent
        self.subs: list[tuple[Any, int]] = []  # sdk: (Subscription, Group index)
        self.raw: list[RawSubscriber] = []
        self.publishers: dict[int, CommandStream] = {}  # by Group index
        self.envelope_bytes = 0
        self.command_bytes = 0
        self.behind_sample: list[tuple[str, str, int, int]] = []
        self.metrics_ports: list[int] = []  # the Authority processes' /metrics
        self.subscriber_kind = (
            "MissionWeave Python agent SDK (missionweave.sdk.agent.Agent: Authority-signature check per event "
            "or per chain, in-order handler, one fsynced cursor file per agent written in rounds (D143), batched ACKs "
            "and batched responses), one Agent per subscriber "
            "identity, every Group on its one gateway stream"
            if args.client == "sdk"
            else "raw GatewayService.Connect streams (parse each event, ACK each frame; no signature check, "
            "no cursor file), one stream per subscriber identity carrying every Group"
        )

    def start_server(self) -> int:
        """The topology's processes; returns the one port clients use (the gateway's, when split)."""
        topo = self.topo
        store = "PostgreSQL" if self.database_url else "SQLite"
        pg_database = database_name(self.database_url) if self.database_url else ""
        self.work.mkdir(parents=True, exist_ok=True)
        # Metrics on a port of the bench's choosing (the default one may be taken); split hands its
        # processes the ports after it (topology.metrics_addresses).
        listen = f"127.0.0.1:{free_port()}"
        split = metrics_addresses(listen, topo.shards)
        authorities = [listen] if topo.shards == 0 else [split[f"authority-{i}"] for i in range(topo.shards)]
        self.metrics_ports = [int(address.rpartition(":")[2]) for address in authorities]
        with mock.patch.dict(os.environ, {"MWP_METRICS_LISTEN": listen}):
            return self._spawn(topo, store, pg_database)

    def _spawn(self, topo: Topology, store: str, pg_database: str) -> int:
        if topo.shards == 0:
            log(f"{self.name}: starting our server ({store} store) in a separate process")
            self.mesh = spawn_mesh(
                self.data_dir, self.work, self.database_url, stderr_name=f"{topo.slug}.stderr"
            )
            track_child(self.mesh.proc)
            self.tree = ProcTree(self.mesh.proc.pid, "mesh", pg_database=pg_database)
            log(f"  server pid {self.mesh.proc.pid}, port {self.mesh.port}")
            port = self.mesh.port
        else:
            log(f"{self.name}: starting mwp serve --topology split --shards {topo.shards} ({store} store)")
            self.split = SplitMesh(
                topo.shards, self.data_dir, self.work / f"{topo.slug}.stderr", self.database_url
            )
            track_child(self.split.proc)
            self.tree = ProcTree(self.split.proc.pid, "launcher", self.split.names, pg_database=pg_database)
            port = self.split.port
            log(f"  launcher pid {self.split.proc.pid}, gateway (the one address) on port {port}")
        self.processes = sorted(self.tree.labels().values())
        log(f"  {len(self.processes)} processes: {', '.join(self.processes)}")
        return port

    async def start(self) -> None:
        from nacl.signing import SigningKey

        from missionweave.kernel import ids
        from missionweave.kernel.clock import SystemClock
        from missionweave.kernel.signing import read_key
        from missionweave.sdk.client import MeshClient
        from missionweave.v1 import common_pb2, membership_pb2
        from tests import builders

        args = self.args
        target = f"127.0.0.1:{self.start_server()}"
        self.client = client = MeshClient(target)
        admin_key_path = self.data_dir / "keys" / "admin.key"
        if not admin_key_path.exists():
            raise RuntimeError(
                f"no admin key at {admin_key_path}: the server did not bootstrap this database"
            )
        admin_key = read_key(admin_key_path)
        self.run_id = run_id = ids.new_id("b")[2:10]
        suffix = "" if self.fresh else f"-{run_id}"  # a shared database (--database-url) already has them
        owner_id, coordinator = f"alice{suffix}", f"coordinator-bot{suffix}"
        owner_key = SigningKey.generate()
        await client.register_identity(
            "admin", admin_key, owner_id, common_pb2.IDENTITY_KIND_HUMAN, bytes(owner_key.verify_key)
        )
        await client.register_identity(
            "admin",
            admin_key,
            coordinator,
            common_pb2.IDENTITY_KIND_AGENT,
            bytes(SigningKey.generate().verify_key),
        )
        sub_keys = {f"sub-{k:02d}{suffix}": SigningKey.generate() for k in range(args.subscribers)}
        self.sub_ids = list(sub_keys)
        for sid, key in sub_keys.items():
            await client.register_identity(
                "admin", admin_key, sid, common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
            )
        self.owner = owner = await client.open_session(owner_id, owner_key)

        self.group_ids = [f"grp_dlv_{run_id}_{g:03d}" for g in range(args.groups)] + [
            f"grp_dlv_{run_id}_noisy"
        ]
        log(
            f"  creating {len(self.group_ids)} Groups ({args.groups} + the noisy one) with mission_create and "
            f"granting {args.subscribers} subscriber Memberships in each"
        )
        now = SystemClock().now()

        async def create(g: int) -> None:
            gid = self.group_ids[g]
            await client.execute(
                owner.sign(
                    owner.command(gid, "mission_create", builders.mission_create(owner_id, coordinator, now))
                )
            )
            self.conv[g] = (await client.group_state(gid)).mission.planning_conversation_id
            for sid in sub_keys:
                grant = membership_pb2.MembershipGrant(
                    member_id=sid, role=membership_pb2.MEMBER_ROLE_OBSERVER
                )
                await client.execute(
                    owner.sign(owner.command(gid, "membership_grant", grant, membership_epoch=1))
                )

        await _bounded(16, [create(g) for g in range(len(self.group_ids))])
        states = await asyncio.gather(*(client.group_state(gid) for gid in self.group_ids))
        self.heads = {g: st.head_sequence for g, st in enumerate(states)}

        probe = self.prepare([(0, "probe")], "probe")[0]
        self.command_bytes = len(probe.payload.command.SerializeToString())
        result = (await client.authority.ExecuteCommand(probe.payload)).result
        self.envelope_bytes = len(result.events[0].SerializeToString())
        self.heads[0] = result.group_revision

        log(
            f"  connecting {args.subscribers} subscribers ({args.client}), each subscribed to {len(self.group_ids)} Groups"
        )
        if args.client == "sdk":
            from missionweave.sdk.agent import Agent

            async def handler(event: Any) -> None:
                self.on_delivery(event.causing_command_id)

            cursor_dir = self.work / "cursors"
            for sid, key in sub_keys.items():
                agent = await Agent.connect(target, sid, key, cursor_dir=cursor_dir, command_timeout=60.0)
                self.agents.append(agent)
                for g, gid in enumerate(self.group_ids):
                    self.subs.append((await agent.subscribe(gid, handler, credits=args.credits), g))
        else:

            def on_event(event: Any) -> None:
                self.on_delivery(event.causing_command_id)

            for sid, key in sub_keys.items():
                signer = await client.open_session(sid, key)
                raw = RawSubscriber(target, signer, self.group_ids, args.credits, on_event)
                await raw.start()
                self.raw.append(raw)
        await wait_caught_up(self, 60.0, f"{self.name}: subscribers catching up with the setup events")

    def prepare(self, plan: list[tuple[int, str]], tag: str) -> list[Item]:
        from missionweave.v1 import authority_service_pb2 as apb
        from tests import builders

        owner, items = self.owner, []
        for i, (g, cls) in enumerate(plan):
            text = f"delivery {tag} {i:08d} ".ljust(self.args.text_bytes, "x")
            cmd = owner.command(
                self.group_ids[g], "message_post", builders.message(self.conv[g], text), membership_epoch=1
            )
            items.append(Item(cmd.command_id, g, cls, apb.ExecuteCommandRequest(command=owner.sign(cmd))))
        return items

    async def publish(self, item: Item) -> str:
        from missionweave.kernel.rejections import rejection_from_rpc_error
        from missionweave.v1 import common_pb2

        if self.args.publish == "stream":
            publisher = self.publishers.get(item.group)
            if publisher is None:
                publisher = self.publishers[item.group] = CommandStream(self.client.channel)
            answer = await publisher.execute(item.payload.command)
            if answer.HasField("rejection"):
                return common_pb2.RejectionReason.Name(answer.rejection.reason).removeprefix(
                    "REJECTION_REASON_"
                )
            result = answer.result
        else:
            try:
                result = (await self.client.authority.ExecuteCommand(item.payload)).result
            except grpc.aio.AioRpcError as err:
                rejection = rejection_from_rpc_error(err)
                if rejection is None:
                    raise
                return common_pb2.RejectionReason.Name(rejection.reason).removeprefix("REJECTION_REASON_")
        self.heads[item.group] = max(self.heads[item.group], result.group_revision)
        return ""

    async def commit_histogram(self) -> dict[float, float] | None:
        try:
            return await asyncio.to_thread(scrape_commit_histogram, self.metrics_ports)
        except OSError as err:  # a diagnostic: the run goes on without it
            log(f"  {self.name}: no group-commit histogram from ports {self.metrics_ports}: {err}")
            return None

    def lagging(self) -> int:
        if self.subs:
            return sum(1 for sub, g in self.subs if sub.cursor < self.heads[g])
        return sum(
            1 for raw in self.raw for g, gid in enumerate(self.group_ids) if raw.cursors[gid] < self.heads[g]
        )

    def failures(self) -> list[str]:
        out = [f"{sub.group_id}: {sub.failure}" for sub, _ in self.subs if sub.failure is not None]
        return out + [e for raw in self.raw for e in raw.errors]

    async def close_subscribers(self) -> None:
        for agent in self.agents:
            await agent.close()
        for raw in self.raw:
            await raw.close()

    CURSORS_SQL = "SELECT agent_id, group_id, cursor FROM gateway_cursors WHERE group_id LIKE "

    def _sqlite_cursors(self, prefix: str) -> list[tuple[str, str, int]]:
        db = sqlite3.connect(f"file:{self.data_dir / 'missionweave.db'}?mode=ro", uri=True)
        try:
            return [tuple(r) for r in db.execute(self.CURSORS_SQL + "?", (prefix,)).fetchall()]
        finally:
            db.close()

    async def _stored_cursors(self) -> list[tuple[str, str, int]]:
        """The gateway's acknowledged cursors of this run's Groups, read only. The gateway's table is
        in the topology's one database (every process of a split mesh gets the same data dir and
        database URL, missionweave_server/mesh/topology.py): the SQLite file in the data dir, opened
        ``mode=ro``; on PostgreSQL a read-only transaction through the database URL."""
        prefix = f"grp_dlv_{self.run_id}_%"
        if not self.database_url:
            return await asyncio.to_thread(self._sqlite_cursors, prefix)
        from sqlalchemy import text

        from missionweave_server.storage.db import make_engine

        if self.engine is None:
            self.engine = make_engine(self.database_url, pool_size=1)
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(postgresql_readonly=True)
            rows = await conn.execute(text(self.CURSORS_SQL + ":prefix"), {"prefix": prefix})
            return [(a, g, int(c)) for a, g, c in rows]

    async def server_behind(self) -> tuple[int, int]:
        """From the gateway's own table of acknowledged cursors (read-only, beside the running server)."""
        heads = dict(self.heads)
        stored = {(a, g): c for a, g, c in await self._stored_cursors()}
        behind = [
            (sid, gid, stored.get((sid, gid), 0), heads[g])
            for sid in self.sub_ids
            for g, gid in enumerate(self.group_ids)
            if stored.get((sid, gid), 0) < heads[g]
        ]
        self.behind_sample = behind[:3]
        return len(behind), sum(head - cursor for _, _, cursor, head in behind)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.close_subscribers()
        for publisher in self.publishers.values():
            publisher.cancel()
        self.publishers.clear()
        if self.client is not None:
            await self.client.channel.close()
        if self.engine is not None:
            with contextlib.suppress(Exception):
                await self.engine.dispose()
            self.engine = None
        if self.mesh is not None:
            self.mesh.stop()
            self.mesh = None
        if self.split is not None:
            self.split.stop()
            self.split = None


# ---------------------------------------------------------------------- NATS JetStream


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


COMMIT_HISTOGRAM = "mwp_group_commit_latency_seconds_bucket"


def scrape_commit_histogram(ports: list[int]) -> dict[float, float]:
    """Sums ``COMMIT_HISTOGRAM`` over the /metrics of the processes on ``ports`` (127.0.0.1)."""
    import urllib.request

    buckets: dict[float, float] = {}
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            for bound, count in parse_commit_histogram(answer.read().decode()).items():
                buckets[bound] = buckets.get(bound, 0.0) + count
    return buckets


def parse_commit_histogram(text: str) -> dict[float, float]:
    """``COMMIT_HISTOGRAM``'s cumulative count per bucket bound in a Prometheus text exposition."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(COMMIT_HISTOGRAM + "{"):
            labels, _, value = line.rpartition(" ")
            bound = labels.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if bound == "+Inf" else float(bound)] = float(value)
    return buckets


def commits_between(before: dict[float, float], after: dict[float, float]) -> tuple[int, int, float]:
    """(commits, commits over 100 ms, upper bound of the slowest one's bucket) between two scrapes."""
    delta = {bound: after[bound] - before.get(bound, 0.0) for bound in after}
    total = delta.get(float("inf"), 0.0)
    slowest = min((bound for bound, n in delta.items() if n >= total), default=0.0) if total else 0.0
    return int(total), int(total - delta.get(0.1, total)), slowest


def ensure_nats_server() -> str:
    """The nats-server binary; installs Debian's package when missing and running as root."""
    path = shutil.which("nats-server")
    if path:
        return path
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Missing(
            "nats-server is not installed and this is not root on Debian: install it (apt-get install nats-server) "
            "or run with --no-nats"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "nats-server"]
    log("nats-server not found: running " + " ".join(install))
    done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        log("  that failed; running apt-get update, then the install again")
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
    path = shutil.which("nats-server")
    if done.returncode != 0 or not path:
        raise Missing(f"could not install nats-server with apt-get:\n{(done.stdout + done.stderr)[-2000:]}")
    log(f"  installed {path}")
    return path


def launch_nats(work: Path) -> tuple[subprocess.Popen[bytes], int, str]:
    """Starts ``nats-server -js`` on a free loopback port with file storage under ``work``."""
    binary = ensure_nats_server()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    port = free_port()
    store = work / "nats"
    store.mkdir(parents=True, exist_ok=True)
    cmd = [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    log(f"NATS: starting {' '.join(cmd)} ({version})")
    with open(work / "nats.stderr", "wb") as stderr:
        proc = track_child(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr))
    return proc, port, version


class Nats(System):
    name = "NATS JetStream"

    def __init__(self, args: argparse.Namespace, work: Path, payload_bytes: int) -> None:
        super().__init__(args.groups, args.subscribers)
        self.args = args
        self.work = work
        self.payload_bytes = max(payload_bytes, KEY_BYTES + 1)
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = ""
        self.run_id = os.urandom(3).hex()
        self.pub: Any = None
        self.js: Any = None
        self.conns: list[Any] = []
        self.cursors: dict[
            tuple[int, int], int
        ] = {}  # (subscriber, Group) -> stream sequence processed + acked
        self.subscriber_kind = (
            "nats-py push consumers (durable, explicit ACK per message, max_ack_pending = credits), one "
            "connection per subscriber carrying its consumer of every Group"
        )

    def stream(self, g: int) -> str:
        return f"MWB_{self.run_id}_{g}"

    def subject(self, g: int) -> str:
        return f"mwb.{self.run_id}.{g}"

    async def start(self) -> None:
        import nats
        from nats.js import api

        self.proc, port, self.version = launch_nats(self.work)
        self.tree = ProcTree(self.proc.pid, "nats-server")
        url = f"nats://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:  # until the port accepts connections
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"nats-server did not start: {(self.work / 'nats.stderr').read_text()[-2000:]}"
                    ) from None
                await asyncio.sleep(0.1)
        self.pub = await nats.connect(url, max_reconnect_attempts=0)
        log(f"  server pid {self.proc.pid}, port {port}")
        self.js = self.pub.jetstream(timeout=30)
        total = self.groups + 1
        log(
            f"  creating {total} streams (file storage, one per Group) and {total * self.subscribers:,} durable "
            f"push consumers over {self.subscribers} subscriber connections"
        )
        for g in range(total):
            await self.js.add_stream(
                name=self.stream(g), subjects=[self.subject(g)], storage=api.StorageType.FILE
            )
            self.heads[g] = 0
        for k in range(self.subscribers):
            conn = await nats.connect(url, name=f"sub-{k:02d}", max_reconnect_attempts=0)
            self.conns.append(conn)
            js = conn.jetstream(timeout=30)
            for g in range(total):
                self.cursors[(k, g)] = 0
                config = api.ConsumerConfig(
                    durable_name=f"sub{k:02d}",
                    ack_policy=api.AckPolicy.EXPLICIT,
                    deliver_policy=api.DeliverPolicy.ALL,
                    max_ack_pending=self.args.credits,
                    ack_wait=120.0,
                )
                await js.subscribe(
                    self.subject(g),
                    stream=self.stream(g),
                    durable=f"sub{k:02d}",
                    config=config,
                    manual_ack=True,
                    cb=self._handler(k, g),
                )

    def _handler(self, k: int, g: int) -> Callable[[Any], Awaitable[None]]:
        async def handler(msg: Any) -> None:
            seq = msg.metadata.sequence.stream
            if seq > self.cursors[(k, g)]:
                self.on_delivery(msg.data[:KEY_BYTES].decode())
            await msg.ack()
            self.cursors[(k, g)] = max(self.cursors[(k, g)], seq)

        return handler

    def prepare(self, plan: list[tuple[int, str]], tag: str) -> list[Item]:
        items = []
        for i, (g, cls) in enumerate(plan):
            key = f"{tag[:6]:<6}{i:0{KEY_BYTES - 6}d}"
            items.append(Item(key, g, cls, key.encode().ljust(self.payload_bytes, b"x")))
        return items

    async def publish(self, item: Item) -> str:
        ack = await self.js.publish(self.subject(item.group), item.payload)
        self.heads[item.group] = max(self.heads[item.group], ack.seq)
        return ""

    def lagging(self) -> int:
        return sum(1 for (_, g), c in self.cursors.items() if c < self.heads[g])

    async def server_behind(self) -> tuple[int, int]:
        """From every consumer's info: ack floor short of the stream head, or ACKs still pending."""
        keys = [(k, g) for k in range(self.subscribers) for g in range(self.groups + 1)]
        infos = await asyncio.gather(*(self.js.consumer_info(self.stream(g), f"sub{k:02d}") for k, g in keys))
        short = [
            max(self.heads[g] - info.ack_floor.stream_seq, info.num_ack_pending)
            for (_, g), info in zip(keys, infos, strict=True)
        ]
        return sum(1 for n in short if n > 0), sum(short)

    async def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(Exception):
                await conn.close()
        if self.pub is not None:
            with contextlib.suppress(Exception):
                await self.pub.close()
        stop_proc(self.proc)
        self.proc = None


_CHILDREN: list[subprocess.Popen[bytes]] = []


def track_child(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Remembers a child process so main() stops it whatever happens (Ctrl-C, SIGTERM, errors)."""
    _CHILDREN.append(proc)
    return proc


def stop_proc(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ====================================================================== phases


async def _bounded(limit: int, coros: list[Awaitable[None]]) -> None:
    slots = asyncio.Semaphore(limit)

    async def one(c: Awaitable[None]) -> None:
        async with slots:
            await c

    await asyncio.gather(*(one(c) for c in coros))


async def wait_server_acked(system: System, seconds: float, what: str) -> bool:
    """Polls the server's ACK state until every subscription's is at its head (or ``seconds`` pass, or
    nothing moves for ``STALL_SECONDS`` while the subscribers have nothing left to do: a stall)."""
    t0 = perf()
    deadline, reported = t0 + seconds, t0
    last, moved = -1, t0
    while True:
        behind, short = await system.server_behind()
        if not behind:
            return True
        if short != last:
            last, moved = short, perf()
        stalled = perf() - moved > STALL_SECONDS and not system.lagging()
        if stalled:
            log(
                f"  {what}: STALLED: the server's ACK state of {behind} subscriptions ({short:,} events short) "
                f"has not moved for {STALL_SECONDS:.0f}s"
            )
        if stalled or perf() > deadline:
            sample = getattr(system, "behind_sample", [])
            log(
                f"  {what}: the server's ACK state of {behind} subscriptions is still short of the head after "
                f"{perf() - t0:.0f}s"
                + (f", e.g. (agent, Group, stored cursor, head) {sample}" if sample else "")
            )
            return False
        if perf() - reported >= 3:
            reported = perf()
            log(
                f"  {what}: waiting for the server's ACK state: {behind} subscriptions short of the head "
                f"({short:,} events) after {reported - t0:.0f}s"
            )
        await asyncio.sleep(0.1)


async def wait_caught_up(system: System, seconds: float, what: str) -> bool:
    """Waits until every subscription handled its Group's head; gives up after ``seconds``, or when neither
    a delivery nor a subscription catching up happened for ``STALL_SECONDS`` (a stall)."""
    deadline = perf() + seconds
    recorder = system.recorder
    last, moved = (-1, -1), perf()
    while lagging := system.lagging():
        progress = (recorder.phase.deliveries if recorder is not None else 0, lagging)
        if progress != last:
            last, moved = progress, perf()
        if perf() - moved > STALL_SECONDS:
            log(f"  {what}: STALLED: {lagging} subscriptions behind and no progress for {STALL_SECONDS:.0f}s")
            return False
        if perf() > deadline:
            log(f"  {what}: {lagging} subscriptions still behind after {seconds:.0f}s")
            return False
        await asyncio.sleep(0.02)
    return True


class PhaseProgress:
    def __init__(self, system: System, phase: Phase) -> None:
        self.system, self.phase = system, phase
        self.task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        t0 = perf()
        while True:
            await asyncio.sleep(3)
            p, el = self.phase, perf() - t0
            log(
                f"  {self.system.name} {p.name}: {p.published + sum(p.refused.values()) + p.errors:,}/{p.events:,} "
                f"published, {p.deliveries:,} deliveries after {el:.0f}s ({p.deliveries / el:,.0f}/s), "
                f"{self.system.lagging()} subscriptions behind"
            )

    def __enter__(self) -> PhaseProgress:
        self.task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task:
            self.task.cancel()


async def run_phase(
    system: System,
    name: str,
    items: list[Item],
    *,
    window: int = 0,
    offsets: list[float] | None = None,
    max_seconds: float,
    ack_seconds: float,
) -> Phase:
    """Publishes ``items`` (closed loop with ``window`` in flight end to end, or open loop at ``offsets``
    seconds from the start) and waits until every subscription has processed and acknowledged its head."""
    phase = Phase(name, len(items))
    slots = asyncio.Semaphore(window) if window else None
    recorder = Recorder(phase, system.subscribers, slots)
    system.recorder = recorder
    tasks: set[asyncio.Task[None]] = set()
    last_answer = 0.0

    async def publish(item: Item) -> None:
        nonlocal last_answer
        recorder.start(item.key, item.cls)
        sent = perf()
        try:
            refused = await system.publish(item)
        except Exception as err:
            phase.errors += 1
            phase.first_error = phase.first_error or repr(err)[:500]
            recorder.cancel(item.key)
            return
        finally:
            last_answer = perf()
        if refused:
            phase.refused[refused] = phase.refused.get(refused, 0) + 1
            recorder.cancel(item.key)
        else:
            phase.published += 1
            phase.expected += system.subscribers
            phase.latencies.setdefault("answered", []).append(last_answer - sent)

    assert system.tree is not None
    commits_before = await system.commit_histogram()
    with PhaseProgress(system, phase):
        # Server CPU (every process of the topology, PostgreSQL backends apart) and this process's CPU,
        # from the first publish until every subscription handled its head.
        with CpuMeter(phase, system.tree):
            t0 = perf()
            deadline = t0 + max_seconds
            for i, item in enumerate(items):
                if perf() > deadline:
                    break
                if slots is not None:
                    await slots.acquire()
                if offsets is not None:
                    delay = t0 + offsets[i] - perf()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    else:
                        phase.behind_max = max(phase.behind_max, -delay)
                    while len(tasks) >= PAUSED_CAP:
                        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                task = asyncio.create_task(publish(item))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(set(tasks))
            phase.publish_seconds = last_answer - t0
            phase.complete = await wait_caught_up(
                system, max(5.0, deadline - perf()), f"{system.name} {name}"
            )
            phase.seconds = perf() - t0
        commits_after = await system.commit_histogram()
        if commits_before is not None and commits_after is not None:
            phase.commits, phase.slow_commits, phase.slowest_commit_s = commits_between(
                commits_before, commits_after
            )
        # The next phase starts from a drained server: its stored ACK state at every head.
        phase.acked_complete = await wait_server_acked(system, ack_seconds, f"{system.name} {name}")
        phase.acked_seconds = perf() - t0
    system.recorder = None
    return phase


def noisy_schedule(groups: int, rate: float, seconds: float, noisy: bool) -> list[tuple[float, int, str]]:
    """(offset s, Group, class): each quiet Group at ``rate``/s, staggered; the noisy Group at 100x."""
    out: list[tuple[float, int, str]] = []
    per_group = max(1, round(rate * seconds))
    for g in range(groups):
        start = (g / groups) / rate
        out += [(start + k / rate, g, "quiet") for k in range(per_group)]
    if noisy:
        fast = rate * NOISY_FACTOR
        out += [(k / fast, groups, "noisy") for k in range(round(fast * seconds))]
    out.sort()
    return out


@dataclass
class Results:
    system: System
    warmup: Phase | None = None
    throughput: Phase | None = None
    half_load: Phase | None = None
    quiet_only: Phase | None = None
    with_noisy: Phase | None = None
    idle: tuple[float, float] = (0.0, 0.0)  # server, client CPU while every subscription is idle (of a core)
    failures: list[str] = field(default_factory=list)

    def phases(self) -> list[Phase]:
        return [
            p
            for p in (self.warmup, self.throughput, self.half_load, self.quiet_only, self.with_noisy)
            if p is not None
        ]


async def idle_cpu(system: System, seconds: float) -> tuple[float, float]:
    """Server (every process) and client CPU, of a core, while nothing is published."""
    assert system.tree is not None
    idle = Phase("idle", 0)
    with CpuMeter(idle, system.tree):
        await asyncio.sleep(seconds)
    return idle.server_cpu / seconds, idle.client_cpu / seconds


async def measure(system: System, args: argparse.Namespace, rates: dict[str, float]) -> Results:
    """Warm-up, throughput, half load, then the noisy-neighbour pair. ``rates`` (events/s per Group):
    "half" and "quiet", set from this system's throughput when missing, so that every later system
    (other topologies, NATS) is offered the same."""
    res = Results(system)
    g = args.groups
    phase_args: dict[str, Any] = {"max_seconds": args.max_seconds, "ack_seconds": args.ack_seconds}
    await wait_server_acked(system, args.ack_seconds, f"{system.name} setup")
    res.idle = await idle_cpu(system, 3.0)
    log(
        f"{system.name}: idle, {len(system.heads) * system.subscribers:,} subscriptions: server CPU {res.idle[0]:.0%}, "
        f"client CPU {res.idle[1]:.0%} of a core (3 s)"
    )
    warm = min(500, max(g, args.events // 10))
    log(f"{system.name}: warm-up, {warm:,} events")
    items = system.prepare([(i % g, "all") for i in range(warm)], "warm")
    res.warmup = await run_phase(system, "warm-up", items, window=args.window, **phase_args)
    log("  " + res.warmup.line())

    log(
        f"{system.name}: throughput, {args.events:,} events over {g} Groups x {args.subscribers} subscribers, "
        f"{args.window} events in flight end to end"
    )
    items = system.prepare([(i % g, "all") for i in range(args.events)], "thru")
    res.throughput = await run_phase(system, "throughput", items, window=args.window, **phase_args)
    log("  " + res.throughput.line())

    # Half of the throughput just measured, spread evenly over every Group at a fixed schedule (open
    # loop): the latency the target names ("p99 <= 50 ms at half of the maximum throughput").
    half_rate = rates.setdefault("half", float(f"{0.5 * res.throughput.rate / (g * args.subscribers):.2g}"))
    schedule = noisy_schedule(g, half_rate, args.noisy_seconds, False)
    log(
        f"{system.name}: half load, {g} Groups at {half_rate:g} events/s each for {args.noisy_seconds:g}s ({len(schedule):,} events)"
    )
    res.half_load = await run_phase(
        system,
        "half load",
        system.prepare([(grp, cls) for _, grp, cls in schedule], "half"),
        offsets=[o for o, _, _ in schedule],
        max_seconds=args.noisy_seconds + args.max_seconds,
        ack_seconds=args.ack_seconds,
    )
    log("  " + res.half_load.line("quiet"))

    # Quiet load such that quiet + noisy together offer --noisy-load of the throughput just measured.
    quiet_rate = rates.setdefault(
        "quiet",
        float(f"{args.noisy_load * res.throughput.rate / ((g + NOISY_FACTOR) * args.subscribers):.2g}"),
    )
    for noisy in (False, True):
        schedule = noisy_schedule(g, quiet_rate, args.noisy_seconds, noisy)
        name = "with noisy" if noisy else "quiet only"
        log(
            f"{system.name}: noisy neighbour, {name}: {g} quiet Groups at {quiet_rate:g} events/s each"
            + (f" + 1 Group at {quiet_rate * NOISY_FACTOR:g}/s" if noisy else "")
            + f" for {args.noisy_seconds:g}s ({len(schedule):,} events)"
        )
        items = system.prepare([(grp, cls) for _, grp, cls in schedule], "noisy" if noisy else "quiet")
        offsets = [o for o, _, _ in schedule]
        phase = await run_phase(
            system,
            name,
            items,
            offsets=offsets,
            max_seconds=args.noisy_seconds + args.max_seconds,
            ack_seconds=args.ack_seconds,
        )
        log(
            "  "
            + phase.line("quiet")
            + (f"; noisy Group p99 {phase.pct('noisy', 99):.1f} ms" if noisy else "")
        )
        if noisy:
            res.with_noisy = phase
        else:
            res.quiet_only = phase
    return res


# ====================================================================== driver and report


async def drive(args: argparse.Namespace, work: Path) -> tuple[list[Results], Results | None, float]:
    """Every topology of ``--topologies`` in turn (each its own server, store and subscribers), then the
    NATS anchor once: it does not depend on our topology. The first topology measured sets the
    noisy-neighbour rates (unless ``--quiet-rate``); every other one and NATS get the same."""
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    if main_task is not None:
        # Ctrl-C and SIGTERM cancel the run; the finally blocks below stop the servers.
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, main_task.cancel)

    topologies: list[Topology] = args.topology_list
    stores = TopologyStores(topologies, args.database_url, "", work)
    ours: list[Results] = []
    rates: dict[str, float] = {"quiet": args.quiet_rate} if args.quiet_rate else {}
    try:
        for topo in topologies:
            if topo.skip:
                continue
            data_dir, url, fresh = stores.place(topo)
            mw = MissionWeave(args, work / topo.slug, topo, data_dir, url, fresh)
            try:
                await mw.start()
                log(
                    f"  message_post command {mw.command_bytes} B signed, stored event envelope {mw.envelope_bytes} B "
                    f"(text {args.text_bytes} B)"
                )
                res = await measure(mw, args, rates)
                res.failures = mw.failures()
                ours.append(res)
                if not args.envelope_bytes:
                    args.envelope_bytes, args.command_bytes = mw.envelope_bytes, mw.command_bytes
            except Exception as exc:  # one topology failing must not lose the others' figures
                lines = [x for x in str(exc).splitlines() if x.strip()] or [""]
                # The first line says what failed; the last, e.g. a child's stderr tail, why.
                why = lines[0][:300] + (f" ... {lines[-1].strip()[:300]}" if len(lines) > 1 else "")
                topo.skip = f"FAILED: {type(exc).__name__}: {why}"
                args.failed.append(topo.label)
                log(f"{topo.label} FAILED: {exc!r}")
            finally:
                await mw.stop()
    finally:
        stores.close()
    if not ours:
        raise SystemExit("no topology could be measured")
    theirs: Results | None = None
    if not args.no_nats:
        nats_sys = Nats(args, work, args.envelope_bytes)
        try:
            await nats_sys.start()
            theirs = await measure(nats_sys, args, rates)
        finally:
            await nats_sys.stop()
        args.nats_version = nats_sys.version
    return ours, theirs, rates["quiet"]


def _ms(v: float) -> str:
    return "n/a" if v != v else f"{v:,.1f}"


def _ratio(a: float, b: float, fmt: str = "{:.2f}x") -> str:
    return fmt.format(a / b) if b and a == a and b == b else "n/a"


def _change(a: float, b: float, fmt: str = "{:,.0f}") -> str:
    """``a -> b (+x%)``."""
    pct = f" ({b / a - 1:+.0%})" if a and a == a and b == b else ""
    return f"{fmt.format(a)} -> {fmt.format(b)}{pct}"


def _fairness(res: Results) -> float:
    qp, np_ = res.quiet_only, res.with_noisy
    assert qp is not None and np_ is not None
    return np_.pct("quiet", 99) / qp.pct("quiet", 99) if qp.pct("quiet", 99) else float("nan")


def _slow_commits(res: Results) -> str:
    """The group commits over 100 ms in the half-load, quiet-only and noisy phases ("" for NATS)."""
    if not isinstance(res.system, MissionWeave):
        return ""
    phases = [p for p in (res.half_load, res.quiet_only, res.with_noisy) if p is not None]
    return " / ".join(str(p.slow_commits) if p.commits is not None else "-" for p in phases)


def _busiest(p: Phase) -> str:
    if not p.server_cpu_by or not p.seconds:
        return ""
    label, cpu = max(p.server_cpu_by.items(), key=lambda kv: kv[1])
    return f"{label} {cpu / p.seconds:.0%} ({p.us(cpu):,.0f} us)"


def _vs_nats(o: Results, t: Results | None) -> None:
    """One topology against the NATS anchor: the figures side by side, with MissionWeave / NATS ratios."""
    assert o.throughput and o.quiet_only and o.with_noisy
    ot, oq, on = o.throughput, o.quiet_only, o.with_noisy
    tt, tq, tn = (t.throughput, t.quiet_only, t.with_noisy) if t else (None, None, None)
    rows: list[tuple[str, str, str, str]] = []

    def row(
        name: str, f: Callable[[Any], float], fmt: str = "{:,.0f}", ratio_fmt: str = "{:.2f}x", per: str = ""
    ) -> None:
        a = f(o if per == "res" else ot)
        b = f(t if per == "res" else tt) if t else float("nan")
        rows.append(
            (
                name,
                fmt.format(a) if a == a else "n/a",
                fmt.format(b) if t and b == b else "",
                _ratio(a, b, ratio_fmt) if t and ratio_fmt else "",
            )
        )

    row("deliveries/s, append -> handled", lambda p: p.rate, ratio_fmt="{:.1%}")
    row("deliveries/s, append -> ACK stored", lambda p: p.acked_rate, ratio_fmt="{:.1%}")
    row("events appended/s (to handled)", lambda p: p.append_rate, ratio_fmt="{:.1%}")
    row("p50 append -> delivery, ms", lambda p: p.pct("all", 50), "{:,.1f}")
    row("p99 append -> delivery, ms", lambda p: p.pct("all", 99), "{:,.1f}")
    row("server CPU, throughput (of a core)", lambda p: p.server_cpu / p.seconds, "{:.0%}", "")
    row("client CPU, throughput (of a core)", lambda p: p.client_cpu / p.seconds, "{:.0%}", "")
    row("server CPU per delivery, us", lambda p: p.us(p.server_cpu), "{:,.0f}")
    if ot.pg_cpu is not None:
        row(
            "  + PostgreSQL backends per delivery, us",
            lambda p: p.us(p.pg_cpu) if p.pg_cpu is not None else float("nan"),
            "{:,.0f}",
            "",
        )
    row(
        f"machine busy, all users ({(os.cpu_count() or 1) * 100}% = all cores)",
        lambda p: p.machine_cores if p.machine_cores is not None else float("nan"),
        "{:.0%}",
        "",
    )
    row("server CPU idle, all subscribed", lambda r: r.idle[0], "{:.0%}", "", per="res")
    oh, th = o.half_load, t.half_load if t else None
    if oh is not None:
        rows.append(("half load (even, open loop)", "", "", ""))
        for label, cls, pct in (
            ("  p50 append -> delivery, ms", "quiet", 50),
            (f"  p99 append -> delivery, ms (<= {HALF_LOAD_P99_MS:g})", "quiet", 99),
            ("  p50 publish -> answered (durable), ms", "answered", 50),
            ("  p99 publish -> answered (durable), ms", "answered", 99),
        ):
            a, b = oh.pct(cls, pct), th.pct(cls, pct) if th else float("nan")
            rows.append((label, _ms(a), _ms(b) if th else "", _ratio(a, b) if th else ""))
    rows.append(("noisy neighbour", "", "", ""))
    for label, po, pt, cls, pct in (
        ("  quiet p50, quiet only, ms", oq, tq, "quiet", 50),
        ("  quiet p50, with noisy, ms", on, tn, "quiet", 50),
        ("  quiet p99, quiet only, ms", oq, tq, "quiet", 99),
        ("  quiet p99, with noisy, ms", on, tn, "quiet", 99),
        ("  noisy Group p50, ms", on, tn, "noisy", 50),
        ("  noisy Group p99, ms", on, tn, "noisy", 99),
    ):
        a, b = po.pct(cls, pct), pt.pct(cls, pct) if pt else float("nan")
        rows.append((label, _ms(a), _ms(b) if pt else "", _ratio(a, b) if pt else ""))
    rows.append(
        (
            "  quiet p99 with / without (<= 1.5x)",
            _ratio(on.pct("quiet", 99), oq.pct("quiet", 99)),
            _ratio(tn.pct("quiet", 99), tq.pct("quiet", 99)) if tn and tq else "",
            "",
        )
    )
    rows.append(
        (
            "  noisy publishes refused",
            f"{sum(on.refused.values()):,}/{on.events - oq.events:,}",
            f"{sum(tn.refused.values()):,}/{tn.events - tq.events:,}" if tn and tq else "",
            "",
        )
    )
    rows.append(("  group commits over 100 ms (half / quiet / noisy)", _slow_commits(o), "", ""))
    label = cast(MissionWeave, o.system).topo.label
    w, cw = max(len(r[0]) for r in rows), max(14, len(label))
    print(
        f"{'figure':<{w}}  {label:>{cw}}  {'NATS JetStream' if t else '':>14}  {'MW / NATS' if t else '':>9}"
    )
    print("-" * (w + cw + 31))
    for name, ours_v, theirs_v, ratio_v in rows:
        print(f"{name:<{w}}  {ours_v:>{cw}}  {theirs_v:>14}  {ratio_v:>9}")


def report(args: argparse.Namespace, ours: list[Results], theirs: Results | None, quiet_rate: float) -> bool:
    """Prints the final tables; returns False if a topology failed, an accepted event did not reach every
    subscriber, a publish failed or a subscription stopped (the server's ACK state short of a head is only
    a warning)."""
    from importlib.metadata import version

    topologies: list[Topology] = args.topology_list
    mws = [cast(MissionWeave, o.system) for o in ours]
    print()
    print(
        f"MissionWeave delivery benchmark - {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, grpcio "
        f"{grpc.__version__}" + (f", {args.nats_version}, nats-py {version('nats-py')}" if theirs else "")
    )
    print(
        f"scale run: {args.groups} Groups x {args.subscribers} subscribers = {args.groups * args.subscribers:,} "
        f"subscriptions (+{args.subscribers} on the noisy Group); throughput phase {args.events:,} events = "
        f"{args.events * args.subscribers:,} deliveries, {args.window} events in flight end to end; credits {args.credits}"
    )
    print(
        "topologies (each its own server, store and subscribers, one after the other; NATS once, after them):"
    )
    for mw in mws:
        print(f"  {mw.topo.label}: processes {', '.join(mw.processes)}")
    for topo in topologies:
        if topo.skip:
            print(f"  {topo.label}: NOT MEASURED - {topo.skip}")
    print(f"subscribers, MissionWeave: {mws[0].subscriber_kind}")
    if theirs:
        print(f"subscribers, NATS:         {theirs.system.subscriber_kind}")
    print(
        f"publisher: one client; MissionWeave = pre-signed message_post ({args.command_bytes} B) through "
        + ("an ExecuteCommandStream per Group" if args.publish == "stream" else "unary ExecuteCommand")
        + " (split: to the gateway, which forwards it to the Group's Authority shard), each answered "
        f"after the group commit (SQLite WAL, synchronous=FULL, or PostgreSQL's commit); stored event {args.envelope_bytes} B"
    )
    if theirs:
        print(
            f"           NATS = js.publish of {args.envelope_bytes} B payloads awaiting the PubAck; file storage, "
            "default sync (JetStream fsyncs on a 2-minute timer, not per message)"
        )
    print(
        "server and client in separate processes on the same cores; one client process publishes and subscribes. "
        "'handled': every subscriber's handler saw the last event and its ACK was due (SDK: cursor file written, "
        "the ACK follows; raw: ACK queued; NATS: msg.ack() sent); 'ACK stored': the server's ACK state (gateway "
        "cursor table / consumer ack floor) reached every head, polled every 0.1 s"
    )
    print(
        "server CPU: every process of the topology summed (single: the mesh process with its signature worker and "
        "SQLite writer; split: launcher, gateway, Authority shards with theirs, membership, artifacts, scheduling); "
        "the PostgreSQL backends serving its database apart"
    )

    # ------------------------------------------------------------ each topology against NATS
    for o in ours:
        print()
        _vs_nats(o, theirs)

    # ------------------------------------------------------------ side by side
    print()
    print("side by side (throughput phase unless said; NATS measured once, after every topology):")
    ths = [cast(Phase, o.throughput) for o in ours]
    tt = theirs.throughput if theirs else None
    nats_col = ["NATS JetStream"] if theirs else []

    def cells(f: Callable[[Phase], str], nats: bool = True) -> list[str]:
        return [f(p) for p in ths] + ([f(tt) if nats else ""] if tt else [])

    rows = [
        ["deliveries/s, handled", *cells(lambda p: f"{p.rate:,.0f}")],
        ["  % of NATS", *cells(lambda p: _ratio(p.rate, tt.rate, "{:.1%}") if tt else "", nats=False)],
        ["deliveries/s, ACK stored", *cells(lambda p: f"{p.acked_rate:,.0f}")],
        [
            "p50 / p99 append -> delivery, ms",
            *cells(lambda p: f"{_ms(p.pct('all', 50))} / {_ms(p.pct('all', 99))}"),
        ],
        ["server CPU per delivery, us", *cells(lambda p: f"{p.us(p.server_cpu):,.0f}")],
        [
            "  + PostgreSQL backends, us",
            *cells(lambda p: f"{p.us(p.pg_cpu):,.0f}" if p.pg_cpu is not None else "", nats=False),
        ],
        ["busiest process (% of a core, us)", *cells(_busiest, nats=False)],
        ["client CPU (of a core)", *cells(lambda p: f"{p.client_cpu / p.seconds:.0%}" if p.seconds else "")],
        [
            "machine busy, all users",
            *cells(lambda p: f"{p.machine_cores:.0%}" if p.machine_cores is not None else "n/a"),
        ],
    ]
    every = [*ours, *([theirs] if theirs else [])]
    rows.append(
        [
            f"half load p50 / p99 ms (p99 <= {HALF_LOAD_P99_MS:g})",
            *(
                f"{_ms(r.half_load.pct('quiet', 50))} / {_ms(r.half_load.pct('quiet', 99))}"
                if r.half_load
                else ""
                for r in every
            ),
        ]
    )
    rows.append(
        [
            "quiet p99 ms, without -> with noisy",
            *(
                f"{_ms(cast(Phase, r.quiet_only).pct('quiet', 99))} -> {_ms(cast(Phase, r.with_noisy).pct('quiet', 99))}"
                for r in every
            ),
        ]
    )
    rows.append(["  ratio (<= 1.5x)", *(f"{_fairness(r):.2f}x" for r in every)])
    rows.append(["  commits over 100 ms (half/quiet/noisy)", *(_slow_commits(r) for r in every)])
    offered = args.groups * quiet_rate * args.subscribers + quiet_rate * NOISY_FACTOR * args.subscribers
    rows.append(
        [
            "  noisy load as % of own throughput",
            *(
                f"{offered / cast(Phase, r.throughput).rate:.0%}" if cast(Phase, r.throughput).rate else "n/a"
                for r in every
            ),
        ]
    )
    _table(["figure", *(mw.topo.label for mw in mws), *nats_col], rows)

    # ------------------------------------------------------------ hop cost and shard gain
    pairs = comparisons([mw.topo for mw in mws])
    if pairs:
        by = {(mw.topo.name, mw.topo.store): o for mw, o in zip(mws, ours, strict=True)}
        print()
        print(
            "what the topology costs or gains (same store, same run; throughput phase, quiet p99 ratio from the noisy pair):"
        )
        rows = []
        for what, a, b in pairs:
            ra, rb = by[(a.name, a.store)], by[(b.name, b.store)]
            pa, pb = cast(Phase, ra.throughput), cast(Phase, rb.throughput)
            rows.append(
                [
                    f"{what}: {a.label} -> {b.label}",
                    _change(pa.rate, pb.rate),
                    _change(pa.acked_rate, pb.acked_rate),
                    f"{_ms(pa.pct('all', 50))} -> {_ms(pb.pct('all', 50))}",
                    f"{_ms(pa.pct('all', 99))} -> {_ms(pb.pct('all', 99))}",
                    f"{pa.us(pa.server_cpu):,.0f} -> {pb.us(pb.server_cpu):,.0f} "
                    f"({pb.us(pb.server_cpu) - pa.us(pa.server_cpu):+,.0f})",
                    f"{_fairness(ra):.2f}x -> {_fairness(rb):.2f}x",
                ]
            )
        _table(
            [
                "comparison",
                "deliveries/s handled",
                "ACK stored",
                "p50 ms",
                "p99 ms",
                "server us/delivery",
                "quiet p99 ratio",
            ],
            rows,
        )

    # ------------------------------------------------------------ per-process breakdown
    print()
    print(
        f"per-process CPU, % of one core (us per delivery), until handled; this machine: {os.cpu_count()} CPUs"
    )
    if any(p.pg_cpu is not None for p in ths):
        print(
            "(postgres backends: those serving the topology's database at the phase's end; one that exited during the\n"
            " phase is not counted: a lower bound)"
        )
    for mw, o in zip(mws, ours, strict=True):
        print()
        print(mw.topo.label)
        phases = [cast(Phase, p) for p in (o.throughput, o.quiet_only, o.with_noisy)]
        _table(["process", *(p.name for p in phases)], process_rows(list(phases)))

    # ------------------------------------------------------------ projection
    print()
    print(
        "projection: CPU ceiling in deliveries/s (throughput phase) if each process's CPU per delivery stays as measured,\n"
        "every process can use one core (one event loop each), Authority shards (with their workers) split their share as\n"
        "unevenly as measured, the mesh's processes have N cores to themselves (the publishing and subscribing client and\n"
        "PostgreSQL elsewhere). The one gateway stays one process. Not a forecast: latency, the window and the database bound it too."
    )
    for mw, o in zip(mws, ours, strict=True):
        topo, p = mw.topo, cast(Phase, o.throughput)
        rows = [
            [
                "-" if k == 0 else f"{k}{' (measured)' if k == topo.shards else ''}",
                *(f"{projection(p, topo.shards, c, k or 1):,.0f}" for c in (2, 4, 8, 16)),
            ]
            for k in ([0] if topo.shards == 0 else sorted({topo.shards, 1, 2, 4, 8}))
        ]
        print()
        print(f"{topo.label} (measured {p.rate:,.0f} deliveries/s; busiest: {_busiest(p)})")
        _table(["shards", "2 cores", "4 cores", "8 cores", "16 cores"], rows)

    # ------------------------------------------------------------ noisy neighbour and checks
    print()
    print(
        f"noisy neighbour load: {args.groups} quiet Groups at {quiet_rate:g} events/s each "
        f"({args.groups * quiet_rate * args.subscribers:,.0f} deliveries/s) for {args.noisy_seconds:g}s, then the same "
        f"plus one Group at {quiet_rate * NOISY_FACTOR:g} events/s (100x, +{quiet_rate * NOISY_FACTOR * args.subscribers:,.0f} "
        "deliveries/s); the same absolute rates for every topology and NATS"
        + ("" if args.quiet_rate else f" (set from {mws[0].topo.label}'s throughput)")
    )
    ok = not args.failed
    for res in every:
        if res.half_load is not None:
            p99 = res.half_load.pct("quiet", 99)
            print(
                f"  {res.system.name}: half load (every Group at the same fixed rate, half of the first measured "
                f"throughput): p99 append -> delivery {p99:.1f} ms (target <= {HALF_LOAD_P99_MS:g} ms): "
                f"{'MET' if p99 <= HALF_LOAD_P99_MS else 'NOT MET'}"
            )
    for res in every:
        qp, np_ = res.quiet_only, res.with_noisy
        assert qp is not None and np_ is not None
        r_ = _fairness(res)
        print(
            f"  {res.system.name}: quiet p99 {qp.pct('quiet', 99):.1f} ms ({qp.count('quiet'):,} deliveries) -> "
            f"{np_.pct('quiet', 99):.1f} ms ({np_.count('quiet'):,}) with the noisy Group = {r_:.2f}x "
            f"(target <= {FAIRNESS_TARGET}x): {'MET' if r_ <= FAIRNESS_TARGET else 'NOT MET'}; publisher at most "
            f"{max(qp.behind_max, np_.behind_max) * 1000:.0f} ms behind its schedule"
        )
    print()
    for label in args.failed:
        print(f"check {label}: FAILED (see the NOT MEASURED line above)")
    for res in every:
        phases = res.phases()
        missing = [p for p in phases if not p.complete or p.deliveries != p.expected]
        unacked = [p.name for p in phases if not p.acked_complete]
        print(
            f"check {res.system.name}: every accepted event reached every subscriber: "
            + (
                "yes"
                if not missing
                else "NO (" + ", ".join(f"{p.name} {p.deliveries:,}/{p.expected:,}" for p in missing) + ")"
            )
            + "; the server's ACK state reached every head after every phase: "
            + (
                "yes"
                if not unacked
                else f"NO ({', '.join(unacked)}, within --ack-seconds {args.ack_seconds:g})"
            )
        )
        ok = ok and not missing
        if unacked:
            print(
                f"  WARNING: {res.system.name}'s server did not store every subscriber's final ACK "
                "(see the STALLED / still short lines above); reported, not counted as a failed run"
            )
        for p in phases:
            if p.first_error:
                print(f"  first error in {p.name}: {p.first_error}")
                ok = False
        for f in res.failures[:5]:
            print(f"  subscription failure: {f}")
            ok = False
        print(
            "  per phase: handled / ACK stored after s; server / client CPU until handled (of a core): "
            + "; ".join(
                f"{p.name} {p.seconds:.1f} / {p.acked_seconds:.1f}s, "
                f"{p.server_cpu / p.seconds:.0%} / {p.client_cpu / p.seconds:.0%}"
                for p in phases
                if p.seconds
            )
        )
    return ok


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--groups",
        type=int,
        default=40,
        help="quiet Groups (default 40; the noisy Group is extra; the issue's scale is 100, see bench/README.md)",
    )
    p.add_argument(
        "--subscribers", type=int, default=5, help="subscribers per Group (default 5; the issue's: 10)"
    )
    p.add_argument("--events", type=int, default=2000, help="events in the throughput phase (default 2000)")
    p.add_argument(
        "--window",
        type=int,
        default=200,
        help="events in flight end to end in the throughput phase (default 200)",
    )
    p.add_argument(
        "--credits",
        type=int,
        default=256,
        help="credit window per subscription / max_ack_pending (default 256)",
    )
    p.add_argument("--text-bytes", type=int, default=64, help="message text size (default 64)")
    p.add_argument(
        "--client", choices=["sdk", "raw"], default="sdk", help="MissionWeave subscribers (default sdk)"
    )
    p.add_argument(
        "--publish",
        choices=["stream", "unary"],
        default="stream",
        help="MissionWeave publisher: an ExecuteCommandStream per Group (default) or unary ExecuteCommand per event",
    )
    p.add_argument(
        "--noisy-seconds", type=float, default=15.0, help="length of each noisy-neighbour phase (default 15)"
    )
    p.add_argument(
        "--quiet-rate",
        type=float,
        default=None,
        help="events/s per quiet Group in the noisy phases (default: so that quiet + noisy offer --noisy-load of "
        "the throughput MissionWeave measured on the first topology; every topology and NATS get the same rates)",
    )
    p.add_argument("--noisy-load", type=float, default=0.5, help="see --quiet-rate (default 0.5)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="cap on each phase's wait (default 120)")
    p.add_argument(
        "--ack-seconds",
        type=float,
        default=60.0,
        help="cap on the wait after each phase for the server's ACK state to reach every head (default 60)",
    )
    p.add_argument("--no-nats", action="store_true", help="skip the NATS JetStream anchor")
    p.add_argument(
        "--default-gc",
        action="store_true",
        help="CPython's default gc thresholds in this process, not gc_policy's (D155)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 20 Groups x 4 subscribers, 800 events, 6 s noisy phases",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (server logs, NATS store)")
    p.add_argument(
        "--topologies",
        default="single,split-1,split-2",
        help="comma-separated: single, split-N, each optionally :sqlite or :pg (default single,split-1,split-2; "
        "split-N with N > 1 runs on PostgreSQL and brings single:pg and split-1:pg beside it), as bench/authority.py",
    )
    p.add_argument(
        "--no-pg-baselines",
        action="store_true",
        help="do not add single:pg and split-1:pg beside a split-N on PostgreSQL",
    )
    p.add_argument(
        "--database-url",
        default="",
        help="postgresql://... for the PostgreSQL topologies (default: MWP_BENCH_POSTGRES_URL, else a fresh database "
        "per topology in the machine's PostgreSQL 15, as bench/authority.py); unsuffixed topologies then run on it",
    )
    args = p.parse_args()
    args.topology_list = parse_topologies(args.topologies, bool(args.database_url), not args.no_pg_baselines)
    args.failed = []  # labels of the topologies that failed
    log("topologies: " + ", ".join(t.label for t in args.topology_list))
    if args.quick:
        args.groups, args.subscribers = min(args.groups, 20), min(args.subscribers, 4)
        args.events, args.noisy_seconds = min(args.events, 800), min(args.noisy_seconds, 6.0)
        args.window = min(args.window, 200)
    args.nats_version, args.envelope_bytes, args.command_bytes = "", 0, 0

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not args.default_gc:
        gc_policy.for_long_running_process()  # this process hosts the subscribers, as an agent host
    if not args.no_nats:
        try:
            import nats  # noqa: F401
        except ImportError:
            print("nats-py is missing: pip install -e '.[bench]' (or run with --no-nats)", file=sys.stderr)
            return 2
        try:
            ensure_nats_server()
        except Missing as missing:
            print(str(missing), file=sys.stderr)
            return 2

    work = Path(tempfile.mkdtemp(prefix="mwp-delivery-"))
    t0 = perf()
    try:
        ours, theirs, quiet_rate = asyncio.run(drive(args, work))
        ok = report(args, ours, theirs, quiet_rate)
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: servers stopped")
        return 130
    finally:
        for proc in _CHILDREN:
            stop_proc(proc)
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    log(f"done in {perf() - t0:.0f}s")
    if not ok:
        print(
            "FAILED: events were lost, a publish failed or a subscription stopped; see the checks above",
            file=sys.stderr,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
