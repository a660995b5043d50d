"""Identifier formats (protos/missionweave/v1/common.proto: "Ids").

Ids are ``<prefix>_<26 base32 chars>``. Random ids are time-ordered (48-bit millisecond time, then
80 random bits, like a ULID) so that index inserts stay append-mostly. Derived ids hash their inputs,
so the pure core can name events deterministically from the command that caused them.
"""

from __future__ import annotations

import base64
import os
import re
import time

import blake3

ID_PATTERN = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_ALPHABET_TRANS = str.maketrans("", "", "=")


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode("ascii").translate(_ALPHABET_TRANS).lower()[:26]


def new_id(prefix: str) -> str:
    """A fresh, time-ordered id such as ``cmd_01...``."""
    millis = int(time.time() * 1000).to_bytes(6, "big")
    return f"{prefix}_{_b32(millis + os.urandom(11))}"


def derived_id(prefix: str, *parts: str) -> str:
    """A deterministic id from its inputs (same inputs, same id; distinct inputs, distinct ids)."""
    h = blake3.blake3()
    for part in parts:
        encoded = part.encode("utf-8")
        h.update(len(encoded).to_bytes(4, "big"))
        h.update(encoded)
    return f"{prefix}_{_b32(h.digest(17))}"


def suffix(identifier: str) -> str:
    """The part after the prefix: ``grp_abc`` -> ``abc``."""
    return identifier.split("_", 1)[1] if "_" in identifier else identifier


def is_valid(identifier: str) -> bool:
    return bool(ID_PATTERN.match(identifier))
