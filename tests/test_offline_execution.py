"""Bounded offline execution through the public gRPC API (spec 11.5): buffered commands the
Authority reconciles or refuses with nothing written, and the SDK Worker runtime cut off from the
mesh (a TCP proxy severed), buffering within its grace and reconciling before anything else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from nacl.signing import SigningKey

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.extensions import BOUNDED_OFFLINE_EXECUTION
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.agent import Agent
from missionweave.sdk.client import SessionSigner, decode_events
from missionweave.sdk.offline import (
    LeaseWindow,
    OfflineBuffer,
    OfflineForbidden,
    SlotChannel,
    binding_of,
    reversible,
)
from missionweave.sdk.worker import Slot, WorkerRuntime, WorkResult
from missionweave.v1 import common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World, polled
from tests.offline_core import progress
from tests.test_agent_sdk import FAST
from tests.test_grpc_authority import db_image
from tests.test_missions import G, create

R = common_pb2.RejectionReason
LEASE_S, GRACE_S = 60, 120


async def night_worker(w: World, name: str = "night-bot") -> tuple[SigningKey, SessionSigner]:
    """A Worker whose identity key the test holds (it opens a second session on reconnection)."""
    key = SigningKey.generate()
    await w.client.register_identity(
        "admin", w.keys["admin"], name, common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
    )
    grant = membership_pb2.MembershipGrant(member_id=name, role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    return key, await w.client.open_session(name, key)


def contract(now: datetime, lease_s: int = LEASE_S, grace_s: int = GRACE_S) -> wp.WorkContract:
    c = builders.contract(now)
    c.time_policy.execution_lease_duration.FromSeconds(lease_s)
    c.time_policy.offline_grace_period.FromSeconds(grace_s)
    return c


async def running(
    w: World, signer: SessionSigner, work_item_id: str = "wi-1", c: wp.WorkContract | None = None
) -> wp.ExecutionLease:
    """``work_item_id`` offered to ``signer``'s agent, accepted and started: its lease."""
    epoch = await w.epoch_of(G, signer.identity_id)
    body = wp.WorkAuthorize(
        work_item_id=work_item_id, title="t", contract=c or contract(w.clock.now()), coordinator_epoch=1
    )
    await w.run(w.coordinator, G, "work_authorize", body, membership_epoch=2)
    offer = wp.WorkOffer(
        work_item_id=work_item_id,
        offer_id=f"off-{work_item_id}",
        candidate_ids=[signer.identity_id],
        expires_at=to_timestamp(w.clock.now() + timedelta(minutes=5)),
        selection_criteria=[builders.selection(signer.identity_id)],
        coordinator_epoch=1,
    )
    await w.run(w.coordinator, G, "work_offer", offer, membership_epoch=2)
    accept = wp.WorkAcceptOffer(
        work_item_id=work_item_id, offer_id=f"off-{work_item_id}", contract_revision=1
    )
    await w.run(signer, G, "work_accept_offer", accept, membership_epoch=epoch)
    start = wp.WorkStart(work_item_id=work_item_id, ownership_epoch=1, lease_id=f"lease-{work_item_id}")
    started = await w.run(signer, G, "work_start", start, membership_epoch=epoch)
    return decode_events(started.events)[0].work_started.lease


async def offline_binding(
    w: World, lease: wp.ExecutionLease, buffered_at: datetime, tokens: int = 100
) -> wp.BoundedOfflineExecutionBinding:
    state = await w.client.group_state(G)
    conversation = next(
        c.conversation_id for c in state.conversations if c.work_item_id == lease.work_item_id
    )
    expires = lease.expires_at.ToDatetime().replace(tzinfo=buffered_at.tzinfo)
    return wp.BoundedOfflineExecutionBinding(
        agent_id=lease.agent_id,
        group_id=G,
        work_item_id=lease.work_item_id,
        original_session_epoch=lease.session_epoch,
        ownership_epoch=lease.ownership_epoch,
        historical_lease_id=lease.lease_id,
        disconnected_at=to_timestamp(expires - timedelta(seconds=LEASE_S / 2)),
        buffered_at=to_timestamp(buffered_at),
        grace_deadline=to_timestamp(expires + timedelta(seconds=GRACE_S)),
        historical_lease_expires_at=lease.expires_at,
        usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=tokens),
        conversation_id=conversation,
    )


