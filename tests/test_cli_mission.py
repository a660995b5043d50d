"""``mwp mission|coordinator|conversation|message``: the CLI as a subprocess against a live mesh.

The mesh runs in the test's event loop on a ManualClock that starts at the real time (the CLI signs
with the real clock, so the Authority's replay window still holds); tests move it to let a
Coordinator lease lapse without waiting.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from missionweave import cli
from missionweave.kernel.clock import ManualClock
from missionweave.kernel.signing import generate_key, read_key, write_key
from missionweave.sdk.client import (
    MeshClient,
    SessionSigner,
    SummaryNotVerified,
    membership_epoch,
    verify_group_summary,
)
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2
from missionweave_server.config import Settings
from tests import builders

ROOT = Path(__file__).resolve().parent.parent
ARTIFACT = "blake3:" + "ab" * 32
IDENTITIES = {
    "alice": common_pb2.IDENTITY_KIND_HUMAN,
    "coord-bot": common_pb2.IDENTITY_KIND_AGENT,
    "relief-bot": common_pb2.IDENTITY_KIND_AGENT,
    "worker-bot": common_pb2.IDENTITY_KIND_AGENT,
}


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def last_line(self) -> str:
        return self.stdout.strip().splitlines()[-1]

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class Bench:
    """A live mesh, four identities with key files and saved sessions, and the CLI to drive it."""

    target: str
    client: MeshClient
    clock: ManualClock
    keys: dict[str, Path]
    signers: dict[str, SessionSigner]
    tmp: Path

    async def mwp(self, *args: str, expect: int = 0) -> Run:
        """Runs ``mwp --target ... ARGS`` without blocking the loop that serves it."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "missionweave.cli",
            "--target",
            self.target,
            *args,
            # Reads are proven as the MissionOwner unless a command names its own --as/--key.
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "MWP_AS": "alice",
                "MWP_KEY": str(self.keys["alice"]),
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        run = Run(proc.returncode or 0, out.decode(), err.decode())
        assert run.code == expect, (
            f"mwp {' '.join(args)} exited {run.code}, expected {expect}:\n{run.stderr}{run.stdout}"
        )
        return run

    def as_(self, identity: str) -> list[str]:
        return ["--as", identity, "--key", str(self.keys[identity])]

    async def create(self, *extra: str) -> str:
        run = await self.mwp(
            "mission",
            "create",
            *self.as_("alice"),
            "--title",
            "Q3 report",
            "--objective",
            "Ship the Q3 report",
            "--done",
            "figures reconcile",
            "--coordinator",
            "coord-bot",
            *extra,
        )
        return run.last_line

    async def show(self, group: str) -> dict[str, Any]:
        return dict((await self.mwp("mission", "show", "--group", group, "--json")).json())


@pytest.fixture
async def bench(tmp_path: Path) -> AsyncIterator[Bench]:
    from missionweave.cli.common import save_session
    from missionweave_server.mesh.server import start

    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        grace_seconds=1,
    )
    clock = ManualClock(datetime.now(UTC))
    mesh = await start(settings, clock)
    client = MeshClient(f"127.0.0.1:{mesh.port}")
    admin_key = read_key(settings.admin_key_path)
    keys, signers = {}, {}
    for identity, kind in IDENTITIES.items():
        keys[identity] = tmp_path / f"{identity}.key"
        write_key(keys[identity], generate_key())
        key = read_key(keys[identity])
        await client.register_identity("admin", admin_key, identity, kind, bytes(key.verify_key))
        signers[identity] = await client.open_session(identity, key)
        save_session(keys[identity], signers[identity])  # the CLI signs with this session
    keys["admin"] = settings.admin_key_path  # operator calls (snapshots) are the administrator's
    signers["admin"] = await client.open_session("admin", admin_key)
    save_session(keys["admin"], signers["admin"])
    try:
        yield Bench(f"127.0.0.1:{mesh.port}", client, clock, keys, signers, tmp_path)
    finally:
        await client.channel.close()
        await mesh.stop(grace=1)


async def execute(bench: Bench, identity: str, group: str, kind: str, body: Any) -> None:
    """A command through the Python client (fast setup for tests that exercise other commands)."""
    signer = bench.signers[identity]
    epoch = (
        0 if kind == "mission_create" else membership_epoch(await bench.client.group_state(group), identity)
    )
    await bench.client.execute(signer.sign(signer.command(group, kind, body, membership_epoch=epoch)))


