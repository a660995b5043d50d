"""Proofs of freshness: a signed proof carries an issue time and a nonce, and each (signer, nonce) is
accepted once while its issue time is inside the replay window. Used by every proof a server checks
(HELLO proofs on gateway streams, call proofs on RPCs), so one replay rule holds everywhere.

Each process remembers the nonces it accepted (``NonceCache``). With ``MWP_NONCE_STORE=database``,
the default (D168), it also records each nonce in its database (``SharedNonces``, table
``proof_nonces``): the first process to record it accepts the proof, any other refuses it as a
replay, whether a replica answering to the same audience (D118) or the same service started again
within the proof's window. ``memory`` keeps nonces in the process only: a restart forgets them."""

from __future__ import annotations

import hashlib
import heapq
import logging
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import BigInteger, Column, LargeBinary, MetaData, Table, bindparam, delete, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.kernel.clock import Clock, to_micros
from missionweave.kernel.errors import R, Rejected
from missionweave_server.storage import schema_versions
from missionweave_server.storage.aio import finish_on_cancel
from missionweave_server.storage.db import compiled_once, dialect_insert, make_engine

log = logging.getLogger("missionweave_server.storage.replay")

REPLAY_WINDOW = timedelta(seconds=30)  # a proof's issue time is within this of the server's clock
NONCE_MIN, NONCE_MAX = 16, 64  # bytes


class NonceCache:
    """Remembers (signer, nonce) pairs until their proof's issue time leaves the window; a pair seen
    again inside it is a replay. Bounded: when ``max_entries`` live pairs are held, new proofs are
    refused (``accept`` returns False with ``full`` set) rather than forgetting pairs still inside
    their window, which would let them be replayed."""

    def __init__(
        self,
        clock: Clock,
        window: timedelta = REPLAY_WINDOW,
        max_entries: int = 1_000_000,
        shared: SharedNonces | None = None,
    ) -> None:
        self._clock = clock
        self._window = window
        self._max = max_entries
        self._seen: set[tuple[str, bytes]] = set()
        self._expiry: list[tuple[datetime, str, bytes]] = []  # min-heap by forget time
        self.full = False
        self.shared = shared  # the replicas' ledger (MWP_NONCE_STORE=database)

    def fresh(self, issued_at: datetime) -> bool:
        """Whether an issue time lies within the window of the clock, either side."""
        return abs(issued_at - self._clock.now()) <= self._window

    def accept(self, signer: str, nonce: bytes, issued_at: datetime) -> bool:
        """True once for a fresh proof's (signer, nonce); False for a stale proof, a nonce of the
        wrong size, a replay, or a full cache."""
        self.full = False
        if not NONCE_MIN <= len(nonce) <= NONCE_MAX or not self.fresh(issued_at):
            return False
        self._forget_expired()
        key = (signer, bytes(nonce))
        if key in self._seen:
            return False
        if len(self._seen) >= self._max:
            self.full = True
            return False
        self._seen.add(key)
        # A proof stays replayable until its issue time is a window in the past.
        heapq.heappush(self._expiry, (issued_at + self._window, signer, key[1]))
        return True

    async def use(self, signer: str, nonce: bytes, issued_at: datetime) -> bool:
        """``accept``, and where the nonces are shared, the first use among every replica: this
        process's own cache answers its replays (and stale or badly sized proofs) without a database
        round trip; a proof new here costs one statement."""
        if not self.accept(signer, nonce, issued_at):
            return False
        return self.shared is None or await self.shared.first_use(signer, nonce, issued_at + self._window)

    def __len__(self) -> int:
        return len(self._seen)

    def _forget_expired(self) -> None:
        now = self._clock.now()
        while self._expiry and self._expiry[0][0] < now:
            _, signer, nonce = heapq.heappop(self._expiry)
            self._seen.discard((signer, nonce))


# ------------------------------------------------------------------ shared by replicas (D118)

METADATA = MetaData()

# One row per accepted proof's nonce, until its proof is stale: the digest of (scope, signer, nonce)
# (fixed size, and no signer or nonce in the clear) and when it may be forgotten.
proof_nonces = Table(
    "proof_nonces",
    METADATA,
    Column("nonce_digest", LargeBinary(32), primary_key=True),
    Column("expires_us", BigInteger, nullable=False, index=True),
)

# How often each process deletes the rows whose proofs are stale (an expired row in the way of a new
# proof is overwritten anyway: pruning only keeps the table small).
PRUNE_EVERY = REPLAY_WINDOW
DATABASE_RETRY_AFTER_MS = 1000
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")  # PostgreSQL: this transaction only


# Every change to these tables ships with its migration in missionweave_server/storage/nonce_migrations/ (docs/upgrades.md).
LINE = schema_versions.SchemaLine("nonces", METADATA, Path(__file__).resolve().parent / "nonce_migrations")


