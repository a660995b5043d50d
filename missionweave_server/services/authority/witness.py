"""A witness of the store kept outside it: a whole database put back to an older copy is refused
at start (issue 40, D173, docs/integrity.md "A store rolled back").

Every Authority instance writes, every ``WITNESS_INTERVAL_S`` and when it stops, what the store
held when it last looked: the sum of every Group's head, the number of Groups and of recorded
Authority keys. Each only ever grows in an intact store (heads never go down, Groups and keys are
never removed), so each is a lower bound of what any later start must find. The witness is signed
by the Authority key and names the store (its first key record), and lives in the witness
directory (``MWP_AUTHORITY_WITNESS_DIR``, default ``<data dir>/witness``), one file per instance.

At start, a store below any witness of its own is refused with a message saying so: a restore from
an older backup, a disk snapshot put back, a database replaced by an older copy. ``mwp restore``
(an intended rollback) clears the witnesses of the data directory it restores into.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from missionweave.kernel.clock import Clock, to_micros
from missionweave.kernel.signing import pae
from missionweave_server.services.authority.keys import KeyHistory
from missionweave_server.services.authority.schema import authority_keys, groups

log = logging.getLogger("missionweave.authority.witness")

WITNESS_INTERVAL_S = 10.0
PAYLOAD_TYPE = "application/vnd.missionweave.internal.store-witness+json"


class StoreRolledBack(ValueError):
    """The store holds less than a witness of it saw: it was put back to an older copy."""


@dataclass(frozen=True)
class Summary:
    heads: int  # the sum of every Group's head
    groups: int
    keys: int  # Authority keys recorded (rotations are never removed)


@dataclass(frozen=True)
class Witness:
    store: str  # the store's first key record: "<key id>@<recorded µs>"
    instance: str
    written_us: int
    summary: Summary


async def summary(engine: AsyncEngine) -> Summary:
    async with engine.connect() as conn:
        heads, count = (
            await conn.execute(select(func.coalesce(func.sum(groups.c.head_seq), 0), func.count()))
        ).one()
        keys = (await conn.execute(select(func.count()).select_from(authority_keys))).scalar_one()
    return Summary(int(heads), int(count), int(keys))


def store_name(history: KeyHistory) -> str:
    first = history.records[0]
    return f"{first.key_id}@{first.recorded_us}"


def _encoded(witness: Witness) -> bytes:
    return json.dumps(asdict(witness), sort_keys=True).encode()


def write(directory: Path, witness: Witness, key: SigningKey) -> None:
    """Atomically (a new file renamed over the old), synced: a crash leaves the old or the new."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    payload = _encoded(witness)
    document = {
        "witness": json.loads(payload),
        "signature": key.sign(pae(PAYLOAD_TYPE, payload)).signature.hex(),
    }
    target = directory / f"{witness.instance}.json"
    scratch = target.with_suffix(".json.new")
    with open(scratch, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(scratch, target)


def read_all(directory: Path, history: KeyHistory) -> list[Witness]:
    """The witnesses in ``directory`` signed by a key of ``history`` (others are logged and left out:
    an unsigned file proves nothing either way)."""
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            fields = document["witness"]
            witness = Witness(
                fields["store"], fields["instance"], int(fields["written_us"]), Summary(**fields["summary"])
            )
            signature = bytes.fromhex(document["signature"])
        except (OSError, ValueError, KeyError, TypeError) as unreadable:
            log.warning(
                "a store witness cannot be read: left out",
                extra={"path": str(path), "detail": str(unreadable)},
            )
            continue
        if not any(_verifies(k, _encoded(witness), signature) for k in history.keys.values()):
            log.warning(
                "a store witness is not signed by the Authority key: left out", extra={"path": str(path)}
            )
            continue
        found.append(witness)
    return found


def _verifies(public_key: bytes, payload: bytes, signature: bytes) -> bool:
    try:
        VerifyKey(public_key).verify(pae(PAYLOAD_TYPE, payload), signature)
        return True
    except (BadSignatureError, ValueError):
        return False


async def check(engine: AsyncEngine, directory: Path, history: KeyHistory) -> Summary:
    """Refuse (``StoreRolledBack``) a store that holds less than a witness of it saw; the store's
    summary otherwise."""
    now = await summary(engine)
    if not history.records:
        return now
    name = store_name(history)
    for witness in read_all(directory, history):
        if witness.store != name:
            continue  # a witness of another store that was in this directory before
        seen = witness.summary
        if now.heads < seen.heads or now.groups < seen.groups or now.keys < seen.keys:
            raise StoreRolledBack(
                f"the store holds less than the Authority saw in it (witness {directory / witness.instance}.json): "
                f"{now.groups} Groups, heads summing to {now.heads}, {now.keys} key(s), against {seen.groups}, "
                f"{seen.heads} and {seen.keys}; it was put back to an older copy (docs/integrity.md "
                f'"A store rolled back"). If that is intended, remove the witness directory {directory} and start again'
            )
    return now


class WitnessWriter:
    """Writes this instance's witness every ``interval`` seconds and once more when closed."""

    def __init__(
        self,
        engine: AsyncEngine,
        directory: Path,
        key: SigningKey,
        history: KeyHistory,
        instance: str,
        clock: Clock,
        interval: float = WITNESS_INTERVAL_S,
    ) -> None:
        self.engine, self.directory, self.key, self.instance, self.clock = (
            engine,
            directory,
            key,
            instance,
            clock,
        )
        self.store = store_name(history)
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def write_now(self) -> None:
        witness = Witness(self.store, self.instance, to_micros(self.clock.now()), await summary(self.engine))
        await asyncio.to_thread(write, self.directory, witness, self.key)

    async def _run(self) -> None:
        while True:
            try:
                await self.write_now()
            except Exception as failed:  # a full disk must not stop the Authority: say so, try again
                log.error("the store witness could not be written", extra={"detail": str(failed)})
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            with contextlib.suppress(Exception):
                await self.write_now()
