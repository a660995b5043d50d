"""The demo's cast: four fresh identities (a unique suffix per run) registered by the Organization
admin: the human MissionOwner and the Coordinator agent, whose sessions the demo opens, and two
Worker agents (``WorkerIdentity``: a key only), whose Worker runtimes' agents open their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from nacl.signing import SigningKey

from missionweave.cli.demo.timeline import Timeline, spoken_label
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import common_pb2


@dataclass(frozen=True)
class WorkerIdentity:
    """A Worker of the cast: its key only; its Worker runtime's agent opens its session."""

    identity_id: str
    key: SigningKey


@dataclass(frozen=True)
class Cast:
    owner: SessionSigner
    coordinator: SessionSigner
    worker_a: WorkerIdentity
    worker_b: WorkerIdentity

    def identities(self) -> dict[str, str]:
        return {role: member.identity_id for role, member in vars(self).items()}


ROLES = (
    ("owner", "ada", common_pb2.IDENTITY_KIND_HUMAN, "Ada, the MissionOwner"),
    ("coordinator", "coord", common_pb2.IDENTITY_KIND_AGENT, "the Coordinator agent"),
    ("worker_a", "worker-a", common_pb2.IDENTITY_KIND_AGENT, "Worker agent A"),
    ("worker_b", "worker-b", common_pb2.IDENTITY_KIND_AGENT, "Worker agent B"),
)
WORKER_ROLES = ("worker_a", "worker_b")


async def register_cast(
    mesh: MeshClient, admin_id: str, admin_key: SigningKey, timeline: Timeline, suffix: str
) -> Cast:
    """Registers the four identities (signed by the admin); opens the owner's and the Coordinator's
    sessions (the Workers' agents open their own when they connect)."""
    members: dict[str, SessionSigner | WorkerIdentity] = {}
    for role, name, kind, display in ROLES:
        identity_id, key = f"{name}-{suffix}", SigningKey.generate()
        timeline.step = f"identity registration of {identity_id}"
        await mesh.register_identity(admin_id, admin_key, identity_id, kind, bytes(key.verify_key), display)
        kind_label = spoken_label(common_pb2.IdentityKind, kind, "IDENTITY_KIND_")
        if role in WORKER_ROLES:
            members[role] = WorkerIdentity(identity_id, key)
            detail = f"{identity_id} ({kind_label}, {display}); served by a Worker runtime"
        else:
            signer = await mesh.open_session(identity_id, key)
            members[role] = signer
            detail = f"{identity_id} ({kind_label}, {display}); session epoch {signer.session_epoch} opened"
        timeline.note(admin_id, "identity.registered", detail)
    mesh.read_as(
        cast(SessionSigner, members["owner"])
    )  # the demo's reads (state, progress) are the MissionOwner's
    return Cast(**members)  # type: ignore[arg-type]
