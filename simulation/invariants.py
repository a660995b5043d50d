"""The invariants checked after every step of a run, each a small named function.

Each reads the world as an oracle would: the store's log and fold (not an instance's cache), what
clients were told, and what readers accepted; each returns the violations it found (empty: holds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from missionweave.v1 import command_pb2, conversation_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.authority.state import SIX, GroupState
from simulation.actors import Reader
from simulation.processes import ArtifactStore
from simulation.store import Store


@dataclass
class LogIndex:
    """Facts of one Group's durable log, indexed as it grows (it never shrinks: power loss only
    takes unsynced events, which no reader was given)."""

    indexed: int = 0
    conversation_of_message: dict[str, str] = field(default_factory=dict)
    group_wide: set[str] = field(default_factory=set)  # the planning Conversation(s)
    # member -> (seq, provisional) at each grant or activation: its provisional status over time
    provisional: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)

    def provisional_at(self, member_id: str, head: int) -> bool:
        status = False
        for seq, provisional in self.provisional.get(member_id, []):
            if seq <= head:
                status = provisional
        return status


@dataclass
class World:
    """What the invariants look at (built and owned by ``simulation.run``)."""

    store: Store
    artifacts: ArtifactStore
    readers: list[Reader]
    acknowledged: dict[tuple[str, str], int]  # (group, command id) -> the seq the ok named
    # Who may read each restricted Conversation: its participants, the MissionOwner, the Coordinator
    # (MW-9-05), as the scenario set it up (not as the core computes it).
    restricted: dict[str, frozenset[str]]
    # (group, WorkItem, ownership epoch) -> the agent that held it: one per epoch, ever.
    epoch_owners: dict[tuple[str, str, int], str] = field(default_factory=dict)
    # Violations found while deciding (stale epochs accepted), reported by the next check.
    found: list[str] = field(default_factory=list)
    # What earlier checks covered (the log only grows, but for a power loss, which rechecks all).
    acks_checked: set[tuple[str, str]] = field(default_factory=set)
    power_losses_seen: int = 0
    delivered_checked: dict[str, int] = field(default_factory=dict)  # reader -> entries checked for content
    gap_checked: dict[str, int] = field(default_factory=dict)  # reader -> entries checked for gaps
    logs: dict[str, LogIndex] = field(default_factory=dict)  # what the invariants look up in each log


def no_acknowledged_command_lost(world: World) -> list[str]:
    out = []
    if world.power_losses_seen != world.store.power_losses:
        world.power_losses_seen, world.acks_checked = world.store.power_losses, set()
    for (group_id, cid), seq in sorted(world.acknowledged.items()):
        if (group_id, cid) in world.acks_checked:
            continue
        world.acks_checked.add((group_id, cid))
        row = world.store.row(group_id)
        events = row.events if row is not None else []
        if seq > len(events) or events[seq - 1].causing_command_id != cid:
            out.append(
                f"{group_id}: {cid} was acknowledged at seq {seq}, the log has {len(events)} events"
                + (f" and seq {seq} is {events[seq - 1].causing_command_id}" if seq <= len(events) else "")
            )
    return out


def _work_items(world: World) -> Iterator[tuple[str, str, Any]]:
    """Every WorkItem of the synced store, in a deterministic order: (Group, WorkItem id, its state)."""
    for group_id in sorted(world.store.rows):
        state = world.store.rows[group_id].state
        if state is not None:
            for wid in sorted(state.work_items):
                yield group_id, wid, state.work_items[wid]


def one_owner_and_lease_per_epoch(world: World) -> list[str]:
    out = []
    for group_id, wid, item in _work_items(world):
        owner, lease = item.owner, item.lease
        if lease is not None and (
            owner is None
            or lease.agent_id != owner.agent_id
            or lease.ownership_epoch != owner.ownership_epoch
        ):
            out.append(
                f"{group_id}/{wid}: lease {lease.lease_id} of {lease.agent_id} at epoch "
                f"{lease.ownership_epoch} but owner {owner}"
            )
        if owner is not None:
            first = world.epoch_owners.setdefault((group_id, wid, owner.ownership_epoch), owner.agent_id)
            if first != owner.agent_id:
                out.append(
                    f"{group_id}/{wid}: ownership epoch {owner.ownership_epoch} held by {first} "
                    f"and then by {owner.agent_id}"
                )
    return out


def stale_epochs(state: GroupState | None, command: command_pb2.Command, session: int) -> list[str]:
    """Which epochs ``command`` cites that were not current in ``state`` (the state it was decided
    on) or at the registry (``session``): called for every accepted command."""
    out = []
    if command.session_epoch != session:
        out.append(f"session {command.session_epoch}, current {session}")
    member = state.members.get(command.actor_id) if state is not None else None
    if member is not None and (not member.active or member.membership_epoch != command.membership_epoch):
        out.append(
            f"membership {command.membership_epoch}, current {member.membership_epoch} active={member.active}"
        )
    kind = command.WhichOneof("body") or ""
    body = getattr(command, kind)
    grant_id = str(getattr(body, "grant_id", ""))
    if (
        state is not None and grant_id and kind != "membership_revoke_delegation"
    ):  # a revocation names its grant
        out += _stale_grant(state, command, grant_id)
    elif state is not None and hasattr(body, "coordinator_epoch") and state.mission is not None:
        coordinator = state.mission.coordinator
        if (
            coordinator is None
            or coordinator.coordinator_epoch != body.coordinator_epoch
            or (coordinator.agent_id != command.actor_id)
        ):
            out.append(
                f"coordinator epoch {body.coordinator_epoch} of {command.actor_id}, current {coordinator}"
            )
    wid = getattr(body, "work_item_id", "")
    item = state.work_items.get(wid) if state is not None and wid else None
    # Ownership and lease are cited by work.start and by whatever names a lease (a Coordinator's
    # work.fail or work.cancel names none: its epoch fields are the Worker's, left empty).
    if (
        item is None
        or not hasattr(body, "ownership_epoch")
        or (kind != "work_start" and not getattr(body, "lease_id", ""))
    ):
        return out
    owner = item.owner
    if owner is None or owner.agent_id != command.actor_id or owner.ownership_epoch != body.ownership_epoch:
        out.append(f"{wid}: ownership epoch {body.ownership_epoch} of {command.actor_id}, owner {owner}")
    if command.extensions:
        # Buffered offline (MW-11.5-10): judged against the lease it names as recorded, which
        # may have ended since; the ownership must still be the same.
        record = item.lease_history.get(str(getattr(body, "lease_id", "")))
        if (
            record is None
            or record.agent_id != command.actor_id
            or record.ownership_epoch != body.ownership_epoch
        ):
            out.append(f"{wid}: buffered under lease {getattr(body, 'lease_id', '')}, recorded {record}")
    elif kind != "work_start" and hasattr(body, "lease_id") and body.lease_id:
        lease = item.lease
        if lease is None or lease.lease_id != body.lease_id or lease.session_epoch != command.session_epoch:
            out.append(f"{wid}: lease {body.lease_id} in session {command.session_epoch}, current {lease}")
    return out


def _stale_grant(state: GroupState, command: command_pb2.Command, grant_id: str) -> list[str]:
    """A command under a delegation grant speaks for the Coordinator that issued it: the grant must
    be the actor's, unrevoked, from the current Coordinator epoch, for the Membership it holds now."""
    grant = state.grants.get(grant_id)
    member = state.members.get(command.actor_id)
    lease = state.mission.coordinator if state.mission is not None else None
    if grant is None or grant.revoked or grant.grantee_id != command.actor_id:
        return [
            f"grant {grant_id}: {'revoked' if grant is not None and grant.revoked else 'not the actor'}'s"
        ]
    if member is None or member.membership_epoch != grant.grantee_membership_epoch:
        return [f"grant {grant_id} made for Membership epoch {grant.grantee_membership_epoch}, now {member}"]
    if (
        lease is None
        or lease.coordinator_epoch != grant.coordinator_epoch
        or lease.agent_id != grant.issuer_id
    ):
        return [f"grant {grant_id} issued at Coordinator epoch {grant.coordinator_epoch}, now {lease}"]
    return []


