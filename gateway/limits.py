"""What one gateway admits: the bounds on its streams (the audiences its HELLO proofs may name are
the mesh's, ``missionweave.rpc.callers.audiences_for``).

Every limit has a setting (``missionweave/config.py``, documented in docs/gateway.md); the defaults
here are the settings' defaults.
"""

from __future__ import annotations

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

@dataclass(frozen=True)
class GatewayLimits:
    max_streams: int = MAX_STREAMS
    max_streams_per_identity: int = MAX_STREAMS_PER_IDENTITY
    hello_timeout_s: float = HELLO_TIMEOUT_S
    stall_timeout_s: float = STALL_TIMEOUT_S
    stream_buffer_bytes: int = STREAM_BUFFER_BYTES
    max_hello_nonces: int = MAX_HELLO_NONCES