async def send_buffered(
    w: World,
    signer: SessionSigner,
    b: wp.BoundedOfflineExecutionBinding,
    kind: str = "work_report_progress",
    body: Message | None = None,
) -> common_pb2.SignedEnvelope:
    command = signer.command(
        G, kind, body or progress(b), membership_epoch=await w.epoch_of(G, signer.identity_id)
    )
    command.issued_at.CopyFrom(to_timestamp(w.clock.now()))
    command.extensions.add(urn=BOUNDED_OFFLINE_EXECUTION, critical=True, data=b.SerializeToString())
    return signer.sign(command)


async def refused_whole(w: World, envelope: common_pb2.SignedEnvelope, reason: int) -> common_pb2.Rejection:
    """Refused with ``reason``, the database byte-identical afterwards (nothing written, MW-11.5-13)."""
    before = await db_image(w)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.client.execute(envelope)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None, info.value
    assert R.Name(rejection.reason) == R.Name(reason), rejection.message
    assert await db_image(w) == before
    return rejection


# ---------------------------------------------------------------- the Authority over gRPC


@pytest.mark.req("MW-11.5-07", "MW-11.5-09", "MW-11.5-10", "MW-11.5-11", "MW-11.5-12", "MW-11.5-13")
async def test_buffered_progress_is_reconciled_from_a_new_session_or_refused_whole(world: World) -> None:
    w = world
    await create(w, lease_seconds=3600)
    key, first = await night_worker(w)
    lease = await running(w, first)
    started = lease.started_at.ToDatetime().replace(tzinfo=w.clock.now().tzinfo)
    w.clock.advance(seconds=LEASE_S + 30)  # the lease expired while the Worker was cut off
    second = await w.client.open_session("night-bot", key)  # the Worker reconnects: a new session
    assert second.session_epoch > lease.session_epoch

    # Buffered inside the grace window: accepted from the new session, usage first, both sessions named.
    inside = await offline_binding(w, lease, started + timedelta(seconds=LEASE_S + 20))
    result = await w.client.execute(await send_buffered(w, second, inside))
    events = decode_events(result.events)
    assert [e.WhichOneof("payload") for e in events] == ["resource_usage_recorded", "work_progress_reported"]
    usage = events[0].resource_usage_recorded
    assert usage.source == wp.USAGE_SOURCE_OFFLINE_RECONCILIATION
    assert (usage.execution_session_epoch, usage.reporting_session_epoch) == (
        lease.session_epoch,
        second.session_epoch,
    )
    assert (usage.lease_id, usage.work_item_used.tokens) == (lease.lease_id, 100)

    # Buffered past the grace deadline, or overflowing the budget: refused whole, nothing written.
    late = await offline_binding(w, lease, started + timedelta(seconds=LEASE_S + GRACE_S + 1))
    w.clock.advance(seconds=GRACE_S)
    rejection = await refused_whole(
        w, await send_buffered(w, second, late), R.REJECTION_REASON_OFFLINE_OUTSIDE_WINDOW
    )
    assert rejection.metadata["check"] == "after_grace_deadline"
    over = await offline_binding(w, lease, started + timedelta(seconds=LEASE_S + 25), tokens=10_000)
    rejection = await refused_whole(
        w, await send_buffered(w, second, over), R.REJECTION_REASON_BUDGET_EXCEEDED
    )
    assert (rejection.metadata["budget"], rejection.metadata["dimension"]) == ("work_item", "tokens")
    # Another Conversation, a kind that is never buffered, a changed binding.
    planning = (await w.client.group_state(G)).mission.planning_conversation_id
    await refused_whole(
        w,
        await send_buffered(w, second, inside, "message_post", builders.message(planning)),
        R.REJECTION_REASON_OFFLINE_OUTSIDE_CONVERSATION,
    )
    submit = wp.WorkSubmit(
        work_item_id="wi-1", lease_id=lease.lease_id, ownership_epoch=1, contract_revision=1
    )
    await refused_whole(
        w,
        await send_buffered(w, second, inside, "work_submit", submit),
        R.REJECTION_REASON_OFFLINE_KIND_NOT_BUFFERABLE,
    )
    altered = wp.BoundedOfflineExecutionBinding()
    altered.CopyFrom(inside)
    altered.usage_delta.tokens = 1  # the delta changed after buffering: the body no longer matches
    rejection = await refused_whole(
        w,
        await send_buffered(w, second, altered, body=progress(inside)),
        R.REJECTION_REASON_OFFLINE_BINDING_INVALID,
    )
    assert (rejection.metadata["field"], rejection.metadata["check"]) == ("binding.usage_delta", "mismatch")
    # An unknown critical extension is still refused (OP-22).
    unknown = second.command(
        G, "work_report_progress", progress(inside), membership_epoch=await w.epoch_of(G, "night-bot")
    )
    unknown.issued_at.CopyFrom(to_timestamp(w.clock.now()))
    unknown.extensions.add(urn="urn:example:unknown", critical=True)
    await refused_whole(w, second.sign(unknown), R.REJECTION_REASON_UNSUPPORTED_CRITICAL_EXTENSION)


