"""Who is calling: every RPC of every service declares what it needs to know about its caller, and
gets a ``Caller`` proven before its body runs (issue 13, docs/security.md).

Three ways to prove it:
- an identity: a ``CallProof`` (missionweave/v1/auth.proto) in the ``mwp-call-proof-bin`` metadata,
  signed by the caller's current session key, made for this method and this mesh, fresh, its nonce
  new (``missionweave_server.storage.replay``);
- a service of the mesh: in process (a ``LocalChannel`` call, peer "local"), or over the network
  with the mesh's shared secret in ``mwp-mesh-token``, or (for internal contracts only) a verified
  client certificate naming a mesh service (a file only the mesh's processes read,
  docs/security.md); service code attaches it through ``MeshServiceChannel``, never the front
  door, which forwards what callers sent and strips that entry;
- nothing: an RPC whose request carries its own signature (commands, identity registration,
  session opening, the gateway's HELLO) or that is public (the Authority's key).

An RPC states its rule with ``@requires(Access...)``; a test checks that every RPC of every
service states one, so a new RPC cannot be left open by omission.
"""

from __future__ import annotations

import enum
import functools
import hmac
import inspect
import re
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from missionweave.kernel.clock import Clock, from_timestamp
from missionweave.kernel.errors import R, Rejected
from missionweave.kernel.signing import (
    CALL_PROOF_METADATA,
    CALL_PROOF_TYPE,
    parse_session_key_id,
    verify_signature,
)
from missionweave.v1 import auth_pb2, common_pb2
from missionweave_server.edge.access_log import note_caller
from missionweave_server.edge.channels import peer_service_name
from missionweave_server.storage.replay import NonceCache

MESH_TOKEN_METADATA = "mwp-mesh-token"
MAX_PROOF_BYTES = 4096  # a proof is ~200 bytes; anything far larger is not one


class Access(enum.Enum):
    """What an RPC needs to know about its caller before it runs."""

    PUBLIC = "public"  # nothing (the Authority's public key)
    SIGNED = "signed"  # the request carries its own signature, checked by the method
    IDENTITY = "identity"  # a proven identity (call proof), or a service of the mesh
    MESH = "mesh"  # a service of the mesh only (internal contracts)


@dataclass(frozen=True)
class Caller:
    """The proven caller of one RPC."""

    identity_id: str = ""  # "" for a mesh service or an unproven caller of a PUBLIC/SIGNED RPC
    kind: int = 0
    org_admin: bool = False
    session_epoch: int = 0
    service: bool = False  # a service of this mesh (trusted to act for the identities it names)

    @property
    def operator(self) -> bool:
        """May run operator RPCs and read everything: a mesh service, an Organization administrator
        or a control-plane (policy) identity."""
        return self.service or self.org_admin or self.kind == common_pb2.IDENTITY_KIND_CONTROL_PLANE


ANONYMOUS = Caller()
MESH_SERVICE = Caller(service=True)


class IdentitySource(Protocol):
    """The identity directory as seen by an authenticator (Membership's registry in its own process,
    ``IdentityDirectoryClient`` elsewhere)."""

    async def get(
        self, identity_id: str, *, at_least_epoch: int = 0
    ) -> Any: ...  # .kind, .org_admin, .session_epoch, or None

    async def session_key(self, identity_id: str, session_epoch: int) -> bytes | None: ...


def unauthenticated(check: str, message: str) -> Rejected:
    return Rejected(R.REJECTION_REASON_UNAUTHENTICATED, message, check=check)


