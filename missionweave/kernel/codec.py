"""The one converter between stored envelopes, signed envelopes and events.

Events travel and are stored as the exact bytes the Authority signed (ARCHITECTURE principle 6):
a ``SignedEnvelope`` whose payload is a serialized ``Event``. Every reader (the Authority, its gRPC
edge, the gateway, the SDK) decodes them here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from missionweave.kernel.errors import R, Rejected
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


# ------------------------------------------------------------ JSON inside messages

# JSON carried in a message field (a Message's ``data_json``, a directive's ``parameters_json``) is
# bounded in size by its field's limit and in nesting depth by this: deeper text is MALFORMED, and is
# refused before it is parsed (Python's parser recurses: thousands of levels raise RecursionError).
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings are not counted), in one pass."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def json_object(text: str, field: str, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The JSON object in a message field, or Rejected: TOO_LARGE over ``max_bytes`` (UTF-8),
    MALFORMED when it is not JSON or nests deeper than ``max_depth``, INVALID_ARGUMENT when it is
    JSON but not an object. Metadata ``field`` names the field."""
    if len(text.encode("utf-8")) > max_bytes:
        raise Rejected(
            R.REJECTION_REASON_TOO_LARGE, f"{field} exceeds {max_bytes} bytes", field=field, limit=max_bytes
        )
    if json_depth(text) > max_depth:
        raise Rejected(
            R.REJECTION_REASON_MALFORMED,
            f"{field} nests deeper than {max_depth} levels",
            field=field,
            limit=max_depth,
        )
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        raise Rejected(R.REJECTION_REASON_MALFORMED, f"{field} is not valid JSON", field=field) from None
    if not isinstance(parsed, dict):
        raise Rejected(R.REJECTION_REASON_INVALID_ARGUMENT, f"{field}: must be a JSON object", field=field)
    return parsed
