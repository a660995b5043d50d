"""A Group's ownership row is sealed by the Authority key (issue 40, D171, docs/integrity.md).

``groups.owner_instance`` says which Authority instance (shard) holds a Group's lease, and so where
every other instance sends its commands (NOT_OWNER with the owner's address). A row rewritten in the
database named an instance that does not exist, and every command was refused for the length of the
lease with no signal. The instance that takes a Group (creating it or acquiring it) signs
(group, owner, writer epoch) with the Authority key into ``groups.owner_seal``; an instance that
finds another instance's row without a seal that verifies under a key of the store's history treats
the lease as lapsed: it logs an error and takes the Group, which raises the writer epoch and so
fences whoever held it (the appends are fenced by the epoch alone, never by this row). A row from
before the seal (NULL) is treated the same way: the first instance to need it seals it.
"""

from __future__ import annotations

from collections.abc import Iterable

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from missionweave.kernel.signing import pae

PAYLOAD_TYPE = "application/vnd.missionweave.internal.group-owner"


def _statement(group_id: str, owner_instance: str, writer_epoch: int) -> bytes:
    payload = b"\0".join((group_id.encode(), owner_instance.encode(), str(writer_epoch).encode()))
    return pae(PAYLOAD_TYPE, payload)


class OwnershipSeal:
    """Seals with ``key`` (None: checks only, as ``mwp verify`` does); checks against ``key`` and
    every key of the store's history, so a row sealed before a rotation still holds."""

    def __init__(self, key: SigningKey | None, public_keys: Iterable[bytes]) -> None:
        self._key = key
        own = [bytes(key.verify_key)] if key is not None else []
        self._verifiers = [VerifyKey(k) for k in sorted({*own, *public_keys})]

    def seal(self, group_id: str, owner_instance: str, writer_epoch: int) -> bytes:
        if self._key is None:
            raise ValueError("this OwnershipSeal only checks seals")
        return self._key.sign(_statement(group_id, owner_instance, writer_epoch)).signature

    def holds(self, group_id: str, owner_instance: str, writer_epoch: int, seal: bytes | None) -> bool:
        if not seal:
            return False
        statement = _statement(group_id, owner_instance, writer_epoch)
        for verifier in self._verifiers:
            try:
                verifier.verify(statement, bytes(seal))
                return True
            except (BadSignatureError, ValueError):
                continue
        return False
