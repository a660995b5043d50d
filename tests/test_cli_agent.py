"""``mwp agent card publish|show`` and ``mwp agent presence report|show``: the CLI as a subprocess
against a live mesh (the ``bench`` of tests/test_cli_mission.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli_mission import Bench
from tests.test_cli_mission import bench as bench  # the fixture


@pytest.mark.req("MW-11.1-13")
async def test_publish_from_a_file_and_flags_then_show_versions(bench: Bench, tmp_path: Path) -> None:
    spec = tmp_path / "card.json"
    spec.write_text(
        json.dumps(
            {
                "cardVersion": "1.0.0",
                "maxConcurrency": 2,
                "displayName": "Worker",
                "capabilities": [{"capabilityId": "code.python", "version": "1.4.0"}],
                "extensions": ["urn:missionweave:ext:review"],
            }
        )
    )
    worker = bench.as_("worker-bot")
    first = await bench.mwp("agent", "card", "publish", *worker, "--file", str(spec))
    assert first.stdout.startswith("agent card worker-bot 1.0.0 (in force; signature verified)")
    assert "capabilities: code.python 1.4.0" in first.stdout
    again = (await bench.mwp("agent", "card", "publish", *worker, "--file", str(spec), "--json")).json()
    assert again["replayed"] is True and again["card"]["max_concurrency"] == 2
    await bench.mwp(
        "agent",
        "card",
        "publish",
        *worker,
        "--file",
        str(spec),
        "--card-version",
        "1.1.0",
        "--max-concurrency",
        "4",
        "--endpoint",
        "gateway://127.0.0.1:50051",
    )

    shown = await bench.mwp("agent", "card", "show", "worker-bot")  # read as alice (MWP_AS)
    assert "agent card worker-bot 1.1.0 (in force; signature verified)" in shown.stdout
    assert "max concurrency: 4" in shown.stdout and "versions (newest first):" in shown.stdout
    old = (await bench.mwp("agent", "card", "show", "worker-bot", "--card-version", "1.0.0", "--json")).json()
    assert (
        old["card"]["card_version"] == "1.0.0"
        and old["latest_version"] == "1.1.0"
        and old["verified"] is True
    )
    assert [v["card_version"] for v in old["versions"]] == ["1.1.0", "1.0.0"]

    lower = await bench.mwp(
        "agent", "card", "publish", *worker, "--card-version", "0.9.0", "--max-concurrency", "1", expect=1
    )
    assert "REVISION_MISMATCH" in lower.stderr and "conflict=order" in lower.stderr
    human = await bench.mwp(
        "agent",
        "card",
        "publish",
        *bench.as_("alice"),
        "--card-version",
        "1.0.0",
        "--max-concurrency",
        "1",
        expect=1,
    )
    assert "PERMISSION_DENIED" in human.stderr
    usage = await bench.mwp("agent", "card", "publish", *worker, "--max-concurrency", "1", expect=2)
    assert "needs a version" in usage.stderr


@pytest.mark.req("MW-11.1-14")
async def test_report_and_show_presence(bench: Bench) -> None:
    worker = bench.as_("worker-bot")
    await bench.mwp("agent", "card", "publish", *worker, "--card-version", "1.0.0", "--max-concurrency", "3")
    reported = await bench.mwp(
        "agent",
        "presence",
        "report",
        *worker,
        "--availability",
        "available",
        "--free",
        "2",
        "--in-use",
        "1",
        "--note",
        "warm",
        "--ttl",
        "30",
    )
    assert reported.stdout.startswith("worker-bot  AVAILABLE  2 free, 1 in use of 3 (card 1.0.0)")
    shown = await bench.mwp("agent", "presence", "show", "worker-bot", "coord-bot")
    assert "worker-bot  AVAILABLE" in shown.stdout and "note: warm" in shown.stdout
    assert "coord-bot  no Presence reported" in shown.stdout
    bench.clock.advance(seconds=31)  # the server's clock: the report is stale
    stale = (await bench.mwp("agent", "presence", "show", "worker-bot", "coord-bot", "--json")).json()
    [presence] = stale["presences"]
    assert presence["fresh"] is False and presence["availability"] == "PRESENCE_AVAILABILITY_UNKNOWN"
    assert presence["reported_availability"] == "PRESENCE_AVAILABILITY_AVAILABLE" and stale["missing"] == [
        "coord-bot"
    ]
    text = await bench.mwp("agent", "presence", "show", "worker-bot")
    assert "UNKNOWN (stale since" in text.stdout and "last reported AVAILABLE" in text.stdout
    over = await bench.mwp(
        "agent", "presence", "report", *worker, "--availability", "busy", "--free", "4", expect=1
    )
    assert "INVALID_ARGUMENT" in over.stderr and "limit=3" in over.stderr
