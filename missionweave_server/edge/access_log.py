"""One access-log line per RPC, and the RPC metrics (docs/operations.md "Metrics and logs").

``AccessLog`` is the outermost server interceptor of every mesh server: it times each call, counts
it in ``mwp_rpcs_total{method,code}`` and ``mwp_rpc_latency_seconds{method}``, and writes one
``rpc`` record at info level (logger ``missionweave.access``) with the method, the proven caller
(when one was proven: ``note_caller``), the gRPC code and the duration in milliseconds.

An idle poll is logged at debug level instead: a long poll that ends with nothing to hand out
(``IDLE_ANSWERS``), which an idle Worker repeats all day long. Every other call, and every failed
one, stays at info.

The lines are rate limited by a token bucket, so a flood of calls cannot fill the disk: a line
over the limit is counted (``mwp_access_log_suppressed_total``) instead of written, and the next
line written carries ``suppressed``, how many were not written since the previous one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import grpc

from missionweave.v1 import scheduling_service_pb2
from missionweave_server.edge.handler_wrapping import CallScope, WrappingInterceptor
from missionweave_server.observability import metrics

log = logging.getLogger("missionweave.access")


def _nothing_placed(answer: Any) -> bool:
    if isinstance(answer, bytes):  # the front door relays the answer's bytes as they came
        answer = scheduling_service_pb2.NextSlotResponse.FromString(answer)
    return not answer.HasField("assignment") and not answer.preemptions


# By full method path: whether an OK answer is an empty long poll (logged at debug level).
IDLE_ANSWERS: dict[str, Callable[[Any], bool]] = {
    "/missionweave.v1.SchedulingService/NextSlot": _nothing_placed,
}


class _Call:
    __slots__ = ("caller",)

    def __init__(self) -> None:
        self.caller = ""


_CURRENT: ContextVar[_Call | None] = ContextVar("mwp_access_call", default=None)


def note_caller(identity: str) -> None:
    """Names the proven caller of the RPC being served (its access-log line's ``caller``)."""
    call = _CURRENT.get()
    if call is not None and not call.caller:
        call.caller = identity


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; ``take`` spends one if there is one."""

    def __init__(self, rate: float, burst: float, now: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._now = now
        self._tokens = self.burst
        self._at = now()

    def take(self) -> bool:
        now = self._now()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class AccessLog(WrappingInterceptor):
    """Times, counts and logs every RPC of the server (see the module's docstring). ``rate`` lines a
    second (bursts of twice that); 0 writes no access log (the metrics are still counted)."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate
        self.bucket = TokenBucket(rate, 2 * rate)
        self.suppressed = 0

    def scope(self, path: str, context: Any) -> CallScope:
        return _Logged(self, path, context)

    def finished(
        self,
        method: str,
        call: _Call,
        context: Any,
        started: float,
        failure: BaseException | None,
        answer: Any = None,
    ) -> None:
        elapsed = time.perf_counter() - started
        code = _code_of(context, failure)
        metrics.RPCS.labels(method, code).inc()
        metrics.RPC_LATENCY.labels(method).observe(elapsed)
        idle = IDLE_ANSWERS.get(method)
        level = logging.DEBUG if code == "OK" and idle is not None and idle(answer) else logging.INFO
        if self.rate <= 0 or not log.isEnabledFor(level):  # a line not written spends no token
            return
        if not self.bucket.take():
            self.suppressed += 1
            metrics.ACCESS_LOG_SUPPRESSED.inc()
            return
        extra: dict[str, object] = {
            "method": method,
            "caller": call.caller,
            "code": code,
            "duration_ms": round(elapsed * 1000, 3),
        }
        if self.suppressed:
            extra["suppressed"] = self.suppressed
            self.suppressed = 0
        log.log(level, "rpc", extra=extra)


class _Logged(CallScope):
    """One call, from its handler's start to its end: its caller (``note_caller``) and its time."""

    __slots__ = ("access", "call", "context", "path", "started_at")

    def __init__(self, access: AccessLog, path: str, context: Any) -> None:
        super().__init__()
        self.access = access
        self.path = path
        self.context = context
        self.call = _Call()
        self.started_at = 0.0

    async def started(self) -> None:
        _CURRENT.set(self.call)
        self.started_at = time.perf_counter()

    async def ended(self, failure: BaseException | None) -> bool:
        self.access.finished(self.path, self.call, self.context, self.started_at, failure, self.answer)
        return False


def _code_of(context: Any, failure: BaseException | None) -> str:
    """The call's gRPC status code name: the one it set or aborted with, else OK or (on an
    exception) CANCELLED or UNKNOWN."""
    try:
        code = context.code()
    except Exception:  # a context without code() (a test double)
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        return _BY_VALUE.get(code, "UNKNOWN")
    if failure is None:
        return "OK"
    if isinstance(failure, asyncio.CancelledError | GeneratorExit):  # the client went away
        return "CANCELLED"
    return "UNKNOWN"


_BY_VALUE = {c.value[0]: c.name for c in grpc.StatusCode}
