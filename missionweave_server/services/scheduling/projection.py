"""One Worker's queue of one Group: a projection of the Group events the Worker sees (MW-11.1-01..04).

The Group log stays the authority for Missions, ownership, leases and WorkItem status; this is a
fold of the accepted events delivered to the Worker (its member view, which may skip sequences:
restricted Conversations, history before its visibility start), kept so that the scheduler can
order the Worker's own work without asking anyone. Replaying the same events gives the same
projection (``==``), which is how it is rebuilt after loss.

Pure: no I/O, no clock. Only scheduling metadata is kept (MW-13.3-08): contracts' deadline,
urgency, business impact, dependencies, capabilities and budget, never goals or content; and only
that is delivered: the events come reduced by the Authority's SCHEDULING view
(missionweave_server/services/authority/scheduling_view.py, MW-13.3-09), whose allow-list covers every field read here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime

from missionweave.kernel.clock import from_timestamp
from missionweave.v1 import event_pb2
from missionweave.v1 import work_pb2 as wp

WS = wp.WorkItemState
# States in which a WorkItem sits in its owner's queue (QUEUED, ACTIVE, BLOCKED: QueueEntry.state).
IN_QUEUE = frozenset({WS.WORK_ITEM_STATE_QUEUED, WS.WORK_ITEM_STATE_ACTIVE, WS.WORK_ITEM_STATE_BLOCKED})
DONE = frozenset({WS.WORK_ITEM_STATE_VERIFIED, WS.WORK_ITEM_STATE_CANCELLED})


@dataclass
class ItemView:
    """What the Worker knows of one WorkItem of the Group (scheduling metadata only)."""

    work_item_id: str
    state: int = WS.WORK_ITEM_STATE_OPEN
    deadline: datetime | None = None
    urgency: int = 0
    business_impact: int = 0
    depends_on: tuple[str, ...] = ()
    required_capabilities: tuple[tuple[str, str], ...] = ()
    budget: tuple[tuple[str, int], ...] = ()
    needs_approval: bool = False
    approved: bool = False
    # Ownership as far as it concerns this Worker.
    owner_id: str = ""
    ownership_epoch: int = 0
    start_deadline: datetime | None = None
    enqueued_at: datetime | None = None  # when it entered this Worker's queue
    lease_id: str = ""
    lease_session_epoch: int = 0  # the session the execution lease is bound to
    retry_not_before: datetime | None = None  # an automatic retry's backoff (MW-11.4-08)
    latest_checkpoint_id: str = ""
    preemption_request_id: str = ""
    open_offers: dict[str, datetime] = field(default_factory=dict)  # offers naming the Worker -> expiry


@dataclass
class GroupProjection:
    """One Worker's view of one Group's work, folded from the events it was delivered."""

    worker_id: str
    group_id: str
    sequence: int = 0  # the last sequence applied (the Worker's cursor)
    items: dict[str, ItemView] = field(default_factory=dict)
    # Who may raise the Worker's priority in this Group (MW-11.1-09): the Mission's MissionOwner.
    mission_owner_id: str = ""

    # ------------------------------------------------------------ reads

    def queue(self) -> list[ItemView]:
        """The Worker's own queued, active and blocked WorkItems."""
        return [i for i in self.items.values() if i.owner_id == self.worker_id and i.state in IN_QUEUE]

    def dependencies_done(self, item: ItemView) -> bool:
        """Whether every dependency is verified, as far as this view knows (an unknown one is not)."""
        return all(
            self.items.get(d) is not None and self.items[d].state == WS.WORK_ITEM_STATE_VERIFIED
            for d in item.depends_on
        )

    # ------------------------------------------------------------ the fold

    def advance(self, sequence: int) -> None:
        """A sequence the Worker may not see (skipped for it): the cursor passes it."""
        self.sequence = max(self.sequence, sequence)

    def to_json(self) -> str:
        """The projection as JSON (the durable copy; replay rebuilds the same)."""
        return json.dumps(asdict(self), default=_encode, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GroupProjection:
        raw = json.loads(text)
        raw.setdefault("mission_owner_id", "")  # stored before the field existed: the next follow sets it
        items = {}
        for wid, fields_ in raw.pop("items").items():
            fields_.setdefault("retry_not_before", None)  # stored before the field existed
            for name in ("deadline", "start_deadline", "enqueued_at", "retry_not_before"):
                if fields_[name] is not None:
                    fields_[name] = datetime.fromisoformat(fields_[name])
            for name in ("depends_on",):
                fields_[name] = tuple(fields_[name])
            for name in ("required_capabilities", "budget"):
                fields_[name] = tuple(tuple(pair) for pair in fields_[name])
            fields_["open_offers"] = {k: datetime.fromisoformat(v) for k, v in fields_["open_offers"].items()}
            fields_.setdefault("lease_session_epoch", 0)  # stored before the field existed
            items[wid] = ItemView(**fields_)
        return cls(items=items, **raw)

    def apply(self, event: event_pb2.Event) -> None:
        """Fold one delivered event (sequences only rise; earlier or repeated ones are ignored)."""
        if event.group_id != self.group_id or event.sequence <= self.sequence:
            return
        self.sequence = event.sequence
        handler = _HANDLERS.get(event.WhichOneof("payload") or "")
        if handler is not None:
            handler(self, event)

    def _item(self, work_item_id: str) -> ItemView:
        item = self.items.get(work_item_id)
        if item is None:  # first seen after the Worker's visibility start: known from now on
            item = self.items[work_item_id] = ItemView(work_item_id)
        return item

    def _contract(self, item: ItemView, contract: wp.WorkContract) -> None:
        item.deadline = from_timestamp(contract.deadline) if contract.HasField("deadline") else None
        item.urgency, item.business_impact = int(contract.urgency), int(contract.business_impact)
        item.depends_on = tuple(contract.depends_on_work_item_ids)
        item.required_capabilities = tuple(
            (c.capability_id, c.version) for c in contract.required_capabilities
        )
        b = contract.budget
        item.budget = tuple((dim, int(getattr(b, dim))) for dim in DIMENSIONS)
        item.needs_approval = contract.requires_execution_approval
        item.approved = False

    def _owned(self, item: ItemView, grant: wp.OwnershipGrant, at: datetime, state: int) -> None:
        item.state = state
        if grant.agent_id != self.worker_id:
            item.owner_id, item.enqueued_at = grant.agent_id, None
            return
        if item.owner_id != self.worker_id or item.ownership_epoch != grant.ownership_epoch:
            item.enqueued_at = at  # a new ownership enters the queue now
        item.owner_id, item.ownership_epoch = grant.agent_id, grant.ownership_epoch
        item.start_deadline = (
            from_timestamp(grant.start_deadline) if grant.HasField("start_deadline") else None
        )

    def _ended(self, item: ItemView, state: int) -> None:
        item.state = state
        item.lease_id = item.preemption_request_id = ""
        if state in DONE or state == WS.WORK_ITEM_STATE_FAILED:
            item.owner_id, item.enqueued_at = "", None
        item.open_offers.clear()


def _encode(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not part of a projection")


DIMENSIONS = ("financial_micros", "tokens", "tool_calls", "compute_ms", "wall_clock_ms", "side_effects")


def _authorized(p: GroupProjection, e: event_pb2.Event) -> None:
    item = p._item(e.work_authorized.work_item_id)
    p._contract(item, e.work_authorized.contract)


def _offered(p: GroupProjection, e: event_pb2.Event) -> None:
    o = e.work_offered
    item = p._item(o.work_item_id)
    if o.HasField("amended_contract"):
        p._contract(item, o.amended_contract)
    item.state, item.lease_id = WS.WORK_ITEM_STATE_OFFERED, ""
    item.owner_id, item.enqueued_at = "", None
    if p.worker_id in o.candidate_ids:
        item.open_offers[o.offer_id] = from_timestamp(o.expires_at)


def _withdrawn(p: GroupProjection, e: event_pb2.Event) -> None:
    item = p._item(e.work_offers_withdrawn.work_item_id)
    for offer_id in e.work_offers_withdrawn.offer_ids:
        item.open_offers.pop(offer_id, None)


def _declined(p: GroupProjection, e: event_pb2.Event) -> None:
    d = e.work_offer_declined
    if e.actor_id == p.worker_id:
        p._item(d.work_item_id).open_offers.pop(d.offer_id, None)


def _accepted(p: GroupProjection, e: event_pb2.Event) -> None:
    a = e.work_offer_accepted
    item = p._item(a.work_item_id)
    item.open_offers.pop(a.offer_id, None)
    p._owned(item, a.ownership, from_timestamp(e.recorded_at), WS.WORK_ITEM_STATE_QUEUED)


def _started(p: GroupProjection, e: event_pb2.Event) -> None:
    s = e.work_started
    item = p._item(s.work_item_id)
    item.state, item.lease_id, item.lease_session_epoch = (
        WS.WORK_ITEM_STATE_ACTIVE,
        s.lease.lease_id,
        s.lease.session_epoch,
    )


def _checkpointed(p: GroupProjection, e: event_pb2.Event) -> None:
    c = e.work_checkpointed
    item = p._item(c.work_item_id)
    item.latest_checkpoint_id = c.checkpoint.checkpoint_id
    if c.HasField("ownership"):  # a checkpoint that released the slot (preemption, MW-11.3-12)
        item.lease_id = item.preemption_request_id = ""
        p._owned(item, c.ownership, from_timestamp(e.recorded_at), WS.WORK_ITEM_STATE_QUEUED)


def _blocked(p: GroupProjection, e: event_pb2.Event) -> None:
    b = e.work_blocked
    item = p._item(b.work_item_id)
    item.lease_id, item.state = "", WS.WORK_ITEM_STATE_BLOCKED
    if b.checkpoint.checkpoint_id:
        item.latest_checkpoint_id = b.checkpoint.checkpoint_id


def _unblocked(p: GroupProjection, e: event_pb2.Event) -> None:
    u = e.work_unblocked
    item = p._item(u.work_item_id)
    if u.HasField("ownership"):
        p._owned(item, u.ownership, from_timestamp(e.recorded_at), int(u.next_state))
    else:
        item.state = int(u.next_state)
        if item.state == WS.WORK_ITEM_STATE_OPEN:
            item.owner_id, item.enqueued_at = "", None


def _submitted(p: GroupProjection, e: event_pb2.Event) -> None:
    item = p._item(e.work_submitted.work_item_id)
    item.state, item.lease_id, item.preemption_request_id = WS.WORK_ITEM_STATE_SUBMITTED, "", ""


def _verified(p: GroupProjection, e: event_pb2.Event) -> None:
    p._ended(p._item(e.work_result_accepted.work_item_id), WS.WORK_ITEM_STATE_VERIFIED)


def _failed(p: GroupProjection, e: event_pb2.Event) -> None:
    p._ended(p._item(e.work_failed.work_item_id), WS.WORK_ITEM_STATE_FAILED)


def _cancelled(p: GroupProjection, e: event_pb2.Event) -> None:
    p._ended(p._item(e.work_cancelled.work_item_id), WS.WORK_ITEM_STATE_CANCELLED)


def _preemption(p: GroupProjection, e: event_pb2.Event) -> None:
    r = e.work_preemption_requested
    p._item(r.work_item_id).preemption_request_id = r.preemption_request_id


def _approved(p: GroupProjection, e: event_pb2.Event) -> None:
    p._item(e.execution_approval_granted.work_item_id).approved = True


def _lease_revoked(p: GroupProjection, e: event_pb2.Event) -> None:
    r = e.lease_revoked
    item = p._item(r.work_item_id)
    item.lease_id = item.preemption_request_id = ""
    item.retry_not_before = from_timestamp(r.retry_not_before) if r.HasField("retry_not_before") else None
    if r.resulting_state:
        item.state = int(r.resulting_state)
    if item.state not in IN_QUEUE:
        item.owner_id, item.enqueued_at = "", None


def _subtask_linked(p: GroupProjection, e: event_pb2.Event) -> None:
    """The WorkItem became a child Mission (MW-10.2-T15): a running attempt ends, it waits blocked."""
    item = p._item(e.subtask_linked.work_item_id)
    item.lease_id, item.preemption_request_id, item.state = "", "", WS.WORK_ITEM_STATE_BLOCKED
    item.open_offers.clear()


def _subtask_ended(p: GroupProjection, e: event_pb2.Event) -> None:
    ended = e.subtask_ended
    item = p._item(ended.work_item_id)
    if ended.resulting_state in (WS.WORK_ITEM_STATE_VERIFIED, WS.WORK_ITEM_STATE_FAILED):
        p._ended(item, int(ended.resulting_state))


def _mission_created(p: GroupProjection, e: event_pb2.Event) -> None:
    p.mission_owner_id = e.mission_created.definition.owner_id


def _owner_replaced(p: GroupProjection, e: event_pb2.Event) -> None:
    p.mission_owner_id = e.mission_owner_replaced.owner_id


_HANDLERS = {
    "mission_created": _mission_created,
    "mission_owner_replaced": _owner_replaced,
    "work_authorized": _authorized,
    "work_offered": _offered,
    "work_offers_withdrawn": _withdrawn,
    "work_offer_declined": _declined,
    "work_offer_accepted": _accepted,
    "work_started": _started,
    "work_checkpointed": _checkpointed,
    "work_blocked": _blocked,
    "work_unblocked": _unblocked,
    "work_submitted": _submitted,
    "work_result_accepted": _verified,
    "work_failed": _failed,
    "work_cancelled": _cancelled,
    "work_preemption_requested": _preemption,
    "execution_approval_granted": _approved,
    "lease_revoked": _lease_revoked,
    "subtask_linked": _subtask_linked,
    "subtask_ended": _subtask_ended,
}
