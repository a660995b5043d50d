"""Agent Cards and Presence (MW-11.1-13, MW-11.1-14; docs/agent-cards.md).

Cards: every version an agent publishes is kept (append only, ``agent_cards``), signed by the
agent's session key at the time; the latest is the card in force. Presence: each agent's last
report (``agent_presence``), replaced by the next and read against the server's clock (D79).

Both are Organization records of this service's database, never part of a Group log. Nothing is
cached here: several Membership instances may share the database, and each answer reflects every
publication or report committed before it. Each publication is also a directory change
(CARD_PUBLISHED, in its transaction), which is how the services that keep cards in force learn
that theirs is out of date (missionweave_server/edge/identities.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from google.protobuf.message import DecodeError
from sqlalchemy import Row, and_, func, insert, select
from sqlalchemy.exc import IntegrityError

from missionweave.internal.v1 import identities_pb2 as directory_pb2
from missionweave.kernel import ids, semver
from missionweave.kernel.clock import to_micros
from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.signing import (
    AGENT_CARD_TYPE,
    check_signature_count,
    parse_session_key_id,
    verify_signature,
)
from missionweave.v1 import agent_card_pb2 as pb
from missionweave.v1 import common_pb2
from missionweave_server.edge import paging
from missionweave_server.edge.callers import Caller
from missionweave_server.services.membership.registry import (
    IdentityRecord,
    IdentityRegistry,
    read_revision,
    record_change,
)
from missionweave_server.services.membership.schema import agent_cards, presence, presence_upsert
from missionweave_server.storage.aio import finish_on_cancel
from missionweave_server.storage.db import SQLITE_IMMEDIATE

# Bounds of a card (agent_card.proto AgentCard); a card over any of them is refused, nothing written.
MAX_CARD_BYTES = 64 * 1024
MAX_CAPABILITIES = 256
MAX_EXTENSIONS = 64
MAX_ENDPOINTS = 16
MAX_URN_CHARS = 256
MAX_ENDPOINT_CHARS = 512
MAX_DISPLAY_NAME_CHARS = 256
MAX_DESCRIPTION_CHARS = 4096
# Presence (agent_card.proto PresenceReport).
MIN_TTL_MS = 1_000
MAX_TTL_MS = 600_000
DEFAULT_TTL_MS = 60_000
MAX_NOTE_CHARS = 512
MAX_PRESENCE_IDS = 256
# A publication that loses a race for the agent's next ordinal is decided again against the winner.
PUBLISH_ATTEMPTS = 3

_URN = re.compile(r"^urn:[A-Za-z0-9][A-Za-z0-9-]{0,31}:\S+$")
_NO_WHITESPACE = re.compile(r"^\S+$")
_REPORTABLE = (
    pb.PRESENCE_AVAILABILITY_AVAILABLE,
    pb.PRESENCE_AVAILABILITY_BUSY,
    pb.PRESENCE_AVAILABILITY_DRAINING,
    pb.PRESENCE_AVAILABILITY_OFFLINE,
)


def malformed(field: str, message: str) -> Rejected:
    return Rejected(R.REJECTION_REASON_MALFORMED, message, field=field)


def too_large(field: str, count: int, limit: int, what: str) -> Rejected:
    return Rejected(
        R.REJECTION_REASON_TOO_LARGE, f"{field}: {count} {what}; at most {limit}", field=field, limit=limit
    )


def check_card(card: pb.AgentCard) -> semver.Version:
    """Every field of ``card`` within the contract's rules and bounds; its parsed version."""
    version = semver.parse(card.card_version)
    if version is None:
        raise malformed(
            "card.card_version", "card_version must be a semantic version MAJOR.MINOR.PATCH[-PRERELEASE]"
        )
    if card.max_concurrency < 1:
        raise Rejected(
            R.REJECTION_REASON_INVALID_ARGUMENT,
            "max_concurrency must be at least 1",
            field="card.max_concurrency",
        )
    _bounded("card.capabilities", card.capabilities, MAX_CAPABILITIES)
    seen: set[str] = set()
    for i, capability in enumerate(card.capabilities):
        if not ids.is_valid(capability.capability_id) or capability.capability_id in seen:
            raise malformed(
                f"card.capabilities[{i}].capability_id", "capability ids are valid ids, each listed once"
            )
        if semver.parse(capability.version) is None:
            raise malformed(f"card.capabilities[{i}].version", "a capability's version is a semantic version")
        seen.add(capability.capability_id)
    _strings("card.extensions", card.extensions, MAX_EXTENSIONS, MAX_URN_CHARS, _URN, "a URN urn:<nid>:<nss>")
    _strings(
        "card.endpoints",
        card.endpoints,
        MAX_ENDPOINTS,
        MAX_ENDPOINT_CHARS,
        _NO_WHITESPACE,
        "non-empty, no whitespace",
    )
    for field, value, limit in (
        ("card.display_name", card.display_name, MAX_DISPLAY_NAME_CHARS),
        ("card.description", card.description, MAX_DESCRIPTION_CHARS),
    ):
        if len(value) > limit:
            raise too_large(field, len(value), limit, "characters")
    return version


