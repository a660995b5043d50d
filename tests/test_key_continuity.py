"""Key continuity (issue 13 item 5, docs/integrity.md): the store records the Authority's key; a
replaced key file is refused at start unless a rotation signed by the old key was recorded
(``mwp authority rotate-key``); after a rotation old events still verify with the key they name.
SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import delete

from missionweave.cli import main as mwp
from missionweave.kernel import codec
from missionweave.kernel.signing import KEY_ROTATION_TYPE, generate_key, read_key, verify_signature, write_key
from missionweave.sdk.client import MeshClient, SessionSigner, decode_events
from missionweave.v1 import authority_service_pb2 as apb
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import Mesh, start
from missionweave_server.services.authority.keys import KeyContinuityError
from missionweave_server.services.authority.schema import authority_keys
from tests import builders

G = "grp_keys"


async def started(settings: Settings) -> tuple[Mesh, MeshClient]:
    mesh = await start(settings)
    client = MeshClient(f"127.0.0.1:{mesh.port}")
    await client.open_session("admin", read_key(settings.admin_key_path))  # reads are the operator's
    return mesh, client


async def stop(mesh: Mesh, client: MeshClient) -> None:
    await client.channel.close()
    await mesh.stop(grace=0.5)


async def some_history(client: MeshClient, settings: Settings) -> SessionSigner:
    admin_key = read_key(settings.admin_key_path)
    await client.open_session("admin", admin_key)
    key = generate_key()
    await client.register_identity(
        "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(key.verify_key)
    )
    await client.register_identity(
        "admin", admin_key, "coord", common_pb2.IDENTITY_KIND_AGENT, bytes(generate_key().verify_key)
    )
    alice = await client.open_session("alice", key)
    from missionweave.kernel.clock import SystemClock

    await client.execute(
        alice.sign(
            alice.command(G, "mission_create", builders.mission_create("alice", "coord", SystemClock().now()))
        )
    )
    return alice


async def read_all(client: MeshClient) -> list[common_pb2.SignedEnvelope]:
    return [e async for r in client.authority.ReadEvents(apb.ReadEventsRequest(group_id=G)) for e in r.events]


def replace_key_file(path: Path) -> Path:
    """Move the key aside (kept, as an operator would) and put a fresh one in its place."""
    kept = path.with_name("old-authority.key")
    path.rename(kept)
    write_key(path, generate_key())
    return kept


def cli(*argv: str) -> int:
    return mwp(list(argv))


def store_flags(settings: Settings) -> list[str]:
    return ["--database-url", settings.db_url, "--authority-key", str(settings.authority_key_path)]


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(listen="127.0.0.1:0", data_dir=tmp_path / "data", database_url=db_url, grace_seconds=0.5)


async def test_a_replaced_authority_key_is_refused_at_start(settings: Settings) -> None:
    """Issue 13 item 5: a different key without a recorded rotation does not start (clear message)."""
    mesh, client = await started(settings)
    await some_history(client, settings)
    await stop(mesh, client)
    replace_key_file(settings.authority_key_path)
    with pytest.raises(KeyContinuityError, match=r"no rotation to it is recorded.*rotate-key"):
        await start(settings)


async def test_a_recorded_rotation_is_accepted_and_old_events_still_verify(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 item 5: ``mwp authority rotate-key`` records a rotation signed by the old key; the
    Authority then starts with the new key, signs with it, serves the old events (signed by the old
    key, which GetAuthorityKey still lists with the rotation), and the retired key is refused."""
    mesh, client = await started(settings)
    alice = await some_history(client, settings)
    old_public = bytes(read_key(settings.authority_key_path).verify_key)
    await stop(mesh, client)

    assert (
        await asyncio.to_thread(
            cli, "authority", "rotate-key", *store_flags(settings), "--reason", "yearly rotation"
        )
        == 0
    )
    retired = next(settings.authority_key_path.parent.glob("authority.key.retired-*"))
    new_public = bytes(read_key(settings.authority_key_path).verify_key)
    assert new_public != old_public

    mesh, client = await started(settings)
    try:
        answer = await client.authority.GetAuthorityKey(apb.GetAuthorityKeyRequest())
        assert answer.public_key == new_public and [k.public_key for k in answer.keys] == [
            old_public,
            new_public,
        ]
        rotation = answer.keys[1].rotation
        assert rotation.payload_type == KEY_ROTATION_TYPE
        assert verify_signature(rotation, old_public, 0) and verify_signature(rotation, new_public, 1)
        assert apb.AuthorityKeyRotation.FromString(rotation.payload).reason == "yearly rotation"
        keys = {k.key_id: k.public_key for k in answer.keys}
        log = await read_all(client)  # verified by the Authority on the way
        assert log and all(verify_signature(e, keys[e.signatures[0].key_id]) for e in log)
        assert {e.signatures[0].key_id for e in log} == {answer.keys[0].key_id}
        # New events are signed by the new key and link onto the old ones.
        conv = (await client.group_state(G)).mission.planning_conversation_id
        result = await client.execute(
            alice.sign(alice.command(G, "message_post", builders.message(conv, "hi"), membership_epoch=1))
        )
        assert result.events[0].signatures[0].key_id == answer.key_id
        assert decode_events(result.events)[0].previous_digest
    finally:
        await stop(mesh, client)

    capsys.readouterr()
    assert await asyncio.to_thread(cli, "verify", *store_flags(settings), "--json") == 0
    assert json.loads(capsys.readouterr().out)["keys"] == [k.key_id for k in answer.keys]

    # The retired key never signs again.
    settings.authority_key_path.rename(settings.authority_key_path.with_name("new.key"))
    retired.rename(settings.authority_key_path)
    with pytest.raises(KeyContinuityError, match="retired"):
        await start(settings)


