"""A Group's ownership row is sealed by the Authority key (issue 40, D171, docs/integrity.md).

An ownership row rewritten in the database (``owner_instance`` naming an instance that does not
exist, or a forged seal) used to refuse every command NOT_OWNER for the length of the lease, with
no signal. Now such a row holds no lease: the next instance that needs the Group logs an error and
takes it over (raising the writer epoch, which fences whoever held it), and ``mwp verify`` names it.
A sealed row of a live instance still sends commands there.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from nacl.signing import SigningKey

from missionweave.kernel.clock import ManualClock, SystemClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from missionweave_server.services.authority.ownership_seal import OwnershipSeal
from tests import builders
from tests.test_row_grants import sql, verify

R = common_pb2.RejectionReason


@pytest.mark.parametrize("edit", ["ghost owner", "forged seal"])
async def test_an_unsealed_ownership_row_is_taken_over_not_obeyed(
    edit: str, db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(SystemClock().now())
    data = tmp_path / "data"
    a = await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-a"), clock
    )
    b = await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, instance_id="auth-b"), clock
    )
    ca, cb = MeshClient(f"127.0.0.1:{a.port}"), MeshClient(f"127.0.0.1:{b.port}")
    try:
        admin_key = read_key(data / "keys" / "admin.key")
        alice_key = SigningKey.generate()
        await ca.register_identity(
            "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key)
        )
        await ca.register_identity(
            "admin", admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT, bytes(SigningKey.generate().verify_key)
        )
        alice = await ca.open_session("alice", alice_key)
        cb.read_as(alice)
        await ca.execute(
            alice.sign(
                alice.command("grp_s", "mission_create", builders.mission_create("alice", "bot", clock.now()))
            )
        )
        conv = (await ca.group_state("grp_s")).mission.planning_conversation_id

        def post(words: str) -> common_pb2.SignedEnvelope:
            return alice.sign(
                alice.command("grp_s", "message_post", builders.message(conv, words), membership_epoch=1)
            )

        # Sealed by a: b sends the command there.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await cb.execute(post("via b"))
        refused = rejection_from_rpc_error(info.value)
        assert (
            refused
            and refused.reason == R.REJECTION_REASON_NOT_OWNER
            and refused.metadata["owner"] == "auth-a"
        )

        if edit == "ghost owner":  # a's seal kept, the owner rewritten: the seal no longer covers the row
            await sql(db_url, "UPDATE groups SET owner_instance = 'auth-ghost' WHERE group_id = 'grp_s'")
        else:  # a's own name, sealed by a key that is not the Authority's
            forged = OwnershipSeal(SigningKey.generate(), []).seal("grp_s", "auth-a", 1)
            await sql(db_url, "UPDATE groups SET owner_seal = :s WHERE group_id = 'grp_s'", s=forged)
        with caplog.at_level(logging.ERROR, logger="missionweave.authority.store"):
            taken = await cb.execute(post("b takes it, the lease still running"))
        assert taken.group_revision == 6
        assert any("not sealed by the Authority key" in r.getMessage() for r in caplog.records)
        # The takeover raised the writer epoch: a's cached ownership is fenced, never interleaved.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ca.execute(post("late write from a"))
        refused = rejection_from_rpc_error(info.value)
        assert (
            refused
            and refused.reason == R.REJECTION_REASON_NOT_OWNER
            and refused.metadata["owner"] == "auth-b"
        )
        assert [e.sequence async for e in cb.read_events("grp_s")] == [1, 2, 3, 4, 5, 6]
    finally:
        await ca.channel.close()
        await cb.channel.close()
        await a.stop(grace=1)
        await b.stop(grace=1)
    assert verify(data, db_url)["clean"]  # b sealed what it took


async def test_mwp_verify_names_an_ownership_row_without_a_valid_seal(db_url: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    mesh = await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url), ManualClock(SystemClock().now())
    )
    client = MeshClient(f"127.0.0.1:{mesh.port}")
    try:
        alice_key = SigningKey.generate()
        admin_key = read_key(data / "keys" / "admin.key")
        await client.register_identity(
            "admin", admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(alice_key.verify_key)
        )
        await client.register_identity(
            "admin", admin_key, "bot", common_pb2.IDENTITY_KIND_AGENT, bytes(SigningKey.generate().verify_key)
        )
        alice = await client.open_session("alice", alice_key)
        for group in ("grp_1", "grp_2", "grp_3"):
            body = builders.mission_create("alice", "bot", SystemClock().now())
            await client.execute(alice.sign(alice.command(group, "mission_create", body)))
    finally:
        await client.channel.close()
        await mesh.stop(grace=1)
    assert verify(data, db_url)["clean"]
    await sql(db_url, "UPDATE groups SET owner_instance = 'auth-ghost' WHERE group_id = 'grp_2'")
    await sql(
        db_url, "UPDATE groups SET owner_seal = NULL WHERE group_id = 'grp_3'"
    )  # as before authority_0002
    report = verify(data, db_url)
    assert report["exit"] == 1
    assert [(f["group_id"], f["detail"]) for f in report["findings"]] == [
        (
            "grp_2",
            "the Group's ownership row (owner auth-ghost, writer epoch 1) is not sealed by the Authority key",
        )
    ]
    assert report["unsealed_ownership"] == 1  # grp_3: holds no lease, sealed by the next instance to take it


def test_a_seal_holds_for_its_row_only_and_across_a_key_rotation() -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    sealed = OwnershipSeal(old, []).seal("grp", "auth-a", 3)
    after_rotation = OwnershipSeal(new, [bytes(old.verify_key)])
    assert after_rotation.holds("grp", "auth-a", 3, sealed)
    assert not after_rotation.holds("grp", "auth-b", 3, sealed)
    assert not after_rotation.holds("grp", "auth-a", 4, sealed)
    assert not after_rotation.holds("grp2", "auth-a", 3, sealed)
    assert not after_rotation.holds("grp", "auth-a", 3, None)
    assert not OwnershipSeal(new, []).holds("grp", "auth-a", 3, sealed)
