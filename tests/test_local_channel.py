"""In-process calls through generated stubs behave like calls over the network (issue 12: a call
between services in one process may skip the network, as long as the caller knows only the contract)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.transport import open_channel
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import authority_service_pb2_grpc as apb_grpc
from missionweave.v1 import membership_pb2
from missionweave.v1 import membership_service_pb2 as mpb
from missionweave.v1 import membership_service_pb2_grpc as mpb_grpc
from missionweave_server.edge.channels import add_listener
from missionweave_server.edge.local import LocalChannel
from missionweave_server.edge.status import rejections_as_status

MEMBERSHIP = mpb.DESCRIPTOR.services_by_name["MembershipService"].full_name
AUTHORITY = apb.DESCRIPTOR.services_by_name["AuthorityService"].full_name


@rejections_as_status
class Membership(mpb_grpc.MembershipServiceServicer):
    async def GetIdentity(
        self, request: mpb.GetIdentityRequest, context: grpc.aio.ServicerContext
    ) -> mpb.GetIdentityResponse:
        if request.identity_id != "alice":
            raise Rejected(
                R.REJECTION_REASON_UNKNOWN_IDENTITY,
                f"{request.identity_id!r} is not registered",
                retry_after_ms=5,
            )
        return mpb.GetIdentityResponse(identity=membership_pb2.Identity(identity_id="alice"))


@rejections_as_status
class Authority(apb_grpc.AuthorityServiceServicer):
    async def ReadEvents(
        self, request: apb.ReadEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[apb.ReadEventsResponse]:
        for head in (1, 2):
            yield apb.ReadEventsResponse(head_sequence=head)
        raise Rejected(R.REJECTION_REASON_NOT_FOUND, "events after 2 are not available online")


@pytest.fixture
async def channels() -> AsyncIterator[dict[str, object]]:
    """The same servicers behind a LocalChannel and behind a real gRPC server on loopback."""
    local = LocalChannel()
    local.register(MEMBERSHIP, Membership())
    local.register(AUTHORITY, Authority())
    server = grpc.aio.server()
    mpb_grpc.add_MembershipServiceServicer_to_server(Membership(), server)
    apb_grpc.add_AuthorityServiceServicer_to_server(Authority(), server)
    port = add_listener(server, "127.0.0.1:0", None)
    await server.start()
    remote = open_channel(f"127.0.0.1:{port}")
    yield {"local": local, "remote": remote}
    await remote.close()
    await server.stop(None)


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_unary_answer_and_a_rejection_look_the_same_in_process_and_over_the_network(
    channels: dict[str, object], kind: str
) -> None:
    stub = mpb_grpc.MembershipServiceStub(channels[kind])
    answer = await stub.GetIdentity(mpb.GetIdentityRequest(identity_id="alice"))
    assert answer.identity.identity_id == "alice"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetIdentity(mpb.GetIdentityRequest(identity_id="mallory"))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details() == "'mallory' is not registered"
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_UNKNOWN_IDENTITY
    assert dict(rejection.metadata) == {"retry_after_ms": "5"}


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_stream_delivers_its_answers_then_its_rejection(
    channels: dict[str, object], kind: str
) -> None:
    stub = apb_grpc.AuthorityServiceStub(channels[kind])
    seen = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for answer in stub.ReadEvents(apb.ReadEventsRequest(group_id="g")):
            seen.append(answer.head_sequence)
    assert seen == [1, 2]
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_NOT_FOUND


@pytest.mark.parametrize("kind", ["local", "remote"])
async def test_a_method_nobody_serves_is_unimplemented(channels: dict[str, object], kind: str) -> None:
    stub = mpb_grpc.MembershipServiceStub(channels[kind])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.OpenSession(mpb.OpenSessionRequest())
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_servicer_registered_after_the_stub_was_built_answers() -> None:
    local = LocalChannel()
    stub = mpb_grpc.MembershipServiceStub(local)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetIdentity(mpb.GetIdentityRequest(identity_id="alice"))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    local.register(MEMBERSHIP, Membership())
    assert (
        await stub.GetIdentity(mpb.GetIdentityRequest(identity_id="alice"))
    ).identity.identity_id == "alice"


async def test_an_in_process_call_past_its_deadline_fails_with_deadline_exceeded() -> None:
    import asyncio

    class Slow(mpb_grpc.MembershipServiceServicer):
        async def GetIdentity(
            self, request: mpb.GetIdentityRequest, context: grpc.aio.ServicerContext
        ) -> mpb.GetIdentityResponse:
            await asyncio.sleep(5)
            return mpb.GetIdentityResponse()

    local = LocalChannel()
    local.register(MEMBERSHIP, Slow())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await mpb_grpc.MembershipServiceStub(local).GetIdentity(mpb.GetIdentityRequest(), timeout=0.05)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
