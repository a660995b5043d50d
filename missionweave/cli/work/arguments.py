"""The argument types of ``mwp work`` (each an argparse type: bad input exits 2): ``ID[=TEXT]`` and
ids, a criterion's required Evidence methods, a contract input (an Artifact or another WorkItem's
deliverable), and ``vector``, which turns ``--budget``/``--usage`` values into a ResourceVector in
the currency named, else the Mission's.
"""

from __future__ import annotations

import argparse
from typing import Any

from missionweave.cli.common import UsageError
from missionweave.cli.delegation import Cap
from missionweave.cli.mission import artifact_ref
from missionweave.kernel import ids
from missionweave.sdk.contracts import EVIDENCE_METHODS, ContractError, Input, budget_vector
from missionweave.v1 import common_pb2


def id_text(text: str) -> tuple[str, str]:
    """``ID=TEXT`` (or ``ID`` alone: no text) -> (id, text); the id must be a valid id."""
    key, _, value = text.partition("=")
    if not ids.is_valid(key.strip()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected ID[=TEXT], the id being 1..128 of A-Z a-z 0-9 . _ : -"
        )
    return key.strip(), value.strip()


def id_value(text: str) -> str:
    if not ids.is_valid(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (1..128 of A-Z a-z 0-9 . _ : -)")
    return text


def methods(text: str) -> tuple[str, list[str]]:
    """``CRITERION=METHOD[,METHOD]`` -> (criterion, methods), each a known Evidence method."""
    key, sep, value = text.partition("=")
    names = [m.strip().lower().replace("_", "-") for m in value.split(",") if m.strip()]
    if not sep or not ids.is_valid(key) or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected CRITERION=METHOD[,METHOD], e.g. balances=test,review"
        )
    for name in names:
        if name not in EVIDENCE_METHODS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: unknown method {name!r}; one of {', '.join(EVIDENCE_METHODS)}"
            )
    return key, names


def work_input(text: str) -> Input:
    """``NAME=blake3:HEX[:SIZE]`` (an Artifact) or ``NAME=WORK_ITEM[/DELIVERABLE]`` (its output)."""
    name, sep, source = text.partition("=")
    if not sep or not ids.is_valid(name) or not source:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=blake3:HEX[:SIZE] or NAME=WORK_ITEM[/DELIVERABLE]"
        )
    if source.startswith("blake3:"):
        return Input(name, artifact=artifact_ref(source))
    item, _, deliverable = source.partition("/")
    if not ids.is_valid(item) or (deliverable and not ids.is_valid(deliverable)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=WORK_ITEM[/DELIVERABLE]")
    return Input(name, from_work_item=item, from_deliverable=deliverable)


def vector(caps: list[Cap] | None, flag: str, currency: str) -> common_pb2.ResourceVector:
    """``--budget``/``--usage`` values as a ResourceVector: a dimension given twice is refused;
    the currency is the one named, else the Mission's."""
    values: dict[str, Any] = {}
    named = {c.currency for c in caps or [] if c.currency}
    for c in caps or []:
        if c.dimension in values:
            raise UsageError(f"{flag} {c.dimension} is given twice")
        values[c.dimension] = c.value
    if len(named) > 1:
        raise UsageError(f"{flag} names more than one currency: {', '.join(sorted(named))}")
    try:
        return budget_vector({**values, "currency": next(iter(named), currency)}, flag.lstrip("-"))
    except ContractError as err:
        raise UsageError(f"{flag}: {err}") from None
