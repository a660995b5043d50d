"""The command kinds: one declaration per kind (``CommandKind``), collected from the rule families.

Whatever depends on a command's kind reads it here: the decider (its handler, whether it creates
its Group or ends the Mission, the evolve rule of each event) and the shell (which identities,
linked Groups and artifact it looks up, whether it erases history). Who may issue it is the one
other table keyed by kind (``rules/authorization.py``). A kind is added by declaring it beside its
rules in ``rules/``, giving it a row in the authorization table and adding its body to the Command
in ``protos/``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from missionweave.kernel import ids
from missionweave.v1 import command_pb2, work_pb2
from missionweave_server.services.authority.rules import (
    children,
    conversations,
    delegation,
    memberships,
    missions,
    work,
)
from missionweave_server.services.authority.rules.common import Applier, CommandKind


def index(declarations: Iterable[CommandKind]) -> tuple[dict[str, CommandKind], dict[str, Applier]]:
    """Kinds by body field and evolve rules by event payload field; each declared exactly once."""
    kinds: dict[str, CommandKind] = {}
    appliers: dict[str, Applier] = {}
    for kind in declarations:
        if kind.body in kinds:
            raise ValueError(f"command kind {kind.name} is declared twice")
        kinds[kind.body] = kind
        for payload, applier in kind.appliers.items():
            if payload in appliers:
                raise ValueError(f"event payload {payload} has two evolve rules (the second in {kind.name})")
            appliers[payload] = applier
    return kinds, appliers


DECLARED = (
    *missions.KINDS,
    *children.KINDS,
    *conversations.KINDS,
    *memberships.KINDS,
    *delegation.KINDS,
    *work.KINDS,
)
KINDS: Mapping[str, CommandKind]
APPLIERS: Mapping[str, Applier]
KINDS, APPLIERS = index(DECLARED)


def kind_of(command: command_pb2.Command) -> CommandKind | None:
    """The declaration of the command's body; None for a command without a known body."""
    return KINDS.get(command.WhichOneof("body") or "")


def referenced_identities(command: command_pb2.Command) -> set[str]:
    """The identities whose registration the decision consults: the actor and those the body names."""
    kind = kind_of(command)
    return {command.actor_id, *(kind.references(command) if kind else ())}


def card_holders(command: command_pb2.Command) -> set[str]:
    """The agents whose Agent Card in force the decision consults."""
    kind = kind_of(command)
    return set(kind.card_holders(command)) if kind else set()


def linked_groups(command: command_pb2.Command) -> list[str]:
    """Other Groups whose durable state the decision consults (never written by this command)."""
    kind = kind_of(command)
    groups = kind.linked_groups(command) if kind else ()
    return [g for g in groups if g and ids.is_valid(g) and g != command.group_id]


def published_artifact(command: command_pb2.Command) -> work_pb2.WorkPublishArtifact | None:
    """The artifact the command publishes, for the shell to look up in the artifact index."""
    kind = kind_of(command)
    return kind.published_artifact(command) if kind else None


def named_artifacts(command: command_pb2.Command) -> tuple[str, ...]:
    """The blobs the command names as deliverables or Evidence, for the shell to look up (D161)."""
    kind = kind_of(command)
    return kind.named_artifacts(command) if kind else ()


def erases(command: command_pb2.Command) -> bool:
    """Whether the command's events rewrite earlier ones (every earlier append must be durable first)."""
    kind = kind_of(command)
    return kind is not None and kind.erases(command)
