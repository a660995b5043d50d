"""How a refused tool call reaches the model: an MCP tool error (``isError``) whose structured
content carries the stable reason, the message, its metadata and a hint saying what to call next.

A refusal writes nothing: the mesh refuses a command whole (docs/errors.md), and a client-side check
fails before anything is sent. ``refused_by`` says which of the two answered: ``mesh`` reasons are
the ``RejectionReason`` names of docs/errors.md; ``mwp-mcp`` reasons are this server's own checks
(docs/mcp.md lists them).
"""

from __future__ import annotations

from typing import Any

import grpc
from mcp_types import CallToolResult, TextContent

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2

# What to do next, by reason: written for a model that must decide its next call.
HINTS = {
    "LEASE_STALE": "Your execution lease is no longer the current one (revoked, or started from another "
    "session). Call show_work_item: if you still own the WorkItem and it is queued, call start_work "
    "again and resume from your last checkpoint; otherwise stop working on it.",
    "LEASE_EXPIRED": "The lease or the ownership lapsed. Call show_work_item: if you still own it and it is "
    "queued, call start_work again; if it was offered to someone else, stop working on it.",
    "OWNERSHIP_EPOCH_STALE": "The WorkItem was reassigned: you no longer own it. Stop working on it and "
    "call list_work for other work.",
    "SESSION_EPOCH_STALE": "Another process opened a session as this identity (mwp session open, another "
    "agent): this server's session is fenced and every command is refused. Ask the operator to restart "
    "mwp mcp after `mwp session open` for this identity.",
    "MEMBERSHIP_EPOCH_STALE": "Your Membership changed while the call was made. Call the tool again once.",
    "NOT_A_MEMBER": "You are not an active member of that Group. Call list_work to see your Groups.",
    "PERMISSION_DENIED": "Your role may not do this (the metadata names the check). Do not retry; ask the "
    "Coordinator in the Conversation (post_message) if you believe it should be allowed.",
    "OFFER_EXPIRED": "The offer expired. Call list_work or wait_for_offer for a new one.",
    "INVALID_TRANSITION": "The WorkItem is not in a state that allows this. Call show_work_item to see its "
    "state, then pick the tool that fits it.",
    "TERMINAL_STATE": "The WorkItem (or Mission) is finished; nothing more can be done on it.",
    "REVISION_MISMATCH": "The contract changed. Call show_work_item to read the new contract, then retry.",
    "BUDGET_EXCEEDED": "The usage would exceed a budget (metadata: which one). Report less, or checkpoint "
    "and block with a question asking the Coordinator for more budget.",
    "PRECONDITION_FAILED": "A precondition is not met (metadata says which: dependencies, approval, "
    "deadline, capability). Call show_work_item; wait (follow_work_item) or ask in the Conversation.",
    "INVALID_ARGUMENT": "An argument is invalid (metadata `field` names it). Fix it and call again.",
    "NOT_FOUND": "Something named does not exist or is not visible to you (metadata `field`). Check the "
    "ids (list_work, show_work_item); an Artifact must be stored with store_output first.",
    "COORDINATOR_EPOCH_STALE": "You are no longer the current Coordinator of this Mission. Stop coordinating it.",
    "OVERLOADED": "The Group is busy. Wait the metadata's retry_after_ms, then call again.",
    "PEER_UNAVAILABLE": "A service of the mesh did not answer; nothing was written. Call again shortly.",
    "TOO_LARGE": "The content is too large for this call. Store it with store_output (a file path) instead.",
    "MESH_UNAVAILABLE": "The mesh did not answer; nothing was written. Call again shortly.",
    "MESH_TIMEOUT": "The mesh did not answer in time: a command may or may not have been written. Call "
    "show_work_item (or read_messages) to see where things stand before calling the same tool again.",
    "NOT_HELD": "You hold no execution lease on this WorkItem. Call start_work first (after accept_offer).",
    "NO_OPEN_OFFER": "No open offer names you. Call list_work or wait_for_offer.",
    "UNKNOWN_CRITERION": "The contract has no such acceptance criterion. Call show_work_item for the ids.",
    "MISSING_EVIDENCE": "Every required acceptance criterion needs Evidence. Add one entry per criterion "
    "listed in metadata `criteria`, citing the Artifacts that show it.",
    "UNKNOWN_INPUT": "The WorkItem has no such input. Call show_work_item for the input names.",
    "INPUT_NOT_VERIFIED": "The bytes received do not hash to the input's digest: do not use them. Call "
    "read_input again; if it fails again, block with a question.",
    "PATH_NOT_ALLOWED": "This server reads files only under the directories given with --files. Pass the "
    "content as text or base64 instead, or ask the operator to allow the directory.",
    "BAD_CONTENT": "Give exactly one of text, base64 or path.",
    "NOT_BLOCKED": "The WorkItem has no open blocker to answer. Call show_work_item.",
    "NOT_VERIFIED": "What the mesh sent does not verify against the Authority key: do not use it; call again.",
}
DEFAULT_HINT = "Nothing was written. Read the message and metadata; do not call again unchanged."


class Refused(Exception):
    """A refusal to hand back as a tool error; nothing was written."""

    def __init__(
        self, reason: str, message: str, *, metadata: dict[str, str] | None = None, by: str = "mwp-mcp"
    ) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.by = by

    @property
    def hint(self) -> str:
        return HINTS.get(self.reason, DEFAULT_HINT)

    def document(self) -> dict[str, Any]:
        return {
            "refused": True,
            "refused_by": self.by,
            "reason": self.reason,
            "message": self.message,
            "metadata": self.metadata,
            "hint": self.hint,
            "written": False,
        }

    def result(self) -> CallToolResult:
        text = f"refused: {self.reason}: {self.message}\nnothing was written. next: {self.hint}"
        return CallToolResult(
            content=[TextContent(type="text", text=text)], structured_content=self.document(), is_error=True
        )


def from_rpc_error(err: grpc.aio.AioRpcError) -> Refused:
    """The mesh's refusal (its stable reason), or MESH_UNAVAILABLE for a call that got no answer."""
    rejection = rejection_from_rpc_error(err)
    if rejection is None:
        return Refused("MESH_UNAVAILABLE", f"{err.code().name}: {err.details()}", by="mwp-mcp")
    reason = common_pb2.RejectionReason.Name(rejection.reason).removeprefix("REJECTION_REASON_")
    return Refused(
        reason, rejection.message or str(err.details()), metadata=dict(rejection.metadata), by="mesh"
    )
