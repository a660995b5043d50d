"""``mwp work ...``: a Coordinator's and a Worker's WorkItem commands as a subprocess against a live
mesh (the ``bench`` of tests/test_cli_mission.py): every command's happy path, the look-ups that keep
the simple case short, bad flags refused before anything is sent (exit 2, the head unchanged) and the
server's refusals (exit 1 with the reason)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_cli_artifact import put, write
from tests.test_cli_mission import Bench
from tests.test_cli_mission import bench as bench  # the fixture

BUDGET = ["--budget", "tokens=5000", "--budget", "tool_calls=20", "--budget", "financial=0.50"]


async def mission(bench: Bench) -> str:
    """A Mission with a budget its WorkItems fit in, coord-bot its Coordinator, worker-bot and
    relief-bot Workers."""
    group = await bench.create("--tokens", "100000", "--tool-calls", "1000", "--budget", "20")
    for worker in ("worker-bot", "relief-bot"):
        await bench.mwp("member", "grant", "--group", group, worker, "--role", "worker", *bench.as_("alice"))
    return group


async def head(bench: Bench, group: str) -> int:
    return int((await bench.show(group))["head_sequence"])


async def work(bench: Bench, group: str, *args: str, as_: str = "coord-bot", expect: int = 0) -> str:
    """``mwp work ARGS --group G`` as ``as_``; its last line (the new id, where there is one)."""
    run = await bench.mwp("work", *args, "--group", group, *bench.as_(as_), expect=expect)
    return run.last_line if expect == 0 else run.stderr


async def item(bench: Bench, group: str, work_item: str) -> dict[str, Any]:
    return dict((await bench.mwp("work", "show", "--group", group, work_item, "--json")).json())


async def authorize(bench: Bench, group: str, work_item: str, *extra: str) -> str:
    return await work(
        bench,
        group,
        "authorize",
        *([work_item] if work_item else []),
        "--title",
        f"task {work_item or 'b'}",
        "--criterion",
        "complete=every entity is present",
        "--evidence",
        "complete=test",
        *BUDGET,
        *extra,
    )


async def submitted(
    bench: Bench, group: str, work_item: str, tmp_path: Path, worker: str = "worker-bot"
) -> str:
    """The Worker's part by hand: accept the open offer, start, store a real Artifact with its
    manifest under the lease, submit it with Evidence. Returns the Artifact's digest."""
    await work(bench, group, "accept", work_item, as_=worker)
    lease = await work(bench, group, "start", work_item, as_=worker)
    epoch = str((await item(bench, group, work_item))["ownership_epoch"])
    data = f"{work_item}: every entity is present ({lease})\n".encode()
    digest = await put(
        bench,
        write(tmp_path / f"{work_item}-{lease}.txt", data),
        "--manifest-for",
        group,
        "--work-item",
        work_item,
        "--lease-id",
        lease,
        "--ownership-epoch",
        epoch,
        *bench.as_(worker),
    )
    await work(
        bench,
        group,
        "submit",
        work_item,
        "--artifact",
        digest,
        "--evidence-pass",
        "complete=42 of 42 present",
        as_=worker,
    )
    return digest


@pytest.mark.req("MW-10.2-T02", "MW-10.2-T03", "MW-10.2-T04", "MW-10.2-T07", "MW-10.2-T11", "MW-10.2-T12")
async def test_a_workitem_from_authorize_to_verified(bench: Bench, tmp_path: Path) -> None:
    group = await mission(bench)
    assert await authorize(bench, group, "wi-a") == "wi-a"
    generated = await authorize(bench, group, "", "--depends-on", "wi-a", "--input", "figures=wi-a/result")
    assert generated.startswith("wi_")
    shown = await item(bench, group, "wi-a")
    contract = shown["contract"]
    # The defaults: the title as goal and deliverable, the Mission's deadline and currency, normal urgency.
    assert contract["goal"] == "task wi-a" and contract["deliverables"][0]["deliverable_id"] == "result"
    assert contract["acceptance_criteria"][0]["required_evidence_methods"] == ["EVIDENCE_METHOD_TEST"]
    assert (
        contract["deadline"]
        == (await bench.mwp("state", "--group", group)).json()["mission"]["definition"]["deadline"]
    )
    assert contract["budget"] == {
        "currency": "EUR",
        "financial_micros": "500000",
        "tokens": "5000",
        "tool_calls": "20",
    }
    assert contract["urgency"] == "WORK_URGENCY_NORMAL" and contract["retry_policy"] == {"max_attempts": 3}

    offer = await work(bench, group, "offer", "wi-a", "--to", "worker-bot")
    extended = await bench.mwp(
        "work", "extend", "--group", group, "wi-a", "--to", "relief-bot", "--json", *bench.as_("coord-bot")
    )
    assert extended.json()["offer_id"] == offer
    (record,) = (await item(bench, group, "wi-a"))["offers"]
    assert record["offer_id"] == offer and record["candidate_ids"] == ["worker-bot", "relief-bot"]

    digest = await submitted(bench, group, "wi-a", tmp_path)
    text = (await bench.mwp("work", "show", "--group", group, "wi-a")).stdout
    assert "Artifacts" in text and digest in text and "submitted evt_" in text
    assert "complete" in text and "42 of 42 present" in text and "submission" in text

    accepted = await bench.mwp(
        "work",
        "accept-result",
        "--group",
        group,
        "wi-a",
        "--evidence-pass",
        "complete=checked the list",
        "--json",
        *bench.as_("coord-bot"),
    )
    assert [e["type"] for e in accepted.json()["events"]] == [
        "work.evidence_recorded",
        "work.result_accepted",
    ]
    verified = await item(bench, group, "wi-a")
    assert verified["state"] == "WORK_ITEM_STATE_VERIFIED"
    stages = [(e["stage"], e["producer_id"], e["result"]) for e in verified["evidence_records"]]
    assert stages == [("submission", "worker-bot", "PASS"), ("review", "coord-bot", "PASS")]
    assert verified["artifact_records"][0]["digest"] == digest

    tree = await bench.mwp("work", "tree", "--group", group)
    lines = tree.stdout.splitlines()
    assert lines[1].startswith("wi-a  VERIFIED  -  'task wi-a'")  # a verified WorkItem has no owner left
    assert lines[2].startswith(f"+-- {generated}  OPEN  -") and "[waiting on dependencies]" not in lines[2]
    document = (await bench.mwp("work", "tree", "--group", group, "--json")).json()
    assert document["roots"] == ["wi-a"] and document["order"] == ["wi-a", generated]
    assert {n["work_item_id"]: n["dependents"] for n in document["work_items"]} == {
        "wi-a": [generated],
        generated: [],
    }


