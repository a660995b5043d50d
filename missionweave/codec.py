"""The one converter between stored envelopes, signed envelopes and events.

Events travel and are stored as the exact bytes the Authority signed (ARCHITECTURE principle 6):
a ``SignedEnvelope`` whose payload is a serialized ``Event``. Every reader (the Authority, its gRPC
edge, the gateway, the SDK) decodes them here.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from missionweave.v1 import common_pb2, event_pb2

# Parsed events kept for the many subscribers of the same append; larger envelopes are parsed each
# time, so the cache holds at most SHARED_CACHE x SHARED_MAX_BYTES of envelopes (plus parsed copies).
SHARED_CACHE = 1024
SHARED_MAX_BYTES = 16 * 1024


def envelope(stored: bytes) -> common_pb2.SignedEnvelope:
    """The signed envelope of stored bytes."""
    return common_pb2.SignedEnvelope.FromString(stored)


def event_of(signed: common_pb2.SignedEnvelope) -> event_pb2.Event:
    """The event a signed envelope carries (its signature is the caller's to check)."""
    return event_pb2.Event.FromString(signed.payload)


def decode(stored: bytes) -> tuple[common_pb2.SignedEnvelope, event_pb2.Event]:
    """Stored bytes as (envelope, event), both fresh objects the caller may keep or change."""
    signed = envelope(stored)
    return signed, event_of(signed)


def decode_event(stored: bytes) -> event_pb2.Event:
    return decode(stored)[1]


def events_of(envelopes: Iterable[common_pb2.SignedEnvelope]) -> list[event_pb2.Event]:
    return [event_of(signed) for signed in envelopes]


_decode_cached = lru_cache(maxsize=SHARED_CACHE)(decode)


def decode_shared(stored: bytes) -> tuple[common_pb2.SignedEnvelope, event_pb2.Event]:
    """Like ``decode``, but parsed once for every reader of the same bytes object (the log tail hands
    each subscriber the same one, whose hash Python keeps). Shared, so strictly read-only: copy the
    envelope before changing it (a repeated field's ``append`` copies)."""
    return decode(stored) if len(stored) > SHARED_MAX_BYTES else _decode_cached(stored)
