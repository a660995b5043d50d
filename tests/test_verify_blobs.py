"""``mwp verify``'s blob pass (issue 40 part 2): every blob the artifact index names is in the blob
store ``mwp serve`` uses, of its size, hashing to its name (BLAKE3). A flipped byte, a deleted blob
and a truncated one are each reported, readable and in ``--json``, with exit 1; a clean store
exits 0; ``--no-blobs`` skips the pass (docs/integrity.md "mwp verify")."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from missionweave.cli import main as mwp
from missionweave.cli.status_line import StatusLine, size_text
from missionweave.sdk.client import blob_digest
from missionweave_server.commands.integrity import blobs_progress
from missionweave_server.mesh.maintenance import verify_stored_blobs
from missionweave_server.services.artifacts.audit import LocalReader, check_blob, verify_blobs
from missionweave_server.services.artifacts.backends import blobstore_from_env
from missionweave_server.services.artifacts.schema import blobs as blob_rows
from missionweave_server.services.artifacts.schema import create_schema
from missionweave_server.storage.db import make_engine
from tests.conftest import World


def blob_path(w: World, hex_digest: str) -> Path:
    return Path(w.settings.data_dir) / "blobs" / hex_digest[0:2] / hex_digest[2:4] / hex_digest


async def verify_cli(w: World, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    """``mwp verify`` on the test's store, its blobs where the mesh keeps them (MWP_DATA_DIR)."""
    capsys.readouterr()
    args = [
        "verify",
        "--database-url",
        w.settings.db_url,
        "--authority-key",
        str(w.settings.authority_key_path),
        *flags,
    ]
    code = await asyncio.to_thread(mwp, args)
    return code, capsys.readouterr().out