async def approved_mission(bench: Bench, group: str) -> None:
    await execute(
        bench,
        "alice",
        group,
        "mission_create",
        builders.mission_create("alice", "coord-bot", bench.clock.now()),
    )
    mission = (await bench.client.group_state(group)).mission
    submit = mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=1, mission_revision=mission.revision, summary="done"
    )
    await execute(bench, "coord-bot", group, "mission_submit_for_approval", submit)
    submission = (await bench.client.group_state(group)).mission.latest_submission_event_id
    await execute(
        bench, "alice", group, "mission_approve", mission_pb2.MissionApprove(submission_event_id=submission)
    )


# ------------------------------------------------------------------ the walkthrough


@pytest.mark.req("MW-9-12", "MW-7.1-T04", "MW-7.1-T05", "MW-7.1-T06")
async def test_walkthrough_create_converse_submit_review_approve(bench: Bench) -> None:
    group = await bench.create()

    shown = (await bench.mwp("mission", "show", "--group", group)).stdout
    assert "state        ACTIVE" in shown and "owner        alice" in shown
    assert "coord-bot, epoch 1" in shown and "submission   none" in shown and "PLANNING" in shown
    view = await bench.show(group)
    assert view["state"] == "ACTIVE" and view["coordinator"]["agent_id"] == "coord-bot"
    assert {m["member_id"]: m["role"] for m in view["memberships"]} == {
        "alice": "MISSION_OWNER",
        "coord-bot": "COORDINATOR",
    }

    # Conversation: post, correct, retract, redact; the list shows effective forms and the chain.
    post = ["message", "post", "--group", group, "--text"]
    first = (await bench.mwp(*post, "draft plan", *bench.as_("alice"))).last_line
    second = (await bench.mwp(*post, "please start on figures", *bench.as_("coord-bot"))).last_line
    third = (await bench.mwp(*post, "call me on 555-0100", *bench.as_("alice"))).last_line
    amend = ["message", "amend", "--group", group, "--message"]
    await bench.mwp(*amend, first, "--kind", "correction", "--text", "final plan", *bench.as_("alice"))
    await bench.mwp(*amend, second, "--kind", "retraction", *bench.as_("coord-bot"))
    await bench.mwp(*amend, third, "--kind", "redaction", "--reason", "personal data", *bench.as_("alice"))
    listed = (await bench.mwp("message", "list", "--group", group)).stdout
    assert listed.splitlines()[0] == "Messages (conversation only — not assignments)"
    assert f"{first} alice: final plan (corrected)" in listed
    assert f"{second} coord-bot: [retracted]" in listed
    assert f"{third} alice: [redacted: personal data]" in listed and "555-0100" not in listed
    chains = {
        d["message_id"]: d
        for d in map(
            json.loads, (await bench.mwp("message", "list", "--group", group, "--json")).stdout.splitlines()
        )
    }
    assert chains[first]["original_content"]["text"] == "draft plan"
    assert chains[first]["effective_content"]["text"] == "final plan"
    assert [a["kind"] for a in chains[first]["amendments"]] == ["correction"]
    assert chains[third]["status"] == "redacted" and chains[third]["effective_content"] is None
    assert all(d["nature"] == "conversation" and d["authority"] is False for d in chains.values())

    # The signed summary verifies against the Authority key.
    summary = await bench.mwp("coordinator", "summary", "--group", group)
    assert "signature verified (authority:" in summary.stdout
    signed = (await bench.mwp("coordinator", "summary", "--group", group, "--json")).json()
    assert signed["verified"] is True and signed["summary"]["mission_id"] == view["mission_id"]

    # Submit -> request changes -> submit again -> approve.
    coordinator = bench.as_("coord-bot")
    # D161: a digest the store does not hold is refused (exit 1, the reason printed, nothing written).
    missing = await bench.mwp(
        "mission",
        "submit",
        "--group",
        group,
        "--summary",
        "v1",
        "--artifact",
        f"{ARTIFACT}:12",
        *coordinator,
        expect=1,
    )
    assert "NOT_FOUND" in missing.stderr and "is not stored" in missing.stderr
    assert (await bench.show(group))["state"] == "ACTIVE"
    report = bench.tmp / "q3-report.txt"
    report.write_text("Q3 revenue 1.2M, reconciled with the ledger\n")
    put = (
        await bench.mwp(
            "artifact",
            "put",
            str(report),
            "--manifest-for",
            group,
            "--work-item",
            "wi-q3-report",
            "--json",
            *coordinator,
        )
    ).json()
    first_submission = (
        await bench.mwp(
            "mission",
            "submit",
            "--group",
            group,
            "--summary",
            "v1",
            "--artifact",
            put["digest"],
            *coordinator,
        )
    ).last_line
    assert (await bench.show(group))["state"] == "AWAITING_APPROVAL"
    await bench.mwp(
        "mission", "request-changes", "--group", group, "--changes", "add Q2 comparison", *bench.as_("alice")
    )
    assert (await bench.show(group))["state"] == "ACTIVE"
    submitted = (
        await bench.mwp("mission", "submit", "--group", group, "--summary", "v2", "--json", *coordinator)
    ).json()
    second_submission = submitted["submission_event_id"]
    assert second_submission != first_submission
    assert submitted["events"][0]["mission_submitted"]["summary"] == "v2"
    approved = await bench.mwp(
        "mission", "approve", "--group", group, "--comment", "thanks", *bench.as_("alice")
    )
    assert f"approved submission {second_submission}" in approved.stdout

    final = await bench.show(group)
    assert final["state"] == "APPROVED" and final["approval_event_id"]
    assert final["latest_submission_event_id"] == second_submission and final["approval_revoked"] is False
    assert "state        APPROVED" in (await bench.mwp("mission", "show", "--group", group)).stdout

    # An approved Mission is terminal: approving again is refused with the reason (exit 1).
    again = await bench.mwp("mission", "approve", "--group", group, *bench.as_("alice"), expect=1)
    assert again.stderr.startswith("mwp: refused: TERMINAL_STATE: ")


