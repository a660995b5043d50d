"""The TypeScript SDK against a compacted live log (both topologies): a subscription whose cursor is
older than the online history gets CURSOR_TOO_OLD with the Authority's signed snapshot reference;
with `onSnapshot` it fetches the snapshot, verifies it, restores it and goes on from the snapshot
sequence with the events after it, once each, in order; without `onSnapshot` it stops with
`CURSOR_TOO_OLD` (docs: sdks/typescript/README.md "Subscribe", snapshots)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import membership_pb2
from tests import builders
from tests.conftest import World
from tests.test_missions import G, create
from tests.test_sdk_typescript import SDK_DIR, STEP_S, grant, identity, node

pytestmark = pytest.mark.both_topologies

__all__ = ["node"]  # the fixture, shared with tests/test_sdk_typescript.py

FOLLOW_SCRIPT = """
import { Agent, readKeyFile } from "./dist/index.js";
const out = (line) => console.log(JSON.stringify(line, (_, v) => (typeof v === "bigint" ? Number(v) : v)));
const agent = await Agent.connect({
  target: process.env.MWP_TARGET, identityId: process.env.MWP_AGENT_ID,
  identityKey: readKeyFile(process.env.MWP_KEY_FILE), stateDir: process.env.MWP_STATE_DIR, log: () => {},
});
const until = BigInt(process.env.UNTIL);
await new Promise((resolve) => {
  agent.subscribe(process.env.GROUP, async (event) => {
    out({ type: "event", sequence: event.sequence, event_type: event.type });
    if (event.sequence >= until) resolve();
  }, {
    onSnapshot: process.env.RESTORE === "1"
      ? (s) => out({ type: "snapshot", sequence: s.sequence, conversation: s.state?.mission?.planningConversationId })
      : undefined,
    onFailed: (failure) => { out({ type: "failed", reason: failure.reason }); resolve(); },
  });
});
await agent.close();
"""


async def follow(
    node: str, w: World, key_file: Path, state: Path, until: int, restore: bool
) -> list[dict[str, Any]]:
    """Runs FOLLOW_SCRIPT as ts-agent until it handled `until` or its subscription failed."""
    env = {
        **os.environ,
        "MWP_TARGET": w.target,
        "MWP_AGENT_ID": "ts-agent",
        "MWP_KEY_FILE": str(key_file),
        "MWP_STATE_DIR": str(state),
        "GROUP": G,
        "UNTIL": str(until),
        "RESTORE": "1" if restore else "0",
    }
    process = await asyncio.create_subprocess_exec(
        node, "--input-type=module", "-e", FOLLOW_SCRIPT, cwd=SDK_DIR, env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), STEP_S)
    assert process.returncode == 0
    return [json.loads(line) for line in out.decode().splitlines()]


@pytest.mark.req("MW-16-11", "MW-16-12")
async def test_a_typescript_subscription_restores_a_compacted_groups_snapshot_and_goes_on_after_it(
    world: World, node: str, tmp_path: Path
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    key_file = await identity(w, tmp_path, "ts-agent")
    await grant(w, "ts-agent", membership_pb2.MEMBER_ROLE_WORKER)
    for i in range(3):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"before {i}"), membership_epoch=1)
    taken = await w.client.authority.TakeSnapshot(apb.TakeSnapshotRequest(group_id=G, compact=True))
    for i in range(2):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"after {i}"), membership_epoch=1)
    head = (await w.client.group_state(G)).head_sequence
    assert head == taken.sequence + 2

    refused = await follow(node, w, key_file, tmp_path / "plain", head, restore=False)
    assert refused == [{"type": "failed", "reason": "CURSOR_TOO_OLD"}]  # nothing handed over

    lines = await follow(node, w, key_file, tmp_path / "restoring", head, restore=True)
    assert lines[0] == {"type": "snapshot", "sequence": taken.sequence, "conversation": conv}
    assert [(line["sequence"], line["event_type"]) for line in lines[1:]] == [
        (taken.sequence + 1, "message.posted"),
        (taken.sequence + 2, "message.posted"),
    ]  # after the snapshot, once each, in order
    saved = json.loads((tmp_path / "restoring" / "ts-agent" / "cursors.json").read_text())
    assert saved["cursors"] == {G: head}
