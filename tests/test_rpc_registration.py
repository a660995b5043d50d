"""Services are added to the mesh's gRPC server through generic handlers only (D154): grpcio's
asyncio server otherwise keeps a pending request task per registered method and waits on all of
them for every call that arrives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from missionweave.v1 import (
    artifact_service_pb2,
    artifact_service_pb2_grpc,
    authority_service_pb2,
    authority_service_pb2_grpc,
)
from missionweave_server.config import Settings
from missionweave_server.mesh.server import start


async def test_the_mesh_registers_no_method_handlers_and_every_service_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every service of the one-process mesh, added with none of its methods registered; their
    methods are found through the generic handlers (a health check, an Authority query and an
    artifact call answered by their services, not UNIMPLEMENTED)."""
    registered: list[str] = []
    real = grpc.aio._server.Server.add_registered_method_handlers

    def record(self: Any, service: str, handlers: Any) -> None:
        registered.append(service)
        real(self, service, handlers)

    monkeypatch.setattr(grpc.aio._server.Server, "add_registered_method_handlers", record)
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
    )
    mesh = await start(settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{mesh.port}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="")
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            key = await authority_service_pb2_grpc.AuthorityServiceStub(channel).GetAuthorityKey(
                authority_service_pb2.GetAuthorityKeyRequest()
            )
            assert key.public_key
            with pytest.raises(grpc.aio.AioRpcError) as refused:  # answered by the service: no credentials
                await artifact_service_pb2_grpc.ArtifactServiceStub(channel).Stat(
                    artifact_service_pb2.StatRequest()
                )
            assert refused.value.code() != grpc.StatusCode.UNIMPLEMENTED
    finally:
        await mesh.stop(grace=0)
    assert registered == []
