"""Prometheus metrics and the logs that tie together (issue 17 items 1 and 3; docs/operations.md
"Metrics and logs"): a mesh serving its metrics on a port of its own, scraped over HTTP after a
good and a refused command; the refusal's log line naming the command; the access log."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey
from prometheus_client.parser import text_string_to_metric_families

from missionweave.kernel.clock import SystemClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient, SessionSigner, blob_digest
from missionweave.v1 import common_pb2
from missionweave_server.config import DEFAULT_METRICS_LISTEN, Settings
from missionweave_server.mesh.server import Mesh, start
from missionweave_server.mesh.topology import plan
from tests import builders
from tests.conftest import register

R = common_pb2.RejectionReason


@dataclass
class Metered:
    mesh: Mesh
    client: MeshClient
    owner: SessionSigner

    def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        assert self.mesh.metrics is not None
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.mesh.metrics.port}/metrics", timeout=5
        ) as answer:
            text = answer.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
async def metered(tmp_path: Path) -> AsyncIterator[Metered]:
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        grace_seconds=1,
        metrics_listen="127.0.0.1:0",
    )
    mesh = await start(settings)
    client = MeshClient(f"127.0.0.1:{mesh.port}")
    try:
        admin_key = read_key(settings.admin_key_path)
        owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
        await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
        yield Metered(mesh, client, owner)
    finally:
        await client.channel.close()
        await mesh.stop(grace=1)


async def _scrape(m: Metered) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return await asyncio.to_thread(m.scrape)


async def test_metrics_count_commands_rejections_appends_and_rpcs(
    metered: Metered, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    before = await _scrape(metered)
    owner = metered.owner
    body = builders.mission_create("alice", "coord-bot", SystemClock().now())
    good = owner.sign(owner.command("grp_metrics", "mission_create", body))
    await metered.client.execute(good)
    await metered.client.execute(good)  # the same command again: answered as a replay
    refused = owner.command("grp_metrics", "mission_create", body)  # a second mission in that Group
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await metered.client.execute(owner.sign(refused))
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None
    reason = R.Name(rejection.reason).removeprefix("REJECTION_REASON_")
    after = await _scrape(metered)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("mwp_commands_total", kind="mission_create", outcome="accepted") == 1
    assert moved("mwp_commands_total", kind="mission_create", outcome="replayed") == 1
    assert moved("mwp_commands_total", kind="mission_create", outcome="rejected") == 1
    assert moved("mwp_rejections_total", service="Authority", reason=reason) == 1
    assert moved("mwp_append_latency_seconds_count") >= 1
    assert moved("mwp_group_commit_latency_seconds_count") >= 1
    assert moved("mwp_group_commit_batch_size_sum") >= 1
    execute = "/missionweave.v1.AuthorityService/ExecuteCommand"
    assert moved("mwp_rpcs_total", method=execute, code="OK") == 2
    assert moved("mwp_rpcs_total", method=execute, code=info.value.code().name) == 1
    assert moved("mwp_rpc_latency_seconds_count", method=execute) == 3
    # Bounded labels: no series names a Group or an identity.
    assert not [key for key in after if any(v in ("grp_metrics", "alice") for _, v in key[1])]

    # The refusal's one log line names the command it refused.
    (line,) = [
        r
        for r in caplog.records
        if r.getMessage() == "request rejected" and getattr(r, "command_id", "") == refused.command_id
    ]
    fields: Any = line
    assert (fields.group_id, fields.command_kind, fields.actor_id, fields.reason) == (
        "grp_metrics",
        "mission_create",
        "alice",
        reason,
    )
    # One access-log line per RPC: method, caller, code and duration.
    access = [
        r for r in caplog.records if r.name == "missionweave.access" and getattr(r, "method", "") == execute
    ]
    assert [(r.code, r.caller) for r in access] == [
        ("OK", "alice"),
        ("OK", "alice"),
        (info.value.code().name, "alice"),
    ]
    assert all(isinstance(r.duration_ms, float) for r in access)


async def test_accepted_commands_are_logged_at_debug_with_their_fields(
    metered: Metered, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="missionweave.authority")
    owner = metered.owner
    command = owner.command(
        "grp_debug", "mission_create", builders.mission_create("alice", "coord-bot", SystemClock().now())
    )
    await metered.client.execute(owner.sign(command))
    (line,) = [r for r in caplog.records if r.getMessage() == "command accepted"]
    assert (line.group_id, line.command_id, line.command_kind, line.actor_id) == (
        "grp_debug",
        command.command_id,
        "mission_create",
        "alice",
    )


async def test_stopping_the_mesh_stops_its_metrics_endpoint(tmp_path: Path) -> None:
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        services=("membership",),
        metrics_listen="127.0.0.1:0",
    )
    mesh = await start(settings)
    assert mesh.metrics is not None
    port = mesh.metrics.port
    await mesh.stop(grace=0)
    with pytest.raises(OSError):
        await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/metrics", None, 2)


async def test_metrics_are_off_unless_configured(tmp_path: Path) -> None:
    """A bare Settings() serves none (tests start many meshes); `mwp serve` reads the documented default."""
    assert Settings().metrics_listen == ""
    assert Settings.from_env({}).metrics_listen == DEFAULT_METRICS_LISTEN == "127.0.0.1:9464"
    assert Settings.from_env({"MWP_METRICS_LISTEN": ""}).metrics_listen == ""


def test_split_topology_gives_each_child_its_own_metrics_port() -> None:
    settings = Settings(
        listen="127.0.0.1:50099", database_url="postgresql://x/y", metrics_listen="127.0.0.1:9500"
    )
    ports = {c.name: c.env["MWP_METRICS_LISTEN"] for c in plan(settings, 2, "mesh-t")}
    assert ports == {
        "gateway": "127.0.0.1:9500",
        "authority-0": "127.0.0.1:9501",
        "authority-1": "127.0.0.1:9502",
        "membership": "127.0.0.1:9503",
        "artifacts": "127.0.0.1:9504",
        "scheduling": "127.0.0.1:9505",
    }
    off = plan(Settings(listen="127.0.0.1:50099"), 1, "mesh-t")
    assert {c.env["MWP_METRICS_LISTEN"] for c in off} == {""}


def test_every_metric_is_documented_and_the_dashboard_queries_only_defined_ones() -> None:
    import json
    import re

    from prometheus_client import REGISTRY

    from missionweave_server.observability import metrics

    root = Path(__file__).resolve().parent.parent
    defined = {
        m._name
        for m in vars(metrics).values()
        if isinstance(m, metrics.Counter | metrics.Gauge | metrics.Histogram)
    }
    counters = {m._name for m in vars(metrics).values() if isinstance(m, metrics.Counter)}
    operations = (root / "docs" / "operations.md").read_text()
    for name in defined:
        documented = f"{name}_total" if name in counters else name
        assert f"`{documented}`" in operations, f"{documented} is not in docs/operations.md"
    dashboard = json.loads((root / "docs" / "grafana-dashboard.json").read_text())
    queried = {
        re.sub(r"_(bucket|total)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bmwp_[a-z_]+", target["expr"])
    }
    assert queried and queried <= defined, queried - defined
    assert REGISTRY.get_sample_value("mwp_gateway_open_streams") is not None


async def test_a_command_refused_in_a_batch_is_counted_and_logged_like_one_refused_alone(
    metered: Metered, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="missionweave_server.edge")
    owner = metered.owner
    body = builders.mission_create("alice", "coord-bot", SystemClock().now())
    first = owner.command("grp_batch", "mission_create", body)
    second = owner.command("grp_batch", "mission_create", body)
    await metered.client.execute(owner.sign(first))
    before = await _scrape(metered)
    (outcome,) = await metered.client.execute_batch([owner.sign(second)])
    assert isinstance(outcome, Exception)
    after = await _scrape(metered)
    reason = outcome.reason_name  # type: ignore[attr-defined]
    assert (
        value(after, "mwp_rejections_total", service="Authority", reason=reason)
        - value(before, "mwp_rejections_total", service="Authority", reason=reason)
        == 1
    )
    (line,) = [r for r in caplog.records if getattr(r, "command_id", "") == second.command_id]
    assert (line.rpc, line.group_id, line.command_kind, line.actor_id) == (  # type: ignore[attr-defined]
        "Authority.ExecuteCommandBatch",
        "grp_batch",
        "mission_create",
        "alice",
    )


async def test_metrics_count_signatures_artifacts_gateway_delivery_and_scheduling(metered: Metered) -> None:
    """The operator's counters beyond commands: a forged signature, artifact bytes and a digest that
    does not match, a gateway stream with its credits and delivery lag (the scheduler's answers:
    tests/test_scheduling_service.py)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from missionweave.kernel import uploads
    from missionweave.v1 import artifact_service_pb2
    from missionweave.v1 import gateway_service_pb2 as gpb
    from tests.test_gateway import Stream, hello

    before = await _scrape(metered)
    owner = metered.owner
    reader = MeshClient(f"127.0.0.1:{metered.mesh.port}", reader=owner)
    try:
        body = builders.mission_create("alice", "coord-bot", SystemClock().now())
        forged = replace(owner, key=SigningKey.generate())
        with pytest.raises(grpc.aio.AioRpcError):
            await metered.client.execute(forged.sign(owner.command("grp_m2", "mission_create", body)))
        await metered.client.execute(owner.sign(owner.command("grp_m2", "mission_create", body)))
        data = b"metered bytes " * 100
        await reader.upload(data)
        assert await reader.download(blob_digest(data)) == data
        wrong = artifact_service_pb2.UploadHeader(
            digest=blob_digest(b"x" * len(data))
        )  # size right, hash not
        with pytest.raises(grpc.aio.AioRpcError):
            await uploads.upload(reader.artifacts, wrong, [data])
        at_gateway: Any = SimpleNamespace(target=f"127.0.0.1:{metered.mesh.port}", clock=SystemClock())
        stream = Stream(at_gateway, reader.channel)
        await stream.send(hello=hello(at_gateway, owner))
        assert (await stream.recv()).WhichOneof("frame") == "welcome"
        await stream.send(
            subscribe=gpb.SubscribeFrame(subscription_id="s", group_id="grp_m2", initial_credits=1000)
        )
        event = (await stream.until("event")).event
        during = await _scrape(metered)
        await stream.call.done_writing()
    finally:
        await reader.channel.close()
    after = await _scrape(metered)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("mwp_signature_verification_failures_total") == 1
    assert moved("mwp_artifact_bytes_total", direction="in") >= len(data)
    assert moved("mwp_artifact_bytes_total", direction="out") == len(data)
    assert moved("mwp_artifact_verification_failures_total", stage="upload") == 1
    assert value(during, "mwp_gateway_open_streams") >= 1
    assert value(during, "mwp_gateway_credits_outstanding") == 1000 - len(event.events)
    assert (
        value(during, "mwp_gateway_delivery_lag_events_count")
        - value(before, "mwp_gateway_delivery_lag_events_count")
        >= 1
    )