# ------------------------------------------------------------------ who may do what


async def test_role_rules_and_membership_epoch_override(bench: Bench) -> None:
    group = await bench.create()
    owner, coordinator = bench.as_("alice"), bench.as_("coord-bot")
    submit = ["mission", "submit", "--group", group, "--summary", "x"]
    refused = await bench.mwp(*submit, *owner, expect=1)
    assert "refused: PERMISSION_DENIED" in refused.stderr
    stale = await bench.mwp(*submit, "--membership-epoch", "99", *coordinator, expect=1)
    assert "refused: MEMBERSHIP_EPOCH_STALE" in stale.stderr and "current_epoch=" in stale.stderr
    nothing = await bench.mwp("mission", "approve", "--group", group, *owner, expect=1)
    assert "has no submission yet; pass --submission" in nothing.stderr
    assert (
        "PERMISSION_DENIED"
        in (
            await bench.mwp("mission", "cancel", "--group", group, "--reason", "x", *coordinator, expect=1)
        ).stderr
    )
    assert (
        "PERMISSION_DENIED"
        in (
            await bench.mwp("mission", "terminate", "--group", group, "--reason", "x", *owner, expect=1)
        ).stderr
    )
    await bench.mwp(
        "mission",
        "directive",
        "--group",
        group,
        "--directive",
        "focus on tests",
        "--parameters-json",
        '{"max": 3}',
        *owner,
    )
    await bench.mwp("mission", "terminate", "--group", group, "--reason", "blocked upstream", *coordinator)
    assert (await bench.show(group))["state"] == "FAILED"

    other = await bench.create()
    await bench.mwp("mission", "cancel", "--group", other, "--reason", "no longer needed", *owner)
    assert (await bench.show(other))["state"] == "CANCELLED"


async def test_coordinator_renew_replace_and_reconcile(bench: Bench) -> None:
    group = await bench.create("--lease-seconds", "30")
    owner, old, relief = bench.as_("alice"), bench.as_("coord-bot"), bench.as_("relief-bot")
    renewed = await bench.mwp("coordinator", "renew", "--group", group, *old)
    assert "Coordinator lease epoch 1 renewed; expires" in renewed.stdout
    replace = ["coordinator", "replace", "--group", group, "--coordinator", "relief-bot"]
    live = await bench.mwp(*replace, *owner, expect=1)
    assert "refused: PRECONDITION_FAILED" in live.stderr  # only once the lease lapsed

    bench.clock.advance(seconds=45)
    assert (
        "LEASE_EXPIRED" in (await bench.mwp("coordinator", "renew", "--group", group, *old, expect=1)).stderr
    )
    assert "PERMISSION_DENIED" in (await bench.mwp(*replace, *old, expect=1)).stderr  # the owner replaces
    replaced = await bench.mwp(*replace, "--lease-seconds", "120", *owner)
    assert "relief-bot holds epoch 2" in replaced.stdout
    view = await bench.show(group)
    assert view["coordinator"] == {
        **view["coordinator"],
        "agent_id": "relief-bot",
        "coordinator_epoch": 2,
        "reconciled": False,
    }

    unreconciled = await bench.mwp("mission", "submit", "--group", group, "--summary", "x", *relief, expect=1)
    assert "refused: RECONCILIATION_REQUIRED" in unreconciled.stderr
    reconciled = await bench.mwp("coordinator", "reconcile", "--group", group, *relief)
    assert "reconciliation acknowledged for Coordinator epoch 2" in reconciled.stdout
    assert (await bench.show(group))["coordinator"]["reconciled"] is True
    assert (
        "COORDINATOR_EPOCH_STALE"
        in (
            await bench.mwp(
                "coordinator", "renew", "--group", group, "--coordinator-epoch", "1", *relief, expect=1
            )
        ).stderr
    )
    await bench.mwp("mission", "submit", "--group", group, "--summary", "after hand-over", *relief)


