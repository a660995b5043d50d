"""Identifier formats (protos/missionweave/v1/common.proto: "Ids").

Ids are ``<prefix>_<26 lowercase hex chars>`` (104 bits). Random ids are time-ordered (48-bit
millisecond time, then 56 random bits) so that index inserts stay append-mostly. Hex rather than
base32: the stdlib's base32 is pure Python and showed up in the Authority's profile. Derived ids hash their inputs,
so the pure core can name events deterministically from the command that caused them.
"""

from __future__ import annotations

import os
import re
import time

import blake3

ID_PATTERN = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_id(prefix: str) -> str:
    """A fresh, time-ordered id such as ``cmd_01...``."""
    millis = int(time.time() * 1000).to_bytes(6, "big")
    return f"{prefix}_{millis.hex()}{os.urandom(7).hex()}"


def derived_id(prefix: str, *parts: str) -> str:
    """A deterministic id from its inputs (same inputs, same id; distinct inputs, distinct ids)."""
    framed = b"".join(len(e).to_bytes(4, "big") + e for e in (part.encode("utf-8") for part in parts))
    return f"{prefix}_{blake3.blake3(framed).digest(13).hex()}"


def suffix(identifier: str) -> str:
    """The part after the prefix: ``grp_abc`` -> ``abc``."""
    return identifier.split("_", 1)[1] if "_" in identifier else identifier


def is_valid(identifier: str) -> bool:
    return bool(ID_PATTERN.match(identifier))
