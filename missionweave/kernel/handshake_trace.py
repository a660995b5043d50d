"""``mwp serve`` logs every refused TLS handshake (docs/tls.md): grpcio tells Python nothing of a
connection whose handshake failed, but its C core's ``handshaker`` trace names the error and the
peer's address on file descriptor 2, which a server relays line by line
(missionweave_server/observability/stderr_relay.py reads the failures out of it, rate-limited).

The trace is read when gRPC's core starts, that is before ``grpc`` is imported, so the switch is
made from the command line, first thing: only for ``serve`` (whose relay runs in either log
format). Tracing needs the core's INFO verbosity; the relay passes on only the core's lines at the
level asked for (``GRPC_VERBOSITY``, default ERROR), which it is told in ``CORE_LEVEL_VAR``.
Stdlib only: nothing here may import grpc.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

CORE_LEVEL_VAR = "MWP_GRPC_CORE_LEVEL"
TRACER = "handshaker"


def trace_handshakes(argv: Sequence[str], env: MutableMapping[str, str] = os.environ) -> None:
    """Turns the core's handshake trace on for ``mwp serve`` (its split topology's
    children inherit it, and the level asked for, from their parent's environment)."""
    if "serve" not in argv[1:]:
        return
    env.setdefault(CORE_LEVEL_VAR, env.get("GRPC_VERBOSITY", "ERROR"))
    env["GRPC_VERBOSITY"] = "INFO" if env[CORE_LEVEL_VAR].upper() != "DEBUG" else "DEBUG"
    tracers = [t for t in env.get("GRPC_TRACE", "").split(",") if t]
    if TRACER not in tracers and "all" not in tracers:
        env["GRPC_TRACE"] = ",".join([*tracers, TRACER])
