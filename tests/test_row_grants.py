"""Rows that grant authority cannot be edited into authority (issue 40, D170, docs/integrity.md).

A database editor who sets ``org_admin``, swaps an identity's or a session's key, or inserts an
identity gains nothing: each identity and session row must match the signed request that granted
it, checked when the row is read (after a restart, so no cache hides the edit), and ``mwp verify``
names every such row. The chain of grants ends at the administrator's key file, outside the database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey
from sqlalchemy import text

from missionweave.kernel.clock import OffsetClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import (
    MeshClient,
    SessionSigner,
    blob_digest,
    open_session_envelope,
    register_identity_envelope,
)
from missionweave.v1 import common_pb2, membership_pb2, membership_service_pb2
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start
from missionweave_server.services.membership.grants import (
    GrantChecker,
    GrantedIdentity,
    GrantInvalid,
    attest_identity,
    attest_session,
)
from missionweave_server.storage.db import make_engine

R = common_pb2.RejectionReason
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


async def serve(db_url: str, data: Path) -> Any:
    return await start(
        Settings(listen="127.0.0.1:0", data_dir=data, database_url=db_url, grace_seconds=1), OffsetClock()
    )


async def rejection(call: Awaitable[object]) -> common_pb2.Rejection:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    found = rejection_from_rpc_error(info.value)
    assert found is not None, info.value
    return found


async def sql(db_url: str, statement: str, **params: object) -> None:
    engine = make_engine(db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement), params)
    finally:
        await engine.dispose()


def verify(data: Path, db_url: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MWP_DATA_DIR": str(data), "MWP_DATABASE_URL": db_url}
    done = subprocess.run(
        [sys.executable, "-m", "missionweave.cli", "verify", "--json", "--no-blobs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    document: dict[str, Any] = json.loads(done.stdout)
    document["exit"] = done.returncode
    return document


class Org:
    """A store with bob (an agent, not an administrator) registered and in a session."""

    def __init__(self, db_url: str, data: Path) -> None:
        self.db_url, self.data = db_url, data
        self.bob_key = SigningKey.generate()
        self.eve_key = SigningKey.generate()  # the editor's own key
        self.target = ""

    async def build(self) -> None:
        mesh = await serve(self.db_url, self.data)
        client = MeshClient(f"127.0.0.1:{mesh.port}")
        try:
            await client.register_identity(
                "admin", self.admin_key, "bob", common_pb2.IDENTITY_KIND_AGENT, bytes(self.bob_key.verify_key)
            )
            self.bob = await client.open_session("bob", self.bob_key)
        finally:
            await client.channel.close()
            await mesh.stop(grace=1)

    @property
    def admin_key(self) -> SigningKey:
        return read_key(self.data / "keys" / "admin.key")

    async def restarted(
        self, body: Callable[[MeshClient], Awaitable[None]], *, as_admin: bool = True
    ) -> None:
        """``body`` against a fresh mesh on the (edited) store, nothing cached from before: with a
        client reading as the administrator (unless the edit took the administrator away)."""
        mesh = await serve(self.db_url, self.data)
        target = self.target = f"127.0.0.1:{mesh.port}"
        client = MeshClient(target)
        try:
            if as_admin:
                admin = await client.open_session("admin", self.admin_key)
                await client.channel.close()
                client = MeshClient(target, reader=admin)
            await body(client)
        finally:
            await client.channel.close()
            await mesh.stop(grace=1)


@pytest.fixture
async def org(db_url: str, data: Path) -> AsyncIterator[Org]:
    built = Org(db_url, data)
    await built.build()
    assert verify(data, db_url)["grants"]["findings"] == []
    yield built


def findings(org: Org) -> list[tuple[str, str, str]]:
    document = verify(org.data, org.db_url)
    assert document["exit"] == 1 and not document["clean"], document
    return [(f["what"], f["identity_id"], f["detail"]) for f in document["grants"]["findings"]]


async def test_org_admin_set_in_the_database_grants_nothing(org: Org) -> None:
    await sql(org.db_url, "UPDATE identities SET org_admin = :yes WHERE identity_id = 'bob'", yes=True)

    async def check(client: MeshClient) -> None:
        mallory = membership_pb2.Identity(
            identity_id="mallory",
            kind=common_pb2.IDENTITY_KIND_AGENT,
            public_key=bytes(org.eve_key.verify_key),
            org_admin=True,
        )
        envelope = register_identity_envelope("bob", org.bob_key, mallory)
        refused = await rejection(
            client.membership.RegisterIdentity(
                membership_service_pb2.RegisterIdentityRequest(command=envelope)
            )
        )
        assert refused.reason == R.REJECTION_REASON_DATA_CORRUPTED
        got = await rejection(
            client.membership.GetIdentity(membership_service_pb2.GetIdentityRequest(identity_id="bob"))
        )
        assert got.reason == R.REJECTION_REASON_DATA_CORRUPTED
        # The rest of the Organization is untouched: the real administrator still registers.
        await client.register_identity(
            "admin",
            org.admin_key,
            "carol",
            common_pb2.IDENTITY_KIND_HUMAN,
            bytes(SigningKey.generate().verify_key),
        )

    await org.restarted(check)
    assert findings(org) == [
        ("identity", "bob", "identity 'bob': the row differs from the request that registered it"),
        ("session", "bob", "its identity fails its grant check"),
    ]


async def test_a_swapped_identity_key_opens_no_session(org: Org) -> None:
    await sql(
        org.db_url,
        "UPDATE identities SET public_key = :k WHERE identity_id = 'bob'",
        k=bytes(org.eve_key.verify_key),
    )

    async def check(client: MeshClient) -> None:
        envelope = open_session_envelope("bob", org.eve_key, bytes(org.eve_key.verify_key))
        refused = await rejection(
            client.membership.OpenSession(membership_service_pb2.OpenSessionRequest(command=envelope))
        )
        assert refused.reason == R.REJECTION_REASON_DATA_CORRUPTED

    await org.restarted(check)
    assert [(what, who) for what, who, _ in findings(org)] == [("identity", "bob"), ("session", "bob")]


async def test_a_swapped_session_key_signs_no_call(org: Org) -> None:
    await sql(
        org.db_url,
        "UPDATE sessions SET public_key = :k WHERE identity_id = 'bob' AND session_epoch = :e",
        k=bytes(org.eve_key.verify_key),
        e=org.bob.session_epoch,
    )

    async def check(client: MeshClient) -> None:
        forged = MeshClient(org.target, reader=SessionSigner("bob", org.bob.session_epoch, org.eve_key))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await forged.group_state("grp_none")
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value
        finally:
            await forged.channel.close()

    await org.restarted(check)
    assert findings(org) == [
        (
            "session",
            "bob",
            f"session {org.bob.session_epoch} of 'bob': the row differs from the request that opened it",
        )
    ]


async def test_an_inserted_identity_or_a_replaced_root_is_refused(org: Org) -> None:
    # A row copied from bob's with its grant, under another id and with the editor's key.
    await sql(
        org.db_url,
        "INSERT INTO identities (identity_id, kind, display_name, public_key, org_admin, registered_us, session_epoch, "
        "grant_envelope) SELECT 'mallory', kind, display_name, :k, org_admin, registered_us, 0, grant_envelope "
        "FROM identities WHERE identity_id = 'bob'",
        k=bytes(org.eve_key.verify_key),
    )
    # The administrator's row re-granted by the editor's own key: the root is the key file, not the row.
    eve_admin = GrantedIdentity(
        "admin",
        common_pb2.IDENTITY_KIND_HUMAN,
        "Organization administrator",
        bytes(org.eve_key.verify_key),
        True,
    )
    await sql(
        org.db_url,
        "UPDATE identities SET public_key = :k, grant_envelope = :g WHERE identity_id = 'admin'",
        k=bytes(org.eve_key.verify_key),
        g=attest_identity(org.eve_key, eve_admin, 0),
    )

    async def check(client: MeshClient) -> None:
        for who in ("mallory", "admin"):
            envelope = open_session_envelope(who, org.eve_key, bytes(org.eve_key.verify_key))
            refused = await rejection(
                client.membership.OpenSession(membership_service_pb2.OpenSessionRequest(command=envelope))
            )
            assert refused.reason == R.REJECTION_REASON_DATA_CORRUPTED, who

    await org.restarted(check, as_admin=False)
    found = {(what, who) for what, who, _ in findings(org)}
    assert {("identity", "mallory"), ("identity", "admin")} <= found


# ------------------------------------------------------------------ the checker itself


def _row(identity_id: str, key: SigningKey, admin: bool = False) -> GrantedIdentity:
    return GrantedIdentity(
        identity_id, common_pb2.IDENTITY_KIND_AGENT, identity_id, bytes(key.verify_key), admin
    )


def _registered(row: GrantedIdentity, by: str, key: SigningKey) -> bytes:
    identity = membership_pb2.Identity(
        identity_id=row.identity_id,
        kind=row.kind,
        display_name=row.display_name,
        public_key=row.public_key,
        org_admin=row.org_admin,  # type: ignore[arg-type]
    )
    return register_identity_envelope(by, key, identity).SerializeToString()


async def test_grants_chain_through_administrators_to_the_key_file() -> None:
    root, second, plain = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    rows = {
        "admin": (_row("admin", root, True), attest_identity(root, _row("admin", root, True), 0)),
        "ops": (_row("ops", second, True), b""),
        "bot": (_row("bot", plain), b""),
        "worker": (_row("worker", SigningKey.generate()), b""),
    }
    rows["ops"] = (rows["ops"][0], _registered(rows["ops"][0], "admin", root))
    rows["bot"] = (
        rows["bot"][0],
        _registered(rows["bot"][0], "ops", second),
    )  # an admin registered by the root
    rows["worker"] = (rows["worker"][0], _registered(rows["worker"][0], "bot", plain))  # bot is no admin

    async def lookup(identity_id: str) -> tuple[GrantedIdentity, bytes | None] | None:
        return rows.get(identity_id)

    checker = GrantChecker(bytes(root.verify_key))
    for ok in ("admin", "ops", "bot"):
        await checker.identity(*rows[ok], lookup)
    with pytest.raises(GrantInvalid, match="not an Organization admin"):
        await checker.identity(*rows["worker"], lookup)
    with pytest.raises(GrantInvalid, match="not with the administrator key"):
        await GrantChecker(bytes(SigningKey.generate().verify_key)).identity(*rows["admin"], lookup)
    with pytest.raises(GrantInvalid, match="carries no grant"):
        await checker.identity(rows["bot"][0], None, lookup)
    # A session: the identity's own request, or the administrator key's attestation at an upgrade.
    session_key = bytes(SigningKey.generate().verify_key)
    own = open_session_envelope("bot", plain, session_key).SerializeToString()
    checker.session(rows["bot"][0], 1, session_key, own)
    checker.session(rows["bot"][0], 2, session_key, attest_session(root, "bot", session_key, 0))
    with pytest.raises(GrantInvalid, match="signed neither"):
        checker.session(rows["bot"][0], 3, session_key, attest_session(second, "bot", session_key, 0))
    with pytest.raises(GrantInvalid, match="differs"):
        checker.session(rows["bot"][0], 4, bytes(SigningKey.generate().verify_key), own)


async def test_a_membership_start_without_the_admin_key_is_refused_not_re_rooted(org: Org) -> None:
    """Once identities exist, a missing administrator key file is not replaced by a new one (which
    would make every grant fail, or root them in a key nobody vetted): the start is refused."""
    (org.data / "keys" / "admin.key").unlink()
    with pytest.raises(ValueError, match="administrator's key"):
        await serve(org.db_url, org.data)
    assert not (org.data / "keys" / "admin.key").exists()


async def test_a_holder_row_written_in_the_database_reads_no_blob(org: Org) -> None:
    """A ``holders`` row lets an identity read a blob it uploaded (D172): one inserted by hand (with
    no seal, or with the seal of another identity's row) grants nothing."""
    secret = b"bob's unpublished report\n"
    digest = blob_digest(secret)

    async def upload(client: MeshClient) -> None:
        uploader = MeshClient(org.target, reader=await client.open_session("bob", org.bob_key))
        try:
            await uploader.upload(secret)
            assert await uploader.download(digest) == secret
        finally:
            await uploader.channel.close()

    await org.restarted(upload)
    eve = await _registered_eve(org)
    await sql(
        org.db_url,
        "INSERT INTO holders (digest, identity_id, size_bytes, stored_us, holder_seal) "
        "SELECT digest, 'eve', size_bytes, stored_us, holder_seal FROM holders WHERE identity_id = 'bob'",
    )

    async def check(client: MeshClient) -> None:
        reader = MeshClient(org.target, reader=await client.open_session("eve", eve))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await reader.download(digest)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND  # as for any blob it may not read
        finally:
            await reader.channel.close()

    await org.restarted(check)
    assert findings(org) == [
        ("holder", "eve", f"blake3:{digest.hex}: the holder row is not sealed by the artifact service")
    ]


async def _registered_eve(org: Org) -> SigningKey:
    async def register(client: MeshClient) -> None:
        await client.register_identity(
            "admin", org.admin_key, "eve", common_pb2.IDENTITY_KIND_AGENT, bytes(org.eve_key.verify_key)
        )

    await org.restarted(register)
    return org.eve_key
