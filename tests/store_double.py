"""The artifact store's answer, for tests of the pure core's other rules (D161).

The shell asks the artifact store about every blob a command names as a deliverable or as Evidence
and puts the answer in ``DecisionContext.held``. Tests of rules that do not concern that admission
decide as if the actor had uploaded each named blob, at the size named, with a manifest for this
Mission and the command's WorkItem. The admission itself is tested with contexts of its own
(tests/test_core_deliverables.py) and through a live mesh (tests/test_deliverables.py).
"""

from __future__ import annotations

import dataclasses

from missionweave.v1 import command_pb2
from missionweave_server.services.authority import kinds
from missionweave_server.services.authority.rules.common import DecisionContext, HeldArtifact, HeldManifest
from missionweave_server.services.authority.state import GroupState


def _work_item_of(command: command_pb2.Command) -> str:
    body = getattr(command, command.WhichOneof("body") or "", None)
    return str(getattr(body, "work_item_id", ""))


def _sizes(command: command_pb2.Command) -> dict[str, int]:
    """The size each named digest is named with (the first time it is named)."""
    sizes: dict[str, int] = {}

    def walk(message: object) -> None:
        for descriptor, value in message.ListFields():  # type: ignore[attr-defined]
            if descriptor.message_type is None:
                continue
            values = value if descriptor.is_repeated else [value]
            for v in values:
                if descriptor.message_type.name == "Digest":
                    sizes.setdefault(v.hex, int(v.size_bytes))
                else:
                    walk(v)

    walk(command)
    return sizes


def as_if_uploaded(
    state: GroupState | None, command: command_pb2.Command, ctx: DecisionContext
) -> DecisionContext:
    """``ctx`` with every blob the command names held, unless the test gave ``held`` itself."""
    named = kinds.named_artifacts(command)
    if ctx.held or not named or state is None or state.mission is None:
        return ctx
    sizes = _sizes(command)
    manifest = HeldManifest("f" * 64, _work_item_of(command), state.mission.mission_id)
    return dataclasses.replace(ctx, held={d: HeldArtifact(sizes.get(d, 0), (manifest,)) for d in named})
