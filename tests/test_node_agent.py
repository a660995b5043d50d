"""The polyglot proof (issue 6): a Node.js agent (examples/node/agent.js, on the TypeScript SDK in
sdks/typescript: connect-node's gRPC, types generated from protos/, Ed25519 from Node's crypto)
against a live mesh.

It proves its session key in HELLO, subscribes to a Group, verifies the Authority's signature on every
event, prints one JSON line per event and ACKs its cursor with credit grants; the gateway stores the
cursor. Needs `node` (v20+) and `make node-deps`; MWP_SKIP_NODE=1 skips these tests.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey
from sqlalchemy import select

from missionweave.kernel.signing import read_key, write_key
from missionweave.sdk.client import SessionSigner
from missionweave_server.config import Settings
from missionweave_server.services.gateway.schema import cursors
from tests import builders
from tests.client_processes import require_node, run_to_end
from tests.conftest import World
from tests.test_key_continuity import G as KEYS_GROUP
from tests.test_key_continuity import cli, read_all, some_history, started, stop, store_flags
from tests.test_missions import G, create

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

NODE_DIR = Path(__file__).resolve().parent.parent / "examples" / "node"
AGENT_JS = NODE_DIR / "agent.js"
RUN_SECONDS = 60.0


@pytest.fixture
def node() -> str:
    """`node`, with the example's packages (the TypeScript SDK it links) installed by `make node-deps`."""
    return require_node(
        NODE_DIR / "node_modules" / "@missionweave" / "sdk" / "dist" / "index.js", "run `make node-deps`"
    )


@dataclass
class Run:
    returncode: int
    lines: list[dict[str, Any]]  # one JSON object per event printed on stdout
    stderr: str


async def run_agent(
    node: str, target: str, signer: SessionSigner, key_file: Path, *args: str, group: str = G
) -> Run:
    """Runs agent.js to completion (bounded); the process never outlives the test."""
    flags = {
        "--target": target,
        "--agent": signer.identity_id,
        "--session-epoch": str(signer.session_epoch),
        "--key-file": str(key_file),
        "--group": group,
        "--timeout": str(RUN_SECONDS - 10),  # the agent gives up (and says so) before we kill it
    }
    argv = [item for flag in flags.items() for item in flag]
    code, out, err = await run_to_end([node, str(AGENT_JS), *argv, *args], RUN_SECONDS)
    return Run(code, [json.loads(line) for line in out.splitlines() if line.strip()], err)


async def node_session(w: World, tmp_path: Path) -> tuple[SessionSigner, Path]:
    """A fresh session of the Coordinator with a session key of its own, as the Python SDK opens one:
    the identity key only signs OpenSession; the Node agent gets the session key seed (mode 0600)."""
    session_key = SigningKey.generate()
    signer = await w.client.open_session("coord-bot", w.coordinator.key, session_key)
    key_file = tmp_path / "coord-bot.session.key"
    write_key(key_file, session_key)
    return signer, key_file


async def stored_cursor(w: World, agent_id: str) -> int | None:
    async with w.mesh.engine.connect() as conn:  # type: ignore[attr-defined]
        row = (
            await conn.execute(
                select(cursors.c.cursor).where(cursors.c.agent_id == agent_id, cursors.c.group_id == G)
            )
        ).first()
    return None if row is None else int(row[0])


