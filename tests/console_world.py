"""What the browser tests of the web console (tests/test_console_browser.py) stand on: a mesh that
serves the console, people with key files the page can sign in with, Missions seeded through the
SDK (WorkItems planned, offered, worked with real Artifacts and Evidence, submitted for approval),
and the browser itself (Debian's Chromium driven by Playwright).

The page opens its own session with a person's key, which fences every older session of theirs
(docs/console.md): what a test drives through the SDK once the page signed someone in is driven as
the Coordinator or the Worker, never as the person in the browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.kernel.signing import read_key, write_key
from missionweave.sdk.artifacts import NO_AGENT_CARD, Origin, put_artifact
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import command_pb2, common_pb2, membership_pb2, mission_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.config import Settings
from tests import builders

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
STATIC = ROOT / "missionweave_server" / "console" / "static"
AXE = ROOT / "console" / "node_modules" / "axe-core" / "axe.min.js"
# Playwright's waits, in milliseconds: generous for a loaded CI machine, far under the test's limit.
WAIT_MS = 15_000

HUMAN = common_pb2.IDENTITY_KIND_HUMAN
AGENT = common_pb2.IDENTITY_KIND_AGENT
BUDGET = common_pb2.ResourceVector(
    currency="EUR",
    financial_micros=50_000_000,
    tokens=1_000_000,
    tool_calls=500,
    compute_ms=3_600_000,
    wall_clock_ms=36_000_000,
    side_effects=10,
)
ITEM_BUDGET = common_pb2.ResourceVector(
    currency="EUR",
    financial_micros=5_000_000,
    tokens=100_000,
    tool_calls=50,
    compute_ms=600_000,
    wall_clock_ms=3_600_000,
    side_effects=2,
)


def browser_or_skip() -> None:
    """Debian's Chromium, Playwright, the built console and axe-core must be there. Only a missing
    /usr/bin/chromium outside CI skips the test; in CI (CI=true: .ci/run installs Chromium) it fails,
    and so does anything else missing (the test extra installs Playwright; `make test` builds the
    console and its tools first)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"the console's browser tests need {CHROMIUM} (Debian's chromium package); CI installs it"
            )
        pytest.skip(f"the console's browser tests need {CHROMIUM} (Debian's chromium package)")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.fail("the console's browser tests need Playwright: pip install -e './client' -e '.[test]'")
    for built, how in ((STATIC / "app.js", "make console"), (AXE, "make console (npm ci in console/)")):
        if not built.exists():
            pytest.fail(f"{built} is missing: run `{how}` (make test builds it first)")


@dataclass
class Person:
    """A registered identity with the key file the page signs in with."""

    identity_id: str
    key: SigningKey
    key_file: Path
    signer: SessionSigner


@dataclass
class ConsoleMesh:
    """A mesh with its console, its people and an SDK client for each (reads proven as them)."""

    mesh: Any
    target: str
    console_url: str
    data_dir: Path
    people: dict[str, Person] = field(default_factory=dict)
    clients: list[MeshClient] = field(default_factory=list)

    def client(self, reader: str) -> MeshClient:
        client = MeshClient(self.target, reader=self.people[reader].signer)
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await client.channel.close()


async def enrol(
    mesh: ConsoleMesh, admin_key: SigningKey, keys_dir: Path, identity_id: str, kind: int
) -> Person:
    """Registers ``identity_id`` with a new key written as `mwp keygen` writes it, and opens a session."""
    key = SigningKey.generate()
    key_file = keys_dir / f"{identity_id}.key"
    write_key(key_file, key)
    async with MeshClient(mesh.target) as client:
        await client.register_identity("admin", admin_key, identity_id, kind, bytes(key.verify_key))
        signer = await client.open_session(identity_id, key)
    person = Person(identity_id, key, key_file, signer)
    mesh.people[identity_id] = person
    return person


# Who the tests' meshes know: two owners, an outsider (all three people), a Coordinator and a Worker.
PEOPLE = (("alice", HUMAN), ("bob", HUMAN), ("carol", HUMAN), ("coord-bot", AGENT), ("worker-bot", AGENT))


async def people(mesh: ConsoleMesh, admin_key_path: Path, keys_dir: Path) -> None:
    admin_key = read_key(admin_key_path)
    for identity_id, kind in PEOPLE:
        await enrol(mesh, admin_key, keys_dir, identity_id, kind)


