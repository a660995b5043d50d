"""Who may read which blob (issue 13 item 3, docs/artifacts-storage.md "Authorization and quota").

A caller may read a blob when it is an operator (an Organization administrator, a control-plane
identity or a mesh service), when it holds the blob (it uploaded the bytes, proving it has them),
or when a Group references the blob (a signed manifest recorded for that Group names it as its
content) and the caller holds an active Membership there. Membership is asked of the Authority
through its public contract (``GetGroupState``, called as a mesh service so it answers in full);
the artifact service reads no other service's tables.

Everything else is answered exactly as for a blob that is not stored: nobody learns whether a blob
they may not read exists. One ``Readers`` serves one request, and remembers the Memberships it
asked about for that request only (a revoked Membership takes effect on the next call).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from missionweave.kernel.errors import R
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.v1 import authority_service_pb2
from missionweave_server.edge.callers import Caller
from missionweave_server.edge.status import peer_unavailable
from missionweave_server.services.artifacts.blobstore import EMPTY_BLAKE3
from missionweave_server.services.artifacts.index import ArtifactIndex, Edge, ManifestRecord

PEER_TIMEOUT_S = 5.0
# The Authority's answers that mean "this identity is no active member" for a mesh caller.
_NOT_MEMBER = (R.REJECTION_REASON_GROUP_NOT_FOUND, R.REJECTION_REASON_NOT_A_MEMBER)


class Readers:
    """The read rules of one request's caller."""

    def __init__(self, caller: Caller, index: ArtifactIndex, authority: Any | None) -> None:
        self.caller = caller
        self.index = index
        self.authority = authority  # an AuthorityServiceStub on a mesh channel, or None
        self._member: dict[str, bool] = {}

    @property
    def everything(self) -> bool:
        return self.caller.operator

    async def readable(self, digests: Iterable[str], *, held: set[str] | None = None) -> set[str]:
        """Which of ``digests`` the caller may read (whether they are stored is not checked here:
        a caller's right says nothing about existence, callers check the index themselves).
        ``held``: those of them the caller holds, when the caller already asked the index."""
        wanted = set(digests)
        if self.everything:
            return wanted
        out = {d for d in wanted if d == EMPTY_BLAKE3}  # no content: everybody has it
        rest = wanted - out
        if not rest or not self.caller.identity_id:
            return out
        out |= rest & held if held is not None else await self.index.held_by(self.caller.identity_id, rest)
        rest -= out
        if rest:
            for digest, groups in sorted((await self.index.groups_referencing(rest)).items()):
                for group in sorted(groups):
                    if await self.member_of(group):
                        out.add(digest)
                        break
        return out

    async def may_read(self, digest: str, held: bool | None = None) -> bool:
        """``readable`` of one digest; ``held`` = whether the caller holds it, where the caller
        already asked the index (``ArtifactIndex.blob_held``)."""
        known = None if held is None else ({digest} if held else set())
        return digest in await self.readable((digest,), held=known)

    async def sees_manifest(self, record: ManifestRecord) -> bool:
        """A manifest tells which Group and WorkItem produced the bytes: shown to operators, to its
        producer, and to members of its Group."""
        return await self._sees(record.group_id, record.producer_agent_id)

    async def sees_edge(self, edge: Edge) -> bool:
        """A provenance edge is declared by a manifest: the same rule as that manifest."""
        return await self._sees(edge.group_id, edge.producer_agent_id)

    async def _sees(self, group_id: str, producer_id: str) -> bool:
        if self.everything:
            return True
        identity = self.caller.identity_id
        if not identity:
            return False
        return producer_id == identity or await self.member_of(group_id)

    async def member_of(self, group_id: str) -> bool:
        """Whether the caller holds an active Membership in ``group_id`` (asked once per request)."""
        if not group_id or not self.caller.identity_id:
            return False
        known = self._member.get(group_id)
        if known is not None:
            return known
        if self.authority is None:
            raise peer_unavailable(
                "authority", "no Authority is configured for the artifact service (MWP_AUTHORITY_ADDR)"
            )
        try:
            response = await self.authority.GetGroupState(
                authority_service_pb2.GetGroupStateRequest(group_id=group_id),
                timeout=PEER_TIMEOUT_S,
                wait_for_ready=True,  # an Authority reconnecting is waited for, within the deadline
            )
        except grpc.RpcError as err:
            refused = rejection_from_rpc_error(err)
            if refused is None or refused.reason not in _NOT_MEMBER:
                raise peer_unavailable("authority", err) from None
            member = False
        else:
            member = any(
                m.member_id == self.caller.identity_id and m.active for m in response.state.memberships
            )
        self._member[group_id] = member
        return member
