"""Structured rejections (ARCHITECTURE principle 3).

A ``Rejected`` exception carries a stable ``RejectionReason``. It knows nothing of gRPC, so the pure
core raises it without importing a transport; at each service's edge ``missionweave_server.edge.status``
turns it into a ``google.rpc.Status``.
"""

from __future__ import annotations

from missionweave.v1 import common_pb2

R = common_pb2.RejectionReason
DOMAIN = "missionweave.v1"
_PREFIX = "REJECTION_REASON_"


class Rejected(Exception):
    """A command or request refused with a stable reason; nothing was written."""

    def __init__(
        self, reason: common_pb2.RejectionReason.ValueType, message: str, **metadata: object
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = {k: str(v) for k, v in metadata.items()}
        # What the refusal was about, for its log line only (never sent): a command's group_id,
        # command_id, command_kind and actor_id (missionweave_server/services/authority/authority.py).
        self.log_context: dict[str, str] = {}

    @property
    def reason_name(self) -> str:
        return R.Name(self.reason).removeprefix(_PREFIX)

    def to_proto(self) -> common_pb2.Rejection:
        return common_pb2.Rejection(reason=self.reason, message=self.message, metadata=self.metadata)

    def __repr__(self) -> str:
        return f"Rejected({self.reason_name}: {self.message})"


def from_proto(rejection: common_pb2.Rejection) -> Rejected:
    return Rejected(rejection.reason, rejection.message, **dict(rejection.metadata))
