"""The TypeScript SDK (sdks/typescript, issue 44) against a live mesh, in both topologies.

Its conformance driver (dist/conformance-driver.js, a JSON-lines protocol on stdin/stdout) follows a
Group verified and in order, keeps its durable cursor in the Python SDK's file format, executes
signed commands idempotently and reports refusals by their Rejection reason; its example Worker
(examples/worker.mjs) accepts an offer, stores an Artifact with a signed manifest and submits with
Evidence, which the Mission's review shows verified. The SDK's own unit tests (node --test: PAE,
manifests and call proofs byte for byte as the Python side makes them) run here too. Needs `node`
(v20+) and `make sdk-ts`; MWP_SKIP_NODE=1 skips these tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from missionweave.kernel.signing import read_key, write_key
from missionweave.sdk.client import decode_events
from missionweave.v1 import common_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave.v1.authority_service_pb2 import GetMissionProgressRequest
from tests import builders, sdk_vectors
from tests.client_processes import require_node
from tests.conftest import World, polled
from tests.mcp_fixtures import party
from tests.test_bridges_mission import accepted_by_coordinator
from tests.test_cli_worker import mwp
from tests.test_missions import G, create
from tests.test_offline_execution import Proxy
from tests.test_work_items import Flow, setup

pytestmark = pytest.mark.both_topologies  # also on the split topology (conftest.py)

SDK_DIR = Path(__file__).resolve().parent.parent / "sdks" / "typescript"
DRIVER = SDK_DIR / "dist" / "conformance-driver.js"
EXAMPLE_WORKER = SDK_DIR / "examples" / "worker.mjs"
STEP_S = 30.0


@pytest.fixture
def node() -> str:
    """`node`, with the SDK built by `make sdk-ts`."""
    return require_node(DRIVER, "run `make sdk-ts`")


async def identity(w: World, tmp_path: Path, identity_id: str) -> Path:
    """A new agent identity whose key file (as `mwp keygen` writes it) the TypeScript side reads."""
    key = SigningKey.generate()
    await w.client.register_identity(
        "admin", w.keys["admin"], identity_id, common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
    )
    key_file = tmp_path / f"{identity_id}.key"
    write_key(key_file, key)
    return key_file


async def grant(w: World, member_id: str, role: int) -> int:
    """Grants a Membership; returns the sequence after which the member's visibility starts (its grant is the first event it sees)."""
    body = membership_pb2.MembershipGrant(member_id=member_id, role=role)  # type: ignore[arg-type]
    result = await w.run(w.owner, G, "membership_grant", body, membership_epoch=1)
    return min(e.sequence for e in decode_events(result.events)) - 1


