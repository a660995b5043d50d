"""Tested upgrades (issue 39): a store built by a release, upgraded and served by this code.

The fixture (tests/release_fixtures/README.md) is a store a release's own ``mwp serve`` built and
its ``fill.py`` filled through the public API with every kind of record, across an Authority key
rotation, kept as text with the data directory's keys and blobs and an ``expected.json``. Here it
is loaded into a fresh store (SQLite, and PostgreSQL when MWP_TEST_POSTGRES_URL is set), and an
operator's steps are taken with this code's CLI, each a process of its own: ``mwp db status`` (the
store needs an upgrade), ``mwp db upgrade``, ``mwp verify`` (clean, with the key history),
``mwp serve``. Through the public API, then: every event of every Group is there with the same
head digest and verifies (signature by a key of the history, sequence, chain); recorded signed
commands sent again are answered as replays of their recorded events; the gateway's durable
cursors resume where they were; every Artifact downloads with its bytes, its manifests verify and
its holders are as recorded; snapshots are still served; and the mesh takes new work, whose first
event links to the release's last.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import blake3
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nacl.signing import SigningKey
from sqlalchemy import text

from missionweave.kernel.clock import OffsetClock, to_timestamp
from missionweave.kernel.manifest import manifest_digest, verify_manifest
from missionweave.kernel.signing import (
    EVENT_TYPE,
    HELLO_PROOF_TYPE,
    authority_key_id,
    read_key,
    session_key_id,
    sign_envelope,
    verify_signature,
)
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import artifact_service_pb2 as arpb
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import command_pb2, common_pb2, event_pb2, mission_pb2
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave.v1 import gateway_service_pb2_grpc as gpb_grpc
from missionweave.v1 import work_pb2 as wp
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from missionweave_server.storage.db import make_engine
from tests import builders
from tests.conftest import POSTGRES_URL

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "release_fixtures"
RELEASES = sorted(p.name for p in FIXTURES.glob("v*") if p.is_dir())
DEADLINE_S = 30.0
NEW_GROUP = "grp_after_upgrade"


# ---------------------------------------------------------------- the store, loaded from the fixture


@dataclass
class Store:
    """A fresh store holding the fixture's data: the data directory (keys, blobs and, for SQLite,
    the database) and the database URL ("" for the SQLite default)."""

    data: Path
    url: str
    identities: Path
    expected: dict[str, Any]

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "MWP_DATA_DIR": str(self.data),
            "MWP_DATABASE_URL": self.url,
            "MWP_METRICS_LISTEN": "",
            "MWP_LOG_LEVEL": "warning",
        }

    def key(self, identity: str) -> SigningKey:
        entry = self.expected["identities"][identity]
        return read_key(self.fixture_file(entry["key_file"]))

    def fixture_file(self, relative: str) -> Path:
        """A key file named in expected.json, in its loaded place (0600)."""
        if relative.startswith("data/"):
            return self.data / relative.removeprefix("data/")
        return self.identities / Path(relative).name

    def signer(self, identity: str) -> SessionSigner:
        """The identity's session as the release left it (the session key is the identity key):
        nobody opens a new one, so the recorded commands' sessions stay current."""
        epoch = int(self.expected["identities"][identity]["session_epoch"])
        return SessionSigner(identity, epoch, self.key(identity))


def private_copy(source: Path, target: Path) -> None:
    """``source``'s tree at ``target``: directories 0700, files 0600 (key files must be, and git
    keeps neither mode)."""
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    target.chmod(0o700)
    for path in sorted(source.rglob("*")):
        to = target / path.relative_to(source)
        if path.is_dir():
            to.mkdir(mode=0o700, exist_ok=True)
        else:
            shutil.copyfile(path, to)
            to.chmod(0o600)


