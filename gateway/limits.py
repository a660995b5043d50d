"""What one gateway admits: the audience its HELLO proofs must name, and the bounds on its streams.

Every limit has a setting (``missionweave/config.py``, documented in docs/gateway.md); the defaults
here are the settings' defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Streams open at once on this gateway, authenticated or not: one more is refused (LIMIT_EXCEEDED,
# then RESOURCE_EXHAUSTED) until one ends.
MAX_STREAMS = 10_000
# Authenticated streams of one identity at once (an agent needs one per session; a reconnect may
# briefly overlap the old stream).
MAX_STREAMS_PER_IDENTITY = 8
# A stream whose HELLO has not arrived this long after it opened is closed (HELLO_REQUIRED).
HELLO_TIMEOUT_S = 10.0
# A stream that has not taken a frame the gateway is sending for this long is closed: its agent
# stopped reading (what it holds is given back).
STALL_TIMEOUT_S = 30.0
# Frames queued for one stream, in bytes (WELCOME, RESULT, ERROR, EVENT, ...): producers wait beyond
# it (a subscription stops reading the log), except that an empty queue always takes one frame.
STREAM_BUFFER_BYTES = 1024 * 1024
# HELLO proof nonces remembered for their replay window (30 s): past this many, HELLO is refused
# with LIMIT_EXCEEDED until older ones expire (never forgotten early, which would allow replays).
MAX_HELLO_NONCES = 200_000

_WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_SCHEME = re.compile(r"^(?:dns:(?://[^/]*)?/|dns:|ipv4:|ipv6:|unix:)")


@dataclass(frozen=True)
class GatewayLimits:
    max_streams: int = MAX_STREAMS
    max_streams_per_identity: int = MAX_STREAMS_PER_IDENTITY
    hello_timeout_s: float = HELLO_TIMEOUT_S
    stall_timeout_s: float = STALL_TIMEOUT_S
    stream_buffer_bytes: int = STREAM_BUFFER_BYTES
    max_hello_nonces: int = MAX_HELLO_NONCES


def normalize_audience(audience: str) -> str:
    """How an audience is compared: without a gRPC target scheme (``dns:///``, ``ipv4:``), in lower case."""
    return _SCHEME.sub("", audience.strip()).lower()


def audiences(configured: str, listen: str, advertise: str, port: int) -> frozenset[str]:
    """The audiences this gateway accepts: ``configured`` (MWP_GATEWAY_AUDIENCE, comma-separated)
    when set; else the advertised address (MWP_ADVERTISE_ADDR); else the listen address with the
    port actually bound, where a loopback or wildcard host also answers to ``127.0.0.1``,
    ``localhost`` and ``[::1]``. Behind a proxy, a load balancer or a DNS name, configure it."""
    if configured.strip():
        return frozenset(normalize_audience(a) for a in configured.split(",") if a.strip())
    if advertise:
        return frozenset({normalize_audience(advertise)})
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    names = {host} if host not in _WILDCARD_HOSTS else set()
    if host in _WILDCARD_HOSTS or host in _LOOPBACK_HOSTS:
        names.update(_LOOPBACK_HOSTS)
    return frozenset(normalize_audience(f"{name}:{port}") for name in names)
