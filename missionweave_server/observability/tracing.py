"""Distributed tracing with OpenTelemetry (docs/operations.md "Tracing", D107).

Off by default: only the OpenTelemetry API is loaded, whose spans are no-ops, and no interceptor is
installed on any channel or server. ``setup`` switches it on in a process when
``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``; ``none`` or unset: off;
``OTEL_SDK_DISABLED=true`` wins), with the service name of that process as ``service.name`` unless
``OTEL_SERVICE_NAME`` says otherwise. Everything else (endpoint, sampler, batching) is read by the
SDK from the standard ``OTEL_*`` variables.

Trace context crosses every hop: ``server_interceptors`` (every mesh server) read the W3C
``traceparent`` a caller sent, ``client_interceptors`` (``open_channel``: SDK, CLI, peer channels)
send the current one, and ``local_call`` gives an in-process call (``LocalChannel``) the same client
and server spans a network hop would have. Work handed to another process or task travels as a
``traceparent`` string (``current_traceparent``, ``context_of``, ``link_to``).

An application that configured the global OpenTelemetry SDK itself (a program using the SDK) gets
its channels traced too: ``active`` answers True for any installed SDK provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from missionweave.kernel import transport

# The instrumentation scope of every span this project makes.
SCOPE = "missionweave"
# The combined process's service.name (all services, or several of them, in one process).
COMBINED_SERVICE = "missionweave"
# Metadata keys of the W3C trace context: replaced, never duplicated, when a hop sends its own.
CONTEXT_KEYS = ("traceparent", "tracestate")
# Health checks and their watches are probes, every few seconds, not work: never traced.
_UNTRACED_PREFIX = "/grpc.health.v1."
# OTEL_TRACES_EXPORTER names and the exporters' entry points (the SDK's own names).
_EXPORTER_ALIASES = {"otlp": "otlp_proto_grpc"}

_provider: trace.TracerProvider | None = None
_tracer: trace.Tracer = trace.get_tracer(SCOPE)
_service = ""


def service_name_for(services: Sequence[str]) -> str:
    """``service.name`` of a process serving ``services``: the one service's name, else the
    combined process's."""
    return services[0] if len(services) == 1 else COMBINED_SERVICE


def setup(service: str, env: Mapping[str, str] | None = None) -> bool:
    """Switch tracing on for this process when ``OTEL_TRACES_EXPORTER`` asks for it (see the module
    docstring); True when it did. An unknown exporter name raises ValueError."""
    env = os.environ if env is None else env
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    if not names or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_exporter(name) for name in names]
    chosen = env.get("OTEL_SERVICE_NAME", "").strip() or service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: chosen}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # also for any other instrumentation in the process
    install(provider, chosen)
    return True


def _exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    found = entry_points(group="opentelemetry_traces_exporter", name=_EXPORTER_ALIASES.get(name, name))
    if not found:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed: use otlp, console or none"
        )
    return next(iter(found)).load()()


def install(provider: trace.TracerProvider | None, service: str = "") -> None:
    """Trace with ``provider`` from now on (None: back to the global one). ``setup`` calls it; tests
    call it with an SDK provider of their own (an in-memory exporter) and None afterwards."""
    global _provider, _tracer, _service
    _provider = provider
    _tracer = trace.get_tracer(SCOPE, tracer_provider=provider)
    _service = service


def active() -> bool:
    """Whether spans are recorded in this process (a provider installed here or by the application)."""
    if _provider is not None:
        return True
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def service_name() -> str:
    """The service.name ``setup`` chose ("" unless tracing was set up here)."""
    return _service


def tracer() -> trace.Tracer:
    return _tracer


def flush(timeout_ms: int = 5_000) -> None:
    """Export what is buffered (before a process ends on a path that skips the SDK's exit hook)."""
    force_flush = getattr(_provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_ms)


# ------------------------------------------------------------------ context as text


def current_traceparent() -> str:
    """The current span's W3C ``traceparent`` ("" when there is none): how a span's context travels
    with work handed to another process or task."""
    if not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent", "")


def context_of(traceparent: str) -> otel_context.Context:
    """The context a ``traceparent`` names, as a parent; an empty context (a root) for ""."""
    return extract({"traceparent": traceparent}) if traceparent else otel_context.Context()


