"""``mwp plan apply|export`` as a subprocess against a live mesh (the ``bench`` of
tests/test_cli_mission.py): examples/plan.toml (a diamond of four WorkItems) applied, re-applied
without a write (the Group's head sequence unchanged), revised after an edit with the diff shown
first, exported and applied back without a write, and broken plans refused before anything is sent."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from missionweave.cli.common import save_session
from missionweave.cli.plan import plan_changes, revised
from missionweave.cli.plan_file import MissionFacts, items_of, read
from missionweave.kernel.signing import write_key
from missionweave.sdk.client import membership_epoch
from missionweave.sdk.contracts import Budget, work_contract
from tests import builders
from tests.conftest import World
from tests.test_cli_mission import ROOT, Bench
from tests.test_cli_mission import bench as bench  # the fixture

EXAMPLE = ROOT / "examples" / "plan.toml"
DIAMOND = ["extract-eu", "extract-us", "reconcile", "report"]


async def planned_mission(bench: Bench) -> str:
    """A Mission whose budget the example plan fits in, worker-bot one of its Workers."""
    group = await bench.create("--tokens", "100000", "--tool-calls", "1000", "--budget", "20")
    await bench.mwp(
        "member", "grant", "--group", group, "worker-bot", "--role", "worker", *bench.as_("alice")
    )
    return group


async def head(bench: Bench, group: str) -> int:
    return int((await bench.show(group))["head_sequence"])


async def apply(bench: Bench, group: str, plan: Path, *extra: str, expect: int = 0) -> tuple[str, str]:
    run = await bench.mwp(
        "plan", "apply", str(plan), "--group", group, *bench.as_("coord-bot"), *extra, expect=expect
    )
    return run.stdout, run.stderr


def edited(tmp_path: Path, name: str, *replacements: tuple[str, str]) -> Path:
    """The example plan with ``replacements`` made (each must apply)."""
    text = EXAMPLE.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.req("MW-10.4-01", "MW-10.2-T02")
async def test_the_diamond_is_created_once_and_reapplying_or_exporting_writes_nothing(
    bench: Bench, tmp_path: Path
) -> None:
    group = await planned_mission(bench)
    out, _ = await apply(bench, group, EXAMPLE, "--yes")
    assert [line.split()[:3] for line in out.splitlines() if line.startswith("  + ")] == [
        ["+", w, "authorize"] for w in DIAMOND
    ]
    assert "4 to authorize, 0 to revise" in out
    tree = (await bench.mwp("work", "tree", "--group", group, "--json")).json()
    assert tree["roots"] == ["extract-eu", "extract-us"] and tree["order"] == DIAMOND
    deps = {n["work_item_id"]: n["depends_on"] for n in tree["work_items"]}
    assert deps == {
        "extract-eu": [],
        "extract-us": [],
        "reconcile": ["extract-eu", "extract-us"],
        "report": ["reconcile"],
    }
    reconcile = (await bench.mwp("work", "show", "--group", group, "reconcile", "--json")).json()["contract"]
    assert [c["required_evidence_methods"] for c in reconcile["acceptance_criteria"]] == [
        ["EVIDENCE_METHOD_TEST"],
        ["EVIDENCE_METHOD_BUSINESS_RULE", "EVIDENCE_METHOD_REVIEW"],
    ]
    assert reconcile["budget"] == {
        "currency": "EUR",
        "financial_micros": "1000000",
        "tokens": "20000",
        "tool_calls": "60",
    }
    assert [(i["name"], i["from_work_item_id"]) for i in reconcile["inputs"]] == [
        ("eu", "extract-eu"),
        ("us", "extract-us"),
    ]

    at = await head(bench, group)
    again, _ = await apply(bench, group, EXAMPLE)  # no --yes needed: there is nothing to confirm
    assert f"nothing to change: {group} matches the plan" in again
    assert all(line.split()[0] == "=" for line in again.splitlines()[1:-1])
    assert await head(bench, group) == at

    exported = tmp_path / "exported.toml"
    written = await bench.mwp("plan", "export", "--group", group, "-o", str(exported))
    assert f"wrote 4 item(s) of {group}" in written.stdout
    text = exported.read_text()
    assert text.startswith(f"# The WorkItem DAG of {group}") and "[items.reconcile.evidence]" in text
    assert "deadline" not in text  # the Mission's deadline, the default, is left out
    back, _ = await apply(bench, group, exported)
    assert "nothing to change" in back and await head(bench, group) == at
    document = (await bench.mwp("plan", "export", "--group", group, "--json")).json()
    assert list(document["items"]) == DIAMOND and document["items"]["reconcile"]["inputs"] == {
        "eu": "extract-eu/figures",
        "us": "extract-us/figures",
    }


@pytest.mark.req("MW-10.1-04", "MW-10.1-05")
async def test_a_changed_plan_shows_its_diff_first_then_revises_the_contract(
    bench: Bench, tmp_path: Path
) -> None:
    group = await planned_mission(bench)
    await apply(bench, group, EXAMPLE, "--yes")
    at = await head(bench, group)
    changed = edited(
        tmp_path,
        "changed.toml",
        (
            'budget = { tokens = 20000, tool_calls = 60, financial = "1.00" }',
            'budget = { tokens = 25000, tool_calls = 60, financial = "1.00" }',
        ),
        ('offer_to = ["worker-1"]', 'offer_to = ["worker-bot"]'),
        ('intercompany = ["business-rule", "review"]', 'intercompany = ["business-rule"]'),
    )
    # Not confirmed (no terminal, no --yes): the diff, then a usage error; nothing written.
    out, err = await apply(bench, group, changed, expect=2)
    assert "  ~ reconcile  revise (contract revision 1 -> 2, offered to worker-bot)" in out
    assert "      budget.tokens: 20000 -> 25000" in out
    assert '      evidence.intercompany: ["business-rule", "review"] -> ["business-rule"]' in out
    assert "0 to authorize, 1 to revise" in out and "pass --yes" in err
    dry, _ = await apply(bench, group, changed, "--dry-run")
    assert "budget.tokens: 20000 -> 25000" in dry
    assert await head(bench, group) == at

    done = (
        await bench.mwp(
            "plan", "apply", str(changed), "--group", group, "--yes", "--json", *bench.as_("coord-bot")
        )
    ).json()
    assert done["applied"] is True and [c["action"] for c in done["changes"]] == [
        "unchanged",
        "unchanged",
        "revise",
        "unchanged",
    ]
    (result,) = done["results"]
    offered = next(e for e in result["events"] if e["type"] == "work.offered")["work_offered"]
    assert offered["contract_revision"] == "2" and offered["candidate_ids"] == ["worker-bot"]
    shown = (await bench.mwp("work", "show", "--group", group, "reconcile", "--json")).json()
    assert shown["state"] == "WORK_ITEM_STATE_OFFERED" and shown["contract"]["revision"] == "2"
    assert shown["contract"]["budget"]["tokens"] == "25000"
    assert (
        "time_policy" in shown["contract"] and "cost_policy" in shown["contract"]
    )  # kept from the running contract
    again, _ = await apply(bench, group, changed)
    assert "nothing to change" in again

    # A title is not part of the contract: changing it is refused before anything is sent.
    renamed = edited(tmp_path, "renamed.toml", ('title = "Reconcile EU and US"', 'title = "Reconcile"'))
    _, err = await apply(bench, group, renamed, "--yes", expect=2)
    assert "items.reconcile.title: a WorkItem's title is not part of its contract" in err


def test_a_revision_keeps_what_a_plan_does_not_carry() -> None:
    now = datetime.now(UTC)
    running = builders.contract(now)  # lease durations set, as a plan cannot
    running.deliverables[0].schema.artifact.CopyFrom(builders.artifact("c"))
    running.permissions.allowed_tools.append("python.exec")
    running.revision = 1
    planned = work_contract(
        "a new goal",
        deliverables={"report": "the ledger"},
        criteria={"balances": "they match"},
        budget=Budget(tokens=7),
        max_attempts=5,
        now=now,
    )
    out = revised(running, planned)
    assert (out.goal, out.budget.tokens, out.retry_policy.max_attempts, out.revision) == (
        "a new goal",
        7,
        5,
        0,
    )
    assert out.deliverables[0].description == "the ledger"
    assert out.deliverables[0].schema.artifact == running.deliverables[0].schema.artifact
    assert list(out.permissions.allowed_tools) == ["python.exec"] and out.time_policy == running.time_policy


async def test_at_a_terminal_the_changes_are_applied_once_confirmed(bench: Bench) -> None:
    group = await planned_mission(bench)
    at = await head(bench, group)
    for answer, code in ((b"n\n", 1), (b"y\n", 0)):
        terminal, stdin = os.openpty()  # stdin is a terminal: apply asks on stderr, reads the answer
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "missionweave.cli",
            "--target",
            bench.target,
            "plan",
            "apply",
            str(EXAMPLE),
            "--group",
            group,
            *bench.as_("coord-bot"),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        os.close(stdin)
        os.write(terminal, answer)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        os.close(terminal)
        assert proc.returncode == code, err.decode()
        assert "apply these 4 change(s)" in err.decode() and "4 to authorize" in out.decode()
        if code:
            assert "mwp: nothing applied" in err.decode() and await head(bench, group) == at
    assert [
        line.split()[1].rstrip(":") for line in out.decode().splitlines() if line.startswith("  authorize ")
    ] == DIAMOND


async def test_broken_plans_are_refused_before_anything_is_sent_naming_item_and_field(
    bench: Bench, tmp_path: Path
) -> None:
    group = await planned_mission(bench)
    at = await head(bench, group)
    broken = {
        "items.extract-eu.depends_on: a dependency cycle: extract-eu -> report -> reconcile -> extract-eu": (
            'goal = "Extract the Q3 figures of every EU entity from the ledger"',
            'goal = "Extract the Q3 figures of every EU entity from the ledger"\ndepends_on = ["report"]',
        ),
        "items.report.depends_on[1]: no item 'nope' in the plan and no WorkItem 'nope' in the Group": (
            'depends_on = ["reconcile"]',
            'depends_on = ["reconcile", "nope"]',
        ),
        "items.report.evidence.typo: no acceptance criterion 'typo'": (
            'readable = ["review"] }',
            'readable = ["review"], typo = ["test"] }',
        ),
        "items.extract-us.budget.tokens: a whole number >= 0, not -1": (
            'budget = { tokens = 10000, tool_calls = 40, financial = "0.50" }\ndeliverables = { figures = { description = "the US',
            'budget = { tokens = -1, tool_calls = 40, financial = "0.50" }\ndeliverables = { figures = { description = "the US',
        ),
        "items.report.budget: required": (
            'budget = { tokens = 15000, tool_calls = 30, financial = "1.00" }\n',
            "",
        ),
        "items.report.inputs.figures.from: reconcile is not among depends_on": (
            'depends_on = ["reconcile"]\n',
            "",
        ),
        "items.report.evidence.readable: 'telepathy' is not one of integrity, schema, test": (
            'readable = ["review"]',
            'readable = ["telepathy"]',
        ),
        "items.report.colour: unknown key": ("[items.report]\n", '[items.report]\ncolour = "red"\n'),
        "items.extract-eu.deadline: expected a time with its zone": (
            "max_attempts = 3\n",
            'max_attempts = 3\ndeadline = "soon"\n',
        ),
        "not valid TOML": ("[items.report]", "[items.report"),
    }
    for i, (message, replacement) in enumerate(broken.items()):
        _, err = await apply(
            bench, group, edited(tmp_path, f"broken-{i}.toml", replacement), "--yes", expect=2
        )
        assert message in err, (message, err)
    assert await head(bench, group) == at

    # A cycle through a WorkItem the Group already holds is found once the Group is read.
    await apply(bench, group, EXAMPLE, "--yes")
    at = await head(bench, group)
    only = tmp_path / "only.toml"
    only.write_text(
        'version = 1\n[items.extract-eu]\ntitle = "Extract the EU figures"\n'
        'goal = "Extract the Q3 figures of every EU entity from the ledger"\ndepends_on = ["report"]\n'
        'budget = { tokens = 10000, tool_calls = 40, financial = "0.50" }\noffer_to = ["worker-bot"]\n'
        'deliverables = { figures = { description = "the EU figures as CSV", media_type = "text/csv" } }\n'
        'criteria = { complete = "every EU entity of the ledger has a row" }\nevidence = { complete = ["test"] }\n'
    )
    _, err = await apply(bench, group, only, "--yes", expect=2)
    assert re.search(r"items\.extract-eu\.depends_on: a dependency cycle: .*extract-eu", err), err
    assert await head(bench, group) == at


async def test_command_ids_follow_the_plan_so_a_retried_apply_is_answered_by_idempotency(
    bench: Bench,
) -> None:
    group = await planned_mission(bench)
    planned = (
        await bench.mwp(
            "plan", "apply", str(EXAMPLE), "--group", group, "--dry-run", "--json", *bench.as_("coord-bot")
        )
    ).json()
    from_cli = {c["work_item_id"]: c["command_id"] for c in planned["changes"]}

    # The same ids computed in this process: they depend on the plan and the Group, not on the run.
    state = await bench.client.group_state(group)
    args = argparse.Namespace(
        group=group, coordinator_epoch=None, override_reason=None, offer_expires_in=None
    )
    changes = plan_changes(args, state, items_of(read(EXAMPLE), MissionFacts.of(state)), {})
    assert {c.work_item_id: c.command_id for c in changes} == from_cli

    # An apply that sent extract-eu's command and crashed before its answer: the retry is replayed.
    coord = bench.signers["coord-bot"]
    first = changes[0]
    assert first.body is not None
    epoch = membership_epoch(state, "coord-bot")
    sent = await bench.client.execute(
        coord.sign(
            coord.command(group, first.kind, first.body, membership_epoch=epoch, command_id=first.command_id)
        )
    )
    retried = await bench.client.execute(
        coord.sign(
            coord.command(group, first.kind, first.body, membership_epoch=epoch, command_id=first.command_id)
        )
    )
    assert not sent.replayed and retried.replayed and retried.group_revision == sent.group_revision
    out, _ = await apply(bench, group, EXAMPLE, "--yes")
    assert "  = extract-eu  unchanged" in out and "3 to authorize, 0 to revise" in out


# ------------------------------------------------------------------ both topologies


@pytest.mark.both_topologies
async def test_apply_reapply_and_export_in_both_topologies(world: World, tmp_path: Path) -> None:
    """The same plan through the gateway of a split mesh (every service a process of its own) as
    through a single process: created once, re-applied and exported back without a write."""
    keys = {}
    for name, signer in (
        ("alice", world.owner),
        ("coord-bot", world.coordinator),
        ("worker-bot", world.worker),
    ):
        keys[name] = tmp_path / f"{name}.key"
        write_key(keys[name], signer.key)
        save_session(keys[name], signer)  # the CLI signs with the world's sessions (the Coordinator lease's)

    async def mwp(*args: str, as_: str = "coord-bot", expect: int = 0) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "missionweave.cli",
            "--target",
            world.target,
            *args,
            "--as",
            as_,
            "--key",
            str(keys[as_]),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        assert proc.returncode == expect, err.decode() + out.decode()
        return out.decode()

    create = [
        "mission",
        "create",
        "--title",
        "Q3",
        "--objective",
        "Q3 report",
        "--done",
        "reconciled",
        "--coordinator",
        "coord-bot",
    ]
    group = (
        (await mwp(*create, "--tokens", "100000", "--tool-calls", "1000", "--budget", "20", as_="alice"))
        .strip()
        .splitlines()[-1]
    )
    await mwp("member", "grant", "--group", group, "worker-bot", "--role", "worker", as_="alice")
    assert "4 to authorize" in await mwp("plan", "apply", str(EXAMPLE), "--group", group, "--yes")
    at = (await world.client.group_state(group)).head_sequence
    assert "nothing to change" in await mwp("plan", "apply", str(EXAMPLE), "--group", group)
    exported = tmp_path / "exported.toml"
    await mwp("plan", "export", "--group", group, "-o", str(exported))
    assert "nothing to change" in await mwp("plan", "apply", str(exported), "--group", group)
    await mwp("work", "offer", "--group", group, "extract-eu", "--to", "worker-bot")
    await mwp("work", "accept", "--group", group, "extract-eu", as_="worker-bot")
    tree = await mwp("work", "tree", "--group", group)
    assert "extract-eu  QUEUED  worker-bot" in tree and "+-- reconcile  OPEN" in tree
    assert (await world.client.group_state(group)).head_sequence == at + 2
