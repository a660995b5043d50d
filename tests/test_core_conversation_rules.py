"""Pure core: Conversations and Messages (spec 9, MW-9.1-19..21, MW-7.4-04/05) through
decider.decide/evolve: who opens which Conversation, who reads restricted ones, what a Message may
carry, and the rules of corrections, retractions, redactions and erasures."""

from __future__ import annotations

import pytest

from missionweave.kernel import ids
from missionweave.kernel.errors import Rejected
from missionweave.v1 import conversation_pb2 as cp
from missionweave.v1 import membership_pb2, work_pb2
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.common import MAX_DATA_JSON_BYTES, MAX_TEXT_BYTES
from missionweave_server.services.authority.state import GroupState, MessageState
from tests import builders
from tests.steward_fixtures import (
    BASE,
    GROUP,
    GROUP_ID,
    LATE,
    NOW,
    PLANNING,
    cancelled,
    events,
    rejection,
    replaced,
)

CK, AK, CE = cp.ConversationKind, cp.MessageAmendmentKind, cp.ContentErasure
REVIEW, RESTRICTED = CK.CONVERSATION_KIND_REVIEW, CK.CONVERSATION_KIND_RESTRICTED
CORRECTION, RETRACTION, REDACTION = (
    AK.MESSAGE_AMENDMENT_KIND_CORRECTION,
    AK.MESSAGE_AMENDMENT_KIND_RETRACTION,
    AK.MESSAGE_AMENDMENT_KIND_REDACTION,
)
INVALID = "INVALID_ARGUMENT"


def opening(**fields: object) -> cp.ConversationOpen:
    body = cp.ConversationOpen(
        kind=RESTRICTED, title="sensitive figures", conversation_id="conv_r", participant_ids=["worker"]
    )
    return builders.with_overrides(body, fields)


def open_decision(
    state: GroupState = BASE,
    actor: str = "alice",
    ctx: decider.DecisionContext | None = None,
    **fields: object,
) -> object:
    return GROUP.decide(state, "conversation_open", opening(**fields), actor, ctx)


def invalid_field(decision: object) -> str:
    reason, metadata = rejection(decision)
    assert reason == INVALID, decision
    return metadata["field"]


RESTRICTED_STATE = GROUP.run(BASE, "conversation_open", opening(), "alice")


def post(
    conversation_id: str = PLANNING, message_id: str = "msg_1", text: str = "hello", **fields: object
) -> cp.MessagePost:
    body = builders.message(conversation_id, text)
    body.message_id = message_id
    return builders.with_overrides(body, fields)


def content(**fields: object) -> cp.MessageContent:
    return cp.MessageContent(**fields)  # type: ignore[arg-type]


def post_decision(state: GroupState = BASE, actor: str = "worker", **content_fields: object) -> object:
    body = post()
    body.content.CopyFrom(content(**content_fields))
    return GROUP.decide(state, "message_post", body, actor)


POSTED = GROUP.run(BASE, "message_post", post(), "worker")  # msg_1 by worker in the planning Conversation


def amend(kind: int, message_id: str = "msg_1", **fields: object) -> cp.MessageAmend:
    return builders.with_overrides(cp.MessageAmend(message_id=message_id, kind=kind), fields)


def amend_decision(kind: int, actor: str, state: GroupState = POSTED, **fields: object) -> object:
    return GROUP.decide(state, "message_amend", amend(kind, **fields), actor)


# ---------------------------------------------------------------- conversation.open


@pytest.mark.req("MW-9-03", "MW-9-04", "MW-9-05")
def test_the_owner_opens_a_restricted_conversation_with_its_participants_listed_once_in_order() -> None:
    body = opening(participant_ids=["worker", "rev", "worker"], linked_conversation_id=PLANNING)
    (event,) = events(BASE, "conversation_open", body, "alice")
    assert (event.type, event.sequence) == ("conversation.opened", BASE.head_sequence + 1)
    assert event.conversation_opened == cp.ConversationOpened(
        conversation_id="conv_r",
        kind=RESTRICTED,
        title="sensitive figures",
        participant_ids=["rev", "worker"],
        linked_conversation_id=PLANNING,
    )
    state = GROUP.run(BASE, "conversation_open", body, "alice")
    conversation = state.conversations["conv_r"]
    assert (
        conversation.kind,
        conversation.title,
        conversation.participant_ids,
        conversation.linked_conversation_id,
    ) == (
        RESTRICTED,
        "sensitive figures",
        ("rev", "worker"),
        PLANNING,
    )
    assert (conversation.work_item_id, conversation.message_count) == ("", 0)