@pytest.mark.req("MW-11.5-10")
async def test_buffered_after_an_ownership_change_is_refused_over_grpc(world: World) -> None:
    w = world
    await create(w, lease_seconds=3600)
    key, first = await night_worker(w)
    lease = await running(w, first)
    started = lease.started_at.ToDatetime().replace(tzinfo=w.clock.now().tzinfo)
    second = await w.client.open_session("night-bot", key)  # reconnected (before the server clock moves)
    w.clock.advance(minutes=11)  # lease and ownership lapsed: the Coordinator re-offers
    reoffer = wp.WorkOffer(
        work_item_id="wi-1",
        offer_id="off-2",
        candidate_ids=["night-bot"],
        expires_at=to_timestamp(w.clock.now() + timedelta(minutes=5)),
        selection_criteria=[builders.selection("night-bot")],
        coordinator_epoch=1,
    )
    await w.run(w.coordinator, G, "work_offer", reoffer, membership_epoch=2)
    b = await offline_binding(w, lease, started + timedelta(seconds=LEASE_S + 20))
    rejection = await refused_whole(
        w, await send_buffered(w, second, b), R.REJECTION_REASON_OFFLINE_AFTER_OWNERSHIP_CHANGE
    )
    assert rejection.metadata["rule"] == "ownership_changed"


# ---------------------------------------------------------------- the Worker runtime cut off


class Proxy:
    """A TCP proxy in front of the mesh that the test severs (every connection dropped, new ones
    refused) and restores, as a network partition would."""

    def __init__(self, upstream: str) -> None:
        self.host, port = upstream.rsplit(":", 1)
        self.upstream_port = int(port)
        self.severed = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.severed:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()
            self._writers.discard(writer)

    def sever(self) -> None:
        self.severed = True
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self.severed = False

    async def close(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)


