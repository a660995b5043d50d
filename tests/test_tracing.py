"""Distributed tracing and logs that tie to it (issue 17 items 2 and 3, docs/operations.md "Tracing").

In process, spans go to an in-memory exporter installed with ``tracing.install``; processes of
their own (the SQLite writer, ``mwp serve``, the split topology's children) export over OTLP to a
small collector served by the test itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

from missionweave.kernel import logs
from missionweave.kernel.clock import SystemClock
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient
from missionweave.v1 import common_pb2
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave_server.observability import stderr_relay, tracing
from tests import builders
from tests.conftest import World, polled, register
from tests.split_mesh import free_port, wait_serving
from tests.test_gateway import connected
from tests.test_missions import G, create

COMMAND = "/missionweave.v1.AuthorityService/ExecuteCommand"
CONNECT = "/missionweave.v1.GatewayService/Connect"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace collector: every exported span, with its process's service.name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, trace_pb2.Span]] = []
        self.env: dict[str, str] = {}

    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend((attributes.get("service.name", ""), span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str, trace_id: bytes | None = None) -> list[tuple[str, trace_pb2.Span]]:
        return [
            (s, span) for s, span in self.spans if span.name == name and trace_id in (None, span.trace_id)
        ]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collector]:
    """The collector, and (in ``env``, and in this process's environment for the children it
    starts) the standard variables that switch tracing on and point it there."""
    # A thread-pool server: it leaves no task on the test's event loop (the ``world`` fixture
    # checks that a stopped mesh leaves none).
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    for name, value in servicer.env.items():
        monkeypatch.setenv(name, value)
    try:
        yield servicer
    finally:
        server.stop(0)


def trace_of(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [
        s for s in exporter.get_finished_spans() if s.context is not None and s.context.trace_id == trace_id
    ]


def ancestors(span: ReadableSpan, among: list[ReadableSpan]) -> list[tuple[SpanKind, str]]:
    by_id = {s.context.span_id: s for s in among if s.context is not None}
    chain = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        chain.append((span.kind, span.name))
    return chain


async def test_a_command_over_the_gateway_is_one_trace_down_to_the_writer_processes_commit(
    spans: InMemorySpanExporter, collector: Collector, world: World
) -> None:
    w = world
    conversation = (await create(w)).mission.planning_conversation_id
    with tracing.tracer().start_as_current_span("agent posts") as root:
        stream = await connected(w, w.owner)
        command = w.owner.command(
            G, "message_post", builders.message(conversation, "traced"), membership_epoch=1
        )
        await stream.send(
            command=gpb.CommandFrame(command_id=command.command_id, command=w.owner.sign(command))
        )
        assert (await stream.until("result")).result.result.group_revision > 0
        stream.call.cancel()

    async def committed() -> bool:
        return any(
            s.name == "authority.group_commit" and s.links for s in spans.get_finished_spans()
        ) and any(
            s.name == CONNECT and s.kind == SpanKind.CLIENT
            for s in trace_of(spans, root.get_span_context().trace_id)
        )

    await polled(committed)
    ours = trace_of(spans, root.get_span_context().trace_id)
    (decide,) = [s for s in ours if s.name == "authority.decide"]
    assert decide.attributes is not None and decide.context is not None
    assert decide.attributes["mwp.command_id"] == command.command_id
    assert decide.attributes["mwp.group_id"] == G and decide.attributes["mwp.command_kind"] == "message_post"
    # The same shape as over the network: the gateway's in-process call to the Authority has its
    # client and server spans, under the agent's stream.
    assert ancestors(decide, ours) == [
        (SpanKind.SERVER, COMMAND),
        (SpanKind.CLIENT, COMMAND),
        (SpanKind.SERVER, CONNECT),
        (SpanKind.CLIENT, CONNECT),
        (SpanKind.INTERNAL, "agent posts"),
    ]
    # One batch serves many traces: its span is a root of its own, linked to each decision.
    (commit,) = [
        s
        for s in spans.get_finished_spans()
        if s.name == "authority.group_commit"
        and any(link.context.span_id == decide.context.span_id for link in s.links)
    ]
    assert (
        commit.parent is None and commit.attributes is not None and commit.attributes["mwp.batch_size"] >= 1
    )
    assert commit.context is not None
    if w.settings.database_url.startswith("postgresql"):
        return  # PostgreSQL commits from the Authority's own process: no writer process to follow
    commit_id = commit.context.span_id.to_bytes(8, "big")
    decide_id = decide.context.span_id.to_bytes(8, "big")

    async def written() -> bool:
        return any(
            span.parent_span_id == commit_id and any(link.span_id == decide_id for link in span.links)
            for _, span in collector.named("authority.writer.commit")
        )

    await polled(written)
    (service, writer_commit), *_ = [
        (s, span)
        for s, span in collector.named("authority.writer.commit")
        if span.parent_span_id == commit_id
    ]
    assert service == "authority" and writer_commit.trace_id == commit.context.trace_id.to_bytes(16, "big")
    assert {a.key: a.value.int_value for a in writer_commit.attributes}["mwp.batch_size"] >= 1


def _clean_env(**extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("MWP_", "OTEL_", "GRPC_"))}
    # No web console: its default address is one per machine, and it prints a line of its own.
    return {**kept, "MWP_VERIFY_WORKERS": "0", "MWP_CONSOLE_LISTEN": "", "MWP_METRICS_LISTEN": "", **extra}


async def _signed_mission(client: MeshClient, data_dir: Path, group: str) -> common_pb2.SignedEnvelope:
    admin_key = read_key(data_dir / "keys" / "admin.key")
    owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
    await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
    body = builders.mission_create("alice", "coord-bot", SystemClock().now())
    return owner.sign(owner.command(group, "mission_create", body))


async def test_in_the_split_topology_the_clients_trace_id_reaches_the_authority_process(
    spans: InMemorySpanExporter, collector: Collector, tmp_path: Path
) -> None:
    port = free_port()
    launcher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        "--topology",
        "split",
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path / "data"),
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
        env=_clean_env(**collector.env),
    )
    client = None
    try:
        await wait_serving(launcher)
        client = MeshClient(f"127.0.0.1:{port}")
        envelope = await _signed_mission(client, tmp_path / "data", "grp_traced")
        with tracing.tracer().start_as_current_span("owner creates a mission") as root:
            await client.execute(envelope)
        trace_id = root.get_span_context().trace_id.to_bytes(16, "big")

        # The front door's server span, its call to the Authority, the Authority's server span and
        # its decision: each process exports its own, in its own time.
        hops = {
            ("gateway", trace_pb2.Span.SPAN_KIND_SERVER),
            ("gateway", trace_pb2.Span.SPAN_KIND_CLIENT),
            ("authority", trace_pb2.Span.SPAN_KIND_SERVER),
        }

        async def decided() -> bool:
            served = {(s, span.kind) for s, span in collector.named(COMMAND, trace_id)}
            return bool(collector.named("authority.decide", trace_id)) and hops <= served

        await polled(decided)
        ((service, decide),) = collector.named("authority.decide", trace_id)
        assert service == "authority"

        async def linked() -> bool:
            return any(
                any(link.span_id == decide.span_id for link in span.links)
                for _, span in collector.named("authority.writer.commit")
            )

        await polled(linked)
    finally:
        if client is not None:
            await client.channel.close()
        launcher.send_signal(signal.SIGTERM)
        await asyncio.wait_for(launcher.wait(), 60)


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[tuple[MeshClient, list[str]]]:
    """``mwp serve`` (all services in one process) as a subprocess: a client of it, and its stderr
    lines (complete once the block ends, after the process stopped)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "data"),
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    lines: list[str] = []

    async def read() -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            lines.append(raw.decode())

    reader = asyncio.create_task(read())

    def port() -> int | None:
        for line in lines:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("msg") == "mesh listening":
                    return int(entry["port"])
        return None

    async def listening() -> bool:
        assert process.returncode is None, "".join(lines)
        return port() is not None

    client = None
    try:
        await polled(listening, limit_s=60)
        client = MeshClient(f"127.0.0.1:{port()}")
        yield client, lines
    finally:
        if client is not None:
            await client.channel.close()
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)
        await asyncio.wait_for(reader, 30)