async def test_review_refusals_failures_blocks_and_cancellation(bench: Bench, tmp_path: Path) -> None:
    group = await mission(bench)
    for wid in ("wi-1", "wi-2", "wi-3", "wi-4"):
        await authorize(bench, group, wid)

    # Changes requested: failing Evidence, failed, offered again to the same Worker, a new epoch.
    await work(bench, group, "offer", "wi-1", "--to", "worker-bot")
    await submitted(bench, group, "wi-1", tmp_path)
    await work(bench, group, "request-changes", "wi-1", "--evidence-fail", "complete=3 entities missing")
    again = await item(bench, group, "wi-1")
    assert again["state"] == "WORK_ITEM_STATE_OFFERED" and again["offers"][0]["candidate_ids"] == [
        "worker-bot"
    ]
    failure = [e for e in again["evidence_records"] if e["stage"] == "failure"]
    assert [(e["criterion_id"], e["result"], e["summary"]) for e in failure] == [
        ("complete", "FAIL", "3 entities missing")
    ]
    await work(bench, group, "accept", "wi-1", as_="worker-bot")
    assert (await item(bench, group, "wi-1"))["ownership_epoch"] == "2"

    # Blocked by the Worker, unblocked by the Coordinator (the blocked lease is live: queued).
    await work(bench, group, "start", "wi-1", as_="worker-bot")
    await work(bench, group, "renew", "wi-1", "--usage", "tokens=120", as_="worker-bot")
    await work(bench, group, "block", "wi-1", "--needs", "the Q2 ledger", as_="worker-bot")
    assert (await item(bench, group, "wi-1"))["state"] == "WORK_ITEM_STATE_BLOCKED"
    unblocked = await bench.mwp(
        "work", "unblock", "--group", group, "wi-1", "--resolution", "attached", *bench.as_("coord-bot")
    )
    assert "unblocked wi-1: it is QUEUED" in unblocked.stdout
    # The Coordinator fails it with failure Evidence (the observation, by default).
    await work(bench, group, "fail", "wi-1", "--reason", "the ledger is gone")
    failed = await item(bench, group, "wi-1")
    assert (
        failed["state"] == "WORK_ITEM_STATE_FAILED" and failed["usage"]["budget"]["used"]["tokens"] == "120"
    )

    # Rejected with Evidence: failed, not offered again.
    await work(bench, group, "offer", "wi-2", "--to", "relief-bot")
    await submitted(bench, group, "wi-2", tmp_path, worker="relief-bot")
    recorded = await work(
        bench, group, "evidence", "wi-2", "--evidence-pass", "complete=the file opens", "--method", "review"
    )
    assert recorded.startswith("evd_")
    await work(
        bench,
        group,
        "reject",
        "wi-2",
        "--evidence-fail",
        "complete=nothing attached",
        "--reason",
        "wrong file",
    )
    assert (await item(bench, group, "wi-2"))["state"] == "WORK_ITEM_STATE_FAILED"

    # A Worker's transient failure under its lease is retried by the Authority: queued again.
    await work(bench, group, "offer", "wi-3", "--to", "worker-bot")
    await work(bench, group, "accept", "wi-3", as_="worker-bot")
    await work(bench, group, "start", "wi-3", as_="worker-bot")
    failed_by_owner = await bench.mwp(
        "work",
        "fail",
        "--group",
        group,
        "wi-3",
        "--kind",
        "transient",
        "--reason",
        "timeout",
        *bench.as_("worker-bot"),
    )
    assert "reported failed (transient) by the owner" in failed_by_owner.stdout
    assert (await item(bench, group, "wi-3"))["state"] == "WORK_ITEM_STATE_QUEUED"

    # Declined, then cancelled.
    await work(bench, group, "offer", "wi-4", "--to", "worker-bot")
    await work(bench, group, "decline", "wi-4", "--reason", "capacity", as_="worker-bot")
    await work(bench, group, "cancel", "wi-4", "--reason", "descoped")
    assert (await item(bench, group, "wi-4"))["state"] == "WORK_ITEM_STATE_CANCELLED"


