"""MembershipService: Organization identities and sessions over gRPC."""

from __future__ import annotations

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import open_session_envelope, register_identity_envelope
from missionweave.v1 import common_pb2, membership_pb2, membership_service_pb2
from tests import builders
from tests.conftest import World

R = common_pb2.RejectionReason


async def rejection(call: object) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    out = rejection_from_rpc_error(info.value)
    assert out is not None
    return out


@pytest.mark.req("MW-8-04")
async def test_identity_registration_is_authorized_by_organization_policy(world: World) -> None:
    """MW-8-04: an Organization command, signed by an admin, never by a Group Membership."""
    key = SigningKey.generate()
    ident = membership_pb2.Identity(
        identity_id="carol", kind=common_pb2.IDENTITY_KIND_HUMAN, public_key=bytes(key.verify_key)
    )
    # Alice is a registered human but not an Organization admin.
    env = register_identity_envelope("alice", world.owner.key, ident)
    r = await rejection(
        world.client.membership.RegisterIdentity(membership_service_pb2.RegisterIdentityRequest(command=env))
    )
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
    # A forged admin signature.
    forged = register_identity_envelope("admin", SigningKey.generate(), ident)
    r = await rejection(
        world.client.membership.RegisterIdentity(
            membership_service_pb2.RegisterIdentityRequest(command=forged)
        )
    )
    assert r.reason == R.REJECTION_REASON_SIGNATURE_INVALID
    good = register_identity_envelope("admin", world.keys["admin"], ident, request_id="req_carol")
    first = await world.client.membership.RegisterIdentity(
        membership_service_pb2.RegisterIdentityRequest(command=good)
    )
    again = await world.client.membership.RegisterIdentity(
        membership_service_pb2.RegisterIdentityRequest(command=good)
    )
    assert first.identity == again.identity  # idempotent by request id
    dup = register_identity_envelope("admin", world.keys["admin"], ident)
    r = await rejection(
        world.client.membership.RegisterIdentity(membership_service_pb2.RegisterIdentityRequest(command=dup))
    )
    assert r.reason == R.REJECTION_REASON_IDENTITY_EXISTS


async def test_registration_validates_fields(world: World) -> None:
    for ident, field in [
        (
            membership_pb2.Identity(
                identity_id="bad id", kind=common_pb2.IDENTITY_KIND_AGENT, public_key=b"k" * 32
            ),
            "identity_id",
        ),
        (membership_pb2.Identity(identity_id="dave", public_key=b"k" * 32), "kind"),
        (
            membership_pb2.Identity(
                identity_id="dave", kind=common_pb2.IDENTITY_KIND_AGENT, public_key=b"short"
            ),
            "public_key",
        ),
    ]:
        env = register_identity_envelope("admin", world.keys["admin"], ident)
        r = await rejection(
            world.client.membership.RegisterIdentity(
                membership_service_pb2.RegisterIdentityRequest(command=env)
            )
        )
        assert r.reason == R.REJECTION_REASON_MALFORMED and r.metadata["field"] == field


async def test_open_session_raises_epoch_and_refuses_replays(world: World) -> None:
    key = world.owner.key
    env = open_session_envelope("alice", key, bytes(key.verify_key))
    first = await world.client.membership.OpenSession(membership_service_pb2.OpenSessionRequest(command=env))
    assert first.session.session_epoch == world.owner.session_epoch + 1
    r = await rejection(
        world.client.membership.OpenSession(membership_service_pb2.OpenSessionRequest(command=env))
    )
    assert r.reason == R.REJECTION_REASON_COMMAND_ID_REUSED
    stranger = open_session_envelope("alice", SigningKey.generate(), bytes(key.verify_key))
    r = await rejection(
        world.client.membership.OpenSession(membership_service_pb2.OpenSessionRequest(command=stranger))
    )
    assert r.reason == R.REJECTION_REASON_SIGNATURE_INVALID
    ident = await world.client.membership.GetIdentity(
        membership_service_pb2.GetIdentityRequest(identity_id="alice")
    )
    assert ident.identity.session_epoch == first.session.session_epoch
    assert ident.identity.kind == common_pb2.IDENTITY_KIND_HUMAN


async def test_list_memberships_reads_the_group_through_the_authority_contract(world: World) -> None:
    """ListMemberships asks the Authority (AuthorityService.GetGroupState) for the Group's state."""
    await world.run(
        world.owner,
        "grp_lm",
        "mission_create",
        builders.mission_create("alice", "coord-bot", world.clock.now()),
    )
    request = membership_service_pb2.ListMembershipsRequest
    listed = await world.client.membership.ListMemberships(request(group_id="grp_lm"))
    assert {m.member_id for m in listed.memberships} == {"alice", "coord-bot"}
    assert all(m.group_id == "grp_lm" and m.active for m in listed.memberships)
    only = await world.client.membership.ListMemberships(request(group_id="grp_lm", member_id="coord-bot"))
    assert [m.member_id for m in only.memberships] == ["coord-bot"]
    r = await rejection(world.client.membership.ListMemberships(request(group_id="grp_missing")))
    assert r.reason == R.REJECTION_REASON_GROUP_NOT_FOUND
    r = await rejection(world.client.membership.ListMemberships(request(member_id="alice")))
    assert r.reason == R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED
