"""Typed read models through the public gRPC API (issue 17 item 5): a WorkItem as the Authority
folded it (GetWorkItem, ListWorkItems), the Missions a caller may see (ListMissions) and the
Organization's identities (ListIdentities), each authorized and paginated."""

from __future__ import annotations

import grpc
import pytest

from missionweave.kernel.clock import from_timestamp
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.sdk.client import MeshClient, decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2, mission_pb2
from missionweave.v1 import membership_service_pb2 as mpb
from missionweave.v1 import work_pb2 as wp
from missionweave_server.edge.paging import encode_token
from tests.conftest import World, register
from tests.test_missions import G, as_member, create
from tests.test_work_items import setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

R = common_pb2.RejectionReason
WS = wp.WorkItemState


async def reason_of(call: object) -> tuple[grpc.StatusCode, int]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    refused = rejection_from_rpc_error(err.value)
    assert refused is not None
    return err.value.code(), int(refused.reason)


async def test_a_work_item_shows_its_lease_epoch_and_submission(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    offer_id = await f.offer("wi-1", "worker-bot")
    item = await w.client.work_item(G, "wi-1")
    assert item.state == WS.WORK_ITEM_STATE_OFFERED and [o.offer_id for o in item.offers] == [offer_id]
    assert item.group_id == G and item.title == "task wi-1" and item.contract.revision == 1
    assert item.conversation_id and not item.HasField("lease")
    epoch = await f.accept(w.worker, "wi-1", offer_id)
    queued = await w.client.work_item(G, "wi-1")
    assert queued.state == WS.WORK_ITEM_STATE_QUEUED and not queued.offers
    assert queued.ownership.agent_id == "worker-bot" and queued.ownership.ownership_epoch == epoch
    assert queued.ownership.lease_kind == wp.WORK_LEASE_KIND_OWNERSHIP and queued.ownership_epoch == epoch
    await f.start(w.worker, "wi-1", epoch, "lease-a")
    # An agent learns its own lease from the read model, without folding events.
    mine = MeshClient(w.target, reader=w.worker)
    try:
        active = await mine.work_item(G, "wi-1")
    finally:
        await mine.channel.close()
    assert active.state == WS.WORK_ITEM_STATE_ACTIVE
    assert active.lease.lease_id == "lease-a" and active.lease.ownership_epoch == epoch
    assert active.lease.agent_id == "worker-bot" and active.attempts == 1 and active.lease.attempt == 1
    assert from_timestamp(active.lease.expires_at) > from_timestamp(active.lease.started_at)
    assert active.ownership.lease_kind == wp.WORK_LEASE_KIND_EXECUTION
    submitted = await f.as_(w.worker, "work_submit", await f.submission(w.worker, "wi-1", epoch, "lease-a"))
    submission = decode_events(submitted.events)[0].event_id
    done = await w.client.work_item(G, "wi-1")
    assert done.state == WS.WORK_ITEM_STATE_SUBMITTED and done.submission_event_id == submission
    assert not done.HasField("lease") and list(done.evidence_ids) == ["ev-1"]
    assert done.usage.budget.limit == done.contract.budget


async def test_work_items_come_in_pages_filtered_by_state(world: World) -> None:
    w = world
    f = await setup(w)
    ids = [f"wi-{n:02d}" for n in range(5)]
    for wid in ids:
        await f.authorize(wid)
    await f.offer("wi-03", "worker-bot")
    seen, token, pages = [], "", 0
    while True:
        resp = await w.client.authority.ListWorkItems(
            apb.ListWorkItemsRequest(group_id=G, page_size=2, page_token=token)
        )
        pages += 1
        assert len(resp.work_items) <= 2 and resp.group_revision > 0
        seen += [i.work_item_id for i in resp.work_items]
        token = resp.next_page_token
        if not token:
            break
    assert seen == ids and pages == 3
    offered = await w.client.work_items(G, state=WS.WORK_ITEM_STATE_OFFERED)
    assert [i.work_item_id for i in offered] == ["wi-03"]
    assert [i.work_item_id for i in await w.client.work_items(G, page_size=5)] == ids
    bad = w.client.authority.ListWorkItems(apb.ListWorkItemsRequest(group_id=G, page_token="not-a-token"))
    assert await reason_of(bad) == (grpc.StatusCode.INVALID_ARGUMENT, R.REJECTION_REASON_INVALID_ARGUMENT)
    big = w.client.authority.ListWorkItems(apb.ListWorkItemsRequest(group_id=G, page_size=1001))
    assert await reason_of(big) == (grpc.StatusCode.INVALID_ARGUMENT, R.REJECTION_REASON_INVALID_ARGUMENT)
    missing = w.client.authority.GetWorkItem(apb.GetWorkItemRequest(group_id=G, work_item_id="wi-nope"))
    assert await reason_of(missing) == (grpc.StatusCode.NOT_FOUND, R.REJECTION_REASON_NOT_FOUND)


async def test_a_non_member_learns_nothing_of_work_items(world: World) -> None:
    w = world
    f = await setup(w)
    await f.authorize("wi-1")
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    them = MeshClient(w.target, reader=outsider)
    try:
        for group in (G, "grp_does_not_exist"):
            got = them.authority.GetWorkItem(apb.GetWorkItemRequest(group_id=group, work_item_id="wi-1"))
            assert await reason_of(got) == (
                grpc.StatusCode.PERMISSION_DENIED,
                R.REJECTION_REASON_NOT_A_MEMBER,
            )
            listed = them.authority.ListWorkItems(apb.ListWorkItemsRequest(group_id=group, page_token="junk"))
            assert await reason_of(listed) == (
                grpc.StatusCode.PERMISSION_DENIED,
                R.REJECTION_REASON_NOT_A_MEMBER,
            )
    finally:
        await them.channel.close()


async def test_missions_list_what_the_caller_may_see_in_pages(world: World) -> None:
    w = world
    for group in ("grp_a", "grp_b", "grp_c"):
        await create(w, group)
    await as_member(w, "grp_b", w.worker)
    everything = await w.client.missions()  # the admin: an operator
    assert [m.group_id for m in everything] == ["grp_a", "grp_b", "grp_c"]
    first = everything[0]
    assert first.state == mission_pb2.MISSION_STATE_ACTIVE and first.owner_id == "alice"
    assert first.coordinator_id == "coord-bot" and first.title and first.budget.tokens > 0
    assert first.mission_id and first.group_revision > 0 and first.HasField("deadline")
    pages, token, seen = 0, "", []
    while True:
        resp = await w.client.authority.ListMissions(apb.ListMissionsRequest(page_size=2, page_token=token))
        pages += 1
        seen += [m.group_id for m in resp.missions]
        token = resp.next_page_token
        if not token:
            break
    assert seen == ["grp_a", "grp_b", "grp_c"] and pages == 2
    outsider = await register(w.client, w.keys["admin"], "outsider-bot", common_pb2.IDENTITY_KIND_AGENT)
    for signer, expected in ((w.worker, ["grp_b"]), (w.owner, ["grp_a", "grp_b", "grp_c"]), (outsider, [])):
        async with MeshClient(w.target, reader=signer) as them:
            assert [m.group_id for m in await them.missions(page_size=1)] == expected, signer.identity_id
    bad = w.client.authority.ListMissions(apb.ListMissionsRequest(page_token="bWlzOg"))  # "mis:" and nothing
    assert await reason_of(bad) == (grpc.StatusCode.INVALID_ARGUMENT, R.REJECTION_REASON_INVALID_ARGUMENT)
    other_list = apb.ListMissionsRequest(page_token=encode_token("wi", "grp_a"))  # another list's token
    assert (await reason_of(w.client.authority.ListMissions(other_list)))[
        1
    ] == R.REJECTION_REASON_INVALID_ARGUMENT


async def test_identities_are_listed_to_operators_only_in_pages(world: World) -> None:
    w = world
    everyone = await w.client.identities()  # the admin
    ids = [i.identity_id for i in everyone]
    assert ids == sorted(ids) and {"admin", "alice", "coord-bot", "worker-bot"} <= set(ids)
    alice = next(i for i in everyone if i.identity_id == "alice")
    assert alice.kind == common_pb2.IDENTITY_KIND_HUMAN and len(alice.public_key) == 32
    assert alice == await w.client.identity("alice")
    first = await w.client.membership.ListIdentities(mpb.ListIdentitiesRequest(page_size=2))
    assert len(first.identities) == 2 and first.next_page_token
    rest = await w.client.identities(page_size=1)
    assert [i.identity_id for i in rest] == ids
    then = await w.client.membership.ListIdentities(
        mpb.ListIdentitiesRequest(page_size=2, page_token=first.next_page_token)
    )
    assert [i.identity_id for i in then.identities] == ids[2:4]
    bad = w.client.membership.ListIdentities(mpb.ListIdentitiesRequest(page_token="%%%"))
    assert await reason_of(bad) == (grpc.StatusCode.INVALID_ARGUMENT, R.REJECTION_REASON_INVALID_ARGUMENT)
    for signer in (w.worker, w.owner, w.coordinator):
        async with MeshClient(w.target, reader=signer) as them:
            denied = them.membership.ListIdentities(mpb.ListIdentitiesRequest())
            assert await reason_of(denied) == (
                grpc.StatusCode.PERMISSION_DENIED,
                R.REJECTION_REASON_PERMISSION_DENIED,
            )


async def test_a_bounded_scan_gives_a_short_page_with_a_token(
    world: World, topology: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListMissions examines at most MAX_LIST_SCAN Groups per call (D106): a member of only the
    last Group gets empty pages with tokens before it, never a wrong last page."""
    if topology.startswith("split"):
        pytest.skip("patches the in-process Authority")
    import missionweave_server.services.authority.servicer as servicer

    w = world
    for group in ("grp_a", "grp_b", "grp_c"):
        await create(w, group)
    await as_member(w, "grp_c", w.worker)
    monkeypatch.setattr(servicer, "MAX_LIST_SCAN", 2)
    async with MeshClient(w.target, reader=w.worker) as mine:
        first = await mine.authority.ListMissions(apb.ListMissionsRequest())
        assert not first.missions and first.next_page_token  # grp_a, grp_b examined: not its Groups
        then = await mine.authority.ListMissions(apb.ListMissionsRequest(page_token=first.next_page_token))
        assert [m.group_id for m in then.missions] == ["grp_c"] and not then.next_page_token
        assert [m.group_id for m in await mine.missions()] == ["grp_c"]
