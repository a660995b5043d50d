"""What ``mwp demo`` prints at the end: ``DemoResult`` holds the Group, the identities, the timeline
and the derived progress, and renders them as text (``lines``) or as the ``--json`` document
(``document``), with the commands that look further into the Group.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from missionweave.cli.common import to_dict
from missionweave.cli.demo.plan import STORY
from missionweave.cli.demo.timeline import Timeline
from missionweave.cli.progress import render_text
from missionweave.v1 import authority_service_pb2 as apb


@dataclass(frozen=True)
class DemoResult:
    group_id: str
    mission_id: str
    identities: dict[str, str]
    timeline: Timeline
    progress: apb.GetMissionProgressResponse

    def inspect_commands(self, target_flag: str = "") -> list[tuple[str, str]]:
        """(command, what it shows) for looking further into the Group."""
        mwp, group = f"mwp {target_flag}".rstrip(), self.group_id
        return [
            (
                f"{mwp} mission progress --group {group} --format dot",
                "the WorkItem DAG for Graphviz (| dot -Tsvg)",
            ),
            (
                f"{mwp} mission show --group {group}",
                "the Mission, its Coordinator lease, Conversations, Memberships",
            ),
            (
                f"{mwp} mission review --group {group} --verify-bytes",
                "what the owner approved: each Artifact verified, Evidence per criterion, budget",
            ),
            (f"{mwp} events --group {group}", "every event of the Group as JSON lines"),
        ]

    def lines(self, target_flag: str = "") -> list[str]:
        return [
            f"mwp demo: Mission {self.mission_id} in group {self.group_id}",
            f"  {STORY}",
            "",
            "Timeline (offset, actor, event, detail)",
            *self.timeline.lines(),
            "",
            "Progress (derived by AuthorityService.GetMissionProgress)",
            *(f"  {line}".rstrip() for line in render_text(self.progress)),
            "",
            f"group {self.group_id}; inspect it further with:",
            *(f"  {command}    # {what}" for command, what in self.inspect_commands(target_flag)),
        ]

    def document(self, target_flag: str = "") -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "mission_id": self.mission_id,
            "identities": self.identities,
            "timeline": [asdict(e) for e in self.timeline.entries],
            "progress": to_dict(self.progress),
            "inspect": [command for command, _ in self.inspect_commands(target_flag)],
        }
