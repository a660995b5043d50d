"""The MCP server's one identity on the mesh: a MeshClient whose reads are proven as that identity
and whose commands it signs with its session, exactly as every ``mwp`` command does (the session
saved next to the key is reused, so ``mwp mcp`` fences no other process of the identity).

Every command goes through :meth:`Desk.execute`: the Membership epoch is read from the Group at the
moment of the call, a refusal becomes :class:`Refused` with the mesh's stable reason, and nothing is
retried behind the model's back except what the Authority answers idempotently (same command id).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from missionweave.kernel import codec, ids
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import authority_service_pb2, command_pb2, event_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_bridges.mcp_server.refusals import Refused, from_rpc_error

T = TypeVar("T")
# Every call to the mesh ends: a mesh that hangs is a MESH_TIMEOUT refusal the model can act on, not a
# tool call that never returns. Storing an output streams bytes at the disk's pace: it has no limit
# (it runs as a task, which the host can cancel).
CALL_LIMIT_S = 30.0
GroupState = authority_service_pb2.GroupState


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def state_name(state: int) -> str:
    return wp.WorkItemState.Name(state).removeprefix("WORK_ITEM_STATE_").lower()  # type: ignore[arg-type]


@dataclass
class Desk:
    """One identity acting on one mesh; ``touched`` is when a host last sent a request."""

    mesh: MeshClient
    signer: SessionSigner
    state_dir: Path
    target: str
    touched: float = field(default_factory=time.monotonic)

    @property
    def me(self) -> str:
        return self.signer.identity_id

    async def call(self, read: Awaitable[T], limit_s: float | None = CALL_LIMIT_S) -> T:
        """A read or command; a refusal or an unanswered call becomes :class:`Refused`."""
        try:
            async with asyncio.timeout(limit_s):
                return await read
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None
        except TimeoutError:
            raise Refused(
                "MESH_TIMEOUT", f"the mesh at {self.target} did not answer within {limit_s:g} s"
            ) from None

    async def execute(
        self, group_id: str, kind: str, body: Message, *, command_id: str | None = None
    ) -> command_pb2.CommandResult:
        """Signs ``body`` with the session and executes it; the Membership epoch is the current one."""
        epoch = await self.call(self.mesh.membership_epoch(group_id, self.me))
        command = self.signer.command(group_id, kind, body, membership_epoch=epoch, command_id=command_id)
        return await self.call(self.mesh.execute(self.signer.sign(command)))

    async def execute_once(self, group_id: str, kind: str, body: Message) -> command_pb2.CommandResult:
        """``execute`` with a command id derived from what is sent: a host that calls the same tool
        again with the same arguments (it lost the answer, it timed out) gets the first result back
        (``replayed``) instead of a second command or a refusal of the repeat."""
        command_id = ids.derived_id(
            "cmd",
            "mwp-mcp",
            self.me,
            str(self.signer.session_epoch),
            group_id,
            kind,
            body.SerializeToString(deterministic=True).hex(),
        )
        return await self.execute(group_id, kind, body, command_id=command_id)

    async def state(self, group_id: str) -> GroupState:
        return await self.call(self.mesh.group_state(group_id))

    async def work_item(self, group_id: str, work_item_id: str) -> wp.WorkItem:
        return await self.call(self.mesh.work_item(group_id, work_item_id))

    async def groups(self, group_id: str = "") -> list[str]:
        """``group_id`` alone, or every Group whose Mission this identity may see (an active member)."""
        if group_id:
            return [group_id]
        return [m.group_id for m in await self.call(self.mesh.missions())]

    async def events(self, group_id: str, after: int = 0) -> list[event_pb2.Event]:
        async def read() -> list[event_pb2.Event]:
            return [e async for e in self.mesh.read_events(group_id, after)]

        return await self.call(read())

    def held_lease(self, item: wp.WorkItem) -> wp.ExecutionLease:
        """The WorkItem's current lease when this identity's session holds it; NOT_HELD otherwise."""
        lease = item.lease
        if (
            not item.HasField("lease")
            or item.state != wp.WORK_ITEM_STATE_ACTIVE
            or lease.agent_id != self.me
            or lease.session_epoch != self.signer.session_epoch
        ):
            raise Refused(
                "NOT_HELD",
                f"{self.me} holds no execution lease on {item.work_item_id} (it is {state_name(item.state)})",
                metadata={"work_item_id": item.work_item_id, "state": state_name(item.state)},
            )
        return lease


def events_of(result: command_pb2.CommandResult) -> list[event_pb2.Event]:
    return codec.events_of(result.events)


def first(result: command_pb2.CommandResult, payload: str) -> event_pb2.Event | None:
    return next((e for e in events_of(result) if e.WhichOneof("payload") == payload), None)


def written(result: command_pb2.CommandResult) -> dict[str, Any]:
    """What a command appended, for the structured result."""
    return {
        "command_id": result.command_id,
        "group_revision": result.group_revision,
        "replayed": result.replayed,
        "events": [
            {"sequence": e.sequence, "type": e.type, "event_id": e.event_id} for e in events_of(result)
        ],
    }


async def poll_until(
    found: Callable[[], Awaitable[T | None]], deadline_s: float, every_s: float = 1.0
) -> T | None:
    """``found()`` every ``every_s`` until it answers something or ``deadline_s`` has passed."""
    end = time.monotonic() + deadline_s
    while True:
        answer = await found()
        if answer is not None:
            return answer
        left = end - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(every_s, left))