@pytest.mark.req("MW-9-03")
def test_the_current_coordinator_opens_a_review_conversation_with_an_id_derived_from_the_command() -> None:
    command = GROUP.command("conversation_open", cp.ConversationOpen(kind=REVIEW, title="r"), "coord", BASE)
    decision = decider.decide(BASE, command, GROUP.ctx)
    assert isinstance(decision, list)
    (event,) = decision
    derived = ids.derived_id("conv", GROUP_ID, command.command_id)
    assert event.conversation_opened == cp.ConversationOpened(conversation_id=derived, kind=REVIEW, title="r")
    assert event.actor_id == "coord"


@pytest.mark.req("MW-9-03", "MW-7.2-04")
def test_a_replaced_coordinator_no_longer_opens_conversations_but_its_successor_does() -> None:
    state = replaced()
    reason, metadata = rejection(open_decision(state, "coord", LATE))
    assert reason == "PERMISSION_DENIED" and "check" not in metadata  # the role may; the lease is gone
    assert "conv_r" in GROUP.run(state, "conversation_open", opening(), "coord2", LATE).conversations


@pytest.mark.req("MW-7.1-06")
def test_no_conversation_opens_in_a_terminal_mission() -> None:
    reason, metadata = rejection(open_decision(cancelled()))
    assert (reason, metadata) == ("TERMINAL_STATE", {"state": "MISSION_STATE_CANCELLED"})


@pytest.mark.req("MW-9-03")
@pytest.mark.parametrize(
    "kind", [CK.CONVERSATION_KIND_PLANNING, CK.CONVERSATION_KIND_WORK_ITEM, CK.CONVERSATION_KIND_UNSPECIFIED]
)
def test_only_review_and_restricted_conversations_are_opened_by_command(kind: int) -> None:
    assert invalid_field(open_decision(kind=kind, participant_ids=[])) == "body.kind"


@pytest.mark.parametrize(
    ("title", "accepted"), [("", False), ("t", True), ("t" * 200, True), ("t" * 201, False)]
)
def test_a_conversation_title_has_1_to_200_characters(title: str, accepted: bool) -> None:
    decision = open_decision(title=title)
    if accepted:
        assert isinstance(decision, list) and decision[0].conversation_opened.title == title
    else:
        assert invalid_field(decision) == "body.title"


@pytest.mark.parametrize("conversation_id", ["bad id!", PLANNING])
def test_a_conversation_id_is_valid_and_new(conversation_id: str) -> None:
    assert invalid_field(open_decision(conversation_id=conversation_id)) == "body.conversation_id"


@pytest.mark.req("MW-9-05")
def test_only_restricted_conversations_list_participants() -> None:
    assert invalid_field(open_decision(kind=REVIEW)) == "body.participant_ids"


@pytest.mark.req("MW-9-05")
def test_at_most_256_participants_each_an_active_member() -> None:
    assert isinstance(open_decision(participant_ids=["worker"] * 256), list)
    assert invalid_field(open_decision(participant_ids=["nobody"] * 257)) == "body.participant_ids"
    assert invalid_field(open_decision(participant_ids=["worker", "nobody"])) == "body.participant_ids[1]"
    revoked = GROUP.run(BASE, "membership_revoke", _revoke("rev"), "alice")
    assert (
        invalid_field(open_decision(revoked, participant_ids=["worker", "rev"])) == "body.participant_ids[1]"
    )


def _revoke(member: str) -> membership_pb2.MembershipRevoke:
    return membership_pb2.MembershipRevoke(member_id=member, reason="left")


def test_a_linked_conversation_must_exist() -> None:
    reason, _ = rejection(open_decision(linked_conversation_id="conv_none"))
    assert reason == "NOT_FOUND"


# ---------------------------------------------------------------- restricted Conversations (MW-9-05)


