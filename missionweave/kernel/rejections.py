"""A client's reading of a refused call: the Rejection inside the google.rpc.Status a MissionWeave
service ends a refused call with (docs/errors.md). The server side (building that status) is
``missionweave_server.edge.status``."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from missionweave.v1 import common_pb2


def rejection_from_rpc_error(err: grpc.RpcError) -> common_pb2.Rejection | None:
    """Client side: the Rejection inside a failed call's google.rpc.Status, if any."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(common_pb2.Rejection.DESCRIPTOR):
            out = common_pb2.Rejection()
            detail.Unpack(out)
            return out
    return None


# The google.rpc.ErrorInfo reason a server ends its streams and long polls with when it shuts down
# (UNAVAILABLE, no Rejection: nothing was refused): reconnect, elsewhere or once it is back.
SHUTTING_DOWN = "SHUTTING_DOWN"


def is_shutting_down(err: grpc.RpcError) -> bool:
    """Whether a call ended because its server shut down (docs/errors.md)."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return False
    info = error_details_pb2.ErrorInfo()
    return any(detail.Unpack(info) and info.reason == SHUTTING_DOWN for detail in status.details)