@pytest.mark.req("MW-16-01", "MW-16-03", "MW-16-06", "MW-16-07", "MW-16-10")
async def test_a_node_agent_receives_verifies_and_acks_every_event_of_a_group(
    world: World, node: str, tmp_path: Path
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    for i in range(8):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"m{i}"), membership_epoch=1)
    expected = [(e.sequence, e.event_id, e.type) async for e in w.client.read_events(G)]
    head = (await w.client.group_state(G)).head_sequence
    assert [s for s, _, _ in expected] == list(range(1, head + 1)) and head >= 10
    signer, key_file = await node_session(w, tmp_path)
    # Pinned out of band (from the server, not over the wire): the agent checks every event against it.
    authority_key = w.mesh.authority.public_key.hex()  # type: ignore[attr-defined]
    # A window of 3 credits over 10+ events: the agent only gets through by granting credits in ACKs.
    common = ("--credits", "3", "--authority-key", authority_key)

    middle = head // 2
    first = await run_agent(
        node, w.target, signer, key_file, *common, "--after-sequence", "0", "--until-sequence", str(middle)
    )
    assert first.returncode == 0, first.stderr
    got = [(line["sequence"], line["event_id"], line["type"]) for line in first.lines]
    assert got == expected[: len(got)] and got[-1][0] >= middle  # in order, none missing, none twice
    assert await stored_cursor(w, "coord-bot") == got[-1][0]  # the final ACK was stored before the exit

    # Resume after the last event printed (MW-16-10), through the head.
    resumed = await run_agent(
        node,
        w.target,
        signer,
        key_file,
        *common,
        "--after-sequence",
        str(got[-1][0]),
        "--until-sequence",
        str(head),
    )
    assert resumed.returncode == 0, resumed.stderr
    got += [(line["sequence"], line["event_id"], line["type"]) for line in resumed.lines]
    assert got == expected
    assert all(line["actor_id"] for line in first.lines + resumed.lines)
    assert await stored_cursor(w, "coord-bot") == head  # the durable ACK cursor reached the head


async def test_the_node_agent_refuses_a_wrong_authority_key_and_the_gateway_a_wrong_session_key(
    world: World, node: str, tmp_path: Path
) -> None:
    """Both signatures are real: the gateway checks the Node-made HELLO proof, the agent the events."""
    w = world
    await create(w)
    signer, key_file = await node_session(w, tmp_path)
    until = ("--until-sequence", "1")

    impostor = await run_agent(node, w.target, signer, key_file, *until, "--authority-key", bytes(32).hex())
    assert impostor.returncode == 1 and "is not the pinned key" in impostor.stderr, impostor.stderr

    wrong_key = tmp_path / "not-the-session.key"
    write_key(wrong_key, SigningKey.generate())
    refused = await run_agent(node, w.target, signer, wrong_key, *until)
    assert refused.returncode == 1 and "HELLO_INVALID" in refused.stderr, refused.stderr

    assert impostor.lines == refused.lines == []
    assert await stored_cursor(w, "coord-bot") is None


async def test_the_node_agent_verifies_history_signed_before_an_authority_key_rotation(
    db_url: str, node: str, tmp_path: Path
) -> None:
    """docs/integrity.md "Key continuity": after ``mwp authority rotate-key`` the old events keep the
    old key's signatures; the agent verifies each against the key it names, from the key history,
    and a pin of the retired key still holds because the recorded rotation leads from it."""
    settings = Settings(
        listen="127.0.0.1:0", data_dir=tmp_path / "data", database_url=db_url, grace_seconds=0.5
    )
    mesh, client = await started(settings)
    alice = await some_history(client, settings)  # signed by the first key
    retired = bytes(read_key(settings.authority_key_path).verify_key).hex()
    await stop(mesh, client)
    assert await asyncio.to_thread(cli, "authority", "rotate-key", *store_flags(settings)) == 0
    mesh, client = await started(settings)
    try:
        conv = (await client.group_state(KEYS_GROUP)).mission.planning_conversation_id
        await client.execute(
            alice.sign(alice.command(KEYS_GROUP, "message_post", builders.message(conv), membership_epoch=1))
        )
        signers = {e.signatures[0].key_id for e in await read_all(client)}
        assert len(signers) == 2  # history on both sides of the rotation
        head = (await client.group_state(KEYS_GROUP)).head_sequence
        key_file = tmp_path / "alice.session.key"
        write_key(key_file, alice.key)
        target = f"127.0.0.1:{mesh.port}"
        run = await run_agent(
            node,
            target,
            alice,
            key_file,
            "--authority-key",
            retired,
            "--until-sequence",
            str(head),
            group=KEYS_GROUP,
        )
        assert run.returncode == 0, run.stderr
        assert [line["sequence"] for line in run.lines] == list(range(1, head + 1))
    finally:
        await stop(mesh, client)
