"""``mwp delegation grant|revoke|list|show``: the CLI as a subprocess against a live mesh (the
``bench`` of tests/test_cli_mission.py); the delegated work itself goes through the SDK."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from missionweave.cli.delegation import grant_table, money, render_grant
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import authority_service_pb2, common_pb2, membership_pb2
from missionweave.v1 import work_pb2 as wp
from tests import builders
from tests.test_cli_member import mission_group
from tests.test_cli_mission import Bench, execute
from tests.test_cli_mission import bench as bench  # the fixture

GRANT = ["--target", "root", "--capability", "code.python=3.0", "--max-depth", "2", "--expires-in", "1h"]


async def planned(bench: Bench) -> str:
    """A Mission with a root WorkItem and relief-bot as its work-delegate (granted with the CLI)."""
    group = await mission_group(bench)
    root = wp.WorkAuthorize(
        work_item_id="root", title="root", contract=builders.contract(bench.clock.now()), coordinator_epoch=1
    )
    await execute(bench, "coord-bot", group, "work_authorize", root)
    await bench.mwp(
        "member", "grant", "--group", group, "relief-bot", "--role", "work-delegate", *bench.as_("alice")
    )
    return group


async def delegated_authorize(bench: Bench, group: str, grant_id: str, work_item_id: str) -> None:
    """The grantee plans a sub-item below the scope root, charged to the grant (10,000 tokens,
    50 tool calls, 1 EUR: builders.contract's budget)."""
    body = wp.WorkAuthorize(
        work_item_id=work_item_id,
        title=work_item_id,
        contract=builders.contract(bench.clock.now()),
        parent_work_item_id="root",
        grant_id=grant_id,
    )
    await execute(bench, "relief-bot", group, "work_authorize", body)


@pytest.mark.req("MW-9.1-04", "MW-9.1-05", "MW-9.1-06", "MW-9.1-11")
async def test_grant_list_show_and_revoke(bench: Bench) -> None:
    group = await planned(bench)
    coordinator = bench.as_("coord-bot")
    granted = await bench.mwp(
        "delegation",
        "grant",
        "--group",
        group,
        "relief-bot",
        *GRANT,
        "--cap",
        "tokens=25000",
        "--cap",
        "tool_calls=150",
        "--cap",
        "financial=3.50 EUR",
        *coordinator,
    )
    grant_id = granted.last_line
    assert grant_id.startswith("grant_")
    out = granted.stdout
    assert out.startswith(f"delegation grant {grant_id}: relief-bot may plan and offer work below root")
    assert "capabilities: code.python>=3.0" in out and "max depth: 2 levels below root" in out
    assert "caps (a dimension at 0 allows nothing):" in out and "membership.delegation.granted" in out
    caps = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("    ")}
    assert (
        caps["financial"] == ["3.50", "EUR"]
        and caps["tokens"] == ["25000"]
        and caps["tool"] == ["calls", "150"]
    )
    assert (
        caps["compute"] == ["ms", "0"]
        and caps["wall"] == ["clock", "ms", "0"]
        and caps["side"] == ["effects", "0"]
    )

    await delegated_authorize(bench, group, grant_id, "sub-1")

    listed = (await bench.mwp("delegation", "list", "--group", group)).stdout.splitlines()
    assert listed[0].startswith(f"Delegation grants of {group}")
    [row] = [line.split() for line in listed[2:]]
    assert row[:8] == [grant_id, "relief-bot", "root", "usable", "15000", "100", "2.50", "EUR"]
    assert "(in 59m" in listed[2] or "(in 1h" in listed[2] or "(in 60m" in listed[2]

    shown = (await bench.mwp("delegation", "show", "--group", group, grant_id)).stdout
    lines = shown.splitlines()
    assert lines[0] == f"delegation grant {grant_id}: usable"
    assert "relief-bot (Membership epoch 3)" in shown and "coord-bot at Coordinator epoch 1" in shown
    budget = {
        line.split()[0]: line.split()[1:]
        for line in lines[lines.index("budget (a cap of 0 allows nothing):") + 2 :]
    }
    assert budget["tokens"] == ["25000", "10000", "15000"]
    assert budget["financial"] == ["3.50", "EUR", "1.00", "EUR", "2.50", "EUR"]
    assert lines[-1] == "charged WorkItems: sub-1"
    document = (await bench.mwp("delegation", "show", "--group", group, grant_id, "--json")).json()
    assert document["status"] == "usable" and document["work_item_ids"] == ["sub-1"]
    assert document["dimensions"]["tokens"] == {"cap": 25000, "charged": 10000, "remaining": 15000}
    assert document["dimensions"]["side_effects"] == {"cap": 0, "charged": 0, "remaining": 0}
    assert document["grant"]["grantee_id"] == "relief-bot" and document["currency"] == "EUR"

    revoked = await bench.mwp(
        "delegation", "revoke", "--group", group, grant_id, "--reason", "replanned", *coordinator
    )
    assert (
        revoked.stdout.startswith(f"delegation grant {grant_id} revoked")
        and "membership.delegation.revoked" in revoked.stdout
    )
    after = (await bench.mwp("delegation", "list", "--group", group, "--json")).json()
    [status] = after["grants"]
    assert status["status"] == "revoked" and status["invalid_because"] == "revoked"
    assert (await bench.mwp("delegation", "show", "--group", group, grant_id)).stdout.startswith(
        f"delegation grant {grant_id}: revoked"
    )
    again = await bench.mwp(
        "delegation", "revoke", "--group", group, grant_id, "--reason", "again", *coordinator, expect=1
    )
    assert "refused: INVALID_TRANSITION" in again.stderr


