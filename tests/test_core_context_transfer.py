"""Pure core: the check a Context Package for another Group passes (check_transfer in
rules/missions/context_transfer.py)."""

from __future__ import annotations

import pytest

from missionweave.kernel.errors import Rejected
from missionweave.v1 import common_pb2
from missionweave_server.services.authority.rules.missions.context_transfer import check_transfer
from missionweave_server.services.authority.state import GroupState, TransferGrant

R = common_pb2.RejectionReason
STATE = GroupState(
    group_id="grp_a",
    transfers={
        "evt_whole": TransferGrant("grp_b", ()),  # the whole Mission
        "evt_scoped": TransferGrant("grp_b", ("wi_1", "wi_2")),
        "evt_other": TransferGrant("grp_c", ()),
    },
)


def refusal(target: str, authorization: str, work_item_ids: list[str]) -> Rejected:
    with pytest.raises(Rejected) as caught:
        check_transfer(STATE, target, authorization, work_item_ids)
    return caught.value


@pytest.mark.req("MW-13.3-05", "MW-13.3-07")
def test_an_authorization_names_its_target_group() -> None:
    r = refusal("", "evt_whole", [])
    assert r.reason == R.REJECTION_REASON_INVALID_ARGUMENT and r.metadata["field"] == "target_group_id"


@pytest.mark.req("MW-13.3-05", "MW-13.3-07")
def test_content_does_not_enter_another_group_without_an_authorization() -> None:
    r = refusal("grp_b", "", ["wi_1"])
    assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED and "by default" in r.args[0]


@pytest.mark.req("MW-13.3-05", "MW-13.3-07")
def test_an_authorization_for_another_group_or_none_at_all_is_refused() -> None:
    for authorization in ("evt_other", "evt_unknown"):
        r = refusal("grp_b", authorization, [])
        assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED
        assert r.metadata["field"] == "transfer_authorization_event_id"


@pytest.mark.req("MW-13.3-05", "MW-13.3-07")
def test_a_scoped_authorization_covers_its_work_items_only() -> None:
    for requested in (["wi_3"], ["wi_1", "wi_3"], []):  # [] asks for the whole Mission
        r = refusal("grp_b", "evt_scoped", requested)
        assert r.reason == R.REJECTION_REASON_PERMISSION_DENIED and r.metadata["field"] == "work_item_ids"
    check_transfer(STATE, "grp_b", "evt_scoped", ["wi_2"])
    check_transfer(STATE, "grp_b", "evt_scoped", ["wi_1", "wi_2"])


@pytest.mark.req("MW-13.3-07")
def test_an_authorization_of_the_whole_mission_covers_any_scope() -> None:
    check_transfer(STATE, "grp_b", "evt_whole", [])
    check_transfer(STATE, "grp_b", "evt_whole", ["wi_9"])
    check_transfer(STATE, "grp_c", "evt_other", ["wi_1"])
