"""Context Packages (spec 13.3) through AuthorityService.GetContextPackage."""

from __future__ import annotations

import grpc
import pytest

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import verify_signature
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import authority_service_pb2 as pb
from missionweave.v1 import common_pb2
from missionweave_server.services.authority.context_package import CONTEXT_PACKAGE_TYPE
from tests import builders
from tests.conftest import World
from tests.test_missions import G
from tests.test_work_items import setup


async def package(w: World, **kw: object) -> tuple[common_pb2.SignedEnvelope, apb.ContextPackage]:
    request = pb.GetContextPackageRequest(
        group_id=G, purpose=apb.CONTEXT_PACKAGE_PURPOSE_COORDINATOR_HANDOVER, **kw
    )  # type: ignore[arg-type]
    envelope = (await w.client.authority.GetContextPackage(request)).package
    return envelope, apb.ContextPackage.FromString(envelope.payload)


@pytest.mark.req("MW-13.3-02", "MW-13.3-01", "MW-13.3-04", "MW-13.3-05", "MW-7.2-07")
async def test_signed_versioned_scoped_packages_of_the_groups_own_content(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    await f.authorize("wi-2")
    group = await w.mesh.authority.state(G)  # type: ignore[attr-defined]
    question = builders.message(group.work_items["wi-1"].conversation_id, "EU or global?")
    question.topic = "ambiguity"
    await f.as_(w.worker, "message_post", question)
    envelope, first = await package(w, work_item_ids=["wi-1"], recipient_ids=["coord-bot"])
    key_id, public_key = await w.client.authority_key()
    assert envelope.payload_type == CONTEXT_PACKAGE_TYPE and verify_signature(envelope, public_key)
    # MW-13.3-02: scope, source events, artifacts, decisions, constraints, open questions, generator, time.
    assert (
        first.mission_id == "mis_lifecycle" and list(first.work_item_ids) == ["wi-1"] and first.version == 1
    )
    head = (await w.client.group_state(G)).head_sequence
    assert [(r.group_id, r.first_sequence, r.last_sequence) for r in first.source_event_ranges] == [
        (G, 1, head)
    ]
    assert [q.question for q in first.open_questions] and first.constraints and first.generator_id == key_id
    assert first.HasField("generated_at") and first.signer_key_id == key_id
    # MW-13.3-04: an update is a new version linked to the previous one.
    _, second = await package(w, work_item_ids=["wi-1"], previous_version=envelope)
    assert second.version == 2 and second.context_package_id == first.context_package_id
    assert second.previous_version.hex and second.previous_version.size_bytes == len(envelope.payload)
    # A previous version not signed by this Authority is refused.
    forged = common_pb2.SignedEnvelope()
    forged.CopyFrom(envelope)
    forged.signatures[0].sig = bytes(64)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await package(w, previous_version=forged)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == common_pb2.REJECTION_REASON_SIGNATURE_INVALID
    # MW-13.3-05: the Group's content does not go into another Group's context by default.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await package(w, target_group_id="grp_elsewhere")
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == common_pb2.REJECTION_REASON_PERMISSION_DENIED


@pytest.mark.req("MW-13.3-05", "MW-13.3-07")
async def test_cross_group_transfer_needs_the_owners_recorded_authorization_within_its_scope(
    world: World,
) -> None:
    from missionweave.sdk.client import decode_events
    from missionweave.v1 import mission_pb2
    from tests.conftest import register
    from tests.test_missions import create, refused

    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    await f.authorize("wi-2")
    await create(w, "grp_next")  # another Mission of the same owner (alice)
    R = common_pb2.RejectionReason

    def grant(
        target: str, *work_items: str, reason: str = "reuse the EU findings"
    ) -> mission_pb2.MissionAuthorizeContextTransfer:
        return mission_pb2.MissionAuthorizeContextTransfer(
            target_group_id=target, work_item_ids=list(work_items), reason=reason
        )

    async def refused_package(**kw: object) -> int:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await package(w, **kw)
        rejection = rejection_from_rpc_error(info.value)
        assert rejection is not None
        return rejection.reason

    # Refusals write nothing: not the owner, no reason, unknown target, a target someone else owns.
    kind = "mission_authorize_context_transfer"
    await refused(
        w, w.coordinator, G, kind, grant("grp_next"), R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=2
    )
    await refused(
        w,
        w.owner,
        G,
        kind,
        grant("grp_next", reason=""),
        R.REJECTION_REASON_INVALID_ARGUMENT,
        membership_epoch=1,
    )
    await refused(w, w.owner, G, kind, grant("grp_nowhere"), R.REJECTION_REASON_NOT_FOUND, membership_epoch=1)
    bob = await register(w.client, w.keys["admin"], "bob", common_pb2.IDENTITY_KIND_HUMAN)
    await w.run(
        bob, "grp_theirs", "mission_create", builders.mission_create("bob", "coord-bot", w.clock.now())
    )
    await refused(
        w, w.owner, G, kind, grant("grp_theirs"), R.REJECTION_REASON_PERMISSION_DENIED, membership_epoch=1
    )
    # Without an authorization: refused by default (MW-13.3-05).
    assert await refused_package(target_group_id="grp_next") == R.REJECTION_REASON_PERMISSION_DENIED

    authorized = decode_events(
        (await w.run(w.owner, G, kind, grant("grp_next", "wi-1"), membership_epoch=1)).events
    )[0]
    assert authorized.type == "mission.context_transfer.authorized"  # the audit record (MW-13.3-07)
    auth_id = authorized.event_id
    envelope, moved = await package(
        w, target_group_id="grp_next", transfer_authorization_event_id=auth_id, work_item_ids=["wi-1"]
    )
    assert moved.target_group_id == "grp_next" and moved.transfer_authorization_event_id == auth_id
    _, public_key = await w.client.authority_key()
    assert verify_signature(envelope, public_key)
    # Beyond the authorized scope, or for another target, or citing something else: refused.
    assert (
        await refused_package(target_group_id="grp_next", transfer_authorization_event_id=auth_id)
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    assert (
        await refused_package(
            target_group_id="grp_next", transfer_authorization_event_id=auth_id, work_item_ids=["wi-2"]
        )
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    assert (
        await refused_package(
            target_group_id="grp_theirs", transfer_authorization_event_id=auth_id, work_item_ids=["wi-1"]
        )
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
    assert (
        await refused_package(
            target_group_id="grp_next",
            transfer_authorization_event_id="evt_not_an_authorization",
            work_item_ids=["wi-1"],
        )
        == R.REJECTION_REASON_PERMISSION_DENIED
    )
