"""Histories of the real mesh, checked by ``simulation.checker`` (issue 40 part 4).

Concurrent clients post commands (each one command at a time, retrying the same command id after an
error) and readers read the Group logs (ReadEvents), every operation recorded in a
``simulation.history.History`` as it is invoked and as its outcome is known, while

* a shard of ``mwp serve --topology split --shards 3`` on PostgreSQL is killed with SIGKILL (the
  launcher starts it again; its Groups move on once their leases lapse);
* the shard owning the most Groups is paused (SIGSTOP) for twice its lease while clients routing
  their commands to the shards themselves move on, then resumed: the others have taken its Groups
  over, and the commands it received while asleep must be fenced (a zombie owner);
* two Authority instances on one database hand Groups over to each other several times (the
  ownership lease lapses on the shared clock; the new owner's higher writer epoch fences the old).

At the end every Group's log is read back as ``final_logs`` and the checker must find nothing: no
acknowledged command lost or applied twice, no gap, no stale read, no two commands acknowledged at
one seq, no read of an event the log does not have, nothing applied out of real-time order, no
failed attempt applied. Each test also asserts that its history is not trivial (enough commands
acknowledged, retries across the fault, reads that delivered events), so it cannot pass vacuously.

Outcomes: an answer is OK; a refusal that promises nothing was written (NOT_OWNER, WRITER_FENCED,
OVERLOADED) is FAIL; anything else the client cannot judge (a deadline, a broken connection, the
front door's PEER_UNAVAILABLE for a shard that did not answer) is INFO.

The last test (an expected failure) is a defect the checker finds: the front door's shard router
answers NOT_OWNER for a command whose connection to its owner broke after it was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.kernel.clock import Clock, ManualClock, SystemClock, to_timestamp
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.agent import Agent, Subscription
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import (
    authority_service_pb2,
    authority_service_pb2_grpc,
    command_pb2,
    common_pb2,
    event_pb2,
    membership_pb2,
)
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from simulation.checker import Anomaly, check
from simulation.history import History, Kind, Phase
from tests import builders
from tests.conftest import register
from tests.shard_mesh import owners
from tests.split_mesh import free_port, start_split, wait_serving

pytestmark = pytest.mark.postgres

R = common_pb2.RejectionReason
# Refusals that promise nothing was written: the attempt FAILed.
NOTHING_WRITTEN = {
    R.REJECTION_REASON_NOT_OWNER,
    R.REJECTION_REASON_WRITER_FENCED,
    R.REJECTION_REASON_OVERLOADED,
}
ATTEMPT_S = 5.0  # one attempt's deadline: past it the outcome is unknown (INFO)

# send(envelope) -> (result, which instance answered)
Send = Callable[[common_pb2.SignedEnvelope], Awaitable[tuple[command_pb2.CommandResult, str]]]


class Recorder:
    """Records each operation's invocation and outcome, in the order they happen (one event loop)."""

    def __init__(self) -> None:
        self.history = History()
        self.acknowledged = 0
        self.faults_at: list[int] = []  # history times at which a fault was injected
        self._progress = asyncio.Event()
        self.refusals: Counter[str] = Counter()  # why attempts failed or were left unknown

    async def until_acknowledged(self, n: int) -> None:
        while self.acknowledged < n:
            self._progress.clear()
            await self._progress.wait()

    async def command(
        self, process: str, group: str, envelope: common_pb2.SignedEnvelope, cid: str, send: Send
    ) -> None:
        """Sends one command until it is acknowledged (the same envelope, so the same command id)."""
        deadline = time.monotonic() + 60
        while not await self.attempt(process, group, envelope, cid, send):
            assert time.monotonic() < deadline, f"{cid} was not acknowledged within 60 s"
            await asyncio.sleep(0.1)

    async def attempt(
        self, process: str, group: str, envelope: common_pb2.SignedEnvelope, cid: str, send: Send
    ) -> bool:
        """One attempt, recorded; whether it was acknowledged."""
        self.history.record(process, Kind.COMMAND, Phase.INVOKE, group, command_id=cid)
        try:
            result, shard = await send(envelope)
        except grpc.aio.AioRpcError as err:
            self._refused(process, group, cid, err)
            return False
        events = decode_events(result.events)
        seq = events[0].sequence if events else int(result.group_revision)
        epoch = f"/epoch {events[0].writer_epoch}" if events else ""
        self.history.record(
            process, Kind.COMMAND, Phase.OK, group, command_id=cid, seq=seq, shard=shard + epoch
        )
        self.acknowledged += 1
        self._progress.set()
        return True

    def _refused(self, process: str, group: str, cid: str, err: grpc.aio.AioRpcError) -> None:
        rejection = rejection_from_rpc_error(err)
        self.refusals[R.Name(rejection.reason) if rejection is not None else err.code().name] += 1
        if rejection is not None and rejection.reason in NOTHING_WRITTEN:
            owner = rejection.metadata.get("owner", "")
            self.history.record(process, Kind.COMMAND, Phase.FAIL, group, command_id=cid, shard=owner)
            return
        if rejection is None or rejection.reason == R.REJECTION_REASON_PEER_UNAVAILABLE:
            self.history.record(process, Kind.COMMAND, Phase.INFO, group, command_id=cid)
            return
        self.history.record(process, Kind.COMMAND, Phase.FAIL, group, command_id=cid)
        raise AssertionError(f"{cid} refused: {R.Name(rejection.reason)} {rejection.message}")

    async def read(
        self, process: str, client: MeshClient, shard: str, group: str, after: int, limit: int
    ) -> int:
        """One ReadEvents call; the head it was told (0 if it failed)."""
        self.history.record(process, Kind.READ, Phase.INVOKE, group, after=after)
        delivered: list[tuple[int, str]] = []
        head = 0
        request = authority_service_pb2.ReadEventsRequest(group_id=group, after_sequence=after, limit=limit)
        try:
            async for batch in client.authority.ReadEvents(request, timeout=ATTEMPT_S):
                head = max(head, int(batch.head_sequence))
                delivered.extend((e.sequence, e.causing_command_id) for e in decode_events(batch.events))
        except grpc.aio.AioRpcError:
            self.history.record(process, Kind.READ, Phase.INFO, group)
            return 0
        self.history.record(
            process, Kind.READ, Phase.OK, group, events=tuple(delivered), head=head, shard=shard
        )
        return head

    async def final_logs(self, client: MeshClient, groups: list[str]) -> None:
        for group in groups:
            events = [e async for e in client.read_events(group)]
            self.history.final_logs[group] = [(e.sequence, e.causing_command_id) for e in events]

    def attempts_after_fault(self) -> int:
        """Attempts that did not succeed (FAIL or INFO) recorded after the first fault."""
        first = self.faults_at[0] if self.faults_at else 0
        return sum(
            1
            for op in self.history.ops
            if op.kind is Kind.COMMAND and op.phase in (Phase.FAIL, Phase.INFO) and op.time > first
        )

    def planted_loss_is_seen(self) -> bool:
        """Whether the checker reports a loss once the last acknowledged command of a client is
        dropped from (a copy of) its final log: the recorded seqs and ids line up with the log."""
        last = next(
            op for op in reversed(self.history.ops)
            if op.kind is Kind.COMMAND and op.phase is Phase.OK and op.process.startswith("client")
        )  # fmt: skip
        logs = {g: [e for e in log if e[1] != last.command_id] for g, log in self.history.final_logs.items()}
        copy = History(ops=list(self.history.ops), final_logs=logs)
        return any(a.kind == "lost" and last in a.ops for a in check(copy))

    def figures(self) -> str:
        ops = self.history.ops
        oks = sum(1 for op in ops if op.kind is Kind.COMMAND and op.phase is Phase.OK)
        fails = sum(1 for op in ops if op.kind is Kind.COMMAND and op.phase is Phase.FAIL)
        infos = sum(1 for op in ops if op.kind is Kind.COMMAND and op.phase is Phase.INFO)
        retried = len(
            {op.command_id for op in ops if op.kind is Kind.COMMAND and op.phase in (Phase.FAIL, Phase.INFO)}
        )
        reads = [op for op in ops if op.kind is Kind.READ and op.phase is Phase.OK]
        delivered = sum(len(op.events) for op in reads)
        entries = sum(len(log) for log in self.history.final_logs.values())
        started = time.perf_counter()
        check(self.history)
        took = time.perf_counter() - started
        return (
            f"{len(ops)} records: {oks} commands acknowledged ({retried} after retries; {fails} attempts "
            f"refused, {infos} unknown), "
            f"{len(reads)} reads delivering {delivered} events; {entries} final log entries; check {took * 1000:.0f} ms; "
            f"refusals {dict(self.refusals)}"
        )


