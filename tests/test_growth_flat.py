"""Issue 18 item 3: a WorkItem lifecycle costs the Authority the same work whatever the Group's size.

The lifecycle of ``bench/work_lifecycle.py`` (authorize, offer, accept, start, three renewals
reporting usage, submit, accept the result: 9 signed commands) is run once in a Group holding 8
WorkItems and once in the same Group grown to 88, and the Python function calls the server makes in
the Authority's code (decider, rules, state, aggregates, the shell and its views) are counted with
cProfile. Any per-command scan of the Group's WorkItems, a copy of its state or of a WorkItem map,
shows as calls that grow with it (80 more WorkItems, 9 commands: hundreds of calls per scan). The
counts are deterministic, unlike CPU time on a shared machine (bench/README.md, "Growth mode").
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
from datetime import timedelta
from pathlib import Path

import grpc
from google.protobuf.message import Message

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import SessionSigner, decode_events, membership_epoch
from missionweave.v1 import common_pb2, event_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.conftest import World

G = "grp_growth"
AUTHORITY = str(Path(__file__).resolve().parent.parent / "missionweave_server" / "services" / "authority")
# The group commit's own bookkeeping follows how appends happened to be batched, not the Group.
BATCHING = ("store.py", "group_commit.py", "writer_process.py", "batch_sql.py")


class Lifecycles:
    def __init__(self, w: World) -> None:
        self.w = w

    async def setup(self) -> None:
        w = self.w
        budget = common_pb2.ResourceVector(
            currency="EUR", financial_micros=10**12, tokens=10**12, tool_calls=10**9
        )
        body = builders.mission_create("alice", "coord-bot", w.clock.now(), budget=budget)
        body.coordinator_renewal.lease_duration.FromSeconds(3600)
        await w.run(w.owner, G, "mission_create", body)
        grant = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
        await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
        state = await w.client.group_state(G)
        self.cm = membership_epoch(state, "coord-bot")
        self.wm = membership_epoch(state, "worker-bot")
        self.ce = state.mission.coordinator.coordinator_epoch
        self.mission_id = state.mission.mission_id

    async def coord(self, kind: str, body: Message) -> list[event_pb2.Event]:
        return await self._paced(self.w.coordinator, kind, body, self.cm)

    async def work(self, kind: str, body: Message) -> list[event_pb2.Event]:
        return await self._paced(self.w.worker, kind, body, self.wm)

    async def _paced(
        self, session: SessionSigner, kind: str, body: Message, epoch: int
    ) -> list[event_pb2.Event]:
        """The command, sent again after the server's ``retry_after_ms`` while the Group is over
        its ingress rate (MW-8-16: a quiet machine grows the Group faster than that), as a client
        would; the refused attempt wrote nothing."""
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            try:
                return decode_events(
                    (await self.w.run(session, G, kind, body, membership_epoch=epoch)).events
                )
            except grpc.aio.AioRpcError as err:
                rejection = rejection_from_rpc_error(err)
                if rejection is None or rejection.reason != common_pb2.REJECTION_REASON_OVERLOADED:
                    raise
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{kind} was refused for the Group's command rate for 30 s")
            await asyncio.sleep(int(rejection.metadata["retry_after_ms"]) / 1000)

    async def run(self, i: int) -> None:
        now = self.w.clock.now()
        wi, offer_id, lease_id = f"wi-{i:05d}", f"offer-{i:05d}", f"lease-{i:05d}"
        contract = builders.contract(now)
        contract.time_policy.execution_lease_duration.FromSeconds(600)
        contract.time_policy.start_deadline.FromSeconds(600)
        await self.coord(
            "work_authorize",
            wp.WorkAuthorize(
                work_item_id=wi, title=f"task {i}", contract=contract, coordinator_epoch=self.ce
            ),
        )
        offer = wp.WorkOffer(
            work_item_id=wi,
            offer_id=offer_id,
            candidate_ids=["worker-bot"],
            selection_criteria=[builders.selection("worker-bot")],
            coordinator_epoch=self.ce,
        )
        offer.expires_at.FromDatetime(now + timedelta(hours=1))
        await self.coord("work_offer", offer)
        await self.work(
            "work_accept_offer", wp.WorkAcceptOffer(work_item_id=wi, offer_id=offer_id, contract_revision=1)
        )
        await self.work("work_start", wp.WorkStart(work_item_id=wi, ownership_epoch=1, lease_id=lease_id))
        for _ in range(3):
            renew = wp.WorkRenewLease(work_item_id=wi, lease_id=lease_id, ownership_epoch=1)
            renew.usage_delta.tokens = 100
            await self.work("work_renew_lease", renew)
        submit = wp.WorkSubmit(
            work_item_id=wi,
            lease_id=lease_id,
            ownership_epoch=1,
            contract_revision=1,
            artifacts=[
                await self.w.deliverable(
                    self.w.worker, G, wi, f"task {i}".encode(), mission_id=self.mission_id
                )
            ],
            evidence=[builders.evidence()],
            summary=f"task {i}: done",
        )
        (submitted, *_) = await self.work("work_submit", submit)
        await self.coord(
            "work_accept_result",
            wp.WorkAcceptResult(
                work_item_id=wi, coordinator_epoch=self.ce, submission_event_id=submitted.event_id
            ),
        )

    async def grow(self, first: int, count: int, concurrency: int = 8) -> None:
        pending = iter(range(first, first + count))

        async def one() -> None:
            for i in pending:
                await self.run(i)

        await asyncio.gather(*(one() for _ in range(concurrency)))

    async def counted(self, i: int) -> dict[str, int]:
        """Calls per Authority function (module:function) of one lifecycle, run alone."""
        # The readers' copy of the state folds acknowledged events in batches (SETTLE_BATCH): fold
        # them now, so that no batch of earlier lifecycles' events lands in the count.
        authority = self.w.mesh.authority  # type: ignore[attr-defined]
        await authority.state(G)
        # Let the Group's ingress bucket refill so no command of the counted lifecycle is refused
        # and sent again, which would add calls that are not the Group's.
        await asyncio.sleep(self.w.settings.group_burst / self.w.settings.group_rate)
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            await self.run(i)
        finally:
            profiler.disable()
        calls: dict[str, int] = {}
        for (path, _line, name), (_cc, ncalls, *_rest) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
            if path.startswith(AUTHORITY) and not path.endswith(BATCHING):
                key = f"{path[len(AUTHORITY) + 1 :]}:{name}"
                calls[key] = calls.get(key, 0) + ncalls
        return calls


async def test_a_lifecycle_does_the_same_work_in_a_grown_group(world: World) -> None:
    flow = Lifecycles(world)
    await flow.setup()
    await flow.grow(0, 7)
    await flow.run(7)  # warm: every code path of the lifecycle has run once
    small = await flow.counted(8)  # the Group holds 9 WorkItems
    await flow.grow(9, 80)
    large = await flow.counted(89)  # 89 WorkItems
    assert sum(small.values()) > 1_000, small  # the profile saw the Authority at work
    grown = {k: (small.get(k, 0), n) for k, n in large.items() if n > small.get(k, 0) + 2}
    assert not grown, f"Authority calls that grew with the Group (9 -> 89 WorkItems): {grown}"
    assert sum(large.values()) <= sum(small.values()) * 1.02 + 20, (sum(small.values()), sum(large.values()))
