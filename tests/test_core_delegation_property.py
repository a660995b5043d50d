"""Stateful property test of delegation grant accounting (spec 9.1; hypothesis RuleBasedStateMachine).

Random interleavings of grants, delegated authorize and offer, fail, cancel, revocation, Membership
changes, Coordinator replacement and time under several grants. Invariants: what a grant has been
charged equals a tally the machine keeps itself from the commands it saw accepted, and that tally
never exceeds any of the caps it asked for (MW-9.1-11); an accepted delegated command used a grant
that was valid at that moment (MW-9.1-13..15); replaying the log gives the live state."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, event_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.delegation import ENDS_A_GRANT, depth_below
from missionweave_server.services.authority.state import SIX, GroupState, IdentityInfo
from tests import builders
from tests.aggregates_check import assert_aggregates_recompute

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
AGENT = common_pb2.IDENTITY_KIND_AGENT
IDS = {
    "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
    **{n: IdentityInfo(n, AGENT, session_epoch=1) for n in ("coord", "coord2", "lead1", "lead2", "w1")},
}
LEADS = ["lead1", "lead2"]
Role = membership_pb2.MemberRole


def vector(tokens: int) -> dict[str, int]:
    """The budget dimensions this machine uses (the others are zero in budgets and caps alike)."""
    return {"tokens": tokens, "tool_calls": tokens // 100}


def dims(v: common_pb2.ResourceVector) -> dict[str, int]:
    return {dim: int(getattr(v, dim)) for dim in SIX}


class GrantMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.n = 0
        self.log: list[event_pb2.Event] = []
        self.state: GroupState | None = None
        self.coordinator = "coord"
        # The machine's own books, from the commands it saw accepted (never from the grant's
        # accounting): each WorkItem's budget, each grant's caps, and per grant the budget of every
        # WorkItem authorized or offered under it, counted once at its latest size. MW-9.1-11 is
        # cumulative (docs/delegation.md, D82): failing or cancelling an item releases nothing.
        self.budgets: dict[str, dict[str, int]] = {}
        self.caps: dict[str, dict[str, int]] = {}
        self.tally: dict[str, dict[str, dict[str, int]]] = {}
        create = builders.mission_create("alice", "coord", START)
        create.coordinator_renewal.lease_duration.FromSeconds(3_600)
        self._apply("mission_create", create, "alice", must=True)
        for member, role in (
            ("w1", Role.MEMBER_ROLE_WORKER),
            *((lead, Role.MEMBER_ROLE_WORK_DELEGATE) for lead in LEADS),
        ):
            self._apply(
                "membership_grant",
                membership_pb2.MembershipGrant(member_id=member, role=role),
                "alice",
                must=True,
            )
        for wid, parent in (("root-a", ""), ("root-b", ""), ("a1", "root-a")):
            body = wp.WorkAuthorize(
                work_item_id=wid,
                title=wid,
                contract=self._contract(100),
                parent_work_item_id=parent,
                coordinator_epoch=1,
            )
            self._apply("work_authorize", body, "coord", must=True)

    # ------------------------------------------------------------ plumbing

    def _contract(self, tokens: int) -> wp.WorkContract:
        return builders.contract(START, budget=common_pb2.ResourceVector(currency="EUR", **vector(tokens)))

    def _apply(self, kind: str, body: object, actor: str, *, must: bool = False) -> bool:
        self.n += 1
        member = self.state.members.get(actor) if self.state else None
        c = command_pb2.Command(
            command_id=f"c{self.n}",
            group_id="grp_g",
            actor_id=actor,
            session_epoch=1,
            membership_epoch=member.membership_epoch if member else 0,
            issued_at=to_timestamp(self.now),
        )
        getattr(c, kind).CopyFrom(body)
        before = copy.deepcopy(self.state)
        decision = decider.decide(self.state, c, decider.DecisionContext(self.now, IDS))
        assert self.state == before, "decide mutated the state"
        if isinstance(decision, Rejected):
            assert not must, decision
            return False
        if kind in ("work_authorize", "work_offer") and body.grant_id and before is not None:  # type: ignore[attr-defined]
            self._was_usable(before, actor, body.grant_id)  # type: ignore[attr-defined]
            hypothesis_event(f"accepted delegated {kind}")
        for event in decision:
            self.state = decider.evolve(self.state, event)
            self.log.append(event)
        self._book(kind, body)
        return True

    def _book(self, kind: str, body: object) -> None:
        """Keep the machine's books for an accepted command."""
        if kind == "work_authorize":
            b: wp.WorkAuthorize = body  # type: ignore[assignment]
            self.budgets[b.work_item_id] = dims(b.contract.budget)
        if kind in ("work_authorize", "work_offer") and body.grant_id:  # type: ignore[attr-defined]
            wid = body.work_item_id  # type: ignore[attr-defined]
            self.tally.setdefault(body.grant_id, {})[wid] = self.budgets[wid]  # type: ignore[attr-defined]
        if kind == "membership_grant_delegation":
            [grant_id] = set(self._grants()) - set(self.caps)
            self.caps[grant_id] = dims(body.caps)  # type: ignore[attr-defined]

    def _was_usable(self, before: GroupState, actor: str, grant_id: str) -> None:
        """MW-9.1-13..16, restated from the state before the command."""
        grant = before.grants[grant_id]
        member = before.members[actor]
        lease = before.mission.coordinator  # type: ignore[union-attr]
        assert actor == grant.grantee_id and not grant.revoked and self.now < grant.expires_at
        assert member.active and member.membership_epoch == grant.grantee_membership_epoch
        assert lease is not None and (lease.agent_id, lease.coordinator_epoch) == (
            grant.issuer_id,
            grant.coordinator_epoch,
        )
        target = before.work_items.get(grant.target_work_item_id)
        assert target is not None and target.state not in ENDS_A_GRANT

    def _grants(self) -> list[str]:
        assert self.state is not None
        return sorted(self.state.grants)

    def _items(self) -> list[str]:
        assert self.state is not None
        return sorted(self.state.work_items)

    # ------------------------------------------------------------ rules

    @rule(
        grantee=st.sampled_from(LEADS),
        root=st.sampled_from(["root-a", "root-b", "a1"]),
        tokens=st.sampled_from([0, 100, 200, 400]),
        depth=st.sampled_from([0, 1, 2, 2, 3, 3]),
        minutes=st.sampled_from([1, 10, 60]),
    )
    def grant(self, grantee: str, root: str, tokens: int, depth: int, minutes: int) -> None:
        lease = self.state.mission.coordinator  # type: ignore[union-attr]
        body = membership_pb2.MembershipGrantDelegation(
            grantee_id=grantee,
            target_work_item_id=root,
            allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.0")],
            caps=common_pb2.ResourceVector(currency="EUR", **vector(tokens)),
            max_descendant_depth=depth,
            expires_at=to_timestamp(self.now + timedelta(minutes=minutes)),
            coordinator_epoch=lease.coordinator_epoch if lease else 0,
        )
        self._apply("membership_grant_delegation", body, self.coordinator)

    @rule(
        pick=st.integers(0, 20),
        actor=st.sampled_from(["grantee"] * 4 + ["other"]),
        parent=st.integers(0, 20),
        inside=st.sampled_from([True] * 3 + [False]),
        tokens=st.sampled_from([0, 50, 100, 200, 200]),
    )
    def delegated_authorize(self, pick: int, actor: str, parent: int, inside: bool, tokens: int) -> None:
        grants = self._grants()
        if not grants:
            return
        grant = self.state.grants[grants[pick % len(grants)]]  # type: ignore[union-attr]
        who = grant.grantee_id if actor == "grantee" else next(x for x in LEADS if x != grant.grantee_id)
        items = self._items()
        if inside:  # mostly a parent in the grant's subtree, so that the other checks are reached
            items = [i for i in items if depth_below(self.state, grant.target_work_item_id, i) is not None]  # type: ignore[arg-type]
        body = wp.WorkAuthorize(
            work_item_id=f"d{self.n}",
            title="sub",
            contract=self._contract(tokens),
            parent_work_item_id=items[parent % len(items)],
            grant_id=grant.grant_id,
        )
        self._apply("work_authorize", body, who)

    @rule(pick=st.integers(0, 20), item=st.integers(0, 20))
    def delegated_offer(self, pick: int, item: int) -> None:
        grants, items = self._grants(), self._items()
        if not grants:
            return
        grant = self.state.grants[grants[pick % len(grants)]]  # type: ignore[union-attr]
        body = wp.WorkOffer(
            work_item_id=items[item % len(items)],
            offer_id=f"off{self.n}",
            candidate_ids=["w1"],
            expires_at=to_timestamp(self.now + timedelta(minutes=5)),
            selection_criteria=[builders.selection("w1")],
            grant_id=grant.grant_id,
        )
        self._apply("work_offer", body, grant.grantee_id)

    @rule(item=st.integers(0, 20), ending=st.sampled_from(["fail", "cancel"]))
    def fail_or_cancel(self, item: int, ending: str) -> None:
        items = self._items()
        wid = items[item % len(items)]
        epoch = self.state.mission.coordinator.coordinator_epoch  # type: ignore[union-attr]
        if ending == "fail":
            body: object = wp.WorkFail(
                work_item_id=wid,
                coordinator_epoch=epoch,
                kind=wp.WORK_FAILURE_KIND_TRANSIENT,
                evidence=[builders.evidence()],
                reason="r",
            )
            self._apply("work_fail", body, self.coordinator)
        else:
            self._apply(
                "work_cancel",
                wp.WorkCancel(work_item_id=wid, coordinator_epoch=epoch, reason="r"),
                self.coordinator,
            )

    @rule(pick=st.integers(0, 20))
    def revoke(self, pick: int) -> None:
        grants = self._grants()
        if grants:
            body = membership_pb2.MembershipRevokeDelegation(
                grant_id=grants[pick % len(grants)], reason="done"
            )
            self._apply("membership_revoke_delegation", body, self.coordinator)

    @rule(lead=st.sampled_from(LEADS))
    def membership_changes(self, lead: str) -> None:
        self._apply(
            "membership_grant",
            membership_pb2.MembershipGrant(member_id=lead, role=Role.MEMBER_ROLE_WORK_DELEGATE),
            "alice",
        )

    @rule(minutes=st.sampled_from([1, 5, 30]))
    def time_passes(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)

    @rule()
    def coordinator_replaced(self) -> None:
        lease = self.state.mission.coordinator  # type: ignore[union-attr]
        assert lease is not None
        if lease.expires_at > self.now:
            return
        successor = "coord2" if self.coordinator == "coord" else "coord"
        body = mission_pb2.MissionReplaceCoordinator(
            coordinator_id=successor, replaced_coordinator_epoch=lease.coordinator_epoch
        )
        if self._apply("mission_replace_coordinator", body, "alice"):
            self.coordinator = successor

    # ------------------------------------------------------------ invariants

    @invariant()
    def charges_equal_the_tally_and_fit_every_cap(self) -> None:
        assert self.state is not None
        assert set(self.state.grants) == set(self.caps)
        for grant_id, grant in self.state.grants.items():
            items = self.tally.get(grant_id, {})
            tally = {dim: sum(budget[dim] for budget in items.values()) for dim in SIX}
            assert grant.charged == tally, (grant_id, items)
            assert all(tally[dim] <= self.caps[grant_id][dim] for dim in SIX), (
                grant_id,
                tally,
                self.caps[grant_id],
            )

    @invariant()
    def delegated_items_sit_in_their_subtree_within_depth(self) -> None:
        assert self.state is not None
        for event in self.log:
            p = event.work_authorized
            if event.WhichOneof("payload") == "work_authorized" and p.grant_id:
                grant = self.state.grants[p.grant_id]
                depth = depth_below(self.state, grant.target_work_item_id, p.work_item_id)
                assert depth is not None and 1 <= depth <= grant.max_descendant_depth

    @invariant()
    def aggregates_equal_a_recomputation(self) -> None:
        assert_aggregates_recompute(self.state)

    @invariant()
    def replay_equals_live(self) -> None:
        assert decider.fold(self.log) == self.state


GrantMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestGrantAccounting = GrantMachine.TestCase
TestGrantAccounting.pytestmark = [pytest.mark.req("MW-9.1-11", "MW-9.1-13", "MW-9.1-14", "MW-9.1-15")]  # type: ignore[attr-defined]
