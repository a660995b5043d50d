"""Semantic versions (SemVer 2.0.0) without build metadata: parsing and precedence.

Agent Card versions must strictly increase per agent (docs/agent-cards.md, D80). Build metadata
("+...") is refused rather than ignored: two versions differing only in it would have equal
precedence, so neither could follow the other.
"""

from __future__ import annotations

import re
from functools import total_ordering

MAX_LENGTH = 64
_NUMBER = r"(?:0|[1-9]\d*)"
_IDENT = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
_PATTERN = re.compile(rf"^({_NUMBER})\.({_NUMBER})\.({_NUMBER})(?:-({_IDENT}(?:\.{_IDENT})*))?$")


@total_ordering
class Version:
    """A parsed version, ordered by SemVer precedence (a pre-release sorts before its release)."""

    __slots__ = ("core", "pre", "text")

    def __init__(self, text: str, core: tuple[int, int, int], pre: tuple[str, ...]) -> None:
        self.text, self.core, self.pre = text, core, pre

    def _key(self) -> tuple[tuple[int, int, int], int, tuple[tuple[int, int | str], ...]]:
        # Numeric identifiers sort before alphanumeric ones, and a release after every pre-release.
        pre = tuple((0, int(p)) if p.isdigit() else (1, p) for p in self.pre)
        return self.core, 0 if self.pre else 1, pre

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text


def parse(text: str) -> Version | None:
    """The version ``text`` spells, or None when it is not ``MAJOR.MINOR.PATCH[-PRERELEASE]``."""
    if len(text) > MAX_LENGTH:
        return None
    match = _PATTERN.match(text)
    if match is None:
        return None
    major, minor, patch, pre = match.groups()
    return Version(text, (int(major), int(minor), int(patch)), tuple(pre.split(".")) if pre else ())