def link_to(traceparents: Sequence[str]) -> list[Link]:
    """A span link to each span named by a ``traceparent`` (empty or unparsable ones skipped)."""
    links = []
    for text in traceparents:
        if text:
            span_context = trace.get_current_span(context_of(text)).get_span_context()
            if span_context.is_valid:
                links.append(Link(span_context))
    return links


# ------------------------------------------------------------------ gRPC


def _rpc_attributes(method: str) -> dict[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def _traced(method: str) -> bool:
    return not method.startswith(_UNTRACED_PREFIX)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The server span of every call but health checks (a caller's ``traceparent`` its parent);
    none while tracing is off. Outermost, so that the access log's line is written inside it."""
    if not active():
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

    return [aio_server_interceptor(tracer_provider=_provider, filter_=filters.negate(filters.health_check()))]


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """A client span per call, its context sent in ``traceparent`` (replacing one a front door
    forwards); none while tracing is off. One interceptor per call shape: a channel files each
    interceptor under the first shape it implements only."""
    if not active():
        return []
    return [_UnaryUnarySpans(), _UnaryStreamSpans(), _StreamUnarySpans(), _StreamStreamSpans()]


# The tasks that record a finished call's code on its span (held so that none is collected early).
_finishing: set[asyncio.Task[None]] = set()


class _ClientSpans:
    """Unlike the instrumentation package's client interceptors, these hand back the call itself,
    never a wrapping iterator: streams keep ``read()`` and ``write()``, which the gateway's agents
    use. The span ends when the call does."""

    async def _intercept(self, continuation: Any, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        if not _traced(method):
            return await continuation(details, request)
        span = _tracer.start_span(method, kind=SpanKind.CLIENT, attributes=_rpc_attributes(method))
        carrier: dict[str, str] = {}
        inject(carrier, context=trace.set_span_in_context(span))
        sent = [(k, v) for k, v in (details.metadata or ()) if k not in CONTEXT_KEYS]
        details = details._replace(metadata=grpc.aio.Metadata(*sent, *carrier.items()))  # type: ignore[attr-defined]
        try:
            call = await continuation(details, request)
        except BaseException as failed:
            span.record_exception(failed)
            span.set_status(Status(StatusCode.ERROR, type(failed).__name__))
            span.end()
            raise
        call.add_done_callback(lambda done: _ended(span, done))
        return call


def _ended(span: trace.Span, call: Any) -> None:
    ended = time.time_ns()

    async def record() -> None:  # the code is a coroutine, and a done callback cannot await
        with contextlib.suppress(Exception):
            code = await call.code()
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code != grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, code.name))
        span.end(end_time=ended)

    try:
        task = asyncio.get_running_loop().create_task(record())
    except RuntimeError:  # no loop any more (a channel closed at exit)
        span.end(end_time=ended)
        return
    _finishing.add(task)
    task.add_done_callback(_finishing.discard)


class _UnaryUnarySpans(_ClientSpans, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _ClientSpans._intercept  # type: ignore[assignment]


class _UnaryStreamSpans(_ClientSpans, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _ClientSpans._intercept  # type: ignore[assignment]


class _StreamUnarySpans(_ClientSpans, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _ClientSpans._intercept  # type: ignore[assignment]


class _StreamStreamSpans(_ClientSpans, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _ClientSpans._intercept  # type: ignore[assignment]


@contextlib.contextmanager
def local_call(method: str) -> Iterator[None]:
    """The client and server spans of a call made in process (``LocalChannel``), so that a trace of
    the embedded mesh has the same shape as one of the split topology. Only while tracing is on
    (callers check ``active`` first)."""
    attributes = _rpc_attributes(method)
    with (
        _tracer.start_as_current_span(method, kind=SpanKind.CLIENT, attributes=attributes),
        _tracer.start_as_current_span(method, kind=SpanKind.SERVER, attributes=attributes),
    ):
        yield


# Every channel of this process (the SDK's too) gets the client spans while tracing is on.
transport.CHANNEL_INTERCEPTORS.append(client_interceptors)


class TraceIds(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (W3C hex) to a record made while a span is current, so that
    a log line leads to its trace and back. Without tracing no span is ever current."""

    def filter(self, record: logging.LogRecord) -> bool:
        span = trace.get_current_span().get_span_context()
        if span.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = trace.format_trace_id(span.trace_id)
            record.span_id = trace.format_span_id(span.span_id)
        return True