class StreamReader:
    """An SDK agent following Groups through a front door: each event its handler is given is one
    READ of that subscription's process (invoked once the previous event was handled, from its seq;
    completed when this one is handled). A stream's events may have been read by the mesh before
    the previous one was handled, so its reads name no head: they are checked for gaps, forks and
    events from the future, not for staleness."""

    def __init__(self, recorder: Recorder, identity_id: str, key: SigningKey) -> None:
        self.recorder, self.identity_id, self.key = recorder, identity_id, key
        self.agent: Agent | None = None
        self.subscriptions: dict[str, Subscription] = {}

    async def start(self, target: str, cursor_dir: Path, groups: list[str]) -> None:
        self.agent = await Agent.connect(target, self.identity_id, self.key, cursor_dir=cursor_dir)
        history = self.recorder.history
        for group in groups:
            process = f"{self.identity_id}/{group}"
            history.record(process, Kind.READ, Phase.INVOKE, group, after=0)

            async def handler(event: event_pb2.Event, group: str = group, process: str = process) -> None:
                delivered = ((event.sequence, event.causing_command_id),)
                history.record(process, Kind.READ, Phase.OK, group, events=delivered, shard="stream")
                history.record(process, Kind.READ, Phase.INVOKE, group, after=event.sequence)

            self.subscriptions[group] = await self.agent.subscribe(group, handler, credits=16)

    async def caught_up(self, heads: dict[str, int]) -> None:
        async with asyncio.timeout(30):
            await asyncio.gather(*(self.subscriptions[g].reached(h) for g, h in heads.items()))

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.close()


