"""Rows that grant authority carry the signed request that granted them (D170, docs/integrity.md).

An identity row (its key, its kind, ``org_admin``) is only as good as the RegisterIdentity request
an Organization administrator signed for it, kept in the row as ``grant_envelope``; a session row's key is
only as good as the OpenSession request the identity signed. Both are checked whenever a row is
read from the database, so a row written or edited outside this service (an ``org_admin`` flipped,
a key swapped, an identity inserted) grants nothing: the row is refused as corrupted and logged.

The chain ends at the Organization administrator created on first start, whose request is signed
by the administrator's own key: the key file this service holds (``keys/admin.key``), outside the
database, is the root of trust. ``mwp db upgrade`` vouches for rows older than this check with that
key (an attestation, signed as the same request types).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from nacl.signing import SigningKey

from missionweave.kernel.signing import (
    OPEN_SESSION_TYPE,
    REGISTER_IDENTITY_TYPE,
    sign_envelope,
    verify_signature,
)
from missionweave.v1 import common_pb2, membership_pb2, membership_service_pb2

ATTESTATION_REQUEST_PREFIX = "granted-by-admin-key-"


class GrantInvalid(Exception):
    """A row that grants authority does not carry a valid grant (written outside the service)."""


@dataclass(frozen=True)
class GrantedIdentity:
    """The fields of an identity row that grant something."""

    identity_id: str
    kind: int
    display_name: str
    public_key: bytes
    org_admin: bool


# The granting identity (``admin_id`` of the request): its row's fields and its own grant.
SignerLookup = Callable[[str], Awaitable[tuple[GrantedIdentity, bytes | None] | None]]


def _envelope(grant: bytes | None, payload_type: str, what: str) -> common_pb2.SignedEnvelope:
    if not grant:
        raise GrantInvalid(f"{what} carries no grant")
    envelope = common_pb2.SignedEnvelope()
    try:
        envelope.ParseFromString(grant)
    except DecodeError:
        raise GrantInvalid(f"{what}: its grant is not a SignedEnvelope") from None
    if envelope.payload_type != payload_type or len(envelope.signatures) != 1:
        raise GrantInvalid(f"{what}: its grant is not a {payload_type} request with one signature")
    return envelope


class GrantChecker:
    """Checks identity and session rows against their grants; remembers what it checked (a row's
    grant never changes, so a row equal to one checked before is not checked again)."""

    MAX_CHAIN = 64  # administrators registered by administrators: far beyond any real chain

    def __init__(self, admin_public_key: bytes) -> None:
        self.anchor = admin_public_key
        self._identities: dict[str, tuple[GrantedIdentity, bytes]] = {}
        self._sessions: dict[tuple[str, int], tuple[bytes, bytes]] = {}

    async def identity(self, row: GrantedIdentity, grant: bytes | None, signer_of: SignerLookup) -> None:
        """Raise ``GrantInvalid`` unless ``row`` is what an administrator signed (or the root)."""
        await self._identity(row, grant, signer_of, depth=0)

    async def _identity(
        self, row: GrantedIdentity, grant: bytes | None, signer_of: SignerLookup, depth: int
    ) -> None:
        if self._identities.get(row.identity_id) == (row, grant or b""):
            return
        what = f"identity {row.identity_id!r}"
        if depth > self.MAX_CHAIN:
            raise GrantInvalid(f"{what}: its chain of administrators is longer than {self.MAX_CHAIN}")
        envelope = _envelope(grant, REGISTER_IDENTITY_TYPE, what)
        command = membership_service_pb2.RegisterIdentityCommand()
        try:
            command.ParseFromString(envelope.payload)
        except DecodeError:
            raise GrantInvalid(f"{what}: its grant's payload is not a RegisterIdentityCommand") from None
        signed = command.identity
        if (
            GrantedIdentity(
                signed.identity_id,
                signed.kind,
                signed.display_name,
                bytes(signed.public_key),
                signed.org_admin,
            )
            != row
        ):
            raise GrantInvalid(f"{what}: the row differs from the request that registered it")
        if verify_signature(envelope, self.anchor):
            pass  # the administrator key this service holds outside the database: the root
        elif command.admin_id == row.identity_id:
            raise GrantInvalid(
                f"{what}: registered by itself, but not with the administrator key of this Organization"
            )
        else:
            signer = await signer_of(command.admin_id)
            if signer is None:
                raise GrantInvalid(f"{what}: registered by {command.admin_id!r}, who is not in the store")
            admin, admin_grant = signer
            if not admin.org_admin:
                raise GrantInvalid(
                    f"{what}: registered by {command.admin_id!r}, who is not an Organization admin"
                )
            if not verify_signature(envelope, admin.public_key):
                raise GrantInvalid(f"{what}: its grant is not signed by {command.admin_id!r}'s key")
            await self._identity(admin, admin_grant, signer_of, depth + 1)
        self._identities[row.identity_id] = (row, grant or b"")

    def session(
        self, identity: GrantedIdentity, session_epoch: int, session_key: bytes, grant: bytes | None
    ) -> None:
        """Raise ``GrantInvalid`` unless the session's key is what ``identity`` (already checked) asked
        for, or what the administrator key attested at an upgrade."""
        at = (identity.identity_id, session_epoch)
        if self._sessions.get(at) == (session_key, grant or b""):
            return
        what = f"session {session_epoch} of {identity.identity_id!r}"
        envelope = _envelope(grant, OPEN_SESSION_TYPE, what)
        command = membership_service_pb2.OpenSessionCommand()
        try:
            command.ParseFromString(envelope.payload)
        except DecodeError:
            raise GrantInvalid(f"{what}: its grant's payload is not an OpenSessionCommand") from None
        if command.identity_id != identity.identity_id or bytes(command.session_public_key) != session_key:
            raise GrantInvalid(f"{what}: the row differs from the request that opened it")
        if not (verify_signature(envelope, identity.public_key) or verify_signature(envelope, self.anchor)):
            raise GrantInvalid(
                f"{what}: its grant is signed neither by the identity nor by the administrator key"
            )
        self._sessions[at] = (session_key, grant or b"")


def granted(identity: membership_pb2.Identity) -> GrantedIdentity:
    return GrantedIdentity(
        identity.identity_id,
        identity.kind,
        identity.display_name,
        bytes(identity.public_key),
        identity.org_admin,
    )


def attest_identity(admin_key: SigningKey, row: GrantedIdentity, issued_at_us: int) -> bytes:
    """The administrator key's grant for an identity row that predates grants (``mwp db upgrade``)
    or for the first administrator (its own registration)."""
    command = membership_service_pb2.RegisterIdentityCommand(
        identity=membership_pb2.Identity(
            identity_id=row.identity_id,
            kind=row.kind,  # type: ignore[arg-type]
            display_name=row.display_name,
            public_key=row.public_key,
            org_admin=row.org_admin,
        ),
        admin_id="admin",
        request_id=ATTESTATION_REQUEST_PREFIX + row.identity_id,
    )
    command.issued_at.FromMicroseconds(issued_at_us)
    envelope = sign_envelope(command.SerializeToString(), REGISTER_IDENTITY_TYPE, admin_key, "admin")
    return envelope.SerializeToString()


def attest_session(admin_key: SigningKey, identity_id: str, session_key: bytes, issued_at_us: int) -> bytes:
    """The administrator key's grant for a session row that predates grants (``mwp db upgrade``)."""
    command = membership_service_pb2.OpenSessionCommand(
        identity_id=identity_id, session_public_key=session_key
    )
    command.issued_at.FromMicroseconds(issued_at_us)
    envelope = sign_envelope(command.SerializeToString(), OPEN_SESSION_TYPE, admin_key, "admin")
    return envelope.SerializeToString()
