"""The A2A endpoint's reading of a Group without a mesh: what a ReadEvents stream may do that a live
mesh rarely shows (a batch that repeats events, an event of another Group) against the handler's
guards, with events signed by a test Authority key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import InternalError
from nacl.signing import SigningKey

from missionweave.kernel.signing import EVENT_TYPE, sign_envelope
from missionweave.sdk.event_verification import AuthorityVerifier
from missionweave.v1 import authority_service_pb2, event_pb2, work_pb2
from missionweave_bridges.a2a.server_handler import Acting, IdentityUser, MissionTaskHandler

AUTHORITY = SigningKey.generate()
KEY_ID = "authority#test"
G = "grp_fold"


def event(sequence: int, kind: str, group: str = G) -> event_pb2.Event:
    e = event_pb2.Event(
        event_id=f"evt_{group}_{sequence}", group_id=group, sequence=sequence, actor_id="coord"
    )
    if kind == "authorized":
        e.type = "work.authorized"
        e.work_authorized.CopyFrom(work_pb2.WorkAuthorized(work_item_id="wi-1", conversation_id="conv-1"))
    elif kind == "offered":
        e.type = "work.offered"
        e.work_offered.work_item_id = "wi-1"
    else:
        e.type = "work.started"
        e.work_started.work_item_id = "wi-1"
    return e


def batch(*events: event_pb2.Event) -> authority_service_pb2.ReadEventsResponse:
    return authority_service_pb2.ReadEventsResponse(
        events=[sign_envelope(e.SerializeToString(), EVENT_TYPE, AUTHORITY, KEY_ID) for e in events],
        head_sequence=3,
        first_sequence=events[0].sequence,
        last_sequence=events[-1].sequence,
    )


class Call:
    def __init__(self, batches: list[authority_service_pb2.ReadEventsResponse]) -> None:
        self.batches = batches

    def __aiter__(self) -> AsyncIterator[authority_service_pb2.ReadEventsResponse]:
        return self._each()

    async def _each(self) -> AsyncIterator[authority_service_pb2.ReadEventsResponse]:
        for b in self.batches:
            yield b

    def cancel(self) -> None:
        pass


class Authority:
    """ReadEvents answering the history with ``batches``, and a follow with nothing more."""

    def __init__(self, batches: list[authority_service_pb2.ReadEventsResponse]) -> None:
        self.batches = batches

    def ReadEvents(self, request: authority_service_pb2.ReadEventsRequest) -> Call:
        return Call([] if request.follow else self.batches)


class Mesh:
    def __init__(self, batches: list[authority_service_pb2.ReadEventsResponse]) -> None:
        self.authority = Authority(batches)


def handler(*batches: authority_service_pb2.ReadEventsResponse) -> MissionTaskHandler:
    mesh: Any = Mesh(list(batches))
    acting = Acting("ann", mesh, signer=None, verifier=AuthorityVerifier(KEY_ID, bytes(AUTHORITY.verify_key)))  # type: ignore[arg-type]
    return MissionTaskHandler({"ann": acting}, a2a.AgentCard())


def context(cursor: str) -> ServerCallContext:
    return ServerCallContext(user=IdentityUser("ann"), state={"headers": {"mwp-cursor": cursor}})


async def test_a_repeated_event_is_served_once_in_order() -> None:
    # A batch that overlaps the previous one (a reconnect's replay) repeats sequence 2.
    h = handler(
        batch(event(1, "authorized"), event(2, "offered")), batch(event(2, "offered"), event(3, "started"))
    )
    served = [
        e
        async for e in h.on_subscribe_to_task(
            a2a.SubscribeToTaskRequest(id=f"workitem:{G}/wi-1"), context("0")
        )
    ]
    assert [e.metadata.fields["mwp.cursor"].string_value for e in served] == ["1", "2", "3"]
    assert served[-1].status.state == a2a.TASK_STATE_WORKING  # type: ignore[union-attr]


async def test_an_event_of_another_group_is_refused() -> None:
    h = handler(batch(event(1, "authorized"), event(2, "offered", group="grp_other")))
    with pytest.raises(InternalError, match="grp_other"):
        await h.on_get_task(a2a.GetTaskRequest(id=f"workitem:{G}/wi-1"), context(""))
