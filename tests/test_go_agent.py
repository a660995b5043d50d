"""The Go agent (go/cmd/mwp-go-agent, docs/getting-started-go.md) against a live mesh.

Built by `make go-check` from stubs generated out of protos/ with Debian's packages. The agent opens
a session by signing OpenSession with an identity key file, posts a signed message.post, and reads
the Group with call proofs, checking each event's Authority signature before printing it. Every
signature it makes is checked by the mesh and every one it checks was made by Python, so the
signed bytes must match on both sides. Needs Debian's Go packages (`make print-go-packages`);
without `go` these tests skip, or fail when CI=true. MWP_SKIP_GO=1 skips them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from missionweave.kernel.signing import read_key, write_key
from missionweave_server.config import Settings
from tests import builders
from tests.client_processes import run_to_end
from tests.conftest import World
from tests.test_key_continuity import G as KEYS_GROUP
from tests.test_key_continuity import cli, some_history, started, stop, store_flags
from tests.test_missions import G, create
from tests.test_node_agent import Run

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "build" / "go" / "bin" / "mwp-go-agent"
GO_TOOLS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")
RUN_SECONDS = 60.0


@pytest.fixture(scope="session")
def go_agent() -> Path:
    """The agent, built by `make go-check` (stubs, vet, build: seconds once Go's build cache is warm)."""
    if os.environ.get("MWP_SKIP_GO") == "1":
        pytest.skip("MWP_SKIP_GO=1: the Go agent tests are skipped")
    missing = [tool for tool in GO_TOOLS if shutil.which(tool) is None]
    if missing:
        packages = subprocess.run(
            ["make", "--no-print-directory", "-s", "print-go-packages"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        message = (
            f"{', '.join(missing)} not on PATH: install Debian's {packages} "
            "(or set MWP_SKIP_GO=1 to skip the Go agent tests)"
        )
        if os.environ.get("CI") == "true":  # CI must run them (.ci/run installs the packages)
            pytest.fail(message)
        pytest.skip(message)
    build = subprocess.run(
        ["make", "--no-print-directory", "go-check"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert build.returncode == 0, f"make go-check failed:\n{build.stdout}{build.stderr}"
    return AGENT


def key_file(tmp_path: Path, name: str, key: SigningKey) -> Path:
    path = tmp_path / f"{name}.key"
    write_key(path, key)
    return path


async def run_agent(agent: Path, target: str, as_: str, key: Path, *args: str, group: str = G) -> Run:
    """Runs the agent to completion (bounded); the process never outlives the test."""
    flags = ["--target", target, "--as", as_, "--key", str(key), "--group", group]
    argv = [str(agent), *flags, "--timeout", f"{RUN_SECONDS - 10:.0f}s", *args]
    code, out, err = await run_to_end(argv, RUN_SECONDS)
    return Run(code, [json.loads(line) for line in out.splitlines()], err)


def seen(run: Run) -> list[tuple[int, str, str, str]]:
    return [(line["sequence"], line["event_id"], line["type"], line["actor_id"]) for line in run.lines]


async def the_log(w: World, after: int = 0) -> list[tuple[int, str, str, str]]:
    return [(e.sequence, e.event_id, e.type, e.actor_id) async for e in w.client.read_events(G, after)]


@pytest.mark.req("MW-11.3-09", "MW-9-13")
async def test_a_go_agent_posts_a_signed_message_and_reads_and_follows_the_verified_log(
    world: World, go_agent: Path, tmp_path: Path
) -> None:
    w = world
    await create(w)
    # The fixture registered alice with this key and opened her session with it; the agent opens its own.
    alice_key = key_file(tmp_path, "alice", w.owner.key)
    posted = await run_agent(go_agent, w.target, "alice", alice_key, "--post", "hello from Go")
    assert posted.returncode == 0, posted.stderr
    log = await the_log(w)
    assert seen(posted) == log and log[-1][2:] == ("message.posted", "alice")  # every event, in order
    text = [e.message_posted.content.text async for e in w.client.read_events(G, log[-1][0] - 1)]
    assert text == ["hello from Go"]
    key_id, _ = await w.client.authority_key()
    assert {line["key_id"] for line in posted.lines} == {key_id}

    # Following as the Coordinator: events appended while the agent reads reach it, verified, in order.
    head = log[-1][0]
    coord_key = key_file(tmp_path, "coord-bot", w.coordinator.key)
    follow = asyncio.create_task(
        run_agent(go_agent, w.target, "coord-bot", coord_key, "--after-sequence", str(head), "--until-sequence", str(head + 2))
    )  # fmt: skip
    alice = await w.client.open_session("alice", w.owner.key)  # the agent's session fenced the fixture's
    conv = (await w.client.group_state(G)).mission.planning_conversation_id
    for i in range(2):
        await w.client.execute(
            w.signed(alice, G, "message_post", builders.message(conv, f"m{i}"), membership_epoch=1)
        )
    followed = await follow
    assert followed.returncode == 0, followed.stderr
    assert seen(followed) == await the_log(w, head) and len(followed.lines) == 2


async def test_the_go_agent_refuses_a_wrong_identity_key_a_readable_key_file_and_a_wrong_authority_key(
    world: World, go_agent: Path, tmp_path: Path
) -> None:
    """Clear refusals, exit 1, nothing printed: the mesh checks the Go-made OpenSession signature,
    the agent the Authority's key."""
    w = world
    await create(w)
    wrong = await run_agent(
        go_agent, w.target, "alice", key_file(tmp_path, "not-alice", SigningKey.generate())
    )
    assert wrong.returncode == 1 and "OpenSession refused" in wrong.stderr, wrong.stderr
    assert "REJECTION_REASON_SIGNATURE_INVALID" in wrong.stderr, wrong.stderr

    readable = key_file(tmp_path, "alice", w.owner.key)
    readable.chmod(0o644)
    exposed = await run_agent(go_agent, w.target, "alice", readable)
    assert exposed.returncode == 1 and "must not be readable by others" in exposed.stderr, exposed.stderr

    readable.chmod(0o600)
    impostor = await run_agent(go_agent, w.target, "alice", readable, "--authority-key", bytes(32).hex())
    assert impostor.returncode == 1 and "is not the pinned key" in impostor.stderr, impostor.stderr
    assert wrong.lines == exposed.lines == impostor.lines == []


async def test_the_go_agent_verifies_history_signed_before_an_authority_key_rotation(
    db_url: str, go_agent: Path, tmp_path: Path
) -> None:
    """docs/integrity.md "Key continuity": after `mwp authority rotate-key` the agent verifies each
    event with the key it names, and a pin of the retired key holds through the recorded rotation."""
    settings = Settings(
        listen="127.0.0.1:0", data_dir=tmp_path / "data", database_url=db_url, grace_seconds=0.5
    )
    mesh, client = await started(settings)
    alice = await some_history(
        client, settings
    )  # signed by the first key; alice's session key is her identity key
    retired = bytes(read_key(settings.authority_key_path).verify_key).hex()
    await stop(mesh, client)
    assert await asyncio.to_thread(cli, "authority", "rotate-key", *store_flags(settings)) == 0
    mesh, client = await started(settings)
    try:
        alice_key = key_file(tmp_path, "alice", alice.key)
        target = f"127.0.0.1:{mesh.port}"
        run = await run_agent(
            go_agent, target, "alice", alice_key, "--post", "after the rotation", "--authority-key", retired,
            group=KEYS_GROUP,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert [line["sequence"] for line in run.lines] == list(range(1, len(run.lines) + 1))
        assert run.lines[-1]["type"] == "message.posted"
        current, _ = await client.authority_key()
        assert run.lines[-1]["key_id"] == current and run.lines[0]["key_id"] != current  # both sides
    finally:
        await stop(mesh, client)