def _bounded(field: str, values: Any, limit: int) -> None:
    if len(values) > limit:
        raise too_large(field, len(values), limit, "entries")


def _strings(field: str, values: Any, limit: int, chars: int, pattern: re.Pattern[str], rule: str) -> None:
    _bounded(field, values, limit)
    if len(set(values)) != len(values):
        raise malformed(field, f"{field} lists a value twice")
    for i, value in enumerate(values):
        if len(value) > chars:
            raise too_large(f"{field}[{i}]", len(value), chars, "characters")
        if not pattern.match(value):
            raise malformed(f"{field}[{i}]", f"each entry of {field} is {rule}")


def acting_for(caller: Caller, agent_id: str) -> None:
    """Only the agent itself (or a service of the mesh acting for it) publishes or reports for it."""
    if not caller.service and caller.identity_id != agent_id:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"{caller.identity_id} may not act for {agent_id}",
            agent_id=agent_id,
        )


def _agent(record: IdentityRecord | None, agent_id: str) -> IdentityRecord:
    if record is None:
        raise Rejected(
            R.REJECTION_REASON_UNKNOWN_IDENTITY, f"{agent_id!r} is not registered", agent_id=agent_id
        )
    if record.kind != common_pb2.IDENTITY_KIND_AGENT:
        raise Rejected(
            R.REJECTION_REASON_PERMISSION_DENIED,
            f"{agent_id} is not an agent: only agents publish cards and presence",
            agent_id=agent_id,
        )
    return record


def _published(row: Row[Any]) -> pb.PublishedAgentCard:
    envelope = common_pb2.SignedEnvelope.FromString(row.envelope)
    out = pb.PublishedAgentCard(
        card=pb.AgentCard.FromString(envelope.payload),
        envelope=envelope,
        session_epoch=int(row.session_epoch),
        session_public_key=bytes(row.session_public_key),
    )
    out.published_at.FromMicroseconds(int(row.published_us))
    return out


def unique_ids(values: Iterable[str], limit: int, field: str) -> list[str]:
    """The non-empty ids of one lookup, each once; more than ``limit`` is TOO_LARGE."""
    out = list(dict.fromkeys(v for v in values if v))
    if len(out) > limit:
        raise too_large(field, len(out), limit, "ids")
    return out


