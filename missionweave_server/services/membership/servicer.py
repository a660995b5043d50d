"""MembershipService over gRPC: identities and sessions (Organization policy, MW-8-04), Agent
Cards and Presence (MW-11.1-13/14, ``missionweave_server/services/membership/cards.py``).

Group memberships live in the Groups' logs: ListMemberships reads a Group's state from the
Authority through its public contract (AuthorityService.GetGroupState).
"""

from __future__ import annotations

import grpc

from missionweave.kernel.errors import R, Rejected, from_proto
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import authority_service_pb2, authority_service_pb2_grpc
from missionweave.v1 import membership_service_pb2 as pb
from missionweave.v1 import membership_service_pb2_grpc as pb_grpc
from missionweave_server.edge.callers import Access, CallAuthenticator, Caller, requires
from missionweave_server.edge.paging import decode_token, encode_token, page_size
from missionweave_server.edge.status import peer_unavailable, rejections_as_status
from missionweave_server.services.membership.cards import AgentCards
from missionweave_server.services.membership.directory import IdentityDirectoryServicer
from missionweave_server.services.membership.registry import IdentityRegistry

# Bound on the Authority call behind ListMemberships: an unreachable Authority is a structured,
# retryable answer, never a hang.
AUTHORITY_CALL_TIMEOUT_S = 5.0


@rejections_as_status
class MembershipServicer(pb_grpc.MembershipServiceServicer):
    SERVICE = "missionweave.v1.MembershipService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave_server/mesh/server.py)

    def __init__(
        self,
        registry: IdentityRegistry,
        directory: IdentityDirectoryServicer | None = None,
        authority: authority_service_pb2_grpc.AuthorityServiceAsyncStub | None = None,
    ) -> None:
        self.registry = registry
        self.cards = AgentCards(registry)
        self.directory = directory
        self.authority = authority

    @requires(Access.SIGNED)
    async def RegisterIdentity(
        self, request: pb.RegisterIdentityRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterIdentityResponse:
        record = await self.registry.register(request.command)
        return pb.RegisterIdentityResponse(identity=record.to_proto())

    @requires(Access.SIGNED)
    async def OpenSession(
        self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpenSessionResponse:
        session, revision = await self.registry.open_session(request.command)
        if self.directory is not None:
            # The services following the directory learn of the new session before its holder can
            # use it: the older session is fenced at once everywhere (MW-11.3-09).
            await self.directory.delivered(revision)
        return pb.OpenSessionResponse(session=session)

    @requires(Access.IDENTITY)
    async def GetIdentity(
        self, request: pb.GetIdentityRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetIdentityResponse:
        record = await self.registry.get(request.identity_id)
        if record is None:
            raise Rejected(
                R.REJECTION_REASON_UNKNOWN_IDENTITY,
                f"{request.identity_id!r} is not registered",
                field="identity_id",
            )
        return pb.GetIdentityResponse(identity=record.to_proto())

    @requires(Access.IDENTITY)
    async def ListIdentities(
        self, request: pb.ListIdentitiesRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.ListIdentitiesResponse:
        if not caller.operator:
            raise Rejected(
                R.REJECTION_REASON_PERMISSION_DENIED,
                "listing identities is an operator call (an Organization administrator or policy identity)",
            )
        size = page_size(request.page_size)
        after = decode_token("id", request.page_token)
        records = await self.registry.identities_after(after, size + 1)
        page = records[:size]
        return pb.ListIdentitiesResponse(
            identities=[r.to_proto() for r in page],
            next_page_token=encode_token("id", page[-1].identity_id) if len(records) > size else "",
        )

    @requires(Access.IDENTITY)
    async def ListMemberships(
        self, request: pb.ListMembershipsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.ListMembershipsResponse:
        if not request.group_id and not request.member_id:
            raise Rejected(R.REJECTION_REASON_MALFORMED, "group_id is required", field="group_id")
        if not request.group_id:
            # Cross-Group listing needs a membership index; until then say so instead of scanning.
            raise Rejected(
                R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED,
                "listing by member alone is not implemented yet; pass group_id",
            )
        if self.authority is None:
            raise peer_unavailable(
                "authority",
                "the Authority is not reachable from this Membership instance (MWP_AUTHORITY_ADDR is not set)",
            )
        try:
            response = await self.authority.GetGroupState(
                authority_service_pb2.GetGroupStateRequest(group_id=request.group_id),
                timeout=AUTHORITY_CALL_TIMEOUT_S,
                wait_for_ready=True,  # an Authority reconnecting is waited for, within the deadline
            )
        except grpc.RpcError as err:
            refused = rejection_from_rpc_error(err)
            if (
                refused is not None
                and refused.reason == R.REJECTION_REASON_GROUP_NOT_FOUND
                and not caller.operator
            ):
                # As for the Group's own reads: a non-member learns nothing, not even that it is missing.
                raise Rejected(
                    R.REJECTION_REASON_NOT_A_MEMBER,
                    f"{caller.identity_id} holds no active Membership in {request.group_id}",
                ) from None
            if refused is not None:  # the Authority's own answer, passed on
                raise from_proto(refused) from None
            raise peer_unavailable("authority", err) from None
        if not caller.operator and not any(
            m.member_id == caller.identity_id and m.active for m in response.state.memberships
        ):  # the same rule as the Group's other reads: members and operators only
            raise Rejected(
                R.REJECTION_REASON_NOT_A_MEMBER,
                f"{caller.identity_id} holds no active Membership in {request.group_id}",
            )
        memberships = [
            m for m in response.state.memberships if not request.member_id or m.member_id == request.member_id
        ]
        return pb.ListMembershipsResponse(memberships=memberships)

    # ------------------------------------------------------------ Agent Cards and Presence

    @requires(Access.IDENTITY)
    async def PublishAgentCard(
        self, request: pb.PublishAgentCardRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.PublishAgentCardResponse:
        published, replayed, revision = await self.cards.publish(request.card, caller)
        if self.directory is not None:
            # The services that keep cards in force drop this agent's before it is told the new
            # version took effect: the next offer or acceptance checks against it.
            await self.directory.delivered(revision)
        return pb.PublishAgentCardResponse(published=published, replayed=replayed)

    @requires(Access.IDENTITY)
    async def GetAgentCard(
        self, request: pb.GetAgentCardRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetAgentCardResponse:
        published, latest = await self.cards.get(request.agent_id, request.card_version)
        return pb.GetAgentCardResponse(published=published, latest_version=latest)

    @requires(Access.IDENTITY)
    async def ListAgentCardVersions(
        self, request: pb.ListAgentCardVersionsRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.ListAgentCardVersionsResponse:
        versions, token = await self.cards.versions(request.agent_id, request.page_size, request.page_token)
        return pb.ListAgentCardVersionsResponse(versions=versions, next_page_token=token)

    @requires(Access.IDENTITY)
    async def ReportPresence(
        self, request: pb.ReportPresenceRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.ReportPresenceResponse:
        return pb.ReportPresenceResponse(presence=await self.cards.report_presence(request.report, caller))

    @requires(Access.IDENTITY)
    async def GetPresence(
        self, request: pb.GetPresenceRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.GetPresenceResponse:
        return pb.GetPresenceResponse(presences=await self.cards.presence(list(request.agent_ids)))
