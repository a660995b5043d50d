"""FETCH on the gateway stream: history on demand within what the Membership permits (MW-8-13),
and a late joiner's cited source events through a Context Package (MW-8-08, MW-8-09, MW-13.3-03)."""

from __future__ import annotations

import pytest

from missionweave.sdk.client import decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, conversation_pb2
from missionweave.v1 import gateway_service_pb2 as pb
from tests import builders
from tests.conftest import World
from tests.test_gateway import Stream, connected
from tests.test_missions import G, as_member, create

E = pb.GatewayErrorCode
CK = conversation_pb2.ConversationKind


async def fetch(
    stream: Stream,
    request_id: str,
    first: int,
    last: int,
    package: common_pb2.SignedEnvelope | None = None,
    group: str = G,
) -> pb.ServerFrame:
    frame = pb.FetchFrame(
        request_id=request_id, group_id=group, ranges=[pb.SequenceRange(first=first, last=last)]
    )
    if package is not None:
        frame.context_package.CopyFrom(package)
    await stream.send(fetch=frame)
    while True:
        answer = await stream.recv()
        kind = answer.WhichOneof("frame")
        if kind == "fetched" and answer.fetched.request_id == request_id:
            return answer
        if kind == "error" and answer.error.request_id == request_id:
            return answer


def served(answer: pb.ServerFrame) -> list[int]:
    return [e.sequence for e in decode_events(answer.fetched.events)]


def withheld(answer: pb.ServerFrame) -> list[int]:
    return [seq for r in answer.fetched.withheld for seq in range(r.first, r.last + 1)]


@pytest.mark.req("MW-8-08", "MW-8-09", "MW-8-13", "MW-13.3-03", "MW-8-07", "MW-9-05")
async def test_a_late_joiner_fetches_what_a_context_package_cites_for_it_and_nothing_restricted(
    world: World,
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    secret = conversation_pb2.ConversationOpen(
        conversation_id="conv_secret", kind=CK.CONVERSATION_KIND_RESTRICTED, title="keys"
    )
    await w.run(w.owner, G, "conversation_open", secret, membership_epoch=1)
    await w.run(w.owner, G, "message_post", builders.message("conv_secret", "the key"), membership_epoch=1)
    for i in range(3):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"early {i}"), membership_epoch=1)
    await as_member(w, G, w.worker)  # joins late: visibility starts at its grant
    state = await w.client.group_state(G)
    start = next(m.visibility_start_sequence for m in state.memberships if m.member_id == "worker-bot")
    head = state.head_sequence
    restricted = {
        e.sequence
        async for e in w.client.read_events(G)
        if "conv_secret" in (e.message_posted.conversation_id, e.conversation_opened.conversation_id)
    }
    stream = await connected(w, w.worker)

    plain = await fetch(stream, "r1", 1, head + 5)
    assert served(plain) == list(range(start, head + 1))  # MW-8-07: nothing before the grant
    assert withheld(plain) == [*range(1, start), *range(head + 1, head + 6)]

    package = (
        await w.client.authority.GetContextPackage(
            apb.GetContextPackageRequest(group_id=G, recipient_ids=["worker-bot"])
        )
    ).package
    cited = await fetch(stream, "r2", 1, head, package)
    expected = [seq for seq in range(1, head + 1) if seq not in restricted]
    assert served(cited) == expected  # the cited history, minus the restricted Conversation
    assert withheld(cited) == sorted(restricted)
    _, authority_key = await w.client.authority_key()
    from missionweave.kernel.signing import verify_signature

    assert all(verify_signature(e, authority_key) for e in cited.fetched.events)

    for_someone_else = (
        await w.client.authority.GetContextPackage(
            apb.GetContextPackageRequest(group_id=G, recipient_ids=["coord-bot"])
        )
    ).package
    assert served(await fetch(stream, "r3", 1, head, for_someone_else)) == list(range(start, head + 1))
    await stream.call.done_writing()


@pytest.mark.req("MW-8-13")
async def test_fetch_refusals(world: World) -> None:
    w = world
    await create(w)
    stream = await connected(w, w.worker)
    assert (await fetch(stream, "x", 1, 1)).error.code == E.GATEWAY_ERROR_CODE_NOT_A_MEMBER
    await as_member(w, G, w.worker)
    assert (await fetch(stream, "big", 1, 5_000)).error.code == E.GATEWAY_ERROR_CODE_LIMIT_EXCEEDED
    assert (await fetch(stream, "inverted", 5, 2)).error.code == E.GATEWAY_ERROR_CODE_MALFORMED_FRAME
    package = (
        await w.client.authority.GetContextPackage(
            apb.GetContextPackageRequest(group_id=G, recipient_ids=["worker-bot"])
        )
    ).package
    package.payload = package.payload + b"\x00"  # tampered
    assert (
        await fetch(stream, "tampered", 1, 1, package)
    ).error.code == E.GATEWAY_ERROR_CODE_CONTEXT_PACKAGE_INVALID
    # The stream is still usable after those refusals.
    assert served(await fetch(stream, "ok", 1, 1)) == []
    await stream.call.done_writing()