async def test_follow_up_and_revoke_approval(bench: Bench) -> None:
    await approved_mission(bench, "grp_approved")
    follow_up = await bench.mwp(
        "mission",
        "follow-up",
        *bench.as_("alice"),
        "--approved-group",
        "grp_approved",
        "--title",
        "Fix Q3",
        "--objective",
        "Correct the Q3 figures",
        "--done",
        "figures corrected",
        "--coordinator",
        "coord-bot",
        "--reason",
        "remediation",
        "--group",
        "grp_fix",
    )
    assert follow_up.last_line == "grp_fix"
    fix = await bench.show("grp_fix")
    approved = await bench.show("grp_approved")
    assert fix["kind"] == "FOLLOW_UP" and fix["follows_up_mission_id"] == approved["mission_id"]

    await bench.mwp(
        "mission",
        "revoke-approval",
        "--group",
        "grp_approved",
        "--reason",
        "figures were wrong",
        "--follow-up-group",
        "grp_fix",
        *bench.as_("alice"),
    )
    revoked = await bench.show("grp_approved")
    assert revoked["state"] == "APPROVED" and revoked["approval_revoked"] is True
    assert revoked["follow_up_mission_ids"] == [fix["mission_id"]]
    assert "revoked      yes" in (await bench.mwp("mission", "show", "--group", "grp_approved")).stdout