class AgentCards:
    """The Agent Card versions and Presence reports of the Organization's agents."""

    def __init__(self, registry: IdentityRegistry) -> None:
        self.registry = registry
        self.engine = registry.engine
        self.clock = registry.clock

    # ------------------------------------------------------------ cards

    async def publish(
        self, envelope: common_pb2.SignedEnvelope, caller: Caller
    ) -> tuple[pb.PublishedAgentCard, bool, int]:
        """Store a new version (or answer the stored one for an identical republish: replayed), and
        a directory revision at or after the change that records it."""
        card, epoch, key = await self._verified(envelope, caller)
        version = check_card(card)
        for _ in range(PUBLISH_ATTEMPTS):
            try:
                return await self._store(card, version, envelope, epoch, key)
            except IntegrityError:
                continue  # a concurrent publication took the ordinal (or the version): decide again
        raise Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            "concurrent publications of this agent's card; retry",
            field="card.card_version",
            conflict="concurrent",
        )

    async def _verified(
        self, envelope: common_pb2.SignedEnvelope, caller: Caller
    ) -> tuple[pb.AgentCard, int, bytes]:
        """The card, signed by its agent's current session key (its epoch and public key) and
        published by the agent itself."""
        if envelope.payload_type != AGENT_CARD_TYPE:
            raise malformed("card.payload_type", f"payload_type must be {AGENT_CARD_TYPE}")
        if len(envelope.payload) > MAX_CARD_BYTES:
            raise too_large("card.payload", len(envelope.payload), MAX_CARD_BYTES, "bytes")
        if not envelope.signatures:
            raise Rejected(R.REJECTION_REASON_SIGNATURE_MISSING, "the card is not signed")
        check_signature_count(envelope, "card")
        try:
            card = pb.AgentCard.FromString(envelope.payload)
        except DecodeError:
            raise malformed("card.payload", "the payload is not an AgentCard") from None
        if not ids.is_valid(card.agent_id):
            raise malformed("card.agent_id", "agent_id is not a valid id")
        acting_for(caller, card.agent_id)
        agent = _agent(await self.registry.get(card.agent_id), card.agent_id)
        # The agent's own call proof has just proven its current epoch through the directory the
        # authenticator follows; this registry's cache may lag another Membership instance.
        current = caller.session_epoch if caller.identity_id == agent.identity_id else agent.session_epoch
        signed_by = parse_session_key_id(envelope.signatures[0].key_id)
        if signed_by is None or signed_by[0] != agent.identity_id:
            raise Rejected(
                R.REJECTION_REASON_SIGNATURE_INVALID,
                f"the card is not signed by a session key of {agent.identity_id}",
            )
        if signed_by[1] != current:
            raise Rejected(
                R.REJECTION_REASON_SESSION_EPOCH_STALE,
                f"the card is signed by session {signed_by[1]}; the current one is {current}",
                session_epoch=current,
            )
        key = await self.registry.session_key(agent.identity_id, current)
        if key is None or not verify_signature(envelope, key):
            raise Rejected(
                R.REJECTION_REASON_SIGNATURE_INVALID,
                f"the card's signature does not verify for {agent.identity_id}",
            )
        return card, current, key

    @finish_on_cancel
    async def _store(
        self,
        card: pb.AgentCard,
        version: semver.Version,
        envelope: common_pb2.SignedEnvelope,
        epoch: int,
        key: bytes,
    ) -> tuple[pb.PublishedAgentCard, bool, int]:
        # Reads, then writes: IMMEDIATE on SQLite (upgrading a deferred transaction fails at once
        # when another connection wrote meanwhile); on PostgreSQL the ordinal's key decides races.
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(**{SQLITE_IMMEDIATE: True})
            async with conn.begin():
                # The latest first: under READ COMMITTED (PostgreSQL) a concurrent publication that
                # commits between the two reads is then seen by the second, as the same version.
                latest = (
                    await conn.execute(
                        select(agent_cards.c.ordinal, agent_cards.c.card_version)
                        .where(agent_cards.c.agent_id == card.agent_id)
                        .order_by(agent_cards.c.ordinal.desc())
                        .limit(1)
                    )
                ).first()
                same = (
                    await conn.execute(
                        select(agent_cards).where(
                            and_(
                                agent_cards.c.agent_id == card.agent_id,
                                agent_cards.c.card_version == card.card_version,
                            )
                        )
                    )
                ).first()
                if same is not None:
                    stored = _published(same)
                    if stored.card == card:
                        # Idempotent: the version as first stored, and the directory's head, which
                        # covers its change (a retry after the first answer was lost waits for it too).
                        return stored, True, await read_revision(conn)
                    raise self._conflict(
                        card,
                        latest,
                        "content",
                        f"version {card.card_version} was published with another card",
                    )
                newest = semver.parse(latest.card_version) if latest is not None else None  # stored: valid
                if newest is not None and not version > newest:
                    raise self._conflict(
                        card,
                        latest,
                        "order",
                        f"version {card.card_version} is not greater than the latest, {newest}",
                    )
                now = to_micros(self.clock.now())
                await conn.execute(
                    insert(agent_cards).values(
                        agent_id=card.agent_id,
                        ordinal=(latest.ordinal if latest is not None else 0) + 1,
                        card_version=card.card_version,
                        envelope=envelope.SerializeToString(),
                        session_epoch=epoch,
                        session_public_key=key,
                        published_us=now,
                    )
                )
                revision = await record_change(
                    conn, card.agent_id, directory_pb2.IDENTITY_CHANGE_KIND_CARD_PUBLISHED, epoch, now
                )
        self.registry.note_head(revision)
        out = pb.PublishedAgentCard(card=card, envelope=envelope, session_epoch=epoch, session_public_key=key)
        out.published_at.FromMicroseconds(now)
        return out, False, revision

    @staticmethod
    def _conflict(card: pb.AgentCard, latest: Row[Any] | None, conflict: str, message: str) -> Rejected:
        return Rejected(
            R.REJECTION_REASON_REVISION_MISMATCH,
            message,
            field="card.card_version",
            conflict=conflict,
            latest_version=latest.card_version if latest is not None else "",
        )

    @finish_on_cancel
    async def get(self, agent_id: str, card_version: str = "") -> tuple[pb.PublishedAgentCard, str]:
        """One version exactly as signed (the card in force when ``card_version`` is empty), and the
        agent's latest version; NOT_FOUND when there is none."""
        if card_version and semver.parse(card_version) is None:
            raise malformed(
                "card_version", "card_version must be a semantic version (or empty for the card in force)"
            )
        mine = agent_cards.c.agent_id == agent_id
        async with self.engine.connect() as conn:
            latest = (
                await conn.execute(
                    select(agent_cards).where(mine).order_by(agent_cards.c.ordinal.desc()).limit(1)
                )
            ).first()
            row = latest
            if card_version and latest is not None and latest.card_version != card_version:
                row = (
                    await conn.execute(
                        select(agent_cards).where(and_(mine, agent_cards.c.card_version == card_version))
                    )
                ).first()
        if row is None or latest is None:
            what = f"version {card_version}" if card_version else "a card"
            raise Rejected(
                R.REJECTION_REASON_NOT_FOUND,
                f"{agent_id!r} has published no {what}",
                agent_id=agent_id,
                card_version=card_version,
            )
        return _published(row), latest.card_version

    @finish_on_cancel
    async def versions(
        self, agent_id: str, page_size: int, page_token: str
    ) -> tuple[list[pb.AgentCardVersion], str]:
        """A page of the agent's versions, newest first, and the token of the next page ("" at the end)."""
        # The shared paging rules: a token another list issued (or garbage) is refused as by every list.
        size = paging.page_size(page_size)
        after = paging.decode_token("card", page_token)
        if after and not after.isdigit():
            raise paging.foreign_token()
        query = select(agent_cards.c.ordinal, agent_cards.c.card_version, agent_cards.c.published_us).where(
            agent_cards.c.agent_id == agent_id
        )
        if after:
            query = query.where(agent_cards.c.ordinal <= int(after))
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query.order_by(agent_cards.c.ordinal.desc()).limit(size + 1))).all()
        out = []
        for row in rows[:size]:
            entry = pb.AgentCardVersion(card_version=row.card_version)
            entry.published_at.FromMicroseconds(int(row.published_us))
            out.append(entry)
        return out, paging.encode_token("card", str(rows[size].ordinal)) if len(rows) > size else ""

    @finish_on_cancel
    async def in_force(self, agent_ids: list[str]) -> list[pb.PublishedAgentCard]:
        """The latest version of each agent's card, for the agents that have one."""
        if not agent_ids:
            return []
        newest = (
            select(agent_cards.c.agent_id, func.max(agent_cards.c.ordinal).label("ordinal"))
            .where(agent_cards.c.agent_id.in_(agent_ids))
            .group_by(agent_cards.c.agent_id)
            .subquery()
        )
        query = select(agent_cards).join(
            newest,
            and_(agent_cards.c.agent_id == newest.c.agent_id, agent_cards.c.ordinal == newest.c.ordinal),
        )
        async with self.engine.connect() as conn:
            return [_published(row) for row in (await conn.execute(query)).all()]

    # ------------------------------------------------------------ presence

    async def report_presence(self, report: pb.PresenceReport, caller: Caller) -> pb.AgentPresence:
        """Replace the agent's Presence with ``report``, bounded by its card in force."""
        if not ids.is_valid(report.agent_id):
            raise malformed("report.agent_id", "agent_id is not a valid id")
        acting_for(caller, report.agent_id)
        if report.availability not in _REPORTABLE:
            raise malformed("report.availability", "availability is AVAILABLE, BUSY, DRAINING or OFFLINE")
        ttl_ms = report.ttl_ms or DEFAULT_TTL_MS
        if not MIN_TTL_MS <= ttl_ms <= MAX_TTL_MS:
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                f"ttl_ms must be {MIN_TTL_MS}..{MAX_TTL_MS} (0: {DEFAULT_TTL_MS})",
                field="report.ttl_ms",
                min=MIN_TTL_MS,
                max=MAX_TTL_MS,
            )
        if len(report.note) > MAX_NOTE_CHARS:
            raise too_large("report.note", len(report.note), MAX_NOTE_CHARS, "characters")
        _agent(await self.registry.get(report.agent_id), report.agent_id)
        cards = await self.in_force([report.agent_id])
        if not cards:
            raise Rejected(
                R.REJECTION_REASON_PRECONDITION_FAILED,
                f"{report.agent_id} has no Agent Card: publish one (its max_concurrency bounds the capacity reported)",
                agent_id=report.agent_id,
            )
        card = cards[0].card
        if report.free_slots + report.in_use_slots > card.max_concurrency:
            raise Rejected(
                R.REJECTION_REASON_INVALID_ARGUMENT,
                f"free_slots + in_use_slots = {report.free_slots + report.in_use_slots} exceeds max_concurrency "
                f"{card.max_concurrency} of card {card.card_version}",
                field="report.free_slots",
                limit=card.max_concurrency,
                card_version=card.card_version,
            )
        row: dict[str, Any] = {
            "agent_id": report.agent_id,
            "availability": int(report.availability),
            "free_slots": report.free_slots,
            "in_use_slots": report.in_use_slots,
            "max_concurrency": card.max_concurrency,
            "card_version": card.card_version,
            "note": report.note,
            "reported_us": to_micros(self.clock.now()),
            "ttl_ms": ttl_ms,
        }
        await self._write_presence(row)
        return self._presence(row, row["reported_us"])

    @finish_on_cancel
    async def _write_presence(self, row: dict[str, Any]) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(presence_upsert(self.engine.dialect.name), [row])

    @finish_on_cancel
    async def presence(self, agent_ids: list[str]) -> list[pb.AgentPresence]:
        """The last report of each agent asked that has reported, in the order asked."""
        wanted = unique_ids(agent_ids, MAX_PRESENCE_IDS, "agent_ids")
        if not wanted:
            raise malformed("agent_ids", "name at least one agent")
        async with self.engine.connect() as conn:
            rows = {
                r.agent_id: r
                for r in (await conn.execute(select(presence).where(presence.c.agent_id.in_(wanted)))).all()
            }
        now = to_micros(self.clock.now())
        return [self._presence(rows[a]._mapping, now) for a in wanted if a in rows]

    @staticmethod
    def _presence(row: Any, now_us: int) -> pb.AgentPresence:
        expires_us = int(row["reported_us"]) + int(row["ttl_ms"]) * 1000
        fresh = now_us < expires_us
        reported = int(row["availability"])
        out = pb.AgentPresence(
            agent_id=row["agent_id"],
            availability=reported if fresh else pb.PRESENCE_AVAILABILITY_UNKNOWN,  # type: ignore[arg-type]
            reported_availability=reported,  # type: ignore[arg-type]
            free_slots=int(row["free_slots"]),
            in_use_slots=int(row["in_use_slots"]),
            max_concurrency=int(row["max_concurrency"]),
            card_version=row["card_version"],
            note=row["note"],
            fresh=fresh,
        )
        out.reported_at.FromMicroseconds(int(row["reported_us"]))
        out.expires_at.FromMicroseconds(expires_us)
        return out
