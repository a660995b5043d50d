"""Capabilities with versions (MW-10.1-01 item 5, OP-35): whether what an agent declares covers
what a contract requires. Shared by the Authority's rules and the Worker's scheduler."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from missionweave.v1 import membership_pb2


def version_key(text: str) -> tuple[int, ...]:
    """A capability version, compared numerically part by part ("1.10" > "1.9")."""
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def missing_capability(
    have: Mapping[str, str], required: Iterable[membership_pb2.Capability]
) -> membership_pb2.Capability | None:
    """The first required capability ``have`` lacks, or declares below the required version."""
    for cap in required:
        version = have.get(cap.capability_id)
        if version is None or version_key(version) < version_key(cap.version):
            return cap
    return None
