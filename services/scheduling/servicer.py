"""SchedulingService until its issue lands: every RPC proves its caller like any other, then
answers UNIMPLEMENTED with a structured reason (COMMAND_NOT_IMPLEMENTED), never a traceback."""

from __future__ import annotations

import grpc

from missionweave.errors import R, Rejected
from missionweave.rpc.callers import Access, CallAuthenticator, Caller, requires
from missionweave.rpc.status import rejections_as_status
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave.v1 import scheduling_service_pb2_grpc as pb_grpc


def _not_yet(method: str) -> Rejected:
    return Rejected(R.REJECTION_REASON_COMMAND_NOT_IMPLEMENTED, f"SchedulingService.{method} is not implemented yet")


@rejections_as_status
class SchedulingServicer(pb_grpc.SchedulingServiceServicer):
    SERVICE = "missionweave.v1.SchedulingService"
    callers: CallAuthenticator | None = None  # set by the mesh (missionweave/mesh/server.py)

    @requires(Access.IDENTITY)
    async def Admit(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.AdmitResponse:
        raise _not_yet("Admit")

    @requires(Access.IDENTITY)
    async def GetQueue(self, request: pb.GetQueueRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.GetQueueResponse:
        raise _not_yet("GetQueue")

    @requires(Access.IDENTITY)
    async def NextSlot(self, request: pb.NextSlotRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.NextSlotResponse:
        raise _not_yet("NextSlot")

    @requires(Access.IDENTITY)
    async def ReleaseSlot(self, request: pb.ReleaseSlotRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.ReleaseSlotResponse:
        raise _not_yet("ReleaseSlot")

    @requires(Access.IDENTITY)
    async def DiscloseSchedule(self, request: pb.DiscloseScheduleRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.DiscloseScheduleResponse:
        raise _not_yet("DiscloseSchedule")

    @requires(Access.IDENTITY)
    async def SetPriority(self, request: pb.SetPriorityRequest, context: grpc.aio.ServicerContext, caller: Caller) -> pb.SetPriorityResponse:
        raise _not_yet("SetPriority")
