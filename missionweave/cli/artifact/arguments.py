"""The argument types of ``mwp artifact`` (each an argparse type: bad input exits 2): a blob's name
``blake3:<64 hex>:<size>`` (``parse_digest``, and ``digest_text`` back), byte offsets and lengths,
an Ed25519 public key, and a manifest's ``tool|model|capability:NAME:VERSION`` component.
"""

from __future__ import annotations

import argparse
import re

from missionweave.v1 import artifact_service_pb2 as apb
from missionweave.v1 import common_pb2

Digest = common_pb2.Digest

_DIGEST = re.compile(r"^blake3:([0-9a-f]{64})(?::(\d+))?$")
_COMPONENT_KINDS = {
    name: apb.ComponentKind.Value(f"COMPONENT_KIND_{name.upper()}")
    for name in ("tool", "model", "capability")
}


def parse_digest(text: str) -> Digest:
    """``blake3:<64 hex>:<size>`` -> Digest (an argparse type: bad input exits 2)."""
    match = _DIGEST.match(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not blake3:<64 lowercase hex>:<size in bytes>")
    hex_digest, size = match.groups()
    if size is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} lacks its size: a blob is named by hash and size, write blake3:<hex>:<size>"
        )
    return Digest(algorithm="blake3", hex=hex_digest, size_bytes=int(size))


def digest_text(digest: Digest) -> str:
    """The command-line form ``blake3:<hex>:<size>`` (what every ``mwp artifact`` command takes)."""
    return f"{digest.algorithm}:{digest.hex}:{digest.size_bytes}"


def non_negative(text: str) -> int:
    """A byte offset or length (an argparse type)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def public_key(text: str) -> bytes:
    """A hex Ed25519 public key (an argparse type)."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise argparse.ArgumentTypeError("an Ed25519 public key is 64 hex characters")
    return bytes.fromhex(text)


def parse_component(text: str) -> apb.ComponentVersion:
    """``KIND:NAME:VERSION`` with KIND tool, model or capability (an argparse type)."""
    kind, _, rest = text.partition(":")
    name, _, version = rest.rpartition(":")
    if kind not in _COMPONENT_KINDS or not name or not version:
        raise argparse.ArgumentTypeError(f"{text!r} is not tool|model|capability:NAME:VERSION")
    return apb.ComponentVersion(kind=_COMPONENT_KINDS[kind], name=name, version=version)
