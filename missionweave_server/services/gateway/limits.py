"""What one gateway admits: the bounds on its streams (the audiences its HELLO proofs may name are
the mesh's, ``missionweave_server.edge.callers.audiences_for``).

Two kinds. ``GatewayLimits`` holds the bounds an operator sets: every one has a setting
(``missionweave_server/config.py``, documented in docs/gateway.md), and the defaults here are the
settings' defaults. The constants below it are the fixed bounds of the frame protocol, as
gateway_service.proto promises them (frame and batch sizes, credits, subscriptions per stream); the
gateway's modules read them as ``limits.NAME`` at the moment they apply, so a test may lower one.
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


# The frame protocol's own bounds (gateway_service.proto; WELCOME repeats some of them).
MAX_EVENTS_PER_FRAME = 256
MAX_CREDITS = 65_536
MAX_SUBSCRIPTIONS = 1_024
MAX_FRAME_BYTES = 4 * 1024 * 1024
# A batched ConnectResponse (HELLO.accepts_frame_batches): at most so many frames and bytes, as
# gateway_service.proto promises.
BATCH_FRAMES = 64
BATCH_BYTES = 256 * 1024
# An EVENT frame stops growing once its envelopes reach this (it always holds one event). With
# BATCH_BYTES and the Authority's FollowGroup batch (``group_log.MAX_BATCH_BYTES``) it bounds what a
# stream whose agent does not read holds beyond its outbox, whatever the credits it granted
# (docs/gateway.md "What a slow agent costs").
EVENT_FRAME_BYTES = 256 * 1024
# An envelope's bytes beyond its payload (type, one signature, key id), as counted against that.
ENVELOPE_OVERHEAD = 128
MAX_SUBSCRIPTION_ID = 128  # characters (SubscribeFrame.subscription_id)
# A refused stream (too many streams) is told to retry after this long.
LIMIT_RETRY_AFTER_MS = 1000