async def test_tracing_is_off_by_default(collector: Collector, tmp_path: Path) -> None:
    assert not tracing.setup("gateway", env={})
    assert not tracing.setup("gateway", env={"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.setup("gateway", env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert (
        not tracing.active() and tracing.server_interceptors() == [] and tracing.client_interceptors() == []
    )
    # A server told where a collector is, but not to trace, exports nothing.
    endpoint_only = {k: v for k, v in collector.env.items() if k != "OTEL_TRACES_EXPORTER"}
    async with serving(tmp_path, _clean_env(**endpoint_only)) as (client, _):
        await client.execute(await _signed_mission(client, tmp_path / "data", "grp_untraced"))
    assert collector.spans == []


async def test_serve_log_lines_carry_the_callers_trace_and_grpc_core_lines_come_out_as_json(
    spans: InMemorySpanExporter, collector: Collector, tmp_path: Path
) -> None:
    env = _clean_env(**collector.env, MWP_LOG_FORMAT="json", GRPC_VERBOSITY="DEBUG")
    async with serving(tmp_path, env) as (client, lines):
        envelope = await _signed_mission(client, tmp_path / "data", "grp_logged")
        with tracing.tracer().start_as_current_span("create") as created:
            await client.execute(envelope)
        with tracing.tracer().start_as_current_span("create again, elsewhere") as refused:
            stale = common_pb2.SignedEnvelope()
            stale.CopyFrom(envelope)
            stale.signatures[0].sig = bytes(64)  # no longer verifies
            with pytest.raises(grpc.aio.AioRpcError):
                await client.execute(stale)
    entries = [json.loads(line) for line in lines]  # every line is a JSON object, gRPC's own too
    assert any(
        e["logger"] == "grpc.core" and "Log level DEBUG" in e["msg"] and e["level"] == "warning"
        for e in entries
    )
    created_id = format_trace_id(created.get_span_context().trace_id)
    (access,) = [
        e for e in entries if e["msg"] == "rpc" and e["method"] == COMMAND and e.get("trace_id") == created_id
    ]
    assert access["code"] == "OK" and len(access["span_id"]) == 16
    refused_id = format_trace_id(refused.get_span_context().trace_id)
    (rejection,) = [e for e in entries if e["msg"] == "request rejected"]
    assert rejection["trace_id"] == refused_id and rejection["reason"] == "SIGNATURE_INVALID"
    # The server's spans of that call are in the caller's trace (the server process exported them).
    assert any(
        service == "missionweave" for service, _ in collector.named(COMMAND, bytes.fromhex(created_id))
    )


def test_log_records_made_inside_a_span_carry_its_ids_in_both_formats(spans: InMemorySpanExporter) -> None:
    def made() -> logging.LogRecord:
        record = logging.LogRecord("missionweave.test", logging.INFO, __file__, 1, "hello", (), None)
        assert tracing.TraceIds().filter(record)
        return record

    outside = made()
    assert "trace_id" not in json.loads(logs.JsonFormatter().format(outside))
    assert "trace_id" not in logs.TextFormatter().format(outside)
    with tracing.tracer().start_as_current_span("work") as span:
        inside = made()
    trace_id, span_id = (
        format_trace_id(span.get_span_context().trace_id),
        format_span_id(span.get_span_context().span_id),
    )
    entry = json.loads(logs.JsonFormatter().format(inside))
    assert (entry["trace_id"], entry["span_id"]) == (trace_id, span_id)
    assert logs.TextFormatter().format(inside).endswith(f"hello trace_id={trace_id} span_id={span_id}")


def test_with_text_logs_the_relay_writes_core_lines_as_the_text_log_does_and_passes_the_rest() -> None:
    from missionweave.kernel import logs

    text = stderr_relay.as_text(Path(logs.__file__))
    core = stderr_relay.record(
        "E1202 01:13:19.316968   26595 add_port.cc:83] Failed to add port", render=text
    )
    assert core.endswith(" ERROR grpc.core: Failed to add port source=add_port.cc:83 core_thread=26595"), core
    own = "2026-12-07 07:00:00,000 INFO missionweave.mesh: mesh listening listen=127.0.0.1:1"
    assert stderr_relay.record(own, render=text) == own  # a text record of the server's own: as it is
    crash = "Fatal Python error: Segmentation fault"
    assert stderr_relay.record(crash, render=text) == crash


def test_the_relay_wraps_core_lines_and_passes_json_through() -> None:
    core = stderr_relay.record("E1202 01:13:19.316968   26595 add_port.cc:83] Failed to add port to server")
    assert {k: v for k, v in json.loads(core).items() if k != "ts"} == {
        "level": "error",
        "logger": "grpc.core",
        "msg": "Failed to add port to server",
        "source": "add_port.cc:83",
        "thread": 26595,
    }
    already = '{"ts": "x", "level": "info", "logger": "missionweave.authority.writer", "msg": "m"}'
    assert stderr_relay.record(already) == already
    other = json.loads(stderr_relay.record("Fatal Python error: Segmentation fault"))
    assert (
        other["logger"] == "stderr"
        and other["level"] == "error"
        and other["msg"] == "Fatal Python error: Segmentation fault"
    )