async def test_grant_json_and_the_default_currency(bench: Bench) -> None:
    group = await planned(bench)
    document = (
        await bench.mwp(
            "delegation",
            "grant",
            "--group",
            group,
            "relief-bot",
            *GRANT,
            "--cap",
            "tokens=100",
            "--cap",
            "financial=0.25",
            "--coordinator-epoch",
            "1",
            "--json",
            *bench.as_("coord-bot"),
        )
    ).json()
    grant = document["grant"]
    assert (
        document["grant_id"] == grant["grant_id"]
        and document["events"][0]["type"] == "membership.delegation.granted"
    )
    # The currency comes from the Mission budget; uint64 fields are strings in proto3 JSON.
    assert grant["caps"] == {"currency": "EUR", "financial_micros": "250000", "tokens": "100"}
    assert grant["max_descendant_depth"] == 2 and grant["issuer_id"] == "coord-bot"


async def test_refused_grants_exit_1_with_the_reason(bench: Bench) -> None:
    group = await planned(bench)
    owner = await bench.mwp(
        "delegation",
        "grant",
        "--group",
        group,
        "relief-bot",
        *GRANT,
        "--cap",
        "tokens=1",
        *bench.as_("alice"),
        expect=1,
    )
    assert owner.stderr.startswith("mwp: refused: PERMISSION_DENIED: ")
    over = await bench.mwp(
        "delegation",
        "grant",
        "--group",
        group,
        "relief-bot",
        *GRANT,
        "--cap",
        "tokens=2000000",
        *bench.as_("coord-bot"),
        expect=1,
    )
    assert over.stderr.startswith("mwp: refused: BUDGET_EXCEEDED: ") and "dimension=tokens" in over.stderr
    usd = await bench.mwp(
        "delegation",
        "grant",
        "--group",
        group,
        "relief-bot",
        *GRANT,
        "--cap",
        "financial=1USD",
        *bench.as_("coord-bot"),
        expect=1,
    )
    assert "refused: INVALID_ARGUMENT" in usd.stderr and "budgets in EUR" in usd.stderr
    assert (await bench.mwp("delegation", "list", "--group", group, "--json")).json()["grants"] == []
    assert "  none" in (await bench.mwp("delegation", "list", "--group", group)).stdout
    missing = await bench.mwp("delegation", "show", "--group", group, "grant_nope", expect=1)
    assert "has no delegation grant 'grant_nope'" in missing.stderr
    # Malformed or inconsistent flags: nothing is sent (exit 2).
    coordinator = bench.as_("coord-bot")
    for bad in (
        ["--cap", "bogus=1"],
        ["--cap", "tokens=-5"],
        ["--cap", "financial=1.2345678"],
        ["--cap", "tokens"],
        ["--max-depth", "-1"],
    ):
        await bench.mwp(
            "delegation", "grant", "--group", group, "relief-bot", *GRANT, *bad, *coordinator, expect=2
        )
    twice = await bench.mwp(
        "delegation",
        "grant",
        "--group",
        group,
        "relief-bot",
        *GRANT,
        "--cap",
        "tokens=1",
        "--cap",
        "tokens=2",
        *coordinator,
        expect=2,
    )
    assert "--cap tokens is given twice" in twice.stderr
    mixed = await bench.mwp(
        "delegation",
        "grant",
        "--group",
        group,
        "relief-bot",
        *GRANT,
        "--cap",
        "financial=1EUR",
        "--currency",
        "USD",
        *coordinator,
        expect=2,
    )
    assert "more than one currency: EUR, USD" in mixed.stderr
    no_expiry = [a for a in GRANT if a not in ("--expires-in", "1h")]
    await bench.mwp("delegation", "grant", "--group", group, "relief-bot", *no_expiry, *coordinator, expect=2)


def test_an_expired_grant_is_shown_expired_by_the_local_clock() -> None:
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    grant = membership_pb2.DelegationGrant(
        grant_id="grant_x",
        grantee_id="lead-bot",
        target_work_item_id="root",
        max_descendant_depth=1,
        caps=common_pb2.ResourceVector(currency="EUR", tokens=10),
        expires_at=to_timestamp(now - timedelta(seconds=5)),
    )
    status = authority_service_pb2.DelegationGrantStatus(
        grant=grant, remaining=common_pb2.ResourceVector(tokens=10)
    )
    [_, row] = grant_table([status], now)
    assert row.split()[:4] == ["grant_x", "lead-bot", "root", "expired"] and "(5s ago)" in row
    assert render_grant(status, now)[0] == "delegation grant grant_x: expired"
    status.invalid_because = "coordinator_replaced"  # what the state says comes first
    assert render_grant(status, now)[0] == "delegation grant grant_x: coordinator_replaced"
    assert [money(m, "EUR") for m in (0, 12_500_000, 1_234_567, -50)] == [
        "0.00 EUR",
        "12.50 EUR",
        "1.234567 EUR",
        "-0.00005 EUR",
    ]
