"""Pure core: which stored events an erasure rewrites, and how (rules/conversations.py, MW-7.4-04/05)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import blake3
import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import command_pb2, common_pb2, conversation_pb2, event_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.conversations import erased, erasure_targets
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders

AK, CE = conversation_pb2.MessageAmendmentKind, conversation_pb2.ContentErasure
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CTX = decider.DecisionContext(
    NOW,
    {
        "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
        "coord": IdentityInfo("coord", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    },
)
_ids = iter(range(1, 1000))


def post(conversation_id: str, message_id: str, text: str) -> conversation_pb2.MessagePost:
    body = builders.message(conversation_id, text)
    body.message_id = message_id
    return body


def run(
    state: GroupState | None, log: list[event_pb2.Event], body_field: str, body: object, actor: str = "alice"
) -> tuple[GroupState, list[event_pb2.Event]]:
    command = command_pb2.Command(
        command_id=f"cmd_{next(_ids)}",
        group_id="grp_e",
        actor_id=actor,
        session_epoch=1,
        membership_epoch=0 if state is None else state.members[actor].membership_epoch,
        issued_at=to_timestamp(NOW),
    )
    getattr(command, body_field).CopyFrom(body)
    decision = decider.decide(state, command, CTX)
    assert not isinstance(decision, Rejected), decision
    for event in decision:
        state = decider.evolve(state, event)
    assert state is not None
    log.extend(decision)
    return state, decision


@pytest.fixture
def erasure() -> tuple[list[event_pb2.Event], list[event_pb2.Event]]:
    """A Message posted by the Coordinator, corrected once, then erased by the owner: (log, erasure's events)."""
    log: list[event_pb2.Event] = []
    state, _ = run(None, log, "mission_create", builders.mission_create("alice", "coord", NOW))
    conversation = state.mission.planning_conversation_id  # type: ignore[union-attr]
    state, _ = run(state, log, "message_post", post(conversation, "msg_1", "secret"), actor="coord")
    correction = conversation_pb2.MessageAmend(
        message_id="msg_1",
        kind=AK.MESSAGE_AMENDMENT_KIND_CORRECTION,
        corrected_content=conversation_pb2.MessageContent(text="still secret"),
    )
    state, _ = run(state, log, "message_amend", correction, actor="coord")
    state, _ = run(state, log, "message_post", post(conversation, "msg_2", "unrelated"), actor="coord")
    erase = conversation_pb2.MessageAmend(
        message_id="msg_1",
        kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION,
        erasure=CE.CONTENT_ERASURE_LEGAL_DELETION,
        policy_reason="GDPR",
    )
    state, decision = run(state, log, "message_amend", erase)
    return log, decision


@pytest.mark.req("MW-7.4-04")
def test_an_erasure_rewrites_the_post_and_its_corrections_only(
    erasure: tuple[list[event_pb2.Event], list[event_pb2.Event]],
) -> None:
    log, decision = erasure
    (tombstone,) = decision
    by_sequence = {e.sequence: e for e in log}
    targets = erasure_targets([*log[:-1], tombstone])  # earlier amendments and posts list nothing
    assert [(t.event_id, s) for t, s in targets] == [
        (tombstone.event_id, s) for s in tombstone.message_amended.erased_sequences
    ]
    sequences = [s for _, s in targets]
    assert [by_sequence[s].type for s in sequences] == ["message.posted", "message.amended"]
    assert by_sequence[sequences[0]].message_posted.message_id == "msg_1"
    assert erasure_targets(log[:-1]) == []


@pytest.mark.req("MW-7.4-04", "MW-7.4-05")
def test_an_erased_event_keeps_everything_but_its_content_and_names_its_tombstone(
    erasure: tuple[list[event_pb2.Event], list[event_pb2.Event]],
) -> None:
    log, (tombstone,) = erasure
    by_sequence = {e.sequence: e for e in log}
    for sequence, cleared in zip(
        tombstone.message_amended.erased_sequences,
        ("message_posted.content", "message_amended.corrected_content"),
        strict=True,
    ):
        original = by_sequence[sequence]
        envelope = original.SerializeToString()  # what the shell read back (signed bytes in real life)
        result = erased(copy.deepcopy(original), tombstone, envelope)
        payload, field = cleared.split(".")
        assert result.WhichOneof("payload") == payload  # the oneof is not switched
        assert getattr(original, payload).HasField(field) and not getattr(result, payload).HasField(field)
        marker = result.redaction
        assert (marker.tombstone_event_id, marker.tombstone_sequence, marker.erasure) == (
            tombstone.event_id,
            tombstone.sequence,
            CE.CONTENT_ERASURE_LEGAL_DELETION,
        )
        assert marker.original_envelope_digest == common_pb2.Digest(
            algorithm="blake3", hex=blake3.blake3(envelope).hexdigest(), size_bytes=len(envelope)
        )
        expected = copy.deepcopy(original)
        getattr(expected, payload).ClearField(field)
        result.ClearField("redaction")
        assert result == expected  # id, sequence and every other field unchanged