class CallAuthenticator:
    """Proves the caller of each RPC of one process's services."""

    def __init__(
        self,
        identities: IdentitySource,
        clock: Clock,
        audiences: Iterable[str],
        mesh_token: bytes,
        nonces: NonceCache | None = None,
    ) -> None:
        self.identities = identities
        self.audiences = set(audiences)
        self._token = mesh_token
        self._nonces = nonces if nonces is not None else NonceCache(clock)  # an empty cache is falsy

    async def authenticate(self, context: Any, method: str, access: Access) -> Caller:
        if access in (Access.PUBLIC, Access.SIGNED):
            return ANONYMOUS
        if context.peer() == "local":  # LocalChannel: a service of this very process
            return MESH_SERVICE
        metadata = context.invocation_metadata() or ()
        token = _first(metadata, MESH_TOKEN_METADATA)
        if token is not None:
            given = token.encode() if isinstance(token, str) else token
            if self._token and hmac.compare_digest(given, self._token):
                return MESH_SERVICE
            raise unauthenticated("mesh", "the mesh token is wrong")
        if access is Access.MESH:
            # A verified client certificate naming a mesh service proves a service for internal
            # contracts only: the front door forwards clients' public calls under its own
            # certificate, so a certificate must never stand in for a caller's identity.
            if peer_service_name(context) is not None:
                return MESH_SERVICE
            raise unauthenticated("mesh", f"{method} is internal to the mesh: services only")
        proof = _first(metadata, CALL_PROOF_METADATA)
        if proof is None:
            raise unauthenticated(
                "missing",
                f"{method} needs a call proof ({CALL_PROOF_METADATA} metadata, see missionweave/v1/auth.proto)",
            )
        return await self.verify(proof if isinstance(proof, bytes) else proof.encode(), method)

    async def verify(self, proof_bytes: bytes, method: str) -> Caller:
        """The identity a serialised, signed CallProof proves for ``method``; Rejected otherwise."""
        if len(proof_bytes) > MAX_PROOF_BYTES:
            raise unauthenticated("malformed", "the call proof is too large")
        try:
            envelope = common_pb2.SignedEnvelope.FromString(proof_bytes)
            claim = auth_pb2.CallProof.FromString(envelope.payload)
        except DecodeError:
            raise unauthenticated(
                "malformed", "the call proof is not a SignedEnvelope over a CallProof"
            ) from None
        key_id = (
            parse_session_key_id(envelope.signatures[0].key_id) if len(envelope.signatures) == 1 else None
        )
        if envelope.payload_type != CALL_PROOF_TYPE or key_id is None:
            raise unauthenticated("malformed", "a call proof is one session-key signature over a CallProof")
        if (claim.identity_id, claim.session_epoch) != key_id:
            raise unauthenticated("malformed", "the call proof names another session than its signature")
        key = await self.identities.session_key(*key_id)
        if key is None or not verify_signature(envelope, key):
            raise unauthenticated("signature", "the call proof does not verify with that session's key")
        if claim.method != method:
            raise unauthenticated("method", f"the call proof is for {claim.method!r}, not {method!r}")
        if normalize_audience(claim.audience) not in self.audiences:
            raise unauthenticated(
                "audience", f"the call proof is for audience {claim.audience!r}, not this mesh"
            )
        try:
            issued_at = from_timestamp(claim.issued_at)
        except (ValueError, OverflowError):  # not a valid Timestamp at all: no time is that stale
            raise unauthenticated("stale", "the call proof's issued_at is not a valid Timestamp") from None
        if not self._nonces.fresh(issued_at):
            raise unauthenticated(
                "stale", "the call proof's issued_at is more than 30 s from the server's clock"
            )
        identity = await self.identities.get(claim.identity_id, at_least_epoch=claim.session_epoch)
        if identity is None or identity.session_epoch != claim.session_epoch:
            raise unauthenticated("session", "a newer session of this identity exists: prove the current one")
        if not await self._nonces.use(claim.identity_id, claim.nonce, issued_at):
            if self._nonces.full:
                raise Rejected(
                    R.REJECTION_REASON_OVERLOADED,
                    "too many call proofs in flight; retry",
                    retry_after_ms=1000,
                )
            raise unauthenticated(
                "replayed", "the call proof's nonce was already used (or is not 16..64 bytes)"
            )
        return Caller(claim.identity_id, int(identity.kind), bool(identity.org_admin), claim.session_epoch)


def _first(metadata: Iterable[tuple[str, Any]], key: str) -> Any:
    return next((v for k, v in metadata if k == key), None)