async def grant_observer(
    recorder: Recorder, owner: SessionSigner, groups: list[str], member: str, send: Send
) -> None:
    """Makes ``member`` an observer of each Group from seq 1 (recorded as process "setup")."""
    for group in groups:
        grant = membership_pb2.MembershipGrant(
            member_id=member, role=membership_pb2.MEMBER_ROLE_OBSERVER, visibility_start_sequence=1
        )
        command = owner.command(group, "membership_grant", grant, membership_epoch=1)
        await recorder.command("setup", group, owner.sign(command), command.command_id, send)


async def setup_groups(
    recorder: Recorder, owner: SessionSigner, groups: list[str], send: Send, clock: Clock
) -> None:
    """Creates each Group's Mission, recorded as process "setup" (its events are in the final logs)."""
    for group in groups:
        command = owner.command(
            group, "mission_create", builders.mission_create("alice", "coord-bot", clock.now())
        )
        command.issued_at.CopyFrom(to_timestamp(clock.now()))
        await recorder.command("setup", group, owner.sign(command), command.command_id, send)


def post(
    owner: SessionSigner, group: str, conversation: str, text: str, clock: ManualClock | None = None
) -> command_pb2.Command:
    command = owner.command(group, "message_post", builders.message(conversation, text), membership_epoch=1)
    if clock is not None:
        command.issued_at.CopyFrom(to_timestamp(clock.now()))  # the instances' clock, which the test moves
    return command


def describe(found: list[Anomaly]) -> str:
    return "\n".join(str(a) for a in found[:20])


# ------------------------------------------------------------------------ a shard killed with SIGKILL

KILL_GROUPS = [f"grp_hist_{i}" for i in range(6)]
KILL_CLIENTS = 8
KILL_COMMANDS = 20  # per client
KILL_READERS = 2
KILL_LEASE_S = 3
PAUSE_S = 2 * KILL_LEASE_S  # a paused owner sleeps past its lease: the others take its Groups over
PAUSED_ATTEMPT_S = 1.0  # the shard router's deadline: then it tries the next shard


