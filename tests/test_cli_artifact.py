"""``mwp artifact put|get|stat|manifest|provenance|verify``: the CLI as a subprocess against a live mesh.

Reuses the ``bench`` of tests/test_cli_mission.py (an in-process mesh on a tmp data directory, four
identities with key files and saved sessions); blobs live in the local backend under
``<tmp>/data/blobs``, where the corruption test alters one. Every artifact command proves an
identity (issue 13): coord-bot's, through MWP_AS / MWP_KEY, unless the test passes ``--as``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from missionweave.cli.artifact.arguments import parse_digest
from missionweave.cli.artifact.transfer import Progress, TransferError, receive, replacing
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave_server.services.artifacts.local import LocalBlobStore
from tests import builders
from tests.test_cli_mission import Bench, execute
from tests.test_cli_mission import bench as bench  # the fixture

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def reader(bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's calls prove coord-bot's session (the identity that uploads, so it holds the blobs)."""
    monkeypatch.setenv("MWP_AS", "coord-bot")
    monkeypatch.setenv("MWP_KEY", str(bench.keys["coord-bot"]))


def digest_of(data: bytes) -> str:
    return f"blake3:{blake3.blake3(data).hexdigest()}:{len(data)}"


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def leftovers(directory: Path) -> list[str]:
    """Temporary download files (``.NAME.*.part``) left behind."""
    return [p.name for p in directory.iterdir() if p.name.endswith(".part")]


async def put(bench: Bench, path: Path, *extra: str) -> str:
    """``mwp artifact put`` and the digest it printed, in the ``blake3:<hex>:<size>`` form."""
    run = await bench.mwp("artifact", "put", str(path), *extra)
    hex_part, size = run.stdout.splitlines()[0].split(" ")
    return f"{hex_part}:{size}"


@pytest.mark.req("MW-13.1-01", "MW-13.1-05")
async def test_put_get_round_trip_ranges_and_stat(bench: Bench, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 12345)
    source = write(tmp_path / "figures.bin", data)
    run = await bench.mwp("artifact", "put", str(source), "--progress")
    assert run.stdout.strip() == f"blake3:{blake3.blake3(data).hexdigest()} {len(data)}"
    assert "100%" in run.stderr and "MB/s" in run.stderr and "MiB" in run.stderr
    digest = digest_of(data)
    again = (await bench.mwp("artifact", "put", str(source), "--json")).json()
    assert again["digest"] == digest and again["already_existed"] is True

    out = tmp_path / "out" / "figures.bin"
    out.parent.mkdir()
    got = await bench.mwp("artifact", "get", digest, "-o", str(out), "--progress")
    assert out.read_bytes() == data and "re-hashed locally" in got.stdout and "100%" in got.stderr
    assert leftovers(out.parent) == []

    part = tmp_path / "out" / "range.bin"
    ranged = await bench.mwp(
        "artifact", "get", digest, "-o", str(part), "--offset", str(MiB - 7), "--length", "20", "--json"
    )
    assert part.read_bytes() == data[MiB - 7 : MiB + 13] and ranged.json()["rehashed"] is False

    stat = (await bench.mwp("artifact", "stat", digest, "--json")).json()
    assert stat["digest"] == digest and stat.get("manifest_count", 0) == 0 and stat["stored_at"]
    assert "manifests      0" in (await bench.mwp("artifact", "stat", digest)).stdout

    empty = await put(bench, write(tmp_path / "empty", b""))
    await bench.mwp("artifact", "get", empty, "-o", str(tmp_path / "out" / "empty"))
    assert (tmp_path / "out" / "empty").read_bytes() == b""

    # The size is part of the name; an unknown blob is refused and leaves no file behind.
    no_size = await bench.mwp("artifact", "get", digest.rsplit(":", 1)[0], "-o", str(out), expect=2)
    assert "size" in no_size.stderr
    unknown = await bench.mwp(
        "artifact", "get", digest_of(b"never stored"), "-o", str(tmp_path / "out" / "x"), expect=1
    )
    assert "NOT_FOUND" in unknown.stderr and not (tmp_path / "out" / "x").exists()
    assert leftovers(out.parent) == []
    usage = await bench.mwp("artifact", "put", str(source), "--manifest-for", "grp_x", expect=2)
    assert "--work-item" in usage.stderr


