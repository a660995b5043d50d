"""Replicas of a service share what must hold across them (issue 13; D118, D119): Kubernetes runs
the gateway, membership and artifacts twice behind one audience (k8s/base/), so a proof accepted by one
replica must be a replay at the other, and an identity's artifact quota must count its uploads in
progress at every replica.

Two meshes on one database (a SQLite file, or PostgreSQL): replica A serves everything, replica B
membership, artifacts and the gateway (as the Kubernetes pods do), reaching A's Authority.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import func, select

from missionweave.kernel.clock import ManualClock, OffsetClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.kernel.uploads import asks_for_bytes
from missionweave.sdk.client import MeshClient, SessionSigner, blob_digest
from missionweave.sdk.credentials import call_proof
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave_server.config import Settings
from missionweave_server.edge.callers import CALL_PROOF_METADATA
from missionweave_server.mesh.server import Mesh, start
from missionweave_server.services.artifacts.schema import upload_reservations
from missionweave_server.storage import replay
from missionweave_server.storage.db import make_engine
from tests.conftest import register
from tests.test_gateway import Stream, hello

# What clients dial (a load balancer in front of both replicas): every proof names it.
AUDIENCE = "mesh.replicas.test:443"
FIND_MISSING = "/missionweave.v1.ArtifactService/FindMissing"
KiB = 1024
MiB = 1024 * KiB


@dataclass
class Replicas:
    a: Mesh
    b: Mesh
    clock: OffsetClock
    alice: SessionSigner
    clients: dict[str, MeshClient]  # alice's, to each replica

    @property
    def client(self) -> MeshClient:  # tests.test_gateway's helpers open streams on this one
        return self.clients["a"]


@pytest.fixture
async def replicas(db_url: str, tmp_path: Path) -> AsyncIterator[Replicas]:
    clock = OffsetClock()
    base = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=db_url,
        grace_seconds=1,
        nonce_store="database",
        audience=AUDIENCE,
    )
    a = await start(base, clock)
    b: Mesh | None = None
    clients: dict[str, MeshClient] = {}
    try:
        b = await start(
            replace(
                base,
                services=("membership", "artifacts", "gateway"),
                instance_id="replica-b",
                peers={"authority": f"127.0.0.1:{a.port}"},
            ),
            clock,
        )
        admin = MeshClient(f"127.0.0.1:{a.port}")
        alice = await register(admin, read_key(base.admin_key_path), "alice", common_pb2.IDENTITY_KIND_AGENT)
        await admin.channel.close()
        for name, mesh in (("a", a), ("b", b)):
            clients[name] = MeshClient(f"127.0.0.1:{mesh.port}", reader=alice)
            clients[name].proofs.audience = AUDIENCE
        yield Replicas(a, b, clock, alice, clients)
    finally:
        for client in clients.values():
            await client.channel.close()
        if b is not None:
            await b.stop(grace=1)
        await a.stop(grace=1)


# ------------------------------------------------------------------ proofs (D118)


async def refusal_of(client: MeshClient, proof: bytes) -> tuple[grpc.StatusCode, common_pb2.Rejection] | None:
    """How a FindMissing call carrying ``proof`` is refused (None: it was answered)."""
    stub = client.channel.unary_unary(
        FIND_MISSING,
        request_serializer=apb.FindMissingRequest.SerializeToString,
        response_deserializer=apb.FindMissingResponse.FromString,
    )
    try:
        await stub(apb.FindMissingRequest(), metadata=((CALL_PROOF_METADATA, proof),))
    except grpc.aio.AioRpcError as err:
        rejection = rejection_from_rpc_error(err)
        assert rejection is not None, err
        return err.code(), rejection
    return None


async def test_a_call_proof_accepted_by_one_replica_is_a_replay_at_the_other(replicas: Replicas) -> None:
    r = replicas
    a, b = r.clients["a"], r.clients["b"]
    proof = call_proof(r.alice, FIND_MISSING, AUDIENCE)
    assert await refusal_of(a, proof) is None
    local = await refusal_of(a, proof)  # the replay the replica catches by itself
    assert local is not None and local[0] == grpc.StatusCode.UNAUTHENTICATED
    assert local[1].metadata["check"] == "replayed"
    assert await refusal_of(b, proof) == local  # the other replica: the same refusal
    # Either way round, and whichever replica sees the proof first.
    other = call_proof(r.alice, FIND_MISSING, AUDIENCE)
    assert await refusal_of(b, other) is None
    assert await refusal_of(a, other) == local


async def test_a_hello_proof_welcomed_by_one_gateway_replica_is_a_replay_at_the_other(
    replicas: Replicas,
) -> None:
    r = replicas
    w: Any = r  # tests.test_gateway's helpers read .clock and .client
    frame = hello(w, r.alice, audience=AUDIENCE)

    async def first_frame(mesh: str) -> gpb.ServerFrame:
        stream = Stream(w, r.clients[mesh].channel)
        await stream.send(hello=frame)
        answer = await stream.recv()
        stream.call.cancel()
        return answer

    assert (await first_frame("a")).HasField("welcome")
    local = await first_frame("a")
    assert local.error.fatal and local.error.code == gpb.GATEWAY_ERROR_CODE_HELLO_INVALID
    assert local.error.rejection.metadata["field"] == "nonce"
    assert await first_frame("b") == local
    # A fresh proof is welcomed at either.
    stream = Stream(w, r.clients["b"].channel)
    await stream.send(hello=hello(w, r.alice, audience=AUDIENCE))
    assert (await stream.recv()).HasField("welcome")
    stream.call.cancel()


async def test_the_shared_ledger_takes_each_nonce_once_and_prunes_stale_rows(db_url: str) -> None:
    """The ledger beneath both: a nonce once across replicas while its proof is fresh; a stale row
    is taken over by a new proof and pruned by the next replica due to prune."""
    engines = [make_engine(db_url), make_engine(db_url)]
    clock = ManualClock()
    try:
        await replay.create_schema(engines[0])
        a, b = (replay.SharedNonces(engine, clock, "call") for engine in engines)
        again, gone = os.urandom(16), os.urandom(16)

        async def rows() -> int:
            async with engines[0].connect() as conn:
                return int(await conn.scalar(select(func.count()).select_from(replay.proof_nonces)) or 0)

        expires = clock.now() + replay.REPLAY_WINDOW
        assert await a.first_use("alice", again, expires)
        assert not await b.first_use("alice", again, expires)  # another replica's replay
        assert await b.first_use("bob", again, expires)  # another signer's nonce is its own
        assert await replay.SharedNonces(engines[1], clock, "hello").first_use(
            "alice", again, expires
        )  # another scope
        assert await a.first_use("alice", gone, expires)
        assert await rows() == 4

        clock.advance(seconds=31)  # every proof above is stale now, and each replica is due to prune
        assert await b.first_use(
            "alice", again, clock.now() + replay.REPLAY_WINDOW
        )  # a stale row, taken over
        assert await rows() == 1  # the other stale rows pruned; the taken-over one is live again
        assert not await a.first_use("alice", again, clock.now() + replay.REPLAY_WINDOW)
    finally:
        for engine in engines:
            await engine.dispose()


def test_the_nonce_store_is_the_database_unless_configured() -> None:
    assert Settings.from_env({}).nonce_store == "database"  # D168: safe across restarts
    assert Settings.from_env({"MWP_NONCE_STORE": "Memory"}).nonce_store == "memory"
    with pytest.raises(ValueError, match="MWP_NONCE_STORE"):
        Settings.from_env({"MWP_NONCE_STORE": "redis"})


# ------------------------------------------------------------------ the quota (D119)


async def start_upload(client: MeshClient, data: bytes) -> Any:
    """An upload whose header the server has answered: with the go-ahead (the bytes are then
    reserved against the quota), or with a refusal. Returns the call."""
    call = client.artifacts.Upload()
    await call.write(apb.UploadRequest(header=apb.UploadHeader(digest=blob_digest(data))))
    await call.initial_metadata()
    return call


async def finish_upload(call: Any, data: bytes) -> apb.UploadResponse:
    for offset in range(0, len(data), MiB):
        await call.write(
            apb.UploadRequest(chunk=apb.UploadChunk(offset=offset, data=data[offset : offset + MiB]))
        )
    await call.done_writing()
    return await call  # type: ignore[no-any-return]


async def quota_refusal(call: Any) -> common_pb2.Rejection:
    assert not asks_for_bytes(await call.initial_metadata()), "admitted: the server asks for the bytes"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == common_pb2.REJECTION_REASON_QUOTA_EXCEEDED, (
        info.value
    )
    return rejection


async def test_an_identitys_quota_counts_its_uploads_at_every_replica(replicas: Replicas) -> None:
    r = replicas
    for mesh in (r.a, r.b):
        assert mesh.artifacts is not None
        mesh.artifacts.quota_bytes = MiB
    first, second = os.urandom(700 * KiB), os.urandom(700 * KiB)
    receiving = await start_upload(r.clients["a"], first)
    assert asks_for_bytes(await receiving.initial_metadata())
    # While A receives the first, B refuses the second on its header: 700 KiB are in use at A.
    refused = await quota_refusal(await start_upload(r.clients["b"], second))
    assert refused.metadata["used_bytes"] == str(len(first))
    assert not (await finish_upload(receiving, first)).already_existed
    # Held now (counted once, not as held and in progress): what is left fits at either replica.
    fits = os.urandom(MiB - len(first))
    assert not (await finish_upload(await start_upload(r.clients["b"], fits), fits)).already_existed
    refused = await quota_refusal(await start_upload(r.clients["a"], b"x"))
    assert refused.metadata["used_bytes"] == str(MiB)


async def test_concurrent_uploads_at_two_replicas_cannot_both_pass_the_quota(replicas: Replicas) -> None:
    r = replicas
    for mesh in (r.a, r.b):
        assert mesh.artifacts is not None
        mesh.artifacts.quota_bytes = MiB
    blobs = [os.urandom(600 * KiB) for _ in range(6)]
    calls = await asyncio.gather(
        *(start_upload(r.clients["ab"[i % 2]], data) for i, data in enumerate(blobs))
    )
    admitted = [i for i, call in enumerate(calls) if asks_for_bytes(await call.initial_metadata())]
    assert len(admitted) == 1, admitted  # 600 KiB twice would pass 1 MiB
    for i, call in enumerate(calls):
        if i in admitted:
            await finish_upload(call, blobs[i])
        else:
            await quota_refusal(call)
    # A refused or finished upload leaves no reservation behind.
    async with r.a.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(upload_reservations)) == 0