class Driver:
    """One conformance driver process: requests answered in order, notifications kept."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.notes: list[dict[str, Any]] = []
        self.next_id = 0

    async def line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), STEP_S)
        assert raw, "the driver ended its output"
        return dict(json.loads(raw))

    async def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.next_id += 1
        self.process.stdin.write(json.dumps({"id": self.next_id, "op": op, **fields}).encode() + b"\n")
        await self.process.stdin.drain()
        while True:
            line = await self.line()
            if line.get("id") == self.next_id:
                return line
            self.notes.append(line)

    async def note(self, kind: str) -> dict[str, Any]:
        """The next notification of ``kind`` (earlier ones included)."""
        while True:
            for i, line in enumerate(self.notes):
                if line.get("type") == kind:
                    return self.notes.pop(i)
            self.notes.append(await self.line())


@asynccontextmanager
async def driver(
    node: str, target: str, agent_id: str, key_file: Path, state: Path, audience: str = ""
) -> AsyncIterator[Driver]:
    env = {
        **os.environ,
        "MWP_TARGET": target,
        "MWP_AUDIENCE": audience or target,
        "MWP_AGENT_ID": agent_id,
        "MWP_KEY_FILE": str(key_file),
        "MWP_STATE_DIR": str(state),
    }
    process = await asyncio.create_subprocess_exec(
        node, str(DRIVER), env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None
    )
    try:
        running = Driver(process)
        assert await running.line() == {"type": "ready", "sdk": "typescript"}
        yield running
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_the_typescript_driver_follows_a_group_verified_and_executes_signed_commands(
    world: World, node: str, tmp_path: Path
) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    key_file = await identity(w, tmp_path, "ts-agent")
    visible_after = await grant(w, "ts-agent", membership_pb2.MEMBER_ROLE_WORKER)
    for i in range(5):
        await w.run(w.owner, G, "message_post", builders.message(conv, f"m{i}"), membership_epoch=1)
    log = [(e.sequence, e.event_id, e.type) async for e in w.client.read_events(G)]
    expected = [e for e in log if e[0] > visible_after]
    assert len(expected) == 6  # the grant and the five messages
    state = tmp_path / "state"
    async with driver(node, w.target, "ts-agent", key_file, state) as d:
        # A window of 2 credits over the whole log: it only gets through by granting credits in ACKs.
        assert (await d.ask("subscribe", group=G, credits=2))["ok"]
        got = [await d.note("event") for _ in expected]
        assert [
            (e["sequence"], e["event_id"], e["event_type"]) for e in got
        ] == expected  # in order, once each

        post = {"conversationId": conv, "content": {"text": "from TypeScript"}}
        done = await d.ask("execute", group=G, kind="message_post", body=post, command_id="cmd_ts-1")
        assert done["ok"] and not done["replayed"] and done["sequence"] == expected[-1][0] + 1, done
        again = await d.ask("execute", group=G, kind="message_post", body=post, command_id="cmd_ts-1")
        assert again["ok"] and again["replayed"] and again["sequence"] == done["sequence"]  # idempotent retry
        assert (await d.note("event"))["sequence"] == done["sequence"]  # its own event, verified, once

        refused = await d.ask(
            "execute",
            group=G,
            kind="message_post",
            body={"conversationId": "conv_missing", "content": {"text": "x"}},
        )
        assert not refused["ok"] and refused["reason"] == "NOT_FOUND", refused

        await polled(lambda: _cursor(d, done["sequence"]), STEP_S)
        assert (await d.ask("close"))["ok"]
        assert await asyncio.wait_for(d.process.wait(), STEP_S) == 0
    saved = json.loads((state / "ts-agent" / "cursors.json").read_text())
    assert saved == {"agent_id": "ts-agent", "cursors": {G: done["sequence"]}}  # the Python SDK's format
    assert (state / "ts-agent" / "session.json").stat().st_mode & 0o077 == 0


async def _cursor(d: Driver, sequence: int) -> bool:
    answer = await d.ask("cursor", group=G)
    return bool(answer["ok"] and answer["cursor"] == sequence)


@asynccontextmanager
async def example_worker(
    node: str, target: str, agent_id: str, key_file: Path, state: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """examples/worker.mjs serving G until the test is done (SIGTERM: a graceful close)."""
    env = {
        **os.environ,
        "MWP_TARGET": target,
        "MWP_AGENT_ID": agent_id,
        "MWP_KEY_FILE": str(key_file),
        "MWP_STATE_DIR": str(state),
    }
    process = await asyncio.create_subprocess_exec(
        node, str(EXAMPLE_WORKER), G, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert process.stderr is not None
        started = await asyncio.wait_for(process.stderr.readline(), STEP_S)
        assert started.startswith(f"worker {agent_id} serving".encode()), started
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STEP_S)
            except TimeoutError:
                process.kill()
                await process.wait()


@pytest.mark.req("MW-10.3-07", "MW-11.1-05", "MW-13.1-03")
async def test_the_typescript_example_worker_accepts_stores_an_artifact_and_submits_with_evidence(
    world: World, node: str, tmp_path: Path
) -> None:
    """A Coordinator (the Python SDK) plans and offers a WorkItem; the TypeScript Worker admits and
    accepts it, starts it, stores its report with a manifest it signed and submits with Evidence for
    the acceptance criterion; the Coordinator accepts, submits the Mission, and the owner's review
    (`mwp mission review --verify-bytes`) finds the Artifact's signature and bytes verified."""
    w = world
    key_file = await identity(w, tmp_path, "ts-worker")
    flow: Flow = await setup(w, w.worker)
    await grant(w, "ts-worker", membership_pb2.MEMBER_ROLE_WORKER)
    async with example_worker(node, w.target, "ts-worker", key_file, tmp_path / "state") as process:
        await flow.authorize("wi-ts")
        await flow.coord("work_offer", flow.offer_body("wi-ts", "ts-worker"))
        assert process.stdout is not None
        finished = json.loads(await asyncio.wait_for(process.stdout.readline(), STEP_S))
    assert finished["work_item_id"] == "wi-ts" and finished["outcome"] == "submitted", finished
    log = [e async for e in w.client.read_events(G)]
    [submitted] = [e.work_submitted for e in log if e.WhichOneof("payload") == "work_submitted"]
    [report] = submitted.artifacts
    assert [report.digest.hex] == finished["artifacts"] and report.media_type == "text/plain"
    assert [  # slot.evidence: one per criterion, about the report, by the method it requires
        (e.evidence_id, e.criterion_id, e.subject.artifact.digest.hex, e.method) for e in submitted.evidence
    ] == [("ev-wi-ts-balances", "balances", report.digest.hex, wp.EVIDENCE_METHOD_TEST)]
    assert [e.actor_id for e in log if e.type == "work.submitted"] == ["ts-worker"]
    progress = await w.client.authority.GetMissionProgress(GetMissionProgressRequest(group_id=G))
    assert {p.work_item_id: p.state for p in progress.work_items}["wi-ts"] == wp.WORK_ITEM_STATE_SUBMITTED

    await accepted_by_coordinator(flow, w, "wi-ts")
    mission = (await w.client.group_state(G)).mission
    submit = mission_pb2.MissionSubmitForApproval(
        coordinator_epoch=1, mission_revision=mission.revision, summary="reported", artifacts=[report]
    )
    await flow.coord("mission_submit_for_approval", submit)
    owner = party(tmp_path / "owner-keys", w.owner)
    code, out, err = await mwp(
        "--target", w.target, "mission", "review", "--group", G, "--verify-bytes", "--json",
        "--as", "alice", "--key", str(owner.key),
    )  # fmt: skip
    assert code == 0, err
    review = json.loads(out)
    [check] = [c for c in review["artifact_checks"] if report.digest.hex in c["digest"]]
    assert check["signature"] == "verified" and check["bytes"]["status"] == "OK", check
    assert "signature by ts-worker#session-" in check["signature_detail"], check  # its own session key
    assert (
        await w.client.download(report.digest)
        == f"Report for wi-ts: {builders.contract(w.clock.now()).goal}\n".encode()
    )