class ShardRouter:
    """Clients that send their commands to the Authority shards themselves (not through the front
    door): to the shard believed to own the Group; after NOT_OWNER naming another, to that one; after
    no answer within PAUSED_ATTEMPT_S (a paused shard), to the next one."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self.names = sorted(n for n in addresses if n.startswith("authority-"))
        self.by_address = {addresses[n]: n for n in self.names}
        self.channels = {n: grpc.aio.insecure_channel(addresses[n]) for n in self.names}
        self.stubs = {n: authority_service_pb2_grpc.AuthorityServiceStub(c) for n, c in self.channels.items()}

    def direct(self, name: str, timeout: float) -> Send:
        async def send(envelope: common_pb2.SignedEnvelope) -> tuple[command_pb2.CommandResult, str]:
            request = authority_service_pb2.ExecuteCommandRequest(command=envelope)
            return (await self.stubs[name].ExecuteCommand(request, timeout=timeout)).result, name

        return send

    def router(self) -> Send:
        at = [self.names[0]]

        def after(name: str) -> str:
            return self.names[(self.names.index(name) + 1) % len(self.names)]

        async def send(envelope: common_pb2.SignedEnvelope) -> tuple[command_pb2.CommandResult, str]:
            name = at[0]
            try:
                return await self.direct(name, PAUSED_ATTEMPT_S)(envelope)
            except grpc.aio.AioRpcError as err:
                rejection = rejection_from_rpc_error(err)
                if rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER:
                    named = self.by_address.get(rejection.metadata.get("owner_address", ""), name)
                    at[0] = named if named != name else after(name)
                elif rejection is None:
                    at[0] = after(name)
                raise

        return send

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fault", ["kill", "pause"])
async def test_history_through_a_shard_killed_or_paused_checks_clean(
    db_url: str, tmp_path: Path, fault: str
) -> None:
    """kill: SIGKILL a shard under load (the launcher starts it again); clients go through the
    front door. pause: SIGSTOP the owner of the most Groups for twice its lease, then SIGCONT it
    (a zombie owner: the others have taken its Groups over; what it had received meanwhile must be
    fenced); clients send to the shards themselves, moving on from a shard that does not answer."""
    if not db_url.startswith("postgresql"):
        pytest.skip("shards share PostgreSQL (D60)")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MWP_")},
        "MWP_CONSOLE_LISTEN": "",
        "MWP_METRICS_LISTEN": "",
        "MWP_VERIFY_WORKERS": "0",
        "MWP_OWNERSHIP_LEASE_S": str(KILL_LEASE_S),
    }
    launcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "missionweave.cli", "serve", "--topology", "split", "--shards", "3",
        "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data"), "--database-url", db_url,
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    assert launcher.stderr is not None
    recorder = Recorder()
    client: MeshClient | None = None
    watcher: StreamReader | None = None
    shards: ShardRouter | None = None
    try:
        addresses: dict[str, str] = {}
        pids = await wait_serving(launcher, addresses=addresses)
        drain = asyncio.create_task(launcher.stderr.read())  # keep the pipe from filling
        client = MeshClient(f"127.0.0.1:{port}")
        admin_key = read_key(tmp_path / "data" / "keys" / "admin.key")
        await client.open_session("admin", admin_key)  # reads as an operator: whole logs, contiguous
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        mesh = client

        async def send(envelope: common_pb2.SignedEnvelope) -> tuple[command_pb2.CommandResult, str]:
            response = await mesh.authority.ExecuteCommand(
                authority_service_pb2.ExecuteCommandRequest(command=envelope), timeout=ATTEMPT_S
            )
            return response.result, "front-door"

        await setup_groups(recorder, owner, KILL_GROUPS, send, SystemClock())
        watcher_key = SigningKey.generate()
        await client.register_identity(
            "admin", admin_key, "watcher", common_pb2.IDENTITY_KIND_AGENT, bytes(watcher_key.verify_key)
        )
        await grant_observer(recorder, owner, KILL_GROUPS, "watcher", send)
        watcher = StreamReader(recorder, "watcher", watcher_key)
        await watcher.start(f"127.0.0.1:{port}", tmp_path / "cursors", KILL_GROUPS)
        conversations = {
            g: (await client.group_state(g)).mission.planning_conversation_id for g in KILL_GROUPS
        }
        placed = await owners(db_url)
        assert len(set(placed.values())) >= 2, placed  # the Groups are spread over the shards
        victim = max(set(placed.values()), key=list(placed.values()).count)

        done = asyncio.Event()
        killed = asyncio.Event()

        shards = ShardRouter(addresses)
        zombie_answers: list[str] = []

        async def writer(n: int) -> None:
            rng = random.Random(n)
            own = shards.router() if fault == "pause" else send
            for i in range(KILL_COMMANDS):
                group = rng.choice(KILL_GROUPS)
                command = post(owner, group, conversations[group], f"c{n} #{i}")
                await recorder.command(f"client-{n}", group, owner.sign(command), command.command_id, own)

        async def reader(n: int) -> None:
            rng = random.Random(100 + n)
            heads = dict.fromkeys(KILL_GROUPS, 0)
            while not done.is_set():
                group = rng.choice(KILL_GROUPS)
                after = rng.randint(max(0, heads[group] - 30), heads[group])
                heads[group] = max(
                    heads[group],
                    await recorder.read(f"reader-{n}", mesh, "front-door", group, after, rng.randint(1, 60)),
                )
                await asyncio.sleep(0.02)

        async def kill_under_load() -> None:
            await recorder.until_acknowledged(2 * len(KILL_GROUPS) + KILL_CLIENTS * KILL_COMMANDS // 4)
            recorder.faults_at.append(len(recorder.history.ops))
            if fault == "kill":
                os.kill(pids[victim], signal.SIGKILL)  # the launcher starts it again
            else:
                os.kill(pids[victim], signal.SIGSTOP)
                try:
                    late = [asyncio.create_task(straggler(n, g)) for n, g in enumerate(victim_groups)]
                    await asyncio.sleep(PAUSE_S)
                finally:
                    os.kill(pids[victim], signal.SIGCONT)
                await asyncio.gather(*late)
            killed.set()

        victim_groups = sorted(g for g, o in placed.items() if o == victim and g in KILL_GROUPS)

        async def straggler(n: int, group: str) -> None:
            """A command sent to the paused owner that waits for it (it answers once resumed, after
            the others took its Groups over), then, if refused, goes on like the other clients."""
            command = post(owner, group, conversations[group], f"straggler {n}")
            first, then = shards.direct(victim, PAUSE_S + 10), shards.router()
            waited = [False]

            async def send(envelope: common_pb2.SignedEnvelope) -> tuple[command_pb2.CommandResult, str]:
                if not waited[0]:
                    waited[0] = True
                    try:
                        answer = await first(envelope)
                    except grpc.aio.AioRpcError as err:
                        rejection = rejection_from_rpc_error(err)
                        zombie_answers.append(R.Name(rejection.reason) if rejection else err.code().name)
                        raise
                    zombie_answers.append("OK")
                    return answer
                return await then(envelope)

            await recorder.command(f"straggler-{n}", group, owner.sign(command), command.command_id, send)

        readers = [asyncio.create_task(reader(n)) for n in range(KILL_READERS)]
        started = time.monotonic()
        await asyncio.gather(kill_under_load(), *(writer(n) for n in range(KILL_CLIENTS)))
        done.set()
        await asyncio.gather(*readers)
        load_s = time.monotonic() - started
        assert killed.is_set()
        heads = {g: (await client.group_state(g)).head_sequence for g in KILL_GROUPS}
        await watcher.caught_up(heads)  # the streams went on through the kill, to every head
        await watcher.close()

        await recorder.final_logs(client, KILL_GROUPS)
        found = check(recorder.history)
        print(
            f"{fault}: {recorder.figures()}; load {load_s:.1f} s; the resumed owner answered {zombie_answers}"
        )
        assert found == [], describe(found)
        assert recorder.planted_loss_is_seen()
        # Not vacuous: every command acknowledged, some attempts failed or were left unknown by the
        # fault (and were retried), and reads delivered events from both sides of it.
        stragglers = len(victim_groups) if fault == "pause" else 0
        assert recorder.acknowledged == 2 * len(KILL_GROUPS) + KILL_CLIENTS * KILL_COMMANDS + stragglers
        assert recorder.attempts_after_fault() >= 1, (
            "the fault interrupted no command: the test proved nothing"
        )
        if fault == "pause":  # the resumed owner answered each straggler (refused: it was fenced)
            assert len(zombie_answers) == len(victim_groups) >= 1, zombie_answers
            assert "DEADLINE_EXCEEDED" not in zombie_answers, zombie_answers
            # and its Groups were written by another shard while it slept
            moved = await owners(db_url)
            writers = {
                op.shard.split("/")[0]
                for op in recorder.history.ops
                if op.phase is Phase.OK and op.group_id in placed and placed[op.group_id] == victim
            }
            assert writers - {victim, "front-door"}, (writers, moved)
        reads = [
            op for op in recorder.history.ops if op.kind is Kind.READ and op.phase is Phase.OK and op.events
        ]
        assert any(op.time < recorder.faults_at[0] for op in reads) and any(
            op.time > recorder.faults_at[0] for op in reads
        )
        drain.cancel()
    finally:
        if watcher is not None:
            await watcher.close()
        if shards is not None:
            await shards.close()
        if client is not None:
            await client.channel.close()
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(launcher.wait(), 60)


# ------------------------------------------------------------- takeovers between two instances

TAKEOVER_GROUPS = [f"grp_hist_t{i}" for i in range(4)]
TAKEOVER_CLIENTS = 6
TAKEOVER_COMMANDS = 20  # per client
TAKEOVER_READERS = 2
TAKEOVER_ROUNDS = 4
TAKEOVER_LEASE_S = 5


@pytest.mark.timeout(120)
async def test_history_through_takeovers_between_two_instances_checks_clean(
    db_url: str, tmp_path: Path
) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("several Authority instances share PostgreSQL")
    clock = ManualClock(SystemClock().now())
    data = tmp_path / "data"

    def settings(name: str) -> Settings:
        return Settings(
            listen="127.0.0.1:0",
            data_dir=data,
            database_url=db_url,
            instance_id=name,
            ownership_lease_s=TAKEOVER_LEASE_S,
        )

    a = await start(settings("auth-a"), clock)
    b = await start(settings("auth-b"), clock)
    clients = {"auth-a": MeshClient(f"127.0.0.1:{a.port}"), "auth-b": MeshClient(f"127.0.0.1:{b.port}")}
    by_address = {f"127.0.0.1:{a.port}": "auth-a", f"127.0.0.1:{b.port}": "auth-b"}
    recorder = Recorder()
    watcher: StreamReader | None = None
    try:
        ca, cb = clients["auth-a"], clients["auth-b"]
        admin_key = read_key(data / "keys" / "admin.key")
        admin = await ca.open_session("admin", admin_key)  # reads as an operator at both instances
        cb.read_as(admin)
        owner = await register(ca, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(ca, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        ca.read_as(admin)
        preferred = ["auth-a"]  # where a client sends a new command (a router's stale or fresh guess)

        def router() -> Send:
            """Sends to the preferred instance; after NOT_OWNER naming another, there (a router)."""
            at = [preferred[0]]

            async def send(envelope: common_pb2.SignedEnvelope) -> tuple[command_pb2.CommandResult, str]:
                name = at[0]
                try:
                    response = await clients[name].authority.ExecuteCommand(
                        authority_service_pb2.ExecuteCommandRequest(command=envelope), timeout=ATTEMPT_S
                    )
                except grpc.aio.AioRpcError as err:
                    rejection = rejection_from_rpc_error(err)
                    if rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_OWNER:
                        at[0] = by_address.get(rejection.metadata.get("owner_address", ""), name)
                    raise
                return response.result, name

            return send

        await setup_groups(recorder, owner, TAKEOVER_GROUPS, router(), clock)
        watcher_key = SigningKey.generate()
        await ca.register_identity(
            "admin", admin_key, "watcher", common_pb2.IDENTITY_KIND_AGENT, bytes(watcher_key.verify_key)
        )
        await grant_observer(recorder, owner, TAKEOVER_GROUPS, "watcher", router())
        watcher = StreamReader(recorder, "watcher", watcher_key)
        await watcher.start(f"127.0.0.1:{a.port}", tmp_path / "cursors", TAKEOVER_GROUPS)
        conversations = {
            g: (await ca.group_state(g)).mission.planning_conversation_id for g in TAKEOVER_GROUPS
        }
        done = asyncio.Event()

        async def writer(n: int) -> None:
            rng = random.Random(n)
            for i in range(TAKEOVER_COMMANDS):
                group = rng.choice(TAKEOVER_GROUPS)
                command = post(owner, group, conversations[group], f"c{n} #{i}", clock)
                await recorder.command(
                    f"client-{n}", group, owner.sign(command), command.command_id, router()
                )

        async def reader(n: int) -> None:
            rng = random.Random(100 + n)
            heads = dict.fromkeys(TAKEOVER_GROUPS, 0)
            while not done.is_set():
                group = rng.choice(TAKEOVER_GROUPS)
                name = rng.choice(sorted(clients))
                after = rng.randint(max(0, heads[group] - 30), heads[group])
                head = await recorder.read(
                    f"reader-{n}", clients[name], name, group, after, rng.randint(1, 60)
                )
                heads[group] = max(heads[group], head)
                await asyncio.sleep(0.01)

        async def hand_over() -> None:
            """Each round: once a further share of the commands is in, the owner's lease lapses on the
            shared clock and new commands go to the other instance, which takes the Groups over."""
            total = 2 * len(TAKEOVER_GROUPS) + TAKEOVER_CLIENTS * TAKEOVER_COMMANDS
            for round_ in range(1, TAKEOVER_ROUNDS + 1):
                await recorder.until_acknowledged(total * round_ // (TAKEOVER_ROUNDS + 1))
                recorder.faults_at.append(len(recorder.history.ops))
                clock.advance(seconds=TAKEOVER_LEASE_S + 1)
                preferred[0] = "auth-b" if round_ % 2 else "auth-a"

        readers = [asyncio.create_task(reader(n)) for n in range(TAKEOVER_READERS)]
        started = time.monotonic()
        await asyncio.gather(hand_over(), *(writer(n) for n in range(TAKEOVER_CLIENTS)))
        done.set()
        await asyncio.gather(*readers)
        load_s = time.monotonic() - started
        heads = {g: (await ca.group_state(g)).head_sequence for g in TAKEOVER_GROUPS}
        await watcher.caught_up(heads)  # a's gateway followed each Group to its new owner
        await watcher.close()

        await recorder.final_logs(ca, TAKEOVER_GROUPS)
        found = check(recorder.history)
        print(f"takeover: {recorder.figures()}; load {load_s:.1f} s")
        assert found == [], describe(found)
        assert recorder.planted_loss_is_seen()
        # Not vacuous: every command acknowledged; Groups were written by both instances (each
        # handed over at least once), with refusals (NOT_OWNER, fenced) along the way.
        assert (
            recorder.acknowledged == 2 * len(TAKEOVER_GROUPS) + TAKEOVER_CLIENTS * TAKEOVER_COMMANDS
        )  # with setup
        writers_of: dict[str, set[str]] = {g: set() for g in TAKEOVER_GROUPS}
        epochs_of: dict[str, set[str]] = {g: set() for g in TAKEOVER_GROUPS}
        for op in recorder.history.ops:
            if op.kind is Kind.COMMAND and op.phase is Phase.OK:
                writers_of[op.group_id].add(op.shard.split("/")[0])
                epochs_of[op.group_id].add(op.shard)
        moved = [g for g in TAKEOVER_GROUPS if writers_of[g] == {"auth-a", "auth-b"}]
        assert moved, writers_of
        assert sum(len(e) for e in epochs_of.values()) >= len(TAKEOVER_GROUPS) + 2, (
            epochs_of
        )  # several hand-overs
        assert recorder.attempts_after_fault() >= 1
        assert any(op.kind is Kind.READ and op.phase is Phase.OK and op.events for op in recorder.history.ops)
    finally:
        if watcher is not None:
            await watcher.close()
        for mesh_client in clients.values():
            await mesh_client.channel.close()
        await a.stop(grace=1)
        await b.stop(grace=1)


# ------------------------------------ a connection broken after sending (found by the checker)


class _BrokenAfterSending:
    """A channel to one shard on which one ExecuteCommand's connection breaks once the request was
    sent: the caller sees UNAVAILABLE at once, while the live shard goes on with the command (it
    gets to it 0.3 s later, as a busy shard would)."""

    def __init__(self, channel: Any, lose: list[bool], late: list[asyncio.Task[Any]]) -> None:
        self.channel, self.lose, self.late = channel, lose, late

    def __getattr__(self, name: str) -> Any:
        return getattr(self.channel, name)

    def unary_unary(self, method: str, *args: Any, **kw: Any) -> Callable[..., Any]:
        call = self.channel.unary_unary(method, *args, **kw)

        async def lossy(request: Any, **options: Any) -> Any:
            if method.endswith("/ExecuteCommand") and self.lose and self.lose.pop():

                async def delivered() -> Any:
                    await asyncio.sleep(0.3)
                    return await call(request, **options)

                self.late.append(asyncio.create_task(delivered()))
                metadata = grpc.aio.Metadata()
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, metadata, metadata, details="Socket closed"
                )
            return await call(request, **options)

        return lossy


async def test_a_command_whose_connection_broke_is_not_refused_as_not_written(
    db_url: str, tmp_path: Path
) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("shards share PostgreSQL (D60)")
    clock = ManualClock(SystemClock().now())
    settings = Settings(
        listen="127.0.0.1:0", data_dir=tmp_path / "data", database_url=db_url, grace_seconds=1
    )
    mesh = await start_split(settings, clock, {"authority": 2})
    client = MeshClient(f"127.0.0.1:{mesh.port}")
    recorder = Recorder()
    try:
        admin_key = read_key(mesh.settings.admin_key_path)
        await client.open_session("admin", admin_key)
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)

        async def send(envelope: common_pb2.SignedEnvelope) -> tuple[command_pb2.CommandResult, str]:
            response = await client.authority.ExecuteCommand(
                authority_service_pb2.ExecuteCommandRequest(command=envelope), timeout=ATTEMPT_S
            )
            return response.result, "front-door"

        group = "grp_hist_broken"
        await setup_groups(recorder, owner, [group], send, clock)
        conversation = (await client.group_state(group)).mission.planning_conversation_id
        owning = (await owners(db_url))[group]  # "authority-<i>": the i-th address
        owner_address = mesh.peer_addresses["authority"].split(",")[int(owning.rsplit("-", 1)[1])]
        sharded = mesh.parts["gateway"].peers.channel("authority")  # the front door's ShardedChannel
        lose: list[bool] = [True]
        late: list[asyncio.Task[Any]] = []
        channel_for = sharded._channel_for
        sharded._channel_for = lambda address: (
            _BrokenAfterSending(channel_for(address), lose, late)
            if address == owner_address
            else channel_for(address)
        )

        command = post(owner, group, conversation, "its connection broke", clock)
        envelope, cid = owner.sign(command), command.command_id
        # Told PEER_UNAVAILABLE (the owner did not answer: outcome unknown), never NOT_OWNER, which
        # would say nothing was written (found by the checker as failed-but-applied).
        assert not await recorder.attempt("client", group, envelope, cid, send)
        assert recorder.refusals["REJECTION_REASON_PEER_UNAVAILABLE"] == 1, recorder.refusals
        await asyncio.gather(*late)  # the owner got to the command
        await recorder.read("reader", client, "front-door", group, 0, 100)  # the log shows it
        await recorder.command("client", group, envelope, cid, send)  # the retry: answered as replayed
        await recorder.final_logs(client, [group])
        found = check(recorder.history)
        assert found == [], describe(found)
    finally:
        await client.channel.close()
        await mesh.stop(1)
