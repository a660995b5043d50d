"""Per-Group ingress token bucket (MW-8-16): a flooding Group is refused with OVERLOADED and a retry
delay, other Groups are not affected, and replays of accepted commands are always answered."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from prometheus_client import REGISTRY

from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import common_pb2
from missionweave_server.services.authority.ingress import GroupIngressLimiter
from tests import builders
from tests.conftest import World
from tests.test_missions import create, refused

R = common_pb2.RejectionReason


class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.req("MW-8-16")
def test_bucket_allows_the_burst_then_the_rate_and_says_how_long_to_wait() -> None:
    time = FakeTime()
    limiter = GroupIngressLimiter(rate=10, burst=3, now=time)
    assert [limiter.admit("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.admit("a") == pytest.approx(0.1)  # one token takes 1/rate seconds
    assert limiter.admit("b") == 0.0  # every Group has its own bucket
    time.t += 0.05
    assert limiter.admit("a") == pytest.approx(0.05)
    time.t += 0.05
    assert limiter.admit("a") == 0.0
    time.t += 60  # refills up to the burst, never beyond
    assert [limiter.admit("a") for _ in range(4)][-1] > 0
    assert GroupIngressLimiter(rate=0, burst=0).admit("a") == 0.0  # disabled


def test_only_recently_active_groups_keep_a_bucket() -> None:
    time = FakeTime()
    limiter = GroupIngressLimiter(rate=1, burst=1, now=time, max_groups=2)
    for g in ("a", "b", "c"):
        limiter.admit(g)
    assert limiter.admit("a") == 0.0  # forgotten = full bucket again
    assert limiter.admit("c") > 0


@pytest.mark.req("MW-8-16")
async def test_a_flooding_group_is_refused_with_a_retry_delay_while_others_proceed(world: World) -> None:
    w = world
    time = FakeTime()
    conv_a = (await create(w, "grp_noisy")).mission.planning_conversation_id
    conv_b = (await create(w, "grp_quiet")).mission.planning_conversation_id
    w.mesh.authority.ingress = GroupIngressLimiter(rate=1, burst=2, now=time)  # type: ignore[attr-defined]
    overloaded = REGISTRY.get_sample_value("mwp_ingress_overloaded_total") or 0.0
    accepted = w.signed(
        w.owner, "grp_noisy", "message_post", builders.message(conv_a, "first"), membership_epoch=1
    )
    await w.client.execute(accepted)
    await w.run(w.owner, "grp_noisy", "message_post", builders.message(conv_a, "second"), membership_epoch=1)
    rejection = await refused(
        w,
        w.owner,
        "grp_noisy",
        "message_post",
        builders.message(conv_a, "third"),
        R.REJECTION_REASON_OVERLOADED,
        membership_epoch=1,
    )
    assert rejection.metadata["retry_after_ms"] == "1000"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.run(w.owner, "grp_noisy", "message_post", builders.message(conv_a, "4th"), membership_epoch=1)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status = rpc_status.from_call(info.value)  # type: ignore[arg-type]
    assert status is not None
    retry = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(retry) == 1
    assert (
        REGISTRY.get_sample_value("mwp_ingress_overloaded_total") or 0.0
    ) - overloaded == 2  # the operator sees both
    # The quiet Group is untouched by the noisy one's empty bucket.
    await w.run(w.owner, "grp_quiet", "message_post", builders.message(conv_b, "hello"), membership_epoch=1)
    # A retried, already accepted command is answered from the log, not refused.
    again = await w.client.execute(accepted)
    assert again.replayed
    time.t += 1.0
    await w.run(w.owner, "grp_noisy", "message_post", builders.message(conv_a, "later"), membership_epoch=1)
    assert rejection_from_rpc_error(info.value) is not None


@pytest.mark.req("MW-8-16")
async def test_an_outsider_floods_on_an_allowance_of_its_own_and_never_spends_the_members(
    world: World,
) -> None:
    """D158: an identity without a Membership in the Group (here the Worker) draws on a bucket of its
    own there. Its refused commands run that bucket dry, and then it is refused OVERLOADED, while the
    Group's own allowance is untouched and its members go on."""
    w = world
    time = FakeTime()
    conversation = (await create(w, "grp_target")).mission.planning_conversation_id
    w.mesh.authority.ingress = GroupIngressLimiter(rate=1, burst=2, now=time)  # type: ignore[attr-defined]
    for round_ in range(2):
        await refused(
            w,
            w.worker,
            "grp_target",
            "message_post",
            builders.message(conversation, f"spam {round_}"),
            R.REJECTION_REASON_NOT_A_MEMBER,
            membership_epoch=1,
        )
    overloaded = await refused(
        w,
        w.worker,
        "grp_target",
        "message_post",
        builders.message(conversation, "spam 2"),
        R.REJECTION_REASON_OVERLOADED,
        membership_epoch=1,
    )
    assert "worker-bot's commands to Group grp_target" in overloaded.message
    # The members' burst is whole: two posts, and only then is the Group over its rate.
    await w.run(
        w.owner, "grp_target", "message_post", builders.message(conversation, "one"), membership_epoch=1
    )
    await w.run(
        w.owner, "grp_target", "message_post", builders.message(conversation, "two"), membership_epoch=1
    )
    await refused(
        w,
        w.owner,
        "grp_target",
        "message_post",
        builders.message(conversation, "three"),
        R.REJECTION_REASON_OVERLOADED,
        membership_epoch=1,
    )
