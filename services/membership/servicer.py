"""MembershipService over gRPC: identities and sessions (Organization policy, MW-8-04)."""

from __future__ import annotations

import grpc

from missionweave.errors import R, Rejected
from missionweave.rpc.status import abort_with
from missionweave.v1 import membership_service_pb2 as pb
from missionweave.v1 import membership_service_pb2_grpc as pb_grpc
from services.authority.authority import GroupAuthority
from services.authority.views import group_state_proto
from services.membership.registry import IdentityRegistry


class MembershipServicer(pb_grpc.MembershipServiceServicer):
    def __init__(self, registry: IdentityRegistry, authority: GroupAuthority | None = None) -> None:
        self.registry = registry
        self.authority = authority

    async def RegisterIdentity(
        self, request: pb.RegisterIdentityRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterIdentityResponse:
        try:
            record = await self.registry.register(request.command)
        except Rejected as rejected:
            await abort_with(context, rejected)
        return pb.RegisterIdentityResponse(identity=record.to_proto())

    async def OpenSession(self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext) -> pb.OpenSessionResponse:
        try:
            session = await self.registry.open_session(request.command)
        except Rejected as rejected:
            await abort_with(context, rejected)
        return pb.OpenSessionResponse(session=session)

    async def GetIdentity(self, request: pb.GetIdentityRequest, context: grpc.aio.ServicerContext) -> pb.GetIdentityResponse:
        record = await self.registry.get(request.identity_id)
        if record is None:
            await abort_with(context, Rejected(R.REJECTION_REASON_UNKNOWN_IDENTITY, f"{request.identity_id!r} is not registered"))
        return pb.GetIdentityResponse(identity=record.to_proto())

    async def ListMemberships(
        self, request: pb.ListMembershipsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMembershipsResponse:
        if not request.group_id:
            # Cross-Group listing needs a membership index; until then say so instead of scanning.
            await abort_with(
                context,
                Rejected(R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED, "listing by member alone is not implemented yet; pass group_id"),
            )
        state = await self.authority.state(request.group_id) if self.authority else None
        if state is None:
            await abort_with(context, Rejected(R.REJECTION_REASON_GROUP_NOT_FOUND, f"group {request.group_id} does not exist"))
        memberships = [
            m for m in group_state_proto(state).memberships if not request.member_id or m.member_id == request.member_id
        ]
        return pb.ListMembershipsResponse(memberships=memberships)
