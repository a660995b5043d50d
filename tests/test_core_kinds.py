"""Pure core: every command kind is declared once (missionweave_server/services/authority/kinds.py), and what the decider
and the shell read from the declarations."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.errors import Rejected
from missionweave.v1 import (
    command_pb2,
    common_pb2,
    conversation_pb2,
    event_pb2,
    membership_pb2,
    mission_pb2,
    work_pb2,
)
from missionweave_server.services.authority import decider, kinds
from missionweave_server.services.authority.rules import authorization
from missionweave_server.services.authority.rules.common import CommandKind, DecisionContext
from missionweave_server.services.authority.state import GroupState, IdentityInfo
from tests import builders

R = common_pb2.RejectionReason
MS = mission_pb2.MissionState
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CTX = DecisionContext(
    NOW,
    {
        "alice": IdentityInfo("alice", common_pb2.IDENTITY_KIND_HUMAN, session_epoch=1),
        "coord": IdentityInfo("coord", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1),
    },
)
COMMAND_BODY = command_pb2.Command.DESCRIPTOR.oneofs_by_name["body"]
EVENT_PAYLOAD = event_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"]
# Events of the delegation kinds, which are in the contract but not implemented yet.


def cmd(
    body_field: str, body: object, group: str = "grp_test", actor: str = "alice", epoch: int = 0
) -> command_pb2.Command:
    c = command_pb2.Command(
        command_id="cmd_1",
        group_id=group,
        actor_id=actor,
        session_epoch=1,
        membership_epoch=epoch,
        issued_at=to_timestamp(NOW),
    )
    getattr(c, body_field).CopyFrom(body)
    return c


def created() -> GroupState:
    decision = decider.decide(
        None, cmd("mission_create", builders.mission_create("alice", "coord", NOW)), CTX
    )
    assert not isinstance(decision, Rejected)
    state = decider.fold(decision)
    assert state is not None
    return state


def test_every_command_body_in_command_proto_has_exactly_one_declaration() -> None:
    assert command_pb2.Command.DESCRIPTOR.file.name == "missionweave/v1/command.proto"
    declared = Counter(kind.body for kind in kinds.DECLARED)
    assert {body: n for body, n in declared.items() if n != 1} == {}
    assert set(declared) == {f.name for f in COMMAND_BODY.fields}
    assert all(callable(kind.handler) for kind in kinds.KINDS.values())


def test_every_event_payload_has_exactly_one_evolve_rule_declared_beside_a_kind() -> None:
    declared = Counter(payload for kind in kinds.DECLARED for payload in kind.appliers)
    assert {payload: n for payload, n in declared.items() if n != 1} == {}
    assert set(declared) == {f.name for f in EVENT_PAYLOAD.fields}


def _handler(state: object, command: object, ctx: object, out: object) -> None:
    """A handler for declarations that are only indexed, never run."""


def test_a_kind_or_an_evolve_rule_declared_twice_is_refused() -> None:
    first = CommandKind("message_post", _handler, {"message_posted": lambda s, e: None})
    with pytest.raises(ValueError, match="declared twice"):
        kinds.index([first, CommandKind("message_post", _handler)])
    with pytest.raises(ValueError, match="two evolve rules"):
        kinds.index([first, CommandKind("message_amend", _handler, {"message_posted": lambda s, e: None})])


def test_a_body_without_a_declaration_is_an_unknown_command_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    state = created()
    post = cmd("message_post", builders.message(state.conversations.popitem()[0]), epoch=1)
    monkeypatch.delitem(kinds.KINDS, "message_post")  # type: ignore[arg-type]
    rejected = decider.decide(state, post, CTX)
    assert isinstance(rejected, Rejected) and rejected.reason == R.REJECTION_REASON_UNKNOWN_COMMAND_KIND


def test_the_declared_facts_of_the_kinds() -> None:
    k = kinds.KINDS.values()
    assert {x.body for x in k if x.creates_group} == {
        "mission_create",
        "mission_create_follow_up",
        "mission_create_child",
    }
    assert {x.body: x.ends_mission for x in k if x.ends_mission} == {
        "mission_cancel": MS.MISSION_STATE_CANCELLED,
        "mission_terminate": MS.MISSION_STATE_FAILED,
    }
    assert {x.body for x in k if authorization.may_act_for_organization(x.body)} == {
        "mission_create",
        "mission_cancel",
        "mission_terminate",
        "mission_replace_coordinator",
        "mission_approve_child_depth",
    }


def test_referenced_identities_are_the_actor_and_those_the_body_names() -> None:
    create = builders.mission_create("owner", "coord", NOW)
    follow_up = mission_pb2.MissionCreateFollowUp(definition=create.definition, coordinator_id="coord2")
    replace = mission_pb2.MissionReplaceCoordinator(coordinator_id="coord3")
    grant = membership_pb2.MembershipGrant(member_id="worker")
    assert kinds.referenced_identities(cmd("mission_create", create, actor="ops")) == {
        "ops",
        "owner",
        "coord",
    }
    assert kinds.referenced_identities(cmd("mission_create_follow_up", follow_up)) == {
        "alice",
        "owner",
        "coord2",
    }
    assert kinds.referenced_identities(cmd("mission_replace_coordinator", replace)) == {"alice", "coord3"}
    assert kinds.referenced_identities(cmd("membership_grant", grant)) == {"alice", "worker"}
    assert kinds.referenced_identities(cmd("message_post", builders.message("conv"))) == {"alice"}
    assert kinds.referenced_identities(command_pb2.Command(actor_id="alice")) == {"alice"}


def test_linked_groups_are_other_valid_groups_the_body_names() -> None:
    follow_up = mission_pb2.MissionCreateFollowUp(approved_group_id="grp_approved")
    revoke = mission_pb2.MissionRevokeApproval(follow_up_group_id="grp_follow")
    transfer = mission_pb2.MissionAuthorizeContextTransfer(target_group_id="grp_target")
    assert kinds.linked_groups(cmd("mission_create_follow_up", follow_up)) == ["grp_approved"]
    assert kinds.linked_groups(cmd("mission_revoke_approval", revoke)) == ["grp_follow"]
    assert kinds.linked_groups(cmd("mission_authorize_context_transfer", transfer)) == ["grp_target"]
    assert (
        kinds.linked_groups(cmd("mission_authorize_context_transfer", transfer, group="grp_target")) == []
    )  # itself
    assert (
        kinds.linked_groups(
            cmd("mission_revoke_approval", mission_pb2.MissionRevokeApproval(follow_up_group_id="no way"))
        )
        == []
    )
    assert kinds.linked_groups(cmd("mission_revoke_approval", mission_pb2.MissionRevokeApproval())) == []
    assert kinds.linked_groups(cmd("message_post", builders.message("conv"))) == []


def test_the_published_artifact_is_a_well_formed_blake3_reference_of_a_publication() -> None:
    publish = work_pb2.WorkPublishArtifact(work_item_id="wi_1", artifact=builders.artifact("b"))
    found = kinds.published_artifact(cmd("work_publish_artifact", publish))
    assert found is not None and found.artifact.digest.hex == "b" * 64 and found.work_item_id == "wi_1"
    sha = work_pb2.WorkPublishArtifact(work_item_id="wi_1", artifact=builders.artifact("b"))
    sha.artifact.digest.algorithm = "sha256"
    assert kinds.published_artifact(cmd("work_publish_artifact", sha)) is None
    bad = work_pb2.WorkPublishArtifact(work_item_id="wi_1", artifact=builders.artifact("b"))
    bad.artifact.digest.hex = "not/an id"
    assert kinds.published_artifact(cmd("work_publish_artifact", bad)) is None
    assert kinds.published_artifact(cmd("message_post", builders.message("conv"))) is None


def test_only_an_amendment_with_an_erasure_erases() -> None:
    AK, CE = conversation_pb2.MessageAmendmentKind, conversation_pb2.ContentErasure
    redaction = conversation_pb2.MessageAmend(
        message_id="m", kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION, policy_reason="x"
    )
    erasure = conversation_pb2.MessageAmend(
        message_id="m", kind=AK.MESSAGE_AMENDMENT_KIND_REDACTION, erasure=CE.CONTENT_ERASURE_LEGAL_DELETION
    )
    assert kinds.erases(cmd("message_amend", erasure))
    assert not kinds.erases(cmd("message_amend", redaction))
    assert not kinds.erases(cmd("message_post", builders.message("conv")))
    assert not kinds.erases(command_pb2.Command())