@pytest.mark.req("MW-11.5-04", "MW-11.5-05", "MW-11.5-06", "MW-11.5-08", "MW-11.5-09", "MW-11.5-12")
@pytest.mark.parametrize("outage", ["past_the_grace", "within_the_lease"])
async def test_a_cut_off_worker_buffers_within_its_grace_and_reconciles_first(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture, outage: str
) -> None:
    """The mesh becomes unreachable while a reversible handler runs: its progress is buffered on
    disk (until the grace deadline, then refused to the handler), no side effect is authorized
    offline, and on reconnection the buffer is reconciled, its usage charged, before the
    handler's submission: accepted when the lease outlived the outage, refused when it did not."""
    caplog.set_level(logging.INFO, "missionweave.sdk")
    w = world
    await create(w, lease_seconds=3600)
    key, _ = await night_worker(w)
    reports: list[str] = []
    effects: list[bool] = []  # for each side effect authorized: whether the mesh was cut off then
    notes: list[str] = []  # what became of the note posted while cut off
    outputs: list[common_pb2.ArtifactRef] = []  # an output stored while cut off
    stop, changed = asyncio.Event(), asyncio.Condition()
    proxy = Proxy(w.target)
    target = await proxy.start()

    async def note(outcome: str) -> None:
        async with changed:
            reports.append(outcome)
            changed.notify_all()

    @reversible
    async def handle(slot: Slot) -> WorkResult:
        while not stop.is_set():
            report = wp.ProgressReport(
                phase=f"step-{len(reports)}",
                next_checkpoint=wp.PlannedCheckpoint(description="next"),
                revised_estimate=wp.RevisedEstimate(reason="on track"),
            )
            severed = proxy.severed
            try:
                delivered = await slot.report_progress(
                    report, common_pb2.ResourceVector(currency="EUR", tokens=10)
                )
                await note("online" if delivered else "offline")
            except OfflineForbidden:
                await note("forbidden")
            if severed and not outputs:  # once while cut off: an output, kept until the store is back
                outputs.append(await slot.put(b"figures computed while cut off", media_type="text/plain"))
            if severed and not notes:  # once while cut off: a note in the WorkItem Conversation
                try:
                    delivered_note = await slot.post_message("cut off; carrying on with the reversible part")
                    notes.append("online" if delivered_note else "buffered")
                except OfflineForbidden:
                    notes.append("forbidden")  # past the grace already: nothing buffered
            try:
                slot.side_effect("send-invoice")
                effects.append(severed or proxy.severed)
            except OfflineForbidden:
                pass
            await asyncio.sleep(0.3)
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()], summary="done")

    try:
        async with Agent.connect(
            target,
            "night-bot",
            key,
            cursor_dir=tmp_path,
            backoff=FAST,
            grace=2.0,
            audience=w.target,
            command_timeout=2.0,
        ) as agent:
            runtime = WorkerRuntime(agent, handle)
            await runtime.serve([G])
            try:
                body = wp.WorkAuthorize(
                    work_item_id="wi-1",
                    title="t",
                    contract=contract(w.clock.now(), 6, 3),
                    coordinator_epoch=1,
                )
                await w.run(w.coordinator, G, "work_authorize", body, membership_epoch=2)
                offer = wp.WorkOffer(
                    work_item_id="wi-1",
                    offer_id="off-1",
                    candidate_ids=["night-bot"],
                    expires_at=to_timestamp(w.clock.now() + timedelta(minutes=5)),
                    selection_criteria=[builders.selection("night-bot")],
                    coordinator_epoch=1,
                )
                await w.run(w.coordinator, G, "work_offer", offer, membership_epoch=2)
                async with asyncio.timeout(30), changed:
                    await changed.wait_for(lambda: reports.count("online") >= 2)
                    proxy.sever()
                    if outage == "past_the_grace":
                        await changed.wait_for(lambda: "forbidden" in reports)  # the grace deadline passed
                    else:
                        await changed.wait_for(lambda: reports.count("offline") >= 2)
                buffered = reports.count("offline")
                assert buffered >= 2
                notes_buffered = notes.count("buffered")
                assert (
                    len(OfflineBuffer(agent.directory / "offline.log")) == buffered + notes_buffered
                )  # durable, on disk
                stop.set()
                proxy.restore()
                async with asyncio.timeout(30):
                    await runtime.reconciled()
                    if outage == "within_the_lease":
                        await runtime.submitted(1)
            finally:
                await runtime.close()
    finally:
        await proxy.close()
    assert False in effects and True not in effects  # side effects online only (MW-11.5-05)
    events = [e async for e in w.client.read_events(G)]
    offline = [
        e
        for e in events
        if e.WhichOneof("payload") == "resource_usage_recorded"
        and e.resource_usage_recorded.source == wp.USAGE_SOURCE_OFFLINE_RECONCILIATION
    ]
    assert len(offline) == reports.count("offline")  # every buffered report accepted, its usage charged
    for usage in offline:
        after = next(e for e in events if e.sequence == usage.sequence + 1)
        assert after.WhichOneof("payload") == "work_progress_reported"  # usage first (MW-11.5-12)
        assert (
            usage.resource_usage_recorded.execution_session_epoch
            == usage.resource_usage_recorded.reporting_session_epoch
        )
    assert not (agent.directory / "offline.log").exists()  # reconciled: the buffer is gone
    if outage == "within_the_lease":  # the output made while cut off was uploaded, then handed in
        [submitted] = [e.work_submitted for e in events if e.WhichOneof("payload") == "work_submitted"]
        assert outputs and outputs[0] in submitted.artifacts
        assert await w.client.download(outputs[0].digest) == b"figures computed while cut off"
        assert not list((agent.directory / "outputs").iterdir())  # its spool file is gone
    # The note was buffered too, bound to the WorkItem's Conversation, and posted on reconciliation.
    posted = [
        e
        for e in events
        if e.WhichOneof("payload") == "message_posted" and e.message_posted.content.text.startswith("cut off")
    ]
    assert len(posted) == notes.count("buffered")
    if outage == "within_the_lease":
        assert notes == ["buffered"]
        assert posted[0].message_posted.conversation_id == next(
            e.work_authorized.conversation_id for e in events if e.WhichOneof("payload") == "work_authorized"
        )
    submitted = [e for e in events if e.WhichOneof("payload") == "work_submitted"]
    if outage == "within_the_lease":  # the submission waited for the reconciliation (MW-11.5-06)
        assert submitted and submitted[0].sequence > offline[-1].sequence
    else:  # the lease expired offline: the late submission is refused (MW-11.5-03)
        assert not submitted


