"""Pure core: the marker an erased event carries (rules/conversations.py ``erased``, MW-7.4-04/05,
docs/integrity.md): it keeps the original event's digest, which the next event's previous_digest
names, also when an event is erased once more (its first marker's digest is the original's)."""

from __future__ import annotations

import copy

import pytest

from missionweave.kernel.eventlog import event_digest
from missionweave.v1 import common_pb2, conversation_pb2, event_pb2
from missionweave_server.services.authority.rules.conversations import erased
from tests import builders
from tests.steward_fixtures import BASE, GROUP, PLANNING, events

AK, CE = conversation_pb2.MessageAmendmentKind, conversation_pb2.ContentErasure


def posted_and_erased() -> tuple[event_pb2.Event, event_pb2.Event]:
    body = builders.message(PLANNING, "secret")
    body.message_id = "msg_s"
    (post,) = events(BASE, "message_post", body, "worker")
    state = GROUP.run(BASE, "message_post", body, "worker")
    erase = conversation_pb2.MessageAmend(
        message_id="msg_s",
        kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION,
        erasure=CE.CONTENT_ERASURE_SECURITY_REDACTION,
        policy_reason="leak",
    )
    (tombstone,) = events(state, "message_amend", erase, "alice")
    return post, tombstone


@pytest.mark.req("MW-7.4-04", "MW-7.4-05")
def test_an_erased_event_keeps_the_digest_of_the_payload_first_signed() -> None:
    post, tombstone = posted_and_erased()
    envelope = common_pb2.SignedEnvelope(
        payload=post.SerializeToString(), payload_type="event"
    ).SerializeToString()
    result = erased(copy.deepcopy(post), tombstone, envelope)
    assert result.redaction.original_event_digest == event_digest(post.SerializeToString())
    assert (result.redaction.tombstone_sequence, result.redaction.erasure) == (
        tombstone.sequence,
        CE.CONTENT_ERASURE_SECURITY_REDACTION,
    )
    # Erased again (re-signed once more): the first marker's original digest stays, whatever the new envelope.
    again_envelope = common_pb2.SignedEnvelope(
        payload=result.SerializeToString(), payload_type="event"
    ).SerializeToString()
    again = erased(copy.deepcopy(result), tombstone, again_envelope)
    assert again.redaction.original_event_digest == event_digest(post.SerializeToString())
    assert again.redaction.original_envelope_digest.size_bytes == len(again_envelope)