def no_stale_epoch_accepted(world: World) -> list[str]:
    found, world.found = world.found, []
    return found


def budgets_never_exceeded(world: World) -> list[str]:
    out = []
    for group_id in sorted(world.store.rows):
        state = world.store.rows[group_id].state
        if state is None or state.mission is None:
            continue
        mission_budget = state.mission.definition.budget
        for dim in SIX:
            if state.mission_used[dim] > getattr(mission_budget, dim):
                out.append(
                    f"{group_id}: the Mission used {state.mission_used[dim]} {dim} of {getattr(mission_budget, dim)}"
                )
            if state.committed[dim] > getattr(mission_budget, dim):
                out.append(
                    f"{group_id}: WorkItems hold {state.committed[dim]} {dim} of the Mission's {getattr(mission_budget, dim)}"
                )
        for gid in sorted(state.grants):
            grant = state.grants[gid]
            for dim in SIX:
                if max(grant.charged[dim], grant.used[dim]) > grant.caps[dim]:
                    out.append(
                        f"{group_id}: grant {gid} charged {grant.charged[dim]}, used {grant.used[dim]} {dim} of {grant.caps[dim]}"
                    )
        for wid in sorted(state.work_items):
            item = state.work_items[wid]
            for dim in SIX:
                if item.used[dim] > getattr(item.contract.budget, dim):
                    out.append(
                        f"{group_id}/{wid}: used {item.used[dim]} {dim} of {getattr(item.contract.budget, dim)}"
                    )
    return out