async def test_conversation_open_and_filtered_list(bench: Bench) -> None:
    group = await bench.create()
    worker = membership_pb2.MembershipGrant(member_id="worker-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await execute(bench, "alice", group, "membership_grant", worker)
    opened = await bench.mwp(
        "conversation",
        "open",
        "--group",
        group,
        "--kind",
        "review",
        "--title",
        "Figures review",
        *bench.as_("coord-bot"),
    )
    review = opened.last_line
    await bench.mwp(
        "conversation",
        "open",
        "--group",
        group,
        "--kind",
        "restricted",
        "--title",
        "Payroll",
        "--participant",
        "worker-bot",
        "--id",
        "conv_payroll",
        *bench.as_("alice"),
    )
    denied = await bench.mwp(
        "conversation",
        "open",
        "--group",
        group,
        "--kind",
        "review",
        "--title",
        "x",
        *bench.as_("worker-bot"),
        expect=1,
    )
    assert "refused: PERMISSION_DENIED" in denied.stderr
    convs = {c["conversation_id"]: c for c in (await bench.show(group))["conversations"]}
    assert convs[review]["kind"] == "REVIEW" and convs[review]["title"] == "Figures review"
    assert convs["conv_payroll"]["participant_ids"] == ["worker-bot"]

    await bench.mwp(
        "message",
        "post",
        "--group",
        group,
        "--conversation",
        review,
        "--text",
        "row 7 looks off",
        *bench.as_("worker-bot"),
    )
    await bench.mwp("message", "post", "--group", group, "--text", "planning note", *bench.as_("alice"))
    only_review = (await bench.mwp("message", "list", "--group", group, "--conversation", review)).stdout
    assert f"Conversation {review} (REVIEW 'Figures review')" in only_review
    assert "row 7 looks off" in only_review and "planning note" not in only_review


@pytest.mark.req("MW-7.4-04", "MW-16-11")
async def test_erase_a_message_then_snapshot_and_compact_the_group(bench: Bench) -> None:
    group = await bench.create()
    await bench.mwp("message", "post", "--group", group, "--text", "card 4111-1111", *bench.as_("coord-bot"))
    listed = (await bench.mwp("message", "list", "--group", group, "--json")).stdout
    message_id = next(json.loads(line)["message_id"] for line in listed.splitlines() if "4111-1111" in line)
    await bench.mwp(
        "message",
        "amend",
        "--group",
        group,
        "--message",
        message_id,
        "--kind",
        "correction",
        "--erase",
        "legal",
        *bench.as_("alice"),
        expect=2,
    )
    erased = await bench.mwp(
        "message",
        "amend",
        "--group",
        group,
        "--message",
        message_id,
        "--kind",
        "redaction",
        "--erase",
        "legal",
        "--reason",
        "card number posted by mistake",
        *bench.as_("alice"),
    )
    assert "erased from history (legal)" in erased.stdout
    after = (await bench.mwp("message", "list", "--group", group)).stdout
    assert "4111-1111" not in after and "[erased: card number posted by mistake]" in after
    taken = await bench.mwp("group", "snapshot", *bench.as_("admin"), "--group", group, "--compact", "--json")
    document = taken.json()
    assert document["verified"] and document["compacted"] and document["sequence"] >= 3
    assert document["digest"].startswith("blake3:")
    # History stays readable after compaction (moved to the archive tier, never deleted).
    assert (
        "[erased: card number posted by mistake]"
        in (await bench.mwp("message", "list", "--group", group)).stdout
    )
    refused = await bench.mwp(
        "group", "snapshot", *bench.as_("admin"), "--group", group, "--archival", expect=1
    )
    assert "PRECONDITION_FAILED" in refused.stderr  # the Mission is still live


# ------------------------------------------------------------------ client-side checks


async def test_usage_errors_exit_2_before_anything_is_sent(bench: Bench) -> None:
    owner = bench.as_("alice")
    bad_digest = await bench.mwp(
        "mission", "submit", "--group", "g", "--summary", "s", "--artifact", "md5:abc", *owner, expect=2
    )
    assert "ALGORITHM:HEX" in bad_digest.stderr
    await bench.mwp(
        "mission",
        "directive",
        "--group",
        "g",
        "--directive",
        "d",
        "--parameters-json",
        "[1]",
        *owner,
        expect=2,
    )
    no_reason = await bench.mwp(
        "message", "amend", "--group", "g", "--message", "m", "--kind", "redaction", *owner, expect=2
    )
    assert "a redaction needs --reason" in no_reason.stderr
    await bench.mwp(
        "message", "amend", "--group", "g", "--message", "m", "--kind", "correction", *owner, expect=2
    )


async def test_unreachable_server_exits_3(bench: Bench) -> None:
    run = await bench.mwp("--target", "127.0.0.1:1", "mission", "show", "--group", "g", expect=3)
    assert "cannot reach 127.0.0.1:1" in run.stderr


@pytest.mark.req("MW-7.2-07")
async def test_a_tampered_summary_is_refused(
    bench: Bench, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await execute(
        bench,
        "alice",
        "grp_t",
        "mission_create",
        builders.mission_create("alice", "coord-bot", bench.clock.now()),
    )
    envelope = await bench.client.signed_group_summary("grp_t")
    key_id, public_key = await bench.client.authority_key()
    assert verify_group_summary(envelope, key_id, public_key).state.group_id == "grp_t"
    tampered = common_pb2.SignedEnvelope()
    tampered.CopyFrom(envelope)
    tampered.payload += b"\x10\x63"  # head_sequence = 99
    with pytest.raises(SummaryNotVerified, match="does not verify"):
        verify_group_summary(tampered, key_id, public_key)
    with pytest.raises(SummaryNotVerified, match="no signature by the Authority key"):
        verify_group_summary(envelope, "authority:someone-else", public_key)

    async def forged(self: MeshClient, group_id: str) -> common_pb2.SignedEnvelope:
        return tampered

    monkeypatch.setattr(MeshClient, "signed_group_summary", forged)
    for args in (
        ["coordinator", "summary", *bench.as_("alice")],
        ["coordinator", "reconcile", *bench.as_("coord-bot")],
    ):
        code = await asyncio.to_thread(cli.main, ["--target", bench.target, *args, "--group", "grp_t"])
        assert code == 1
        assert "the signed summary of grp_t does NOT verify" in capsys.readouterr().err
    assert (await bench.client.group_state("grp_t")).head_sequence == 5  # nothing was acknowledged