async def create_schema(engine: AsyncEngine) -> None:
    """Install this schema into an empty store, or check the store is at it (``SchemaMismatch``)."""
    await schema_versions.prepare(engine, [LINE])


def nonce_engine(engine: AsyncEngine) -> AsyncEngine:
    """The engine ``SharedNonces`` records through. On SQLite, a small one of its own on the same file
    whose commits do not wait for fsync (``synchronous=NORMAL`` in WAL mode: a commit survives the
    process being killed, not the host losing power), as the PostgreSQL transaction commits
    asynchronously (D118, D168): a proof's nonce is a row for 30 s, not history. Otherwise ``engine``
    itself. The caller disposes of an engine it was given that is not its own."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return engine
    return make_engine(
        engine.url.render_as_string(hide_password=False), sqlite_synchronous="NORMAL", pool_size=2
    )


class SharedNonces:
    """The nonces accepted by any replica of the mesh's services, in their shared database.

    Recording is one statement: insert the nonce's row, or take over a row whose proof is already
    stale; a live row (RETURNING nothing) means another replica accepted the proof first. ``scope``
    keeps call proofs and HELLO proofs apart, as their separate caches do in one process."""

    def __init__(self, engine: AsyncEngine, clock: Clock, scope: str) -> None:
        self._engine = engine
        self._clock = clock
        self._scope = scope.encode()
        self._postgres = engine.dialect.name == "postgresql"
        ins = dialect_insert(engine.dialect.name, proof_nonces)
        self._record = compiled_once(
            ins.values(nonce_digest=bindparam("digest"), expires_us=bindparam("expires_us"))
            .on_conflict_do_update(
                index_elements=[proof_nonces.c.nonce_digest],
                set_={"expires_us": ins.excluded.expires_us},
                where=proof_nonces.c.expires_us
                < bindparam("now_us", type_=BigInteger),  # only a row whose proof is stale
            )
            .returning(proof_nonces.c.nonce_digest),
            engine.dialect.name,
        )
        self._next_prune: datetime | None = None

    def digest(self, signer: str, nonce: bytes) -> bytes:
        h = hashlib.sha256()
        for part in (self._scope, signer.encode(), bytes(nonce)):
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
        return h.digest()

    async def first_use(self, signer: str, nonce: bytes, expires: datetime) -> bool:
        """True when no replica has used (signer, nonce) in its window; the database unreachable is
        a retryable refusal (PEER_UNAVAILABLE), never an acceptance."""
        params = {
            "digest": self.digest(signer, nonce),
            "expires_us": to_micros(expires),
            "now_us": to_micros(self._clock.now()),
        }
        try:
            recorded = await self._record_use(params)
        except SQLAlchemyError as err:
            log.warning(
                "the shared nonce store did not answer", extra={"error": f"{type(err).__name__}: {err}"}
            )
            raise Rejected(
                R.REJECTION_REASON_PEER_UNAVAILABLE,
                "the proof could not be checked for replay (database unavailable); retry with a fresh proof",
                peer="database",
                retry_after_ms=DATABASE_RETRY_AFTER_MS,
            ) from None
        await self._prune_when_due()
        return recorded

    @finish_on_cancel
    async def _record_use(self, params: dict[str, object]) -> bool:
        """The nonce's one statement, run to its commit even when the caller is cancelled (an RPC
        whose client went away, often while the INSERT waits for SQLite's write lock). Interrupted,
        SQLAlchemy would close the aiosqlite connection with the INSERT ... RETURNING unfinished, and
        sqlite3 then keeps that closed connection as a zombie, its transaction and SQLite's write lock
        held, until the cyclic garbage collector frees the cursor (gc_policy: rarely): every other
        writer of the file waits out its busy timeout and fails "database is locked"."""
        async with self._engine.begin() as conn:
            if self._postgres:
                # Visible to every replica at commit either way; not waiting for the WAL flush
                # is what makes this cheap (D118). A server crash could forget the last moment's
                # nonces, whose proofs stay replayable for the rest of their 30 s.
                await conn.execute(_ASYNC_COMMIT)
            return (await conn.execute(self._record, params)).first() is not None

    @finish_on_cancel
    async def prune(self) -> int:
        """Delete the rows whose proofs are stale; how many."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                delete(proof_nonces).where(proof_nonces.c.expires_us < to_micros(self._clock.now()))
            )
        return int(result.rowcount or 0)

    async def _prune_when_due(self) -> None:
        now = self._clock.now()
        if self._next_prune is None or now >= self._next_prune:
            self._next_prune = now + PRUNE_EVERY
            try:
                await self.prune()
            except SQLAlchemyError:  # the next interval tries again; stale rows refuse nothing
                log.warning("pruning stale proof nonces failed", exc_info=True)
