"""COMMAND over the stream: a signed command forwarded to the Group Authority, its RESULT back.

The gateway does not verify or decide a command: it checks only that the frame's command id is the
signed command's (so a RESULT can never answer another command), forwards it as
``AuthorityService.ExecuteCommand`` bounded by ``authority_calls.COMMAND_TIMEOUT_S``, and sends the
Authority's result or Rejection as RESULT. No answer at all is AUTHORITY_UNAVAILABLE, after which a
retry with the same command id is safe. Each COMMAND is answered in its own task
(``connection.py``), so the stream goes on reading meanwhile.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError

from missionweave.kernel.errors import Rejected
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import authority_service_pb2, command_pb2, common_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from missionweave_server.services.gateway import authority_calls
from missionweave_server.services.gateway.authority_calls import unavailable_rejection
from missionweave_server.services.gateway.stream import Stream

R = common_pb2.RejectionReason
E = pb.GatewayErrorCode


class Commands(Stream):
    """A stream's COMMAND frames."""

    async def command(self, frame: pb.CommandFrame) -> None:
        """Forward to the Group Authority (AuthorityService.ExecuteCommand); its Rejection, read back
        from the status, is the RESULT. No answer at all is AUTHORITY_UNAVAILABLE: the command may
        or may not have been applied, and a retry with the same command id is safe.

        The frame's command id must be the signed command's: checked before anything is forwarded
        (the command is not verified here, only read for its id; the Authority verifies it)."""
        try:
            signed_id = command_pb2.Command.FromString(frame.command.payload).command_id
        except DecodeError:
            await self.error(
                E.GATEWAY_ERROR_CODE_MALFORMED_FRAME,
                "the command's payload is not a missionweave.v1.Command",
                command_id=frame.command_id,
                rejection=Rejected(
                    R.REJECTION_REASON_MALFORMED,
                    "the command's payload is not a missionweave.v1.Command",
                    field="command.payload",
                ).to_proto(),
            )
            return
        if signed_id != frame.command_id:
            await self.error(
                E.GATEWAY_ERROR_CODE_COMMAND_ID_MISMATCH,
                f"the frame's command id {frame.command_id!r} is not the signed command's ({signed_id!r}); nothing was executed",
                command_id=frame.command_id,
            )
            return
        request = authority_service_pb2.ExecuteCommandRequest(command=frame.command)
        try:
            response = await self.gateway.commands.ExecuteCommand(
                request, timeout=authority_calls.COMMAND_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            rejection = rejection_from_rpc_error(err)
            if rejection is None:
                message = f"the Group Authority did not answer ({err.code().name}: {err.details()}); retry with the same command id"
                await self.error(
                    E.GATEWAY_ERROR_CODE_AUTHORITY_UNAVAILABLE,
                    message,
                    command_id=frame.command_id,
                    rejection=unavailable_rejection(message),
                )
                return
            await self.send(result=pb.ResultFrame(command_id=frame.command_id, rejection=rejection))
            return
        await self.send(result=pb.ResultFrame(command_id=frame.command_id, result=response.result))
