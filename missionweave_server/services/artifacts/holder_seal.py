"""Each holder row is sealed by a key outside the database (issue 40, D172, docs/integrity.md).

A ``holders`` row lets an identity read a blob it uploaded (it proved it has the bytes). A row
inserted in the database gave the identity every blob it named. The artifact service seals each
row it writes with a keyed BLAKE3 of (digest, identity, size) under a key derived from the mesh
token, the secret every artifact replica already holds outside the database; a row without a seal
that holds grants nothing.
"""

from __future__ import annotations

import hmac

import blake3

_CONTEXT = "missionweave 2026-12 artifact holders seal v1"


class HolderSeal:
    def __init__(self, mesh_token: bytes) -> None:
        self._key = blake3.blake3(mesh_token, derive_key_context=_CONTEXT).digest()

    def seal(self, digest: str, identity_id: str, size_bytes: int) -> bytes:
        return blake3.blake3(f"{digest}\0{identity_id}\0{size_bytes}".encode(), key=self._key).digest()

    def holds(self, digest: str, identity_id: str, size_bytes: int, seal: bytes | None) -> bool:
        return seal is not None and hmac.compare_digest(
            self.seal(digest, identity_id, size_bytes), bytes(seal)
        )
