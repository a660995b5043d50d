"""Pure core: the refusal of a role the authorization table does not name (rules/authorization.py,
MW-8-04, docs/authorization.md) through decider.decide: PERMISSION_DENIED with check, role and
command, and a message naming who does issue the command."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from missionweave.v1 import conversation_pb2, mission_pb2
from missionweave_server.services.authority.rules import authorization as authz
from tests import builders
from tests.steward_fixtures import BASE, GROUP, PLANNING

CASES = [
    (
        "obs",
        "message_post",
        builders.message(PLANNING),
        "observer",
        "message.post",
        "mission_owner, coordinator, worker, reviewer, work_delegate",
    ),
    (
        "worker",
        "mission_cancel",
        mission_pb2.MissionCancel(reason="x"),
        "worker",
        "mission.cancel",
        "mission_owner, Organization policy",
    ),
    (
        "rev",
        "conversation_open",
        conversation_pb2.ConversationOpen(kind=conversation_pb2.CONVERSATION_KIND_REVIEW, title="t"),
        "reviewer",
        "conversation.open",
        "mission_owner, coordinator",
    ),
    (
        "alice",
        "mission_submit_for_approval",
        mission_pb2.MissionSubmitForApproval(coordinator_epoch=1),
        "mission_owner",
        "mission.submit_for_approval",
        "coordinator",
    ),
]


@pytest.mark.req("MW-8-04")
@pytest.mark.parametrize(("actor", "kind", "body", "role", "command", "issuers"), CASES)
def test_a_role_the_table_does_not_name_is_refused_with_who_may(
    actor: str, kind: str, body: object, role: str, command: str, issuers: str
) -> None:
    refused = GROUP.refused(BASE, kind, body, actor)
    assert (refused.reason_name, refused.metadata) == (
        "PERMISSION_DENIED",
        {"check": "role", "role": role, "command": command},
    )
    assert (
        refused.message
        == f"a {role} may not issue {command}; it is issued by: {issuers} (docs/authorization.md)"
    )


def fresh_authorization_module() -> ModuleType:
    """rules/authorization.py executed again into a module of its own: the table as its helpers
    build it now (the imported TABLE was built once, when the module was first imported)."""
    spec = importlib.util.spec_from_file_location(authz.__name__, authz.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.req("MW-8-04")
def test_the_table_its_helpers_build_is_the_one_docs_authorization_md_shows() -> None:
    fresh = fresh_authorization_module()
    doc = Path(__file__).resolve().parent.parent / "docs" / "authorization.md"
    assert fresh.markdown() == doc.read_text(encoding="utf-8") == authz.markdown()
    shape = {
        body: ({role: [c.name for c in cs] for role, cs in rule.roles.items()}, rule.spec)
        for body, rule in fresh.TABLE.items()
    }
    assert shape == {
        body: ({role: [c.name for c in cs] for role, cs in rule.roles.items()}, rule.spec)
        for body, rule in authz.TABLE.items()
    }