def test_the_checked_in_byte_vectors_are_what_the_python_side_makes() -> None:
    """sdks/typescript/test/vectors.json is the Python side's bytes now (else the unit tests below
    would compare the TypeScript SDK with a stale copy): regenerate with `python -m tests.sdk_vectors`."""
    checked_in = json.loads((SDK_DIR / "test" / "vectors.json").read_text())
    assert checked_in == sdk_vectors.vectors()


def test_the_typescript_sdk_unit_tests_pass(node: str) -> None:
    """`node --test` over sdks/typescript/test: the bytes above, and the delivery rules of a
    subscription against a scripted gateway (order, dedup, skipped, gaps, verification, handler retries)."""
    run = subprocess.run([node, "--test", "test/"], cwd=SDK_DIR, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "# fail 0" in run.stdout and "# pass 0" not in run.stdout


@pytest.mark.req("MW-11.3-11", "MW-11.3-12")
async def test_the_typescript_worker_pauses_when_preempted_and_resumes_from_its_checkpoint(
    world: World, node: str, tmp_path: Path
) -> None:
    """The driver's `work` op in `pause_on_preemption` mode, on the Group its `subscribe` op follows:
    the Coordinator asks the running work to
    pause; the handler returns a checkpoint, the runtime records it answering the request and
    releases the slot; the WorkItem is placed again and resumed from that checkpoint, then submitted."""
    w = world
    key_file = await identity(w, tmp_path, "ts-worker")
    flow: Flow = await setup(w, w.worker)
    await grant(w, "ts-worker", membership_pb2.MEMBER_ROLE_WORKER)
    async with driver(node, w.target, "ts-worker", key_file, tmp_path / "state") as d:
        assert (await d.ask("subscribe", group=G, credits=16))["ok"]  # one subscription serves both
        assert (await d.ask("work", groups=[G], mode="pause_on_preemption", content="resumed work"))["ok"]
        await flow.authorize("wi-p")
        await flow.coord("work_offer", flow.offer_body("wi-p", "ts-worker"))
        first = await d.note("work_started")
        assert first["work_item_id"] == "wi-p" and first["resume_from_checkpoint_id"] == ""
        ask = wp.WorkRequestPreemption(
            work_item_id="wi-p",
            preemption_request_id="pre-1",
            lease_id=first["lease_id"],
            reason=wp.PREEMPTION_REASON_PRIORITY,
            coordinator_epoch=1,
            ownership_epoch=first["ownership_epoch"],
        )
        await flow.coord("work_request_preemption", ask)
        assert (await d.note("work_finished"))["outcome"] == "paused"
        resumed = await d.note("work_started")
        assert resumed["resume_from_checkpoint_id"] == f"ck-{first['lease_id']}"
        assert resumed["lease_id"] != first["lease_id"]  # a new lease for the resumed start
        done = await d.note("work_finished")
        assert done["outcome"] == "submitted" and len(done["artifacts"]) == 1, done
        types = [(await d.note("event"))["event_type"]]
        while types[-1] != "work.submitted":  # the events reach the notifications too, in order
            types.append((await d.note("event"))["event_type"])
        assert types.index("work.checkpointed") < types.index(
            "work.started", types.index("work.checkpointed")
        )
        assert (await d.ask("close"))["ok"]
    log = [e async for e in w.client.read_events(G)]
    [paused] = [e.work_checkpointed for e in log if e.WhichOneof("payload") == "work_checkpointed"]
    assert paused.preemption_request_id == "pre-1"  # the checkpoint answered the request
    [submitted] = [e.work_submitted for e in log if e.WhichOneof("payload") == "work_submitted"]
    assert [a.digest.hex for a in submitted.artifacts] == done["artifacts"]
    assert await w.client.download(submitted.artifacts[0].digest) == b"resumed work"


async def test_the_typescript_agent_reconnects_resubscribes_from_its_cursor_and_resends_waiting_commands(
    world: World, node: str, tmp_path: Path
) -> None:
    """A network cut (a proxy in between drops every connection and refuses new ones): the agent
    reconnects with capped backoff, SUBSCRIBEs again from its cursor (what was posted meanwhile
    arrives once, in order) and re-sends the command that was waiting, which is applied once."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    key_file = await identity(w, tmp_path, "ts-agent")
    visible_after = await grant(w, "ts-agent", membership_pb2.MEMBER_ROLE_WORKER)
    proxy = Proxy(w.target)
    target = await proxy.start()
    try:
        async with driver(node, target, "ts-agent", key_file, tmp_path / "state", audience=w.target) as d:
            assert (await d.ask("subscribe", group=G, credits=4))["ok"]
            post = {"conversationId": conv, "content": {"text": "before the cut"}}
            before = await d.ask("execute", group=G, kind="message_post", body=post)
            assert before["ok"], before
            proxy.sever()
            for i in range(3):
                await w.run(
                    w.owner, G, "message_post", builders.message(conv, f"cut {i}"), membership_epoch=1
                )
            d.process.stdin.write(  # type: ignore[union-attr]
                json.dumps({"id": 99, "op": "execute", "group": G, "kind": "message_post",
                            "body": {"conversationId": conv, "content": {"text": "during the cut"}},
                            "command_id": "cmd_during-the-cut"}).encode() + b"\n"
            )  # fmt: skip
            await asyncio.sleep(1.0)  # a reconnect attempt or two fail meanwhile
            proxy.restore()
            while (answer := await d.line()).get("id") != 99:
                d.notes.append(answer)
            assert answer["ok"] and not answer["replayed"], answer
            head = (await w.client.group_state(G)).head_sequence
            assert answer["sequence"] == head
            events = []
            while not events or events[-1]["sequence"] < head:
                events.append(await d.note("event"))
            assert [e["sequence"] for e in events] == list(
                range(visible_after + 1, head + 1)
            )  # once each, in order
            assert (await d.ask("close"))["ok"]
    finally:
        await proxy.close()
    texts = [
        e.message_posted.content.text async for e in w.client.read_events(G) if e.type == "message.posted"
    ]
    assert texts.count("during the cut") == 1


SESSION_SCRIPT = """
import { Agent, readKeyFile } from "./dist/index.js";
const agent = await Agent.connect({
  target: process.env.MWP_TARGET, identityId: process.env.MWP_AGENT_ID,
  identityKey: readKeyFile(process.env.MWP_KEY_FILE), stateDir: process.env.MWP_STATE_DIR, log: () => {},
});
console.log(String(agent.signer.sessionEpoch));
await agent.close();
"""


async def test_a_typescript_agent_reuses_its_saved_session_until_the_gateway_refuses_it(
    world: World, node: str, tmp_path: Path
) -> None:
    """session.json is reused on restart (no new session fences anything); once a newer session of
    the identity made it stale, the next start is refused SESSION_STALE at HELLO and opens a new one."""
    w = world
    key_file = await identity(w, tmp_path, "ts-agent")
    env = {
        **os.environ,
        "MWP_TARGET": w.target,
        "MWP_AGENT_ID": "ts-agent",
        "MWP_KEY_FILE": str(key_file),
        "MWP_STATE_DIR": str(tmp_path / "state"),
    }

    async def start() -> int:
        process = await asyncio.create_subprocess_exec(
            node,
            "--input-type=module",
            "-e",
            SESSION_SCRIPT,
            cwd=SDK_DIR,
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(process.communicate(), STEP_S)
        assert process.returncode == 0
        return int(out)

    first = await start()
    assert await start() == first  # reused
    await w.client.open_session("ts-agent", read_key(key_file))  # another process of the identity
    renewed = await start()
    assert renewed == first + 2  # the saved one was refused, a new one opened after the other's
    saved = json.loads((tmp_path / "state" / "ts-agent" / "session.json").read_text())
    assert saved["session_epoch"] == renewed and saved["identity_id"] == "ts-agent"
