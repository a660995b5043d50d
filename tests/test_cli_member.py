"""``mwp member grant|revoke|list``: the CLI as a subprocess against a live mesh (the ``bench`` of
tests/test_cli_mission.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from missionweave.cli.member import membership_table
from missionweave.kernel import ids
from missionweave.kernel.clock import to_timestamp
from missionweave.v1 import membership_pb2
from tests import builders
from tests.test_cli_mission import Bench, execute
from tests.test_cli_mission import bench as bench  # the fixture


async def mission_group(bench: Bench) -> str:
    """A live Mission (alice owns it, coord-bot coordinates), created through the SDK."""
    group = ids.new_id("grp")
    await execute(
        bench,
        "alice",
        group,
        "mission_create",
        builders.mission_create("alice", "coord-bot", bench.clock.now()),
    )
    return group


@pytest.mark.req("MW-8-01", "MW-8-03", "MW-8-06")
async def test_grant_list_and_revoke_memberships(bench: Bench) -> None:
    group = await mission_group(bench)
    granted = await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "worker-bot",
        "--role",
        "worker",
        "--capability",
        "code.python=3.11",
        "--capability",
        "sql@2.0",
        "--visibility-start",
        "1",
        *bench.as_("alice"),
    )
    assert granted.stdout.startswith("granted worker-bot a worker Membership, epoch 3")
    assert (
        "visible from sequence 1" in granted.stdout
        and "capabilities: code.python=3.11, sql=2.0" in granted.stdout
    )
    assert "membership.granted" in granted.stdout

    # The current Coordinator may grant too: a just-in-time Worker, lapsing in 30 minutes.
    provisional = (
        await bench.mwp(
            "member",
            "grant",
            "--group",
            group,
            "relief-bot",
            "--role",
            "worker",
            "--provisional",
            "--expires-in",
            "30m",
            "--json",
            *bench.as_("coord-bot"),
        )
    ).json()
    ms = provisional["membership"]
    assert ms["provisional"] is True and ms["active"] is True and ms["membership_epoch"] == 4
    assert ms["expires_at"].endswith("Z") and provisional["events"][0]["type"] == "membership.granted"

    listed = (await bench.mwp("member", "list", "--group", group)).stdout.splitlines()
    assert listed[0].startswith(f"Memberships of {group} (head sequence ")
    assert listed[1].split() == [
        "MEMBER",
        "ROLE",
        "EPOCH",
        "VISIBLE",
        "FROM",
        "ACTIVE",
        "PROVISIONAL",
        "CAPABILITIES",
    ]
    rows = {line.split()[0]: line for line in listed[2:]}
    assert rows["alice"].split()[:5] == ["alice", "mission-owner", "1", "1", "yes"]
    assert rows["worker-bot"].split()[:5] == ["worker-bot", "worker", "3", "1", "yes"]
    assert rows["worker-bot"].rstrip().endswith("code.python=3.11, sql=2.0")
    assert (
        f"until {ms['expires_at']} (in 29m" in rows["relief-bot"]
        or f"until {ms['expires_at']} (in 30m" in rows["relief-bot"]
    )

    revoked = await bench.mwp(
        "member", "revoke", "--group", group, "worker-bot", "--reason", "not needed", *bench.as_("alice")
    )
    assert (
        revoked.stdout.startswith("revoked worker-bot's Membership (epoch 3)")
        and "membership.revoked" in revoked.stdout
    )
    document = (await bench.mwp("member", "list", "--group", group, "--json")).json()
    by_member = {m["member_id"]: m for m in document["memberships"]}
    assert document["group_id"] == group and by_member["worker-bot"]["active"] is False
    assert by_member["worker-bot"]["capabilities"] == [
        {"capability_id": "code.python", "version": "3.11"},
        {"capability_id": "sql", "version": "2.0"},
    ]
    assert by_member["coord-bot"]["role"] == "coordinator" and by_member["relief-bot"]["provisional"] is True
    after = {
        line.split()[0]: line.split()
        for line in (await bench.mwp("member", "list", "--group", group)).stdout.splitlines()[2:]
    }
    assert after["worker-bot"][4] == "no"


async def test_refusals_and_usage_errors(bench: Bench) -> None:
    group = await mission_group(bench)
    owner = bench.as_("alice")
    owners = await bench.mwp("member", "revoke", "--group", group, "alice", "--reason", "x", *owner, expect=1)
    assert (
        owners.stderr.startswith("mwp: refused: INVALID_ARGUMENT: ") and "cannot be revoked" in owners.stderr
    )
    observer = await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "worker-bot",
        "--role",
        "observer",
        "--provisional",
        "--expires-in",
        "1h",
        *owner,
        expect=1,
    )
    assert (
        "refused: INVALID_ARGUMENT" in observer.stderr
        and "field=body.membership_grant.provisional" in observer.stderr
    )
    await bench.mwp("member", "grant", "--group", group, "worker-bot", "--role", "worker", *owner)
    worker = await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "relief-bot",
        "--role",
        "worker",
        *bench.as_("worker-bot"),
        expect=1,
    )
    assert "refused: PERMISSION_DENIED" in worker.stderr
    # Inconsistent flags are refused before anything is sent.
    lapse = await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "relief-bot",
        "--role",
        "worker",
        "--provisional",
        *owner,
        expect=2,
    )
    assert "--expires-in or --expires-at" in lapse.stderr
    pointless = await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "relief-bot",
        "--role",
        "worker",
        "--expires-in",
        "1h",
        *owner,
        expect=2,
    )
    assert "--provisional Membership only" in pointless.stderr
    await bench.mwp("member", "grant", "--group", group, "relief-bot", "--role", "boss", *owner, expect=2)
    await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "relief-bot",
        "--role",
        "worker",
        "--capability",
        "python",
        *owner,
        expect=2,
    )
    await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "relief-bot",
        "--role",
        "worker",
        "--provisional",
        "--expires-in",
        "soon",
        *owner,
        expect=2,
    )
    naive = await bench.mwp(
        "member",
        "grant",
        "--group",
        group,
        "relief-bot",
        "--role",
        "worker",
        "--provisional",
        "--expires-at",
        "2030-01-01T00:00:00",
        *owner,
        expect=2,
    )
    assert "give the time zone" in naive.stderr


def test_a_provisional_membership_past_its_expiry_is_shown_lapsed() -> None:
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    ms = membership_pb2.Membership(
        member_id="jit-bot",
        membership_epoch=5,
        role=membership_pb2.MEMBER_ROLE_WORKER,
        visibility_start_sequence=9,
        provisional=True,
        expires_at=to_timestamp(now - timedelta(minutes=2)),
        active=True,
    )
    [_, row] = membership_table([ms], now)
    assert row.split()[:5] == ["jit-bot", "worker", "5", "9", "lapsed"]
    assert "until 2026-06-01T11:58:00Z (lapsed 2m 00s ago)" in row