def cursors_never_cross_a_gap(world: World) -> list[str]:
    out = []
    for reader in world.readers:
        done = world.gap_checked.get(reader.name, 0)
        world.gap_checked[reader.name] = len(reader.delivered)
        previous = reader.delivered[done - 1].seq if done else 0
        for entry in reader.delivered[done:]:
            if entry.seq != previous + 1 and not (entry.seq > previous and entry.seq - 1 in reader.starts):
                out.append(f"{reader.name} in {reader.group_id}: seq {entry.seq} delivered after {previous}")
                break
            previous = entry.seq
    return out


def verified_artifacts_exist(world: World) -> list[str]:
    out = []
    for group_id, wid, item in _work_items(world):
        if item.state == wp.WORK_ITEM_STATE_VERIFIED:
            missing = [d for d, _ in item.submitted_artifacts if d not in world.artifacts.blobs]
            if missing:
                out.append(
                    f"{group_id}/{wid} is verified but its Artifact {missing[0][:12]}... was never uploaded"
                )
    return out


def hidden_content_never_delivered(world: World) -> list[str]:
    out = []
    for reader in world.readers:
        row = world.store.row(reader.group_id)
        if row is None:
            continue
        index = _log_index(world, reader.group_id)
        done = world.delivered_checked.get(reader.name, 0)
        world.delivered_checked[reader.name] = len(reader.delivered)
        for entry in reader.delivered[done:]:
            if not entry.visible:
                continue
            event = row.events[entry.seq - 1]  # delivered means synced: never truncated
            payload = event.WhichOneof("payload")
            conversation = ""
            if payload == "message_posted":
                conversation = event.message_posted.conversation_id
            elif payload == "message_amended":
                conversation = index.conversation_of_message.get(event.message_amended.message_id, "")
            elif payload == "conversation_opened" and (
                event.conversation_opened.kind == conversation_pb2.CONVERSATION_KIND_RESTRICTED
            ):
                conversation = event.conversation_opened.conversation_id
            allowed = world.restricted.get(conversation)
            if allowed is not None and reader.member_id not in allowed:
                out.append(
                    f"{reader.member_id} was delivered seq {entry.seq} ({payload}) of restricted {conversation}"
                )
                break
            # MW-8-06, D124: a provisional member hears only of its offers, not the Group's talk.
            if conversation in index.group_wide and index.provisional_at(reader.member_id, entry.read_at):
                out.append(
                    f"provisional {reader.member_id} was delivered seq {entry.seq} ({payload}) of {conversation}"
                )
                break
    return out


def _log_index(world: World, group_id: str) -> LogIndex:
    index = world.logs.setdefault(group_id, LogIndex())
    row = world.store.rows[group_id]
    for event in row.events[index.indexed : row.synced]:
        payload = event.WhichOneof("payload")
        if payload == "message_posted":
            index.conversation_of_message[event.message_posted.message_id] = (
                event.message_posted.conversation_id
            )
        elif (
            payload == "conversation_opened"
            and event.conversation_opened.kind == conversation_pb2.CONVERSATION_KIND_PLANNING
        ):
            index.group_wide.add(event.conversation_opened.conversation_id)
        elif payload == "membership_granted":
            m = event.membership_granted.membership
            index.provisional.setdefault(m.member_id, []).append((event.sequence, m.provisional))
        elif payload == "membership_activated":
            index.provisional.setdefault(event.membership_activated.member_id, []).append(
                (event.sequence, False)
            )
    index.indexed = max(index.indexed, row.synced)
    return index


INVARIANTS: tuple[Callable[[World], list[str]], ...] = (
    no_acknowledged_command_lost,
    one_owner_and_lease_per_epoch,
    no_stale_epoch_accepted,
    budgets_never_exceeded,
    cursors_never_cross_a_gap,
    verified_artifacts_exist,
    hidden_content_never_delivered,
)