def requires(
    access: Access, *, streamed_request: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declares an RPC's rule. For IDENTITY and MESH it proves the caller first, and the decorated
    method takes the proven ``Caller`` as a third argument; the servicer has ``SERVICE`` (its full
    name) and ``callers`` (a ``CallAuthenticator``; None only for a bare servicer built in a test,
    whose callers count as the mesh's own services). PUBLIC and SIGNED methods are only marked.

    ``streamed_request`` (a client-streaming method): the first request is read before the caller
    is judged, so a refusal never races the client's first write (missionweave/kernel/uploads.py)."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        name = method.__name__
        if access in (Access.PUBLIC, Access.SIGNED):  # nothing to prove first: no wrapper on hot paths
            method.__mwp_access__ = access  # type: ignore[attr-defined]
            return method

        async def caller_of(self: Any, context: Any) -> Caller:
            callers: CallAuthenticator | None = getattr(self, "callers", None)
            if callers is None:  # fail closed: a servicer the mesh did not equip answers nobody
                raise unauthenticated("unconfigured", f"{name}: this server cannot authenticate callers")
            caller = await callers.authenticate(context, f"/{self.SERVICE}/{name}", access)
            note_caller(caller.identity_id or ("mesh" if caller.service else ""))
            return caller

        if inspect.isasyncgenfunction(method):

            @functools.wraps(method)
            async def streaming(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
                caller = await caller_of(self, context)
                async for answer in method(self, request, context, caller):
                    yield answer

            streaming.__mwp_access__ = access  # type: ignore[attr-defined]
            return streaming

        if streamed_request:

            @functools.wraps(method)
            async def client_streaming(self: Any, requests: AsyncIterator[Any], context: Any) -> Any:
                first = await anext(requests, None)
                caller = await caller_of(self, context)
                return await method(self, _resumed(first, requests), context, caller)

            client_streaming.__mwp_access__ = access  # type: ignore[attr-defined]
            return client_streaming

        @functools.wraps(method)
        async def unary(self: Any, request: Any, context: Any) -> Any:
            return await method(self, request, context, await caller_of(self, context))

        unary.__mwp_access__ = access  # type: ignore[attr-defined]
        return unary

    return wrap


async def _resumed(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    if first is None:
        return
    yield first
    async for request in rest:
        yield request


def access_of(method: Any) -> Access | None:
    return getattr(method, "__mwp_access__", None)


# ------------------------------------------------------------------ the mesh's shared secret


def load_or_create_mesh_token(path: Path) -> bytes:
    """The mesh token in ``path`` (created, readable by its owner only, on first use)."""
    if path.exists():
        token = path.read_bytes().strip()
        if len(token) < 32:
            raise ValueError(f"{path}: a mesh token is at least 32 characters")
        return token
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # beside the keys: private
    token = secrets.token_hex(32).encode()
    path.touch(mode=0o600)
    path.write_bytes(token + b"\n")
    return token


class _WithMetadata:
    """One multicallable of a channel, with extra metadata on every call."""

    def __init__(self, inner: Any, extra: tuple[tuple[str, str], ...]) -> None:
        self._inner = inner
        self._extra = extra

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner(*args, metadata=tuple(metadata or ()) + self._extra, **kwargs)


class MeshServiceChannel:
    """A channel whose every call is made as a service of the mesh (the mesh token attached); the
    stubs service code builds on it call peers as the mesh, never as a forwarded caller."""

    def __init__(self, channel: Any, token: bytes) -> None:
        self._channel = channel
        self._extra = ((MESH_TOKEN_METADATA, token.decode()),)

    def unary_unary(self, *args: Any, **kwargs: Any) -> _WithMetadata:
        return _WithMetadata(self._channel.unary_unary(*args, **kwargs), self._extra)

    def unary_stream(self, *args: Any, **kwargs: Any) -> _WithMetadata:
        return _WithMetadata(self._channel.unary_stream(*args, **kwargs), self._extra)

    def stream_unary(self, *args: Any, **kwargs: Any) -> _WithMetadata:
        return _WithMetadata(self._channel.stream_unary(*args, **kwargs), self._extra)

    def stream_stream(self, *args: Any, **kwargs: Any) -> _WithMetadata:
        return _WithMetadata(self._channel.stream_stream(*args, **kwargs), self._extra)

    def __getattr__(self, name: str) -> Any:  # close(), channel_ready(), ...
        return getattr(self._channel, name)


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")
_SCHEME = re.compile(r"^(?:dns:(?://[^/]*)?/|dns:|ipv4:|ipv6:|unix:)")


def normalize_audience(audience: str) -> str:
    """How an audience is compared: without a gRPC target scheme (``dns:///``, ``ipv4:``), in lower case."""
    return _SCHEME.sub("", audience.strip()).lower()


def audiences_for(*addresses: str) -> set[str]:
    """The audiences (call proofs and HELLO proofs alike) a mesh reachable at ``addresses`` answers
    to, normalized: each address, and for a loopback or wildcard host the loopback spellings of the
    same port (a wildcard host itself names nothing a client dials)."""
    out: set[str] = set()
    for address in addresses:
        address = normalize_audience(address)
        if not address:
            continue
        host, _, port = address.rpartition(":")
        if host not in _WILDCARD_HOSTS:
            out.add(address)
        if host in (*_LOOPBACK_HOSTS, *_WILDCARD_HOSTS):
            out.update(f"{h}:{port}" for h in _LOOPBACK_HOSTS)
    return out


__all__ = [
    "ANONYMOUS",
    "CALL_PROOF_METADATA",
    "CALL_PROOF_TYPE",
    "MESH_SERVICE",
    "MESH_TOKEN_METADATA",
    "Access",
    "CallAuthenticator",
    "Caller",
    "MeshServiceChannel",
    "access_of",
    "audiences_for",
    "load_or_create_mesh_token",
    "normalize_audience",
    "requires",
]
