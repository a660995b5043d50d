"""A call proof is never accepted twice across a restart (issue 40; D168, docs/security.md): by
default (``MWP_NONCE_STORE`` unset: the database) the nonces a mesh accepted are kept in its store,
so the same proof sent again after the mesh was stopped and started on the same data is refused
``UNAUTHENTICATED`` ``check=replayed``. ``memory`` stays as an explicit opt-out, and the test shows
what it costs: the proof is answered again. SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.sdk.credentials import call_proof
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from tests.conftest import register
from tests.test_replicas import FIND_MISSING, refusal_of

AUDIENCE = "mesh.restart.test:443"  # what the proof names: the same before and after the restart


def settings_for(db_url: str, tmp_path: Path, **kw: object) -> Settings:
    return replace(
        Settings(
            listen="127.0.0.1:0",
            data_dir=tmp_path / "data",
            database_url=db_url,
            grace_seconds=1,
            audience=AUDIENCE,
        ),
        **kw,  # type: ignore[arg-type]
    )


async def accepted_then_replayed_after_restart(
    settings: Settings,
) -> tuple[grpc.StatusCode, common_pb2.Rejection] | None:
    """A proof answered by a mesh, the mesh stopped and started again on the same store, the very
    same proof sent again: how it is refused (None: answered a second time)."""
    mesh = await start(settings)
    admin = MeshClient(f"127.0.0.1:{mesh.port}")
    try:
        alice = await register(
            admin, read_key(settings.admin_key_path), "alice", common_pb2.IDENTITY_KIND_AGENT
        )
        proof = call_proof(alice, FIND_MISSING, AUDIENCE)
        assert await refusal_of(admin, proof) is None  # accepted once
    finally:
        await admin.channel.close()
        await mesh.stop(grace=1)
    mesh = await start(settings)  # the same data dir and database: a restart
    client = MeshClient(f"127.0.0.1:{mesh.port}")
    try:
        return await refusal_of(client, proof)  # well inside the proof's 30 s
    finally:
        await client.channel.close()
        await mesh.stop(grace=1)


def test_the_default_nonce_store_is_the_database() -> None:
    assert Settings().nonce_store == "database"
    assert Settings.from_env({}).nonce_store == "database"
    assert Settings.from_env({"MWP_NONCE_STORE": "memory"}).nonce_store == "memory"


async def test_a_call_proof_replayed_after_a_restart_is_refused_by_default(
    db_url: str, tmp_path: Path
) -> None:
    refused = await accepted_then_replayed_after_restart(settings_for(db_url, tmp_path))
    assert refused is not None, "a proof accepted before the restart was accepted again after it"
    code, rejection = refused
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert rejection.reason == common_pb2.RejectionReason.REJECTION_REASON_UNAUTHENTICATED
    assert rejection.metadata["check"] == "replayed", rejection


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_with_the_memory_opt_out_a_restart_forgets_the_nonces(db_url: str, tmp_path: Path) -> None:
    """Why ``memory`` is documented as unsafe across restarts: the replayed proof is answered."""
    assert (
        await accepted_then_replayed_after_restart(settings_for(db_url, tmp_path, nonce_store="memory"))
        is None
    )