@pytest.mark.req("MW-11.5-09", "MW-11.5-06", "MW-11.5-12")
async def test_a_worker_restarted_while_cut_off_reconciles_its_buffer_from_a_new_session(
    world: World, tmp_path: Path
) -> None:
    """The Worker process stops while the mesh is unreachable and starts again elsewhere with a new
    session: its durable buffer is reconciled from that session, the bindings unchanged (the
    historical session, lease and ownership), before it does anything else."""
    w = world
    await create(w, lease_seconds=3600)
    key, _ = await night_worker(w)
    buffered = 0
    cut_off = asyncio.Event()
    proxy = Proxy(w.target)
    target = await proxy.start()

    @reversible
    async def handle(slot: Slot) -> WorkResult:
        nonlocal buffered
        for step in range(1000):
            report = wp.ProgressReport(
                phase=f"step-{step}",
                next_checkpoint=wp.PlannedCheckpoint(description="next"),
                revised_estimate=wp.RevisedEstimate(reason="on track"),
            )
            if not await slot.report_progress(report, common_pb2.ResourceVector(currency="EUR", tokens=7)):
                buffered += 1
                if buffered == 2:
                    cut_off.set()
            await asyncio.sleep(0.2)
        await slot.put(f"the result of {slot.work_item_id}".encode(), media_type="text/plain")
        return WorkResult(evidence=[builders.evidence()])

    try:
        first = await Agent.connect(
            target,
            "night-bot",
            key,
            cursor_dir=tmp_path,
            backoff=FAST,
            grace=2.0,
            audience=w.target,
            command_timeout=2.0,
        )
        runtime = WorkerRuntime(first, handle)
        await runtime.serve([G])
        body = wp.WorkAuthorize(
            work_item_id="wi-1", title="t", contract=contract(w.clock.now(), 600, 600), coordinator_epoch=1
        )
        await w.run(w.coordinator, G, "work_authorize", body, membership_epoch=2)
        offer = wp.WorkOffer(
            work_item_id="wi-1",
            offer_id="off-1",
            candidate_ids=["night-bot"],
            expires_at=to_timestamp(w.clock.now() + timedelta(minutes=5)),
            selection_criteria=[builders.selection("night-bot")],
            coordinator_epoch=1,
        )
        await w.run(w.coordinator, G, "work_offer", offer, membership_epoch=2)

        async def started() -> bool:
            return any([e async for e in w.client.read_events(G) if e.type == "work.started"])

        await polled(started)
        proxy.sever()
        async with asyncio.timeout(30):
            await cut_off.wait()
        await runtime.close()  # the process stops while cut off: two reports stay on its disk
        await first.close()
        on_disk = len(OfflineBuffer(first.directory / "offline.log"))
        assert on_disk >= 2
        # Started again on another host: the saved session is gone, the agent opens a new one.
        (first.directory / "session.json").unlink()
        proxy.restore()
        async with Agent.connect(
            target, "night-bot", key, cursor_dir=tmp_path, backoff=FAST, grace=2.0, audience=w.target
        ) as second:
            again = WorkerRuntime(second, handle)
            await again.serve([G])
            try:
                async with asyncio.timeout(30):
                    await again.reconciled()
            finally:
                await again.close()
            new_session = second.session.session_epoch
    finally:
        await proxy.close()
    events = [e async for e in w.client.read_events(G)]
    lease = next(e.work_started.lease for e in events if e.type == "work.started")
    reconciled = [
        e.resource_usage_recorded
        for e in events
        if e.WhichOneof("payload") == "resource_usage_recorded"
        and e.resource_usage_recorded.source == wp.USAGE_SOURCE_OFFLINE_RECONCILIATION
    ]
    assert len(reconciled) == on_disk and not again.refused_offline
    assert new_session > lease.session_epoch
    for usage in reconciled:  # the historical session and lease, reported from the new session
        assert (usage.execution_session_epoch, usage.lease_id, usage.reporting_session_epoch) == (
            lease.session_epoch,
            lease.lease_id,
            new_session,
        )
    assert not (first.directory / "offline.log").exists()