@pytest.mark.req("MW-13.1-03", "MW-13.1-04", "MW-13.1-05")
async def test_signed_manifest_provenance_verify_and_corruption(bench: Bench, tmp_path: Path) -> None:
    group = "grp_artifacts"
    await execute(
        bench,
        "alice",
        group,
        "mission_create",
        builders.mission_create("alice", "coord-bot", bench.clock.now()),
    )
    mission_id = (await bench.client.group_state(group)).mission.mission_id
    producer = ["--manifest-for", group, *bench.as_("coord-bot")]

    raw = os.urandom(200_000)
    source = await put(bench, write(tmp_path / "extract.csv", raw), *producer, "--work-item", "wi-extract")
    report_bytes = b"# Q3 report\n" * 1000
    report_path = write(tmp_path / "report.md", report_bytes)
    signed = await bench.mwp(
        "artifact",
        "put",
        str(report_path),
        *producer,
        "--work-item",
        "wi-report",
        "--source",
        source,
        "--component",
        "model:claude-x:2025-01",
        "--classification",
        "confidential",
    )
    report = digest_of(report_bytes)
    assert signed.stdout.splitlines()[1].startswith("manifest blake3:")

    shown = (await bench.mwp("artifact", "manifest", report)).stdout
    assert "work item      wi-report" in shown and f"sources        {source}" in shown
    assert "producer       coord-bot (Agent Card version 1)" in shown and "not checked" in shown
    document = (await bench.mwp("artifact", "manifest", report, "--verify", "--json")).json()
    (entry,) = document["manifests"]
    predicate = entry["predicate"]
    assert entry["signature"] == "verified" and entry["key_ids"] == ["coord-bot#session-1"]
    assert entry["sha256"] == hashlib.sha256(report_bytes).hexdigest()
    assert predicate["mission_id"] == mission_id and predicate["group_id"] == group
    assert (
        predicate["media_type"] == "text/markdown"
        and predicate["classification"] == "DATA_CLASSIFICATION_CONFIDENTIAL"
    )
    assert predicate["retrieval_uri"] == f"mwp://{bench.target}/{report.rsplit(':', 1)[0]}"
    assert predicate["components"] == [
        {"kind": "COMPONENT_KIND_MODEL", "name": "claude-x", "version": "2025-01"}
    ]
    assert predicate["schema"] == {"schema_id": "none"} and predicate["agent_card_version"] == "1"
    assert predicate["created_at"] and predicate["size_bytes"] == str(len(report_bytes))
    wrong_key = await bench.mwp(
        "artifact", "manifest", report, "--verify", "--public-key", "00" * 32, expect=1
    )
    assert "signature FAILED" in wrong_key.stdout and "did not verify" in wrong_key.stderr

    ancestors = (await bench.mwp("artifact", "provenance", report, "--direction", "ancestors")).stdout
    assert (
        "derived from:" in ancestors
        and f"└─ {source}  text/csv  by coord-bot  work item wi-extract" in ancestors
    )
    descendants = (
        await bench.mwp("artifact", "provenance", source, "--direction", "descendants", "--json")
    ).json()
    assert [e["derived"]["hex"] for e in descendants["edges"]] == [report.split(":")[1]]

    ok = await bench.mwp("artifact", "verify", source, report)
    assert ok.stdout.splitlines() == [f"OK        {source}", f"OK        {report}", "2 OK, 0 failed"]
    # Issue 13 item 3: the Group's owner reads what its manifests reference; an identity outside
    # the Group sees the blobs as missing (as if never stored), and no manifest or provenance.
    assert (await bench.mwp("artifact", "verify", report, *bench.as_("alice"))).stdout.startswith("OK")
    outside = await bench.mwp("artifact", "verify", source, report, *bench.as_("worker-bot"), expect=1)
    assert outside.stdout.splitlines()[:2] == [
        f"MISSING   {source}  no blob blake3:{source.split(':')[1]} of {source.split(':')[2]} bytes",
        f"MISSING   {report}  no blob blake3:{report.split(':')[1]} of {report.split(':')[2]} bytes",
    ]
    hidden = await bench.mwp("artifact", "manifest", report, *bench.as_("worker-bot"), "--json")
    assert hidden.json()["manifests"] == []

    corrupt(tmp_path / "data", report.split(":")[1])
    failed = await bench.mwp("artifact", "verify", source, report, expect=1)
    assert f"OK        {source}" in failed.stdout and f"CORRUPTED {report}" in failed.stdout
    target = tmp_path / "downloaded.md"
    refused = await bench.mwp("artifact", "get", report, "-o", str(target), expect=1)
    assert "DATA_CORRUPTED" in refused.stderr and not target.exists() and leftovers(tmp_path) == []


def corrupt(data_dir: Path, hex_digest: str) -> None:
    """Flips one byte of the stored blob in place (same size, different hash)."""
    path = LocalBlobStore(data_dir).path_for(hex_digest)
    if not path.exists():
        pytest.skip("the mesh is not using the local blob backend")
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


class _FakeArtifacts:
    """A Download stub that serves ``data`` whatever was asked (a lying or broken server)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def _stream(self) -> Any:
        yield apb.DownloadResponse(offset=0, data=self.data)

    def Download(self, request: apb.DownloadRequest) -> Any:
        return self._stream()


class _FakeMesh:
    def __init__(self, data: bytes) -> None:
        self.artifacts = _FakeArtifacts(data)


async def test_get_refuses_bytes_that_do_not_hash_to_the_digest(tmp_path: Path) -> None:
    """The client re-hashes full downloads itself: wrong bytes never become the output file."""
    digest = parse_digest(digest_of(b"expected"))
    output = tmp_path / "out"
    with pytest.raises(TransferError, match="hash to"), replacing(output) as fh:
        await receive(_FakeMesh(b"tampered"), digest, 0, 0, fh.write, Progress("get", 8, False))  # type: ignore[arg-type]
    assert not output.exists() and leftovers(tmp_path) == []
    with pytest.raises(TransferError, match="received 3 of 8 bytes"):
        await receive(_FakeMesh(b"exp"), digest, 0, 0, lambda _: None, Progress("get", 8, False))  # type: ignore[arg-type]