@pytest.fixture
def blob_env(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("MWP_DATA_DIR", str(world.settings.data_dir))
    for name in ("MWP_S3_BUCKET", "MWP_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return world


async def uploaded(w: World) -> list[tuple[str, int]]:
    """Four blobs: small ones and one of several read chunks; (hex, size) each."""
    blobs = [b"alpha\n", b"bravo bravo\n", os.urandom(3 * 1024 * 1024 + 17), b"delta" * 1000]
    out = []
    for data in blobs:
        digest = (await w.client.upload(data)).digest
        out.append((digest.hex, int(digest.size_bytes)))
    return out


async def test_a_clean_store_then_a_flipped_a_deleted_and_a_truncated_blob(
    blob_env: World, capsys: pytest.CaptureFixture[str]
) -> None:
    w = blob_env
    blobs = await uploaded(w)
    code, out = await verify_cli(w, capsys, "--json")
    report = json.loads(out)
    assert code == 0 and report["clean"] and report["logs_clean"], report
    assert report["blobs"]["clean"] and report["blobs"]["indexed"] and report["blobs"]["backend"] == "local"
    assert report["blobs"]["blobs"] == len(blobs) and report["blobs"]["bytes"] == sum(
        size for _, size in blobs
    )
    assert report["blobs"]["location"] == str(Path(w.settings.data_dir) / "blobs")
    code, out = await verify_cli(w, capsys)
    assert code == 0 and "CLEAN" in out and f"{len(blobs)} blobs" in out, out

    (flipped, _), (deleted, _), (truncated, size), _ = blobs
    path = blob_path(w, flipped)
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    blob_path(w, deleted).unlink()
    path = blob_path(w, truncated)
    path.chmod(0o644)
    with path.open("r+b") as handle:
        handle.truncate(size - 1)

    code, out = await verify_cli(w, capsys, "--json")
    report = json.loads(out)
    assert code == 1 and not report["clean"] and report["logs_clean"] and not report["findings"], report
    found = {f["digest"]: f for f in report["blobs"]["findings"]}
    assert {d: f["problem"] for d, f in found.items()} == {
        f"blake3:{flipped}": "corrupted",
        f"blake3:{deleted}": "missing",
        f"blake3:{truncated}": "size",
    }
    assert f"{size - 1:,} bytes" in found[f"blake3:{truncated}"]["detail"]
    assert report["blobs"]["blobs"] == len(blobs)  # it went on after the findings

    code, out = await verify_cli(w, capsys)
    assert code == 1 and "CORRUPTED: 3 finding(s), 3 blob(s)" in out, out
    for digest, problem in ((flipped, "corrupted"), (deleted, "missing"), (truncated, "size")):
        assert f"blob blake3:{digest}" in out and f": {problem}: " in out

    code, out = await verify_cli(w, capsys, "--no-blobs", "--json")
    report = json.loads(out)
    assert code == 0 and report["clean"] and report["blobs"] is None
    code, out = await verify_cli(w, capsys, "--no-blobs")
    assert code == 0 and "not checked (--no-blobs)" in out


async def test_blobs_looked_for_in_another_data_dir_are_missing(
    blob_env: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The pass reads where ``mwp serve`` would (MWP_DATA_DIR): pointed elsewhere, every blob is
    reported missing, and nothing is created there."""
    w = blob_env
    blobs = await uploaded(w)
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("MWP_DATA_DIR", str(elsewhere))
    code, out = await verify_cli(w, capsys, "--json")
    report = json.loads(out)
    assert code == 1 and [f["problem"] for f in report["blobs"]["findings"]] == ["missing"] * len(blobs)
    assert not elsewhere.exists()


async def test_a_store_without_an_artifact_index(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    reader = LocalReader(tmp_path)
    try:
        report = await verify_blobs(engine, reader)
    finally:
        await engine.dispose()
        await reader.close()
    assert report.clean and not report.indexed and report.blobs == 0


async def test_unreadable_blob_is_a_finding(tmp_path: Path) -> None:
    class Failing(LocalReader):
        async def stored_size(self, digest_hex: str) -> Any:
            raise PermissionError("denied")

    reader = Failing(tmp_path)
    try:
        finding = await check_blob(reader, "ab" * 32, 3)
    finally:
        await reader.close()
    assert finding is not None and finding.problem == "unreadable" and "denied" in finding.detail


def test_progress_line(capsys: pytest.CaptureFixture[str]) -> None:
    blobs_progress(StatusLine("mwp verify", every=0))(3, 10, 5 * 1024 * 1024, 20 * 1024 * 1024)
    assert capsys.readouterr().err == "mwp verify: 3/10 blobs, 5.0 MiB of 20.0 MiB checked\n"
    assert (size_text(0), size_text(1536), size_text(3 * 1024**3)) == ("0 B", "1.5 KiB", "3.0 GiB")


S3_ENDPOINT = os.environ.get("MWP_TEST_S3_ENDPOINT", "")


@pytest.mark.parametrize("backend", ["local", "s3"])
async def test_each_backend_as_serve_configures_it(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass on an index filled directly, against the local backend and against S3
    (MWP_S3_BUCKET / MWP_S3_ENDPOINT, as ``mwp serve`` reads them): one object's bytes replaced, one
    deleted, both found; the others clean."""
    env: dict[str, str] = {}
    if backend == "s3":
        if not S3_ENDPOINT:
            pytest.skip("S3 variant needs MWP_TEST_S3_ENDPOINT (.ci/run starts moto's server and sets it)")
        for name, value in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        env = {
            "MWP_S3_BUCKET": f"mwp-test-{uuid.uuid4().hex[:16]}",
            "MWP_S3_ENDPOINT": S3_ENDPOINT,
            "MWP_S3_CREATE_BUCKET": "1",
        }
    data_dir = tmp_path / "data"
    url = f"sqlite+aiosqlite:///{tmp_path / 'index.db'}"
    contents = [b"one", b"two" * 100, os.urandom(2 * 1024 * 1024 + 1)]
    digests = [blob_digest(data) for data in contents]
    store = blobstore_from_env(data_dir, env)
    engine = make_engine(url)
    try:
        await create_schema(engine)
        for digest, data in zip(digests, contents, strict=True):
            writer = await store.open_writer(digest.hex, len(data))
            await writer.write(data)
            await writer.commit()
        async with engine.begin() as conn:
            await conn.execute(
                blob_rows.insert(),
                [
                    {"digest": d.hex, "size_bytes": d.size_bytes, "stored_us": 1, "verified_us": 1}
                    for d in digests
                ],
            )
        if backend == "s3":
            client: Any = store.client  # type: ignore[attr-defined]
            bucket = env["MWP_S3_BUCKET"]
            client.put_object(Bucket=bucket, Key=f"blobs/{digests[0].hex}", Body=b"onf")
            client.delete_object(Bucket=bucket, Key=f"blobs/{digests[1].hex}")
        else:
            first = data_dir / "blobs" / digests[0].hex[0:2] / digests[0].hex[2:4] / digests[0].hex
            first.chmod(0o644)
            first.write_bytes(b"onf")
            (data_dir / "blobs" / digests[1].hex[0:2] / digests[1].hex[2:4] / digests[1].hex).unlink()
    finally:
        await engine.dispose()
        await store.close()
    report = await asyncio.to_thread(verify_stored_blobs, url, data_dir, None, env)
    assert report.backend == backend and report.blobs == 3
    assert {f.digest: f.problem for f in report.findings} == {
        digests[0].hex: "corrupted",
        digests[1].hex: "missing",
    }