# ---------------------------------------------------------------- the runtime's pieces


class _Disconnected:
    """An agent that cannot reach the mesh: what a slot's channel sees while offline."""

    identity_id = "night-bot"
    connected = False

    def __init__(self) -> None:
        self.session = SessionSigner("night-bot", 3, SigningKey.generate())


def _channel(
    tmp_path: Path, *, reversible: bool = True, grace_s: int = 30, expires_in: float = 10
) -> SlotChannel:
    now = datetime.now(UTC)
    window = LeaseWindow(
        "lease-1",
        3,
        1,
        now - timedelta(seconds=5),
        now + timedelta(seconds=expires_in),
        timedelta(seconds=grace_s),
    )
    return SlotChannel(
        _Disconnected(),
        OfflineBuffer(tmp_path / "offline.log"),
        G,
        "wi-1",
        "conv-1",
        window,  # type: ignore[arg-type]
        reversible=reversible,
        reconciled=lambda: True,
        on_buffered=lambda: None,
    )


@pytest.mark.req("MW-11.5-04", "MW-11.5-07", "MW-11.5-08")
async def test_buffered_reports_are_signed_bound_and_survive_a_restart(tmp_path: Path) -> None:
    channel = _channel(tmp_path)
    body = wp.WorkReportProgress(work_item_id="wi-1", lease_id="lease-1", ownership_epoch=1)
    usage = common_pb2.ResourceVector(currency="EUR", tokens=7)
    assert await channel.send("work_report_progress", body, usage) is None  # buffered, not sent
    await channel.send("work_report_progress", body, usage)
    with (tmp_path / "offline.log").open("ab") as f:
        f.write(b'{"op": "buffered", "comm')  # a crash mid-write: the torn line is ignored
    again = OfflineBuffer(tmp_path / "offline.log")  # a restarted Worker
    [first, second] = again.pending()
    b = binding_of(first)
    assert b is not None
    assert all(
        b.HasField(f)
        for f in (
            "disconnected_at",
            "buffered_at",
            "grace_deadline",
            "historical_lease_expires_at",
            "usage_delta",
        )
    )
    assert all(
        getattr(b, f)
        for f in (
            "agent_id",
            "group_id",
            "work_item_id",
            "original_session_epoch",
            "ownership_epoch",
            "historical_lease_id",
        )
    )
    assert first.extensions[0].critical and first.extensions[0].urn == BOUNDED_OFFLINE_EXECUTION
    assert (b.usage_delta.tokens, b.historical_lease_id, b.conversation_id) == (7, "lease-1", "conv-1")
    assert first.command_id != second.command_id
    again.reconciled(first.command_id)
    assert [c.command_id for c in OfflineBuffer(tmp_path / "offline.log").pending()] == [second.command_id]
    again.reconciled(second.command_id)
    assert not (tmp_path / "offline.log").exists()


@pytest.mark.req("MW-11.5-04", "MW-11.5-05")
@pytest.mark.parametrize(
    ("case", "options"),
    [
        ("not_reversible", {"reversible": False}),
        ("no_grace", {"grace_s": 0}),
        ("past_grace", {"expires_in": -40}),
    ],
)
async def test_offline_continuation_is_bounded_and_side_effects_need_the_service(
    tmp_path: Path, case: str, options: dict[str, object]
) -> None:
    channel = _channel(tmp_path, **options)  # type: ignore[arg-type]
    body = wp.WorkReportProgress(work_item_id="wi-1", lease_id="lease-1", ownership_epoch=1)
    with pytest.raises(OfflineForbidden):
        await channel.send("work_report_progress", body, common_pb2.ResourceVector())
    assert not (tmp_path / "offline.log").exists()
    with pytest.raises(OfflineForbidden):
        channel.authorize()  # never offline, whatever the lease says