def psql_url(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


def psql(url: str, *args: str) -> None:
    result = subprocess.run(
        ["psql", psql_url(url), "-X", "-q", "-v", "ON_ERROR_STOP=1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PGOPTIONS": "--client-min-messages=warning"},
    )
    assert result.returncode == 0, f"psql {' '.join(args)} exited {result.returncode}: {result.stderr}"


def load(release: str, backend: str, tmp_path: Path) -> Store:
    fixture = FIXTURES / release / backend
    expected = json.loads((fixture / "expected.json").read_text())
    data = tmp_path / "data"
    private_copy(fixture / "data", data)
    identities = tmp_path / "identities"
    private_copy(fixture / "identities", identities)
    dump = (fixture / "database.sql").read_text()
    if backend == "sqlite":
        database = data / "missionweave.db"
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(database)
        try:
            conn.executescript(dump)
        finally:
            conn.close()
        url = ""
    else:
        url = POSTGRES_URL
        psql(url, "-c", "DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        psql(url, "-f", str(fixture / "database.sql"))
    return Store(data, url, identities, expected)


def mwp(store: Store, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """This code's ``mwp``, as an operator runs it: a process of its own on the store's env."""
    result = subprocess.run(
        [sys.executable, "-m", "missionweave.cli", *args],
        cwd=ROOT,
        env=store.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"mwp {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def served(store: Store) -> AsyncIterator[str]:
    """``mwp serve`` on the store until the block ends; then SIGTERM, which it answers with exit 0."""
    target = f"127.0.0.1:{free_port()}"
    log = store.data.parent / "serve.log"
    sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "missionweave.cli",
            "serve",
            "--listen",
            target,
            cwd=ROOT,
            env=store.env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=sink,
        )
    finally:
        os.close(sink)  # the child has its own copy
    try:
        await until_serving(target, proc, log)
        yield target
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(DEADLINE_S):
            assert await proc.wait() == 0, logged(log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def logged(path: Path) -> str:
    return path.read_text()[-4000:]


async def until_serving(target: str, proc: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    async with grpc.aio.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            assert proc.returncode is None, f"mwp serve exited {proc.returncode}:\n{logged(log)}"
            with contextlib.suppress(grpc.aio.AioRpcError):
                answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            assert time.monotonic() < deadline, (
                f"mwp serve did not serve within {DEADLINE_S} s:\n{logged(log)}"
            )
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------- what the release recorded


def chain_link(envelope: common_pb2.SignedEnvelope, event: event_pb2.Event) -> bytes:
    """What the next event's previous_digest names (docs/integrity.md)."""
    if event.HasField("redaction") and event.redaction.original_event_digest:
        return bytes(event.redaction.original_event_digest)
    return blake3.blake3(envelope.payload).digest()


def log_digest(envelopes: Iterable[common_pb2.SignedEnvelope]) -> str:
    """As fill.py computes it: BLAKE3 over each event's payload digest, key id and signature."""
    h = blake3.blake3()
    for envelope in envelopes:
        h.update(blake3.blake3(envelope.payload).digest())
        for signature in envelope.signatures:
            h.update(signature.key_id.encode() + b"\x00" + signature.sig)
    return h.hexdigest()


async def read_log(client: MeshClient, group: str) -> list[tuple[common_pb2.SignedEnvelope, event_pb2.Event]]:
    out: list[tuple[common_pb2.SignedEnvelope, event_pb2.Event]] = []
    async for batch in client.authority.ReadEvents(apb.ReadEventsRequest(group_id=group, after_sequence=0)):
        out.extend(zip(batch.events, decode_events(batch.events), strict=True))
    return out


async def rows(store: Store, query: str) -> set[tuple[Any, ...]]:
    """Rows of the upgraded store, read directly (what no RPC lists: command records, holders...)."""
    url = store.url or f"sqlite+aiosqlite:///{store.data / 'missionweave.db'}"
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return {tuple(r) for r in (await conn.execute(text(query))).all()}
    finally:
        await engine.dispose()


# ---------------------------------------------------------------- the checks


def check_status_needs_upgrade(store: Store) -> None:
    status = mwp(store, "db", "status", "--json", check=False)
    assert status.returncode != 0, "mwp db status says this code can serve a store it must upgrade first"
    lines = schema_lines(json.loads(status.stdout))
    behind = [line for line in lines if line["state"] != "current" or line["revision"] != line["head"]]
    assert behind, (
        f"mwp db status reports nothing to upgrade in a {store.expected['release']} store:\n{status.stdout}"
    )
    assert not [line for line in lines if line["state"] == "ahead"], status.stdout


def check_upgrade_vouches_with_the_admin_key(store: Store) -> None:
    """The release's identities and sessions predate grants (membership_0002, D170): the upgrade
    needs the services stopped and the administrator's key, which vouches for each of them."""
    online = mwp(store, "db", "upgrade", check=False)
    assert online.returncode == 1 and "membership_0002" in online.stderr and "--offline" in online.stderr, (
        online.stderr
    )
    admin_key = store.data / "keys" / "admin.key"
    aside = admin_key.with_name("admin.key.aside")
    admin_key.rename(aside)
    try:
        keyless = mwp(store, "db", "upgrade", "--offline", check=False)
        assert keyless.returncode == 1 and "administrator's key" in keyless.stderr, keyless.stderr
    finally:
        aside.rename(admin_key)
    mwp(store, "db", "upgrade", "--offline")


def check_status_current(store: Store) -> None:
    status = mwp(store, "db", "status", "--json")
    lines = schema_lines(json.loads(status.stdout))
    assert lines and all(line["state"] == "current" and line["revision"] == line["head"] for line in lines), (
        status.stdout
    )


def schema_lines(document: Any) -> list[dict[str, Any]]:
    """Each service's entry of ``mwp db status --json``: its state, the store's revision, the head."""
    if isinstance(document, dict):
        if {"state", "revision", "head"} <= document.keys():
            return [document]
        return [entry for value in document.values() for entry in schema_lines(value)]
    if isinstance(document, list):
        return [entry for value in document for entry in schema_lines(value)]
    return []


def check_verify(store: Store, *, new_groups: int = 0) -> None:
    """``mwp verify``: clean, every Group and event checked (more after new work), every snapshot,
    and the key history with the rotation (also as ``mwp authority keys`` prints it)."""
    report = json.loads(mwp(store, "verify", "--json").stdout)
    expected = store.expected
    assert report["clean"] and not report["findings"], report
    assert report["groups"] == len(expected["groups"]) + new_groups
    released = sum(g["events"] for g in expected["groups"].values())
    assert report["events"] > released if new_groups else report["events"] == released
    assert report["snapshots"] == len(expected["snapshots"])
    assert report["keys"] == expected["authority_keys"], report["keys"]
    history = mwp(store, "authority", "keys").stdout.splitlines()
    assert [line.split()[1] for line in history] == expected["authority_keys"]
    assert history[-1].endswith("(current)")


def check_key_files(store: Store) -> dict[str, bytes]:
    """The Authority's key files as kept: the current one and the retired one, each the key the
    history names. Returns the history's public keys by key id."""
    keys = store.data / "keys"
    current = read_key(keys / "authority.key")
    retired = [read_key(p) for p in keys.glob("authority.key.retired-*")]
    ids = [authority_key_id(bytes(k.verify_key)) for k in [*retired, current]]
    assert ids == store.expected["authority_keys"]
    return {authority_key_id(bytes(k.verify_key)): bytes(k.verify_key) for k in [*retired, current]}


async def check_key_history(
    client: MeshClient, store: Store, key_files: dict[str, bytes]
) -> dict[str, bytes]:
    answer = await client.authority.GetAuthorityKey(apb.GetAuthorityKeyRequest())
    history = {k.key_id: bytes(k.public_key) for k in answer.keys}
    assert list(history) == store.expected["authority_keys"]
    assert history == key_files
    assert answer.key_id == store.expected["authority_keys"][-1]
    return history


async def check_logs(client: MeshClient, store: Store, keys: dict[str, bytes]) -> None:
    """Every Group's events: all there, in order, each signed by a key of the history, the chain
    unbroken, the same head digest and the same bytes as the release served."""
    for group, expected in store.expected["groups"].items():
        log = await read_log(client, group)
        assert len(log) == expected["events"], group
        assert [e.sequence for _, e in log] == list(range(1, expected["events"] + 1)), group
        previous = b""
        for envelope, event in log:
            assert envelope.payload_type == EVENT_TYPE
            key_id = envelope.signatures[0].key_id
            assert key_id in keys and verify_signature(envelope, keys[key_id]), (
                group,
                event.sequence,
                key_id,
            )
            assert event.group_id == group
            assert bytes(event.previous_digest) == previous, (group, event.sequence)
            previous = chain_link(envelope, event)
        assert previous.hex() == expected["head_digest"], group
        assert log_digest(e for e, _ in log) == expected["log_digest"], group
        spans: dict[str, list[int]] = {}
        for _, event in log:
            spans.setdefault(event.causing_command_id, [event.sequence, event.sequence])[1] = event.sequence
        assert [[c, *s] for c, s in spans.items()] == expected["commands"], group
        state = await client.group_state(group)
        assert state.head_sequence == expected["head_sequence"]
        assert mission_pb2.MissionState.Name(state.mission.state) == expected["mission_state"]
        items = {i.work_item_id: wp.WorkItemState.Name(i.state) for i in await client.work_items(group)}
        assert items == expected["work_items"], group


async def check_command_records(store: Store) -> None:
    stored = await rows(store, "SELECT group_id, command_id, first_seq, last_seq FROM commands")
    expected = {
        (g, c, first, last) for g, e in store.expected["groups"].items() for c, first, last in e["commands"]
    }
    assert stored == expected


async def check_replays(client: MeshClient, store: Store) -> None:
    """Each recorded command, sent again with its id and body, is answered as a replay of the
    events the release recorded for it (MW-16-13: retries are idempotent). The recorded bytes were
    issued when the fixture was made, outside the Authority's 5-minute window by now, so they are
    re-issued as an agent resubmits (MW-11.5-09): the same Command, a fresh issued_at, signed again
    by the same session. ``check_exact_replays`` sends the exact bytes."""
    for recorded in store.expected["recorded_commands"]:
        envelope = common_pb2.SignedEnvelope.FromString(base64.b64decode(recorded["envelope"]))
        signer = store.signer(recorded["actor"])
        assert verify_signature(envelope, bytes(signer.key.verify_key)), recorded["label"]
        command = command_pb2.Command.FromString(envelope.payload)
        assert (command.command_id, command.group_id, command.session_epoch) == (
            recorded["command_id"],
            recorded["group_id"],
            signer.session_epoch,
        )
        command.issued_at.CopyFrom(to_timestamp(datetime.now(UTC)))
        result = await client.execute(signer.sign(command))
        assert_replay(result, recorded)


def assert_replay(result: command_pb2.CommandResult, recorded: dict[str, Any]) -> None:
    assert result.replayed, recorded["label"]
    assert (result.command_id, result.group_revision) == (recorded["command_id"], recorded["group_revision"])
    got = [
        {
            "sequence": e.sequence,
            "event_id": e.event_id,
            "type": e.type,
            "payload_blake3": blake3.blake3(env.payload).hexdigest(),
        }
        for env, e in zip(result.events, decode_events(result.events), strict=True)
    ]
    assert got == recorded["events"], recorded["label"]


async def check_exact_replays(store: Store, heads: dict[str, int]) -> None:
    """The exact recorded bytes, to this code's mesh started in this process with its clock set back
    to when they were issued (the 5-minute window is the Authority's): answered as replays, and
    nothing appended anywhere (``heads``: each Group's head before)."""
    issued = [
        command_pb2.Command.FromString(
            common_pb2.SignedEnvelope.FromString(base64.b64decode(r["envelope"])).payload
        )
        .issued_at.ToDatetime()
        .replace(tzinfo=UTC)
        for r in store.expected["recorded_commands"]
    ]
    assert max(issued) - min(issued) < timedelta(minutes=4), "the recorded commands span more than the window"
    clock = OffsetClock()
    clock.offset = min(issued) + (max(issued) - min(issued)) / 2 - datetime.now(UTC)
    settings = Settings(listen="127.0.0.1:0", data_dir=store.data, database_url=store.url, grace_seconds=1)
    mesh = await start(settings, clock)
    client = MeshClient(f"127.0.0.1:{mesh.port}", reader=store.signer("admin"))
    try:
        for recorded in store.expected["recorded_commands"]:
            envelope = common_pb2.SignedEnvelope.FromString(base64.b64decode(recorded["envelope"]))
            assert_replay(await client.execute(envelope), recorded)
        assert {g: (await client.group_state(g)).head_sequence for g in heads} == heads
    finally:
        await client.channel.close()
        await mesh.stop(grace=1)


def hello(target: str, signer: SessionSigner) -> gpb.HelloFrame:
    proof = gpb.HelloProof(
        agent_id=signer.identity_id,
        session_epoch=signer.session_epoch,
        issued_at=to_timestamp(datetime.now(UTC)),
        nonce=os.urandom(16),
        audience=target,
    )
    envelope = sign_envelope(
        proof.SerializeToString(),
        HELLO_PROOF_TYPE,
        signer.key,
        session_key_id(signer.identity_id, signer.session_epoch),
    )
    return gpb.HelloFrame(agent_id=signer.identity_id, session_epoch=signer.session_epoch, proof=envelope)


class Stream:
    """One gateway stream (GatewayService.Connect), after HELLO."""

    def __init__(self, client: MeshClient) -> None:
        self.call: Any = gpb_grpc.GatewayServiceStub(client.channel).Connect()

    @classmethod
    async def open(cls, client: MeshClient, target: str, signer: SessionSigner) -> Stream:
        stream = cls(client)
        await stream.send(hello=hello(target, signer))
        assert (await stream.next()).WhichOneof("frame") == "welcome"
        return stream

    async def send(self, **frame: Any) -> None:
        await self.call.write(gpb.ConnectRequest(frame=gpb.ClientFrame(**frame)))

    async def next(self) -> gpb.ServerFrame:
        async with asyncio.timeout(DEADLINE_S):
            return (await self.call.read()).frame

    async def until(self, *kinds: str) -> gpb.ServerFrame:
        while True:
            frame = await self.next()
            assert frame.WhichOneof("frame") != "error" or "error" in kinds, frame
            if frame.WhichOneof("frame") in kinds:
                return frame

    async def close(self) -> None:
        await self.call.done_writing()
        self.call.cancel()


async def check_cursors(client: MeshClient, store: Store, target: str) -> None:
    """The gateway's stored cursor per (agent, Group) is what the release's subscriber acknowledged
    (FLOW acked_sequence), and a subscriber resuming from it gets the next event on."""
    stored = await rows(store, "SELECT agent_id, group_id, cursor FROM gateway_cursors")
    assert stored == {(c["agent_id"], c["group_id"], c["cursor"]) for c in store.expected["cursors"]}
    for cursor in store.expected["cursors"]:
        group, position = cursor["group_id"], cursor["cursor"]
        head = (await client.group_state(group)).head_sequence
        stream = await Stream.open(client, target, store.signer(cursor["agent_id"]))
        try:
            await stream.send(
                subscribe=gpb.SubscribeFrame(
                    subscription_id="probe", group_id=group, after_sequence=head, initial_credits=1
                )
            )
            assert (await stream.until("flow")).flow.acked_sequence == position
            await stream.send(
                subscribe=gpb.SubscribeFrame(
                    subscription_id="resume", group_id=group, after_sequence=position, initial_credits=4
                )
            )
            frame = (await stream.until("event")).event
            assert frame.first_sequence == position + 1, frame
            log = await read_log(client, group)
            assert [e.event_id for e in decode_events(frame.events)] == [
                e.event_id for _, e in log[position : frame.last_sequence]
            ]
        finally:
            await stream.close()


async def check_snapshots(client: MeshClient, store: Store, target: str) -> None:
    """The snapshots are stored as taken; a Group compacted into its archival snapshot still answers
    a subscriber from before it with CURSOR_TOO_OLD naming that snapshot, signed by the current key."""
    stored = await rows(store, "SELECT group_id, seq, digest, archival FROM snapshots")
    assert stored == {
        (s["group_id"], s["sequence"], s["digest"], int(s["archival"])) for s in store.expected["snapshots"]
    }
    keys = {
        k.key_id: bytes(k.public_key)
        for k in (await client.authority.GetAuthorityKey(apb.GetAuthorityKeyRequest())).keys
    }
    for snapshot in (s for s in store.expected["snapshots"] if s["compacted"]):
        group = snapshot["group_id"]
        owner = (await client.group_state(group)).mission.definition.owner_id
        stream = await Stream.open(client, target, store.signer(owner))
        try:
            await stream.send(
                subscribe=gpb.SubscribeFrame(
                    subscription_id="old", group_id=group, after_sequence=0, initial_credits=8
                )
            )
            too_old = (await stream.until("cursor_too_old")).cursor_too_old
        finally:
            await stream.close()
        assert (
            too_old.snapshot_digest.hex == snapshot["digest"]
            and too_old.snapshot_sequence == snapshot["sequence"]
        )
        reference = too_old.signed_reference
        assert verify_signature(reference, keys[reference.signatures[0].key_id])


async def check_artifacts(client: MeshClient, store: Store, target: str) -> None:
    """Every Artifact downloads with its bytes; its manifests are the recorded ones and verify with
    their producer's key; its provenance edges and holders are as recorded, and a holder still reads
    what it holds while another identity may not."""
    expected = store.expected["artifacts"]
    stored = await rows(store, "SELECT digest, identity_id FROM holders")
    assert stored == {(a["digest"], h) for a in expected for h in a["holders"]}
    readers: dict[str, MeshClient] = {}
    try:
        for artifact in expected:
            digest = common_pb2.Digest(
                algorithm="blake3", hex=artifact["digest"], size_bytes=artifact["size"]
            )
            data = await client.download(digest)
            assert (blake3.blake3(data).hexdigest(), len(data)) == (artifact["digest"], artifact["size"])
            manifests = (await client.artifacts.GetManifest(arpb.GetManifestRequest(digest=digest))).manifests
            assert sorted(manifest_digest(m) for m in manifests) == artifact["manifests"]
            for envelope in manifests:
                producer = envelope.signatures[0].key_id.split("#", 1)[0]
                verify_manifest(
                    envelope,
                    bytes(store.key(producer).verify_key),
                    expected_digest_hex=artifact["digest"],
                    expected_size=artifact["size"],
                    producer_id=producer,
                )
            if artifact["sources"]:
                walked = await client.artifacts.QueryProvenance(
                    arpb.QueryProvenanceRequest(digest=digest, direction=arpb.PROVENANCE_DIRECTION_ANCESTORS)
                )
                assert {e.source.hex for e in walked.edges if e.derived.hex == artifact["digest"]} == set(
                    artifact["sources"]
                )
            for holder in artifact["holders"]:
                if holder not in readers:
                    readers[holder] = MeshClient(target, reader=store.signer(holder))
                assert await readers[holder].download(digest) == data
        # A blob only the outsider holds (no manifest, no Group names it): nobody else but operators reads it.
        private = next(a for a in expected if a["holders"] == ["outsider"])
        alice = MeshClient(target, reader=store.signer("alice"))
        readers["alice"] = alice
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await alice.download(
                common_pb2.Digest(algorithm="blake3", hex=private["digest"], size_bytes=private["size"])
            )
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        for reader in readers.values():
            await reader.channel.close()


async def check_agent_cards(client: MeshClient, store: Store) -> None:
    for card in store.expected["agent_cards"]:
        published = await client.agent_card(card["agent_id"], card["card_version"])
        assert blake3.blake3(published.envelope.SerializeToString()).hexdigest() == card["envelope_blake3"]


async def check_new_work(client: MeshClient, store: Store, target: str) -> None:
    """The upgraded mesh takes new work: a new Mission, a message in an old Group whose event
    links to the release's last one, both signed by the current key."""
    alice, coord = store.signer("alice"), store.signer("coord")
    owner = MeshClient(target, reader=alice)
    try:
        now = datetime.now(UTC)
        body = builders.mission_create(alice.identity_id, coord.identity_id, now, title="After the upgrade")
        created = await owner.execute(alice.sign(alice.command(NEW_GROUP, "mission_create", body)))
        assert decode_events(created.events)[0].type == "mission.created"
        group, expected = max(store.expected["groups"].items(), key=lambda item: int(item[1]["events"]))
        state = await owner.group_state(group)
        post = builders.message(state.mission.planning_conversation_id, "still here after the upgrade")
        command = alice.command(
            group, "message_post", post, membership_epoch=await owner.membership_epoch(group)
        )
        posted = await owner.execute(alice.sign(command))
        (envelope,) = posted.events
        (event,) = decode_events(posted.events)
        assert event.sequence == expected["head_sequence"] + 1
        assert bytes(event.previous_digest).hex() == expected["head_digest"]
        assert envelope.signatures[0].key_id == store.expected["authority_keys"][-1]
        assert (await owner.group_state(NEW_GROUP)).mission.state == mission_pb2.MISSION_STATE_ACTIVE
    finally:
        await owner.channel.close()


# ---------------------------------------------------------------- the test


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "postgres" and not POSTGRES_URL:
        pytest.skip("PostgreSQL variant needs MWP_TEST_POSTGRES_URL (set by .ci/run)")
    yield str(request.param)
    if request.param == "postgres":  # the next test finds the shared database empty, as it was
        psql(POSTGRES_URL, "-c", "DROP SCHEMA public CASCADE; CREATE SCHEMA public;")


@pytest.mark.parametrize("release", RELEASES)
async def test_a_release_store_upgrades_and_serves_on(release: str, backend: str, tmp_path: Path) -> None:
    store = load(release, backend, tmp_path)
    assert store.expected["release"] == release and store.expected["backend"] == backend
    key_files = check_key_files(store)
    check_status_needs_upgrade(store)
    check_upgrade_vouches_with_the_admin_key(store)
    check_status_current(store)
    check_verify(store)
    async with served(store) as target:
        client = MeshClient(target, reader=store.signer("admin"))
        try:
            keys = await check_key_history(client, store, key_files)
            await check_logs(client, store, keys)
            await check_command_records(store)
            await check_replays(client, store)
            await check_cursors(client, store, target)
            await check_snapshots(client, store, target)
            await check_artifacts(client, store, target)
            await check_agent_cards(client, store)
            await check_new_work(client, store, target)
            heads = {
                g: (await client.group_state(g)).head_sequence for g in [*store.expected["groups"], NEW_GROUP]
            }
        finally:
            await client.channel.close()
    await check_exact_replays(store, heads)
    check_verify(store, new_groups=1)  # the new work too
