"""``mwp verify``'s check of the rows that grant authority in the membership tables (D170): every
identity against the RegisterIdentity request that registered it, every session against the
OpenSession request that opened it (``missionweave_server/services/membership/grants.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave_server.services.membership.grants import GrantChecker, GrantedIdentity, GrantInvalid
from missionweave_server.services.membership.schema import identities, sessions


@dataclass(frozen=True)
class GrantFinding:
    what: str  # "identity", "session" or "holder" (identity_id holding the blob named in detail)
    identity_id: str
    session_epoch: int  # 0 for an identity
    detail: str


@dataclass
class GrantReport:
    identities: int = 0
    sessions: int = 0
    holders: int = 0  # the artifact service's holder rows, when checked beside (D172)
    seconds: float = 0.0
    findings: list[GrantFinding] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, object]:
        return {
            "identities": self.identities,
            "sessions": self.sessions,
            "holders": self.holders,
            "seconds": round(self.seconds, 3),
            "findings": [f.__dict__ for f in self.findings],
        }


async def verify_grants(engine: AsyncEngine, admin_public_key: bytes) -> GrantReport:
    """Every identity and session row of the store, checked against its grant."""
    started = time.monotonic()
    report = GrantReport()
    async with engine.connect() as conn:
        rows = (await conn.execute(select(identities).order_by(identities.c.identity_id))).all()
        session_rows = (
            await conn.execute(select(sessions).order_by(sessions.c.identity_id, sessions.c.session_epoch))
        ).all()
    stored = {
        r.identity_id: (
            GrantedIdentity(
                r.identity_id, int(r.kind), r.display_name, bytes(r.public_key), bool(r.org_admin)
            ),
            r.grant_envelope,
        )
        for r in rows
    }

    async def signer_of(identity_id: str) -> tuple[GrantedIdentity, bytes | None] | None:
        return stored.get(identity_id)

    checker = GrantChecker(admin_public_key)
    valid: dict[str, GrantedIdentity] = {}
    for identity_id, (row, grant) in stored.items():
        report.identities += 1
        try:
            await checker.identity(row, grant, signer_of)
            valid[identity_id] = row
        except GrantInvalid as refused:
            report.findings.append(GrantFinding("identity", identity_id, 0, str(refused)))
    for s in session_rows:
        report.sessions += 1
        owner = valid.get(s.identity_id)
        if owner is None:
            problem = (
                "its identity is missing"
                if s.identity_id not in stored
                else "its identity fails its grant check"
            )
            report.findings.append(GrantFinding("session", s.identity_id, int(s.session_epoch), problem))
            continue
        try:
            checker.session(owner, int(s.session_epoch), bytes(s.public_key), s.grant_envelope)
        except GrantInvalid as refused:
            report.findings.append(GrantFinding("session", s.identity_id, int(s.session_epoch), str(refused)))
    report.seconds = time.monotonic() - started
    return report