@contextlib.asynccontextmanager
async def console_mesh(tmp_path: Path) -> AsyncIterator[ConsoleMesh]:
    """A mesh in this process (SQLite, local blobs) serving the console on a free port."""
    from missionweave_server.mesh.server import start

    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        grace_seconds=1,
        console_listen="127.0.0.1:0",
    )
    mesh = await start(settings)
    assert mesh.console is not None, "the mesh serves no console"
    world = ConsoleMesh(mesh, f"127.0.0.1:{mesh.port}", mesh.console.url, settings.data_dir)
    try:
        await people(world, mesh.settings.admin_key_path, tmp_path / "keys")
        yield world
    finally:
        await world.close()
        await mesh.stop(grace=1)


class MissionSeed:
    """One Mission driven through the SDK as its owner, Coordinator and Worker: created, WorkItems
    authorized, offered, started, worked (an Artifact uploaded with its signed manifest, published
    under the lease, submitted with Evidence, accepted by the Coordinator with review Evidence) and
    the whole submitted for the owner's approval."""

    def __init__(
        self,
        mesh: ConsoleMesh,
        group_id: str,
        title: str,
        owner: str = "alice",
        coordinator: str = "coord-bot",
        worker: str = "worker-bot",
    ) -> None:
        self.group_id, self.title = group_id, title
        self.owner = mesh.people[owner].signer
        self.coordinator = mesh.people[coordinator].signer
        self.worker = mesh.people[worker].signer
        self.reader = mesh.client(coordinator)  # a member of every Mission it coordinates
        self.producer = mesh.client(worker)  # the Worker holds what it uploads
        self.mission_id = ""
        self.refs: dict[str, common_pb2.ArtifactRef] = {}

    async def run(self, signer: SessionSigner, kind: str, body: Any) -> command_pb2.CommandResult:
        return await self.reader.execute_as(signer, self.group_id, kind, body)

    async def create(self, *members: str) -> None:
        """The owner creates the Mission and grants ``members`` (Workers) their Membership."""
        create = builders.mission_create(
            self.owner.identity_id,
            self.coordinator.identity_id,
            SystemClock().now(),
            budget=BUDGET,
            title=self.title,
        )
        create.coordinator_renewal.lease_duration.FromSeconds(3600)
        await self.run(self.owner, "mission_create", create)
        self.mission_id = (await self.reader.group_state(self.group_id)).mission.mission_id
        for member in members:
            grant = membership_pb2.MembershipGrant(member_id=member, role=membership_pb2.MEMBER_ROLE_WORKER)
            await self.run(self.owner, "membership_grant", grant)

    async def authorize(self, work_item_id: str, title: str, depends_on: Sequence[str] = ()) -> None:
        contract = builders.contract(SystemClock().now(), depends_on=tuple(depends_on), budget=ITEM_BUDGET)
        body = wp.WorkAuthorize(
            work_item_id=work_item_id, title=title, contract=contract, coordinator_epoch=1
        )
        await self.run(self.coordinator, "work_authorize", body)

    async def offer(self, wid: str) -> None:
        offer = wp.WorkOffer(
            work_item_id=wid,
            offer_id=f"offer-{wid}",
            candidate_ids=[self.worker.identity_id],
            coordinator_epoch=1,
            expires_at=to_timestamp(SystemClock().now() + timedelta(minutes=30)),
            selection_criteria=[builders.selection(self.worker.identity_id)],
        )
        await self.run(self.coordinator, "work_offer", offer)

    async def accept(self, wid: str) -> None:
        body = wp.WorkAcceptOffer(work_item_id=wid, offer_id=f"offer-{wid}", contract_revision=1)
        await self.run(self.worker, "work_accept_offer", body)

    async def start(self, wid: str) -> None:
        body = wp.WorkStart(work_item_id=wid, ownership_epoch=1, lease_id=f"lease-{wid}")
        await self.run(self.worker, "work_start", body)

    async def upload(
        self, name: str, wid: str, data: bytes, media_type: str, *sources: str
    ) -> common_pb2.ArtifactRef:
        origin = Origin(
            self.group_id,
            self.mission_id,
            wid,
            agent_card_version=NO_AGENT_CARD,
            sources=[self.refs[s].digest for s in sources],
        )
        ref = await put_artifact(
            self.producer.artifacts, self.worker, data, media_type=media_type, origin=origin
        )
        self.refs[name] = ref
        return ref

    async def finish(self, wid: str, name: str, data: bytes, media_type: str, *sources: str) -> None:
        """The Worker publishes ``data`` under its lease and submits it with Evidence (a test log);
        the Coordinator records its review and accepts the result."""
        ref = await self.upload(name, wid, data, media_type, *sources)
        publish = wp.WorkPublishArtifact(
            work_item_id=wid,
            lease_id=f"lease-{wid}",
            ownership_epoch=1,
            artifact=ref,
            deliverable_id="report",
        )
        await self.run(self.worker, "work_publish_artifact", publish)
        log = await self.upload(
            f"log of {name}", wid, f"{wid}: 42 of 42 balances match\n".encode(), "text/plain"
        )
        evidence = wp.Evidence(
            evidence_id=f"ev-{wid}",
            criterion_id="balances",
            method=wp.EVIDENCE_METHOD_TEST,
            result=wp.EVIDENCE_RESULT_PASS,
            summary="42 of 42 balances match",
            artifacts=[log],
        )
        submit = wp.WorkSubmit(
            work_item_id=wid,
            lease_id=f"lease-{wid}",
            ownership_epoch=1,
            contract_revision=1,
            artifacts=[ref],
            evidence=[evidence],
            summary=f"{name} written",
            usage_delta=common_pb2.ResourceVector(currency="EUR", wall_clock_ms=500, tokens=50),
        )
        submitted = decode_events((await self.run(self.worker, "work_submit", submit)).events)[0].event_id
        review = wp.Evidence(
            evidence_id=f"rev-{wid}",
            criterion_id="balances",
            method=wp.EVIDENCE_METHOD_REVIEW,
            result=wp.EVIDENCE_RESULT_PASS,
            summary="read against the ledger",
        )
        await self.run(
            self.coordinator,
            "work_record_evidence",
            wp.WorkRecordEvidence(work_item_id=wid, evidence=review, coordinator_epoch=1),
        )
        accept = wp.WorkAcceptResult(
            work_item_id=wid,
            coordinator_epoch=1,
            submission_event_id=submitted,
            review_evidence_ids=[f"rev-{wid}"],
        )
        await self.run(self.coordinator, "work_accept_result", accept)

    async def planned(self) -> None:
        """Created with the Worker as a member, three WorkItems authorized: wi-a, then wi-b and
        wi-c from it."""
        await self.create(self.worker.identity_id)
        await self.authorize("wi-a", "Extract the data")
        await self.authorize("wi-b", "Write the report", ["wi-a"])
        await self.authorize("wi-c", "Draw the chart", ["wi-a"])

    async def worked(self, wid: str, name: str, data: bytes, media_type: str, *sources: str) -> None:
        await self.offer(wid)
        await self.accept(wid)
        await self.start(wid)
        await self.finish(wid, name, data, media_type, *sources)

    async def submitted(self, summary: str = "Q3 report and chart") -> str:
        """Planned, every WorkItem worked and verified, the report and the chart submitted; the
        submission's event id."""
        await self.planned()
        await self.worked("wi-a", "data", DATA, "text/csv")
        await self.worked("wi-b", "report", REPORT, "text/markdown", "data")
        await self.worked("wi-c", "chart", CHART, "image/svg+xml", "data")
        mission = (await self.reader.group_state(self.group_id)).mission
        body = mission_pb2.MissionSubmitForApproval(
            coordinator_epoch=1,
            mission_revision=mission.revision,
            summary=summary,
            artifacts=[self.refs["report"], self.refs["chart"]],
        )
        result = await self.run(self.coordinator, "mission_submit_for_approval", body)
        return decode_events(result.events)[0].event_id

    async def post(self, text: str) -> None:
        """The Coordinator posts ``text`` in the Mission's main Conversation (one event)."""
        state = await self.reader.group_state(self.group_id)
        conversation = state.mission.planning_conversation_id
        await self.run(self.coordinator, "message_post", builders.message(conversation, text))

    async def head(self) -> int:
        return int((await self.reader.group_state(self.group_id)).head_sequence)


DATA = b"region,q3\nnorth,120\nsouth,95\n" * 40
REPORT = b"# Q3 report\n\nNorth grew, south held.\n" * 30
CHART = b"<svg xmlns='http://www.w3.org/2000/svg'><rect width='120'/><rect width='95'/></svg>" * 20


async def first_line(stream: asyncio.StreamReader, *needles: str, limit_s: float = 90) -> list[str]:
    """Reads ``stream`` until every one of ``needles`` was in a line; the lines read."""
    lines: list[str] = []
    waiting = set(needles)
    async with asyncio.timeout(limit_s):
        while waiting:
            line = (await stream.readline()).decode()
            assert line, "".join(lines)  # ended before it said it
            lines.append(line)
            waiting = {n for n in waiting if n not in line}
    return lines