async def test_bad_flags_are_refused_before_anything_is_sent(bench: Bench, tmp_path: Path) -> None:
    group = await mission(bench)
    await authorize(bench, group, "wi-a")
    before = await head(bench, group)
    base = ["authorize", "wi-x", "--title", "x", "--criterion", "complete=done"]
    refusals = {
        "--evidence: evidence.typo: no acceptance criterion 'typo'": [
            *base,
            *BUDGET,
            "--evidence",
            "typo=test",
        ],
        "--input: inputs.figures.from: wi-a is not among depends_on": [
            *base,
            *BUDGET,
            "--input",
            "figures=wi-a",
        ],
        "--budget tokens is given twice": [*base, "--budget", "tokens=1", "--budget", "tokens=2"],
        "--budget: budget.currency: the Mission's budget is in EUR, not USD": [
            *base,
            "--budget",
            "financial=1USD",
        ],
        "--deadline: deadline:": [*base, *BUDGET, "--deadline", "2001-01-01T00:00:00Z"],
        "--to nobody-bot: holds no active Membership": ["offer", "wi-a", "--to", "nobody-bot"],
        "--evidence-pass nosuch: the contract of wi-a has no acceptance criterion": [
            "evidence",
            "wi-a",
            "--evidence-pass",
            "nosuch",
            "--submission",
            "evt_x",
        ],
    }
    for message, args in refusals.items():
        stderr = await work(bench, group, *args, expect=2)
        assert message in stderr, (args, stderr)
    for args in (
        [*base, "--budget", "tokens=-5"],  # argparse: not a whole number
        [*base],  # no budget: a plan must say what the work may spend
        ["authorize", "bad id!", "--title", "x", "--criterion", "c=d", *BUDGET],
        [*base, *BUDGET, "--evidence", "complete=telepathy"],
        [*base, *BUDGET, "--deadline", "2030-01-01T00:00:00"],  # no time zone
        ["fail", "wi-a", "--reason", "x", "--kind", "bogus"],
    ):
        await work(bench, group, *args, expect=2)
    assert await head(bench, group) == before
    # A submission without Evidence for a required criterion is refused before it is sent too.
    await work(bench, group, "offer", "wi-a", "--to", "worker-bot")
    await work(bench, group, "accept", "wi-a", as_="worker-bot")
    await work(bench, group, "start", "wi-a", as_="worker-bot")
    before = await head(bench, group)
    missing = await work(
        bench, group, "submit", "wi-a", "--artifact", "blake3:" + "ab" * 32 + ":3", as_="worker-bot", expect=2
    )
    assert "no Evidence for the required acceptance criteria complete" in missing
    assert await head(bench, group) == before


async def test_refusals_by_the_server_exit_1_with_the_reason(bench: Bench) -> None:
    group = await mission(bench)
    await authorize(bench, group, "wi-a")
    await authorize(bench, group, "wi-b", "--depends-on", "wi-a")
    before = await head(bench, group)
    waiting = await work(bench, group, "offer", "wi-b", "--to", "worker-bot", expect=1)
    assert "refused: PRECONDITION_FAILED" in waiting and "dependencies of wi-b" in waiting
    denied = await work(
        bench,
        group,
        "authorize",
        "wi-c",
        "--title",
        "c",
        "--criterion",
        "c=d",
        *BUDGET,
        as_="worker-bot",
        expect=1,
    )
    assert "refused: PERMISSION_DENIED" in denied
    taken = await work(
        bench, group, "authorize", "wi-a", "--title", "again", "--criterion", "c=d", *BUDGET, expect=1
    )
    assert "refused: INVALID_ARGUMENT" in taken and "body.work_item_id" in taken
    missing = await work(bench, group, "accept-result", "wi-nope", expect=1)
    assert "refused: NOT_FOUND" in missing
    unsubmitted = await work(bench, group, "accept-result", "wi-a", expect=1)
    assert "wi-a has no submission" in unsubmitted
    assert await head(bench, group) == before
    # The MissionOwner may authorize as an audited emergency override (MW-7.1-13).
    override = await bench.mwp(
        "work",
        "authorize",
        "wi-o",
        "--group",
        group,
        "--title",
        "o",
        "--criterion",
        "c=d",
        *BUDGET,
        "--override-reason",
        "the Coordinator is unreachable",
        "--json",
        *bench.as_("alice"),
    )
    authorized = override.json()["events"][0]["work_authorized"]
    assert (
        authorized["emergency_override"] is True
        and authorized["override_reason"] == "the Coordinator is unreachable"
    )