@pytest.mark.req("MW-9-05", "MW-9-13")
@pytest.mark.parametrize(
    ("actor", "allowed"),
    [("worker", True), ("alice", True), ("coord", True), ("rev", False), ("admin", False)],
)
def test_a_restricted_conversation_admits_its_participants_the_owner_and_the_coordinator(
    actor: str, allowed: bool
) -> None:
    decision = GROUP.decide(RESTRICTED_STATE, "message_post", post("conv_r", text="figures"), actor)
    if allowed:
        assert isinstance(decision, list) and decision[0].message_posted.conversation_id == "conv_r"
    else:
        assert rejection(decision) == ("PERMISSION_DENIED", {})


@pytest.mark.req("MW-9-05")
def test_a_replaced_coordinator_loses_access_to_restricted_conversations() -> None:
    state = replaced(RESTRICTED_STATE)
    assert rejection(GROUP.decide(state, "message_post", post("conv_r"), "coord", LATE)) == (
        "PERMISSION_DENIED",
        {},
    )
    assert isinstance(GROUP.decide(state, "message_post", post("conv_r"), "coord2", LATE), list)


@pytest.mark.req("MW-9-05")
def test_amending_a_message_in_a_restricted_conversation_needs_access_to_it() -> None:
    state = GROUP.run(RESTRICTED_STATE, "message_post", post("conv_r", "msg_r"), "worker")
    state = GROUP.run(state, "membership_revoke", _revoke("worker"), "alice")
    # The owner keeps access and may redact; an Organization administrator outside it may not look.
    redact = amend(REDACTION, "msg_r", policy_reason="leak")
    assert isinstance(GROUP.decide(state, "message_amend", redact, "alice"), list)
    assert rejection(GROUP.decide(state, "message_amend", redact, "admin")) == ("PERMISSION_DENIED", {})


# ---------------------------------------------------------------- message.post


@pytest.mark.req("MW-9-13", "MW-9-10")
def test_a_posted_message_carries_its_content_and_no_authority() -> None:
    body = post(reply_to_message_id="msg_1", topic="t" * 128, message_id="msg_2")
    body.content.artifacts.append(builders.artifact())
    body.content.mentions.append("rev")
    (event,) = events(POSTED, "message_post", body, "rev")
    assert event.type == "message.posted"
    assert event.message_posted == cp.MessagePosted(
        message_id="msg_2",
        conversation_id=PLANNING,
        content=body.content,
        reply_to_message_id="msg_1",
        topic="t" * 128,
        authority=False,
    )
    state = GROUP.run(POSTED, "message_post", body, "rev")
    assert state.messages["msg_2"] == MessageState(
        conversation_id=PLANNING, author_id="rev", content_sequences=[event.sequence]
    )
    assert state.conversations[PLANNING].message_count == 2


def test_a_message_id_defaults_to_one_derived_from_the_command() -> None:
    command = GROUP.command("message_post", post(message_id=""), "worker", BASE)
    decision = decider.decide(BASE, command, GROUP.ctx)
    assert isinstance(decision, list)
    expected = f"msg_{ids.suffix(ids.derived_id('x', GROUP_ID, command.command_id))}"
    assert decision[0].message_posted.message_id == expected


@pytest.mark.parametrize("message_id", ["bad id!", "msg_1"])
def test_a_message_id_is_valid_and_new(message_id: str) -> None:
    decision = GROUP.decide(POSTED, "message_post", post(message_id=message_id), "rev")
    assert invalid_field(decision) == "body.message_post.message_id"


def test_a_reply_names_a_message_of_the_group_and_a_topic_has_at_most_128_characters() -> None:
    reason, _ = rejection(
        GROUP.decide(POSTED, "message_post", post(message_id="msg_2", reply_to_message_id="msg_9"), "rev")
    )
    assert reason == "NOT_FOUND"
    assert (
        invalid_field(GROUP.decide(POSTED, "message_post", post(message_id="msg_2", topic="t" * 129), "rev"))
        == "body.message_post.topic"
    )


def test_a_reply_cannot_probe_or_show_a_restricted_conversations_message_ids() -> None:
    """A non-participant is answered alike for a hidden message and an absent one; a participant's
    reply to a restricted message stays in its Conversation (the id would show in the other)."""
    secret = GROUP.run(RESTRICTED_STATE, "message_post", post("conv_r", message_id="msg_secret"), "worker")
    hidden = GROUP.decide(
        secret, "message_post", post(message_id="msg_2", reply_to_message_id="msg_secret"), "rev"
    )
    absent = GROUP.decide(
        secret, "message_post", post(message_id="msg_2", reply_to_message_id="msg_none"), "rev"
    )
    assert isinstance(hidden, Rejected) and isinstance(absent, Rejected)
    assert (hidden.reason, hidden.metadata) == (absent.reason, absent.metadata)
    assert hidden.message.replace("msg_secret", "X") == absent.message.replace("msg_none", "X")
    outside = GROUP.decide(
        secret, "message_post", post(message_id="msg_2", reply_to_message_id="msg_secret"), "worker"
    )
    assert invalid_field(outside) == "body.message_post.reply_to_message_id"
    inside = GROUP.decide(
        secret, "message_post", post("conv_r", message_id="msg_2", reply_to_message_id="msg_secret"), "worker"
    )
    assert not isinstance(inside, Rejected)