async def test_a_key_file_replaced_by_hand_is_recorded_with_the_old_key(settings: Settings) -> None:
    """Rotation after the fact: the configured file already holds the new key; ``--old-key`` signs."""
    mesh, client = await started(settings)
    await some_history(client, settings)
    await stop(mesh, client)
    kept = replace_key_file(settings.authority_key_path)
    with pytest.raises(KeyContinuityError):
        await start(settings)
    assert (
        await asyncio.to_thread(
            cli, "authority", "rotate-key", *store_flags(settings), "--old-key", str(kept)
        )
        == 0
    )
    mesh, client = await started(settings)
    try:
        assert len(await read_all(client)) > 0
    finally:
        await stop(mesh, client)


async def test_a_store_from_before_key_continuity_refuses_a_key_that_did_not_sign_it(
    settings: Settings,
) -> None:
    """A store of an earlier release has no key history: the first start records its key, unless its
    events are signed by another one."""
    mesh, client = await started(settings)
    await some_history(client, settings)
    engine = mesh.engine
    async with engine.begin() as conn:
        await conn.execute(delete(authority_keys))  # as written by an earlier release
    await stop(mesh, client)
    replace_key_file(settings.authority_key_path)
    with pytest.raises(KeyContinuityError, match="events are signed by"):
        await start(settings)


async def test_events_name_the_key_they_were_signed_with(settings: Settings) -> None:
    mesh, client = await started(settings)
    try:
        await some_history(client, settings)
        log = await read_all(client)
        assert {e.signatures[0].key_id for e in log} == {mesh.authority.key_id}  # type: ignore[union-attr]
        assert codec.event_of(log[0]).sequence == 1
    finally:
        await stop(mesh, client)


async def test_a_store_tampered_while_stopped_is_refused_after_the_restart(settings: Settings) -> None:
    """Issue 13 item 5: a row deleted while the Authority was down; after the restart the Group's
    first command is refused DATA_CORRUPTED (not UNKNOWN), and health names the Group."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from missionweave.kernel.rejections import rejection_from_rpc_error
    from missionweave_server.services.authority.schema import events

    mesh, client = await started(settings)
    alice = await some_history(client, settings)
    conv = (await client.group_state(G)).mission.planning_conversation_id
    for i in range(3):
        await client.execute(
            alice.sign(alice.command(G, "message_post", builders.message(conv, f"m{i}"), membership_epoch=1))
        )
    async with mesh.engine.begin() as conn:
        await conn.execute(delete(events).where((events.c.group_id == G) & (events.c.seq == 3)))
    await stop(mesh, client)

    mesh, client = await started(settings)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.execute(
                alice.sign(
                    alice.command(G, "message_post", builders.message(conv, "again"), membership_epoch=1)
                )
            )
        rejection = rejection_from_rpc_error(info.value)
        assert info.value.code() == grpc.StatusCode.DATA_LOSS and rejection is not None
        assert (
            rejection.reason == common_pb2.REJECTION_REASON_DATA_CORRUPTED
            and rejection.metadata["sequence"] == "4"
        )
        stub = health_pb2_grpc.HealthStub(client.channel)
        answer = await stub.Check(
            health_pb2.HealthCheckRequest(service=f"missionweave.authority.integrity/{G}")
        )
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await stop(mesh, client)


def test_mwp_verify_usage_errors_exit_2(tmp_path: Path) -> None:
    """docs/cli.md: 2 for a usage error, also for a data directory that holds no store."""
    assert mwp(["verify", "--data-dir", str(tmp_path / "nothing-here")]) == 2
    with pytest.raises(SystemExit) as info:
        mwp(["verify", "--data-dir", str(tmp_path), "--database-url", "sqlite+aiosqlite:///x.db"])
    assert info.value.code == 2
