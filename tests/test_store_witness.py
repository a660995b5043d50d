"""A whole store put back to an older copy is refused at start (issue 40, D173, docs/integrity.md
"A store rolled back"): the Authority's signed witness, outside the store, remembers a lower bound
of what the store held; a store below it is not served or extended."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from nacl.signing import SigningKey
from sqlalchemy import text

from missionweave.kernel.clock import ManualClock, SystemClock
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import common_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from missionweave_server.services.authority.witness import StoreRolledBack
from missionweave_server.storage.db import make_engine
from tests import builders


class Store:
    def __init__(self, db_url: str, data: Path) -> None:
        self.db_url, self.data = db_url, data
        self.clock = ManualClock(SystemClock().now())
        self.alice: SessionSigner | None = None
        self.alice_key = SigningKey.generate()

    def settings(self) -> Settings:
        return Settings(listen="127.0.0.1:0", data_dir=self.data, database_url=self.db_url, grace_seconds=1)

    async def posts(self, count: int) -> None:
        """``count`` messages in grp_w (created on the first call), then a clean stop."""
        mesh = await start(self.settings(), self.clock)
        client = MeshClient(f"127.0.0.1:{mesh.port}")
        try:
            if self.alice is None:
                admin = read_key(self.data / "keys" / "admin.key")
                await client.register_identity(
                    "admin", admin, "alice", common_pb2.IDENTITY_KIND_HUMAN, bytes(self.alice_key.verify_key)
                )
                await client.register_identity(
                    "admin",
                    admin,
                    "bot",
                    common_pb2.IDENTITY_KIND_AGENT,
                    bytes(SigningKey.generate().verify_key),
                )
                self.alice = await client.open_session("alice", self.alice_key)
                create = builders.mission_create("alice", "bot", self.clock.now())
                await client.execute(self.alice.sign(self.alice.command("grp_w", "mission_create", create)))
            client.read_as(self.alice)
            conversation = (await client.group_state("grp_w")).mission.planning_conversation_id
            for i in range(count):
                body = builders.message(conversation, f"post {i}")
                await client.execute(
                    self.alice.sign(self.alice.command("grp_w", "message_post", body, membership_epoch=1))
                )
        finally:
            await client.channel.close()
            await mesh.stop(grace=1)

    async def serves(self) -> None:
        mesh = await start(self.settings(), self.clock)
        await mesh.stop(grace=1)

    async def sql(self, *statements: str) -> None:
        engine = make_engine(self.db_url)
        try:
            async with engine.begin() as conn:
                for statement in statements:
                    await conn.execute(text(statement))
        finally:
            await engine.dispose()


async def test_a_truncation_that_also_removed_its_records_is_refused_at_start(
    db_url: str, tmp_path: Path
) -> None:
    """The case rule 7 cannot see (the command rows removed with the events): the witness can."""
    store = Store(db_url, tmp_path / "data")
    await store.posts(3)
    await store.serves()  # an intact store starts (and a restart writes the witness again)
    await store.sql(
        "DELETE FROM events WHERE group_id = 'grp_w' AND seq > 4",
        "DELETE FROM commands WHERE group_id = 'grp_w' AND last_seq > 4",
        "DELETE FROM chain_checkpoints WHERE group_id = 'grp_w' AND seq > 4",
        "UPDATE groups SET head_seq = 4 WHERE group_id = 'grp_w'",
    )
    with pytest.raises(StoreRolledBack, match="put back to an older copy"):
        await store.serves()
    # The operator who means it (a restore they chose) removes the witness; the store then serves.
    shutil.rmtree(tmp_path / "data" / "witness")
    await store.serves()


async def test_an_older_copy_of_the_sqlite_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = Store("", data)
    await store.posts(1)
    shutil.copy(data / "missionweave.db", tmp_path / "older.db")
    await store.posts(2)
    (data / "missionweave.db").unlink()
    for journal in data.glob("missionweave.db-*"):
        journal.unlink()
    shutil.copy(tmp_path / "older.db", data / "missionweave.db")
    with pytest.raises(StoreRolledBack) as refused:
        await store.serves()
    assert "heads summing to 6, 1 key(s), against 1, 8 and 1" in str(refused.value)


async def test_a_witness_not_signed_by_the_authority_key_proves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = Store("", data)
    await store.posts(1)
    [path] = (data / "witness").glob("*.json")
    document = json.loads(path.read_text())
    document["witness"]["summary"]["heads"] += 1000  # a forged witness would refuse a good store
    path.write_text(json.dumps(document))
    await store.serves()  # left out (logged), so the intact store is served
    forged = SigningKey.generate().sign(b"x").signature.hex()
    document["signature"] = forged
    path.write_text(json.dumps(document))
    await store.serves()