def test_posting_to_an_unknown_conversation_is_not_found() -> None:
    assert rejection(GROUP.decide(BASE, "message_post", post("conv_none"), "worker")) == (
        "NOT_FOUND",
        {"field": "conversation_id"},
    )


@pytest.mark.req("MW-9-09")
def test_text_is_bounded_in_utf8_bytes() -> None:
    assert isinstance(post_decision(text="a" * MAX_TEXT_BYTES), list)
    too_large = ("TOO_LARGE", {"field": "body.message_post.content.text", "limit": str(MAX_TEXT_BYTES)})
    assert rejection(post_decision(text="a" * (MAX_TEXT_BYTES + 1))) == too_large
    assert rejection(post_decision(text="é" * (MAX_TEXT_BYTES // 2 + 1))) == too_large  # 2 bytes each


@pytest.mark.req("MW-9-08", "MW-9-09")
def test_structured_data_is_a_bounded_json_object() -> None:
    fits = '{"k":"' + "v" * (MAX_DATA_JSON_BYTES - 8) + '"}'
    assert len(fits) == MAX_DATA_JSON_BYTES and isinstance(post_decision(data_json=fits), list)
    over = '{"k":"' + "é" * ((MAX_DATA_JSON_BYTES - 8) // 2 + 1) + '"}'
    assert rejection(post_decision(data_json=over)) == (
        "TOO_LARGE",
        {"field": "body.message_post.content.data_json", "limit": str(MAX_DATA_JSON_BYTES)},
    )
    assert invalid_field(post_decision(data_json="[1, 2]")) == "body.message_post.content.data_json"
    assert isinstance(post_decision(data_json='{"only": "data"}'), list)  # data alone is content


@pytest.mark.req("MW-9-08")
def test_at_most_32_artifact_references_and_32_mentions() -> None:
    refs = [builders.artifact(c) for c in "abcdef0123456789" * 2]
    assert isinstance(
        post_decision(artifacts=refs, mentions=["rev"] * 32), list
    )  # artifacts alone are content too
    assert rejection(post_decision(text="x", artifacts=[*refs, builders.artifact()]))[0] == "TOO_LARGE"
    assert rejection(post_decision(text="x", mentions=["rev"] * 33))[0] == "TOO_LARGE"


@pytest.mark.req("MW-9-08", "MW-13.1-06")
def test_artifact_references_are_blake3_digests_and_mentions_are_members() -> None:
    bad = builders.artifact()
    bad.digest.algorithm = "sha256"
    assert (
        invalid_field(post_decision(text="x", artifacts=[builders.artifact(), bad]))
        == "body.message_post.content.artifacts[1].digest"
    )
    assert (
        invalid_field(post_decision(text="x", mentions=["rev", "nobody"]))
        == "body.message_post.content.mentions[1]"
    )


@pytest.mark.req("MW-9-06")
def test_a_message_needs_text_data_or_artifacts() -> None:
    assert invalid_field(post_decision(mentions=["rev"])) == "body.message_post.content"


@pytest.mark.req("MW-10.1-02")
def test_an_ambiguity_posted_in_a_work_item_conversation_is_recorded_on_the_work_item() -> None:
    authorize = work_pb2.WorkAuthorize(
        work_item_id="wi", title="wi", contract=builders.contract(NOW), coordinator_epoch=1
    )
    state = GROUP.run(BASE, "work_authorize", authorize, "coord")
    conversation = state.work_items["wi"].conversation_id
    state = GROUP.run(state, "message_post", post(conversation, "msg_a", topic="ambiguity"), "coord")
    state = GROUP.run(state, "message_post", post(conversation, "msg_b", topic="other"), "coord")
    state = GROUP.run(state, "message_post", post(PLANNING, "msg_c", topic="ambiguity"), "coord")
    assert state.work_items["wi"].open_ambiguities == {"msg_a"}


# ---------------------------------------------------------------- message.amend (MW-9.1-19..21)


@pytest.mark.req("MW-9.1-19", "MW-9.1-20")
def test_a_correction_by_the_author_appends_an_event_citing_the_message() -> None:
    corrected = content(text="hello, corrected")
    (event,) = events(POSTED, "message_amend", amend(CORRECTION, corrected_content=corrected), "worker")
    assert event.type == "message.amended"
    assert event.message_amended == cp.MessageAmended(
        message_id="msg_1", kind=CORRECTION, corrected_content=corrected
    )
    state = GROUP.run(POSTED, "message_amend", amend(CORRECTION, corrected_content=corrected), "worker")
    first = POSTED.messages["msg_1"].content_sequences
    assert state.messages["msg_1"] == MessageState(
        conversation_id=PLANNING,
        author_id="worker",
        latest_amendment=CORRECTION,
        amendments=1,
        content_sequences=[*first, event.sequence],
    )
    again = GROUP.run(
        state, "message_amend", amend(CORRECTION, corrected_content=content(text="third")), "worker"
    )
    assert again.messages["msg_1"].amendments == 2 and len(again.messages["msg_1"].content_sequences) == 3


@pytest.mark.req("MW-9.1-20")
def test_only_the_author_corrects_or_retracts() -> None:
    for actor in ("alice", "coord", "admin"):
        assert rejection(amend_decision(CORRECTION, actor, corrected_content=content(text="x"))) == (
            "PERMISSION_DENIED",
            {},
        )
        assert rejection(amend_decision(RETRACTION, actor)) == ("PERMISSION_DENIED", {})


def test_a_correction_is_complete_content() -> None:
    assert invalid_field(amend_decision(CORRECTION, "worker")) == "body.corrected_content"
    too_large = amend_decision(
        CORRECTION, "worker", corrected_content=content(text="a" * (MAX_TEXT_BYTES + 1))
    )
    assert rejection(too_large)[1]["field"] == "body.corrected_content.text"


@pytest.mark.req("MW-9.1-20")
def test_a_retraction_carries_no_content_and_ends_amending() -> None:
    assert (
        invalid_field(amend_decision(RETRACTION, "worker", corrected_content=content(text="x")))
        == "body.corrected_content"
    )
    (event,) = events(POSTED, "message_amend", amend(RETRACTION), "worker")
    assert event.message_amended == cp.MessageAmended(message_id="msg_1", kind=RETRACTION)
    state = GROUP.run(POSTED, "message_amend", amend(RETRACTION), "worker")
    assert (state.messages["msg_1"].latest_amendment, state.messages["msg_1"].content_sequences) == (
        RETRACTION,
        POSTED.messages["msg_1"].content_sequences,
    )
    refused = GROUP.refused(
        state, "message_amend", amend(CORRECTION, corrected_content=content(text="x")), "worker"
    )
    assert refused.reason_name == "INVALID_TRANSITION" and "was retraction" in refused.message


@pytest.mark.req("MW-9.1-21")
@pytest.mark.parametrize("actor", ["worker", "alice", "coord", "admin"])
def test_a_redaction_by_the_author_a_steward_or_organization_policy_records_its_reason(actor: str) -> None:
    (event,) = events(POSTED, "message_amend", amend(REDACTION, policy_reason="contains a secret"), actor)
    assert event.message_amended == cp.MessageAmended(
        message_id="msg_1", kind=REDACTION, policy_reason="contains a secret"
    )
    state = GROUP.run(POSTED, "message_amend", amend(REDACTION, policy_reason="contains a secret"), actor)
    assert (state.messages["msg_1"].latest_amendment, state.messages["msg_1"].erased) == (REDACTION, False)
    refused = GROUP.refused(state, "message_amend", amend(REDACTION, policy_reason="again"), "worker")
    assert refused.reason_name == "INVALID_TRANSITION" and "was redaction" in refused.message


@pytest.mark.req("MW-9.1-21")
def test_a_redaction_by_anyone_else_is_refused() -> None:
    assert rejection(amend_decision(REDACTION, "rev", policy_reason="mine now")) == ("PERMISSION_DENIED", {})
    state = replaced(POSTED)
    assert rejection(
        GROUP.decide(state, "message_amend", amend(REDACTION, policy_reason="x"), "coord", LATE)
    ) == ("PERMISSION_DENIED", {})


@pytest.mark.req("MW-9.1-21")
@pytest.mark.parametrize("policy_reason", ["", "   ", "r" * 4097])
def test_a_redaction_needs_a_bounded_reason(policy_reason: str) -> None:
    assert (
        invalid_field(amend_decision(REDACTION, "alice", policy_reason=policy_reason)) == "body.policy_reason"
    )


def test_a_redaction_carries_no_content_and_the_kind_is_required() -> None:
    masked = amend_decision(REDACTION, "alice", policy_reason="x", corrected_content=content(text="x"))
    assert invalid_field(masked) == "body.corrected_content"
    assert invalid_field(amend_decision(AK.MESSAGE_AMENDMENT_KIND_UNSPECIFIED, "worker")) == "body.kind"


def test_amending_an_unknown_message_is_not_found() -> None:
    assert rejection(amend_decision(CORRECTION, "worker", message_id="msg_9")) == (
        "NOT_FOUND",
        {"field": "message_id"},
    )


# ---------------------------------------------------------------- erasure (MW-7.4-04/05)


@pytest.mark.req("MW-7.4-04", "MW-7.4-05")
@pytest.mark.parametrize(
    "erasure", [CE.CONTENT_ERASURE_SECURITY_REDACTION, CE.CONTENT_ERASURE_LEGAL_DELETION]
)
@pytest.mark.parametrize("actor", ["alice", "admin"])
def test_an_erasure_by_the_owner_or_organization_policy_lists_every_event_with_the_content(
    erasure: int, actor: str
) -> None:
    corrected = GROUP.run(
        POSTED, "message_amend", amend(CORRECTION, corrected_content=content(text="v2")), "worker"
    )
    sequences = corrected.messages["msg_1"].content_sequences
    assert len(sequences) == 2
    body = amend(REDACTION, erasure=erasure, policy_reason="GDPR")
    (event,) = events(corrected, "message_amend", body, actor)
    assert event.message_amended == cp.MessageAmended(
        message_id="msg_1",
        kind=REDACTION,
        policy_reason="GDPR",
        erasure=erasure,
        erased_sequences=sequences,
    )
    state = GROUP.run(corrected, "message_amend", body, actor)
    assert state.messages["msg_1"].erased and state.messages["msg_1"].latest_amendment == REDACTION
    refused = GROUP.refused(state, "message_amend", body, actor)
    assert refused.reason_name == "INVALID_TRANSITION" and "already erased" in refused.message


@pytest.mark.req("MW-7.4-04")
def test_an_erasure_is_also_allowed_after_a_retraction_or_a_masking_redaction() -> None:
    erase = amend(REDACTION, erasure=CE.CONTENT_ERASURE_LEGAL_DELETION, policy_reason="GDPR")
    for first in (amend(RETRACTION), amend(REDACTION, policy_reason="mask")):
        state = GROUP.run(POSTED, "message_amend", first, "worker")
        (event,) = events(state, "message_amend", erase, "alice")
        assert list(event.message_amended.erased_sequences) == POSTED.messages["msg_1"].content_sequences


@pytest.mark.req("MW-7.4-04")
def test_an_erasure_is_a_redaction_by_the_owner_with_a_reason_and_no_content() -> None:
    legal = CE.CONTENT_ERASURE_LEGAL_DELETION
    assert (
        invalid_field(
            amend_decision(CORRECTION, "worker", erasure=legal, corrected_content=content(text="x"))
        )
        == "body.erasure"
    )
    assert invalid_field(amend_decision(REDACTION, "alice", erasure=99, policy_reason="x")) == "body.erasure"
    for actor in ("worker", "coord"):  # the author and the Coordinator mask, only the owner erases
        assert rejection(amend_decision(REDACTION, actor, erasure=legal, policy_reason="x")) == (
            "PERMISSION_DENIED",
            {},
        )
    assert (
        invalid_field(amend_decision(REDACTION, "alice", erasure=legal, policy_reason=" "))
        == "body.policy_reason"
    )
    with_content = amend_decision(
        REDACTION, "alice", erasure=legal, policy_reason="x", corrected_content=content(text="x")
    )
    assert invalid_field(with_content) == "body.corrected_content"


# ---------------------------------------------------------------- what each refusal of an amendment says

RETRACTED = GROUP.run(POSTED, "message_amend", amend(RETRACTION), "worker")
LEGAL = CE.CONTENT_ERASURE_LEGAL_DELETION
AMEND_REFUSALS = [
    (
        RETRACTED,
        CORRECTION,
        "worker",
        {"corrected_content": content(text="x")},
        "message msg_1 was retraction; post a new Message instead",
    ),
    (
        POSTED,
        CORRECTION,
        "alice",
        {"corrected_content": content(text="x")},
        "only the author corrects a Message",
    ),
    (POSTED, RETRACTION, "alice", {}, "only the author retracts a Message"),
    (
        POSTED,
        RETRACTION,
        "worker",
        {"corrected_content": content(text="x")},
        "body.corrected_content: a retraction carries no content",
    ),
    (
        POSTED,
        REDACTION,
        "rev",
        {"policy_reason": "x"},
        "a redaction is made by the author, the MissionOwner, the Coordinator or Organization policy",
    ),
    (
        POSTED,
        REDACTION,
        "alice",
        {"policy_reason": "x", "corrected_content": content(text="x")},
        "body.corrected_content: a redaction masks the Message; it carries no content",
    ),
    (
        POSTED,
        AK.MESSAGE_AMENDMENT_KIND_UNSPECIFIED,
        "worker",
        {},
        "body.kind: correction, retraction or redaction",
    ),
    (
        POSTED,
        CORRECTION,
        "alice",
        {"erasure": LEGAL},
        "body.erasure: erasing content is a kind of redaction (kind REDACTION)",
    ),
    (
        POSTED,
        REDACTION,
        "alice",
        {"erasure": 99, "policy_reason": "x"},
        "body.erasure: SECURITY_REDACTION or LEGAL_DELETION",
    ),
    (
        POSTED,
        REDACTION,
        "coord",
        {"erasure": LEGAL, "policy_reason": "x"},
        "content is erased from history by the MissionOwner or Organization policy",
    ),
    (
        POSTED,
        REDACTION,
        "alice",
        {"erasure": LEGAL, "policy_reason": "x", "corrected_content": content(text="x")},
        "body.corrected_content: an erasure carries no content",
    ),
    (POSTED, CORRECTION, "worker", {"message_id": "msg_9"}, "no message msg_9 in this Group"),
]


@pytest.mark.req("MW-9.1-20", "MW-9.1-21", "MW-7.4-04")
@pytest.mark.parametrize(("state", "kind", "actor", "fields", "message"), AMEND_REFUSALS)
def test_each_refusal_of_an_amendment_says_why(
    state: GroupState, kind: int, actor: str, fields: dict[str, object], message: str
) -> None:
    assert GROUP.refused(state, "message_amend", amend(kind, **fields), actor).message == message


@pytest.mark.req("MW-7.4-04")
def test_a_second_erasure_says_the_content_is_already_erased() -> None:
    erase = amend(REDACTION, erasure=LEGAL, policy_reason="GDPR")
    state = GROUP.run(POSTED, "message_amend", erase, "alice")
    assert (
        GROUP.refused(state, "message_amend", erase, "alice").message
        == "the content of message msg_1 was already erased"
    )


@pytest.mark.req("MW-9-06", "MW-9-09")
def test_each_refusal_of_a_posts_content_says_why() -> None:
    assert GROUP.refused(BASE, "message_post", post(text="a" * (MAX_TEXT_BYTES + 1)), "worker").message == (
        f"body.message_post.content.text exceeds {MAX_TEXT_BYTES} bytes; upload large content to the artifact store and "
        "reference it by hash (MW-9-09)"
    )
    empty = post()
    empty.content.Clear()
    assert GROUP.refused(BASE, "message_post", empty, "worker").message == (
        "body.message_post.content: a Message needs text, data or Artifact references"
    )
    assert (
        GROUP.refused(BASE, "message_post", post(topic="t" * 129), "worker").message
        == "body.message_post.topic: at most 128 characters"
    )
    assert GROUP.refused(BASE, "conversation_open", opening(kind=REVIEW), "alice").message == (
        "body.participant_ids: only restricted Conversations list participants"
    )
    assert GROUP.refused(cancelled(), "conversation_open", opening(), "alice").message.startswith(
        "conversation.open: the Mission is"
    )
