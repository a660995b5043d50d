"""The configuration of `mwp bridge a2a-server` (docs/bridge-a2a-server.md): the mesh it is a client
of, where it listens, and the MissionWeave identities it serves, each with its key file and the
SHA-256 of the bearer token that selects it.

A2A clients cannot sign MWP commands, so the endpoint holds the keys; a token stands for exactly one
identity, and every command the endpoint signs for a request is that identity's own. Tokens are kept
hashed: the file reveals no credential, and a token is random (32 bytes), so one SHA-256 suffices
(no password stretching is needed against a guess of 256 bits).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(Exception):
    """The configuration file is missing something or names something that does not exist."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh bearer token (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ServedIdentity:
    identity_id: str
    key_file: Path
    token_sha256: str


@dataclass(frozen=True)
class ServerConfig:
    identities: tuple[ServedIdentity, ...]
    # The mesh (gateway or front door); "" takes `mwp`'s: --target, else $MWP_TARGET, else 127.0.0.1:50051.
    target: str = ""
    grpc_listen: str = "127.0.0.1:50070"
    # JSON-RPC and the Agent Card; "" serves no HTTP (then the card is reachable over gRPC only).
    http_listen: str = "127.0.0.1:50071"
    # The URLs the Agent Card announces (behind a proxy they differ from the listen addresses).
    grpc_url: str = ""
    http_url: str = ""
    # How far back (in Group sequences) a resume cursor is replayed event by event; an older cursor
    # gets a snapshot and the live tail (docs/bridge-a2a-server.md "Resuming").
    replay_window: int = 10_000
    # Artifacts up to this size are sent inline in A2A artifacts; larger ones as a reference.
    inline_bytes: int = 65_536
    # TLS towards A2A clients (both a certificate and its key, or neither).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # TLS towards the mesh: a CA bundle to verify it (None: plain text, as `mwp` without MWP_TLS).
    mesh_tls_ca: Path | None = None
    name: str = "MissionWeave"
    _by_hash: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for identity in self.identities:
            self._by_hash[identity.token_sha256] = identity.identity_id

    def identity_for(self, authorization: str) -> str | None:
        """The identity an ``Authorization: Bearer <token>`` value stands for, None for any other.
        Every configured hash is compared in constant time, so timing tells nothing about a token."""
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = hash_token(token.strip())
        found = None
        for known, identity_id in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                found = identity_id
        return found


def _text(table: dict[str, object], key: str, where: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or (default is None and not value):
        raise ConfigError(f"{where}: `{key}` must be a non-empty string")
    return value


def load(path: Path) -> ServerConfig:
    """The configuration in ``path`` (TOML); key files are resolved against its directory."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: {err}") from err
    base = path.parent
    entries = raw.get("identity", [])
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: at least one [[identity]] is required")
    identities: list[ServedIdentity] = []
    hashes: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{path}: [[identity]] #{i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} is not a table")
        digest = _text(entry, "token_sha256", where).lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(
                f"{where}: `token_sha256` must be 64 hex characters (mwp bridge a2a-server --new-token)"
            )
        if digest in hashes:
            raise ConfigError(f"{where}: the same token is configured twice (one token, one identity)")
        hashes.add(digest)
        key = Path(_text(entry, "key_file", where)).expanduser()
        identities.append(
            ServedIdentity(_text(entry, "id", where), key if key.is_absolute() else base / key, digest)
        )
    if len({i.identity_id for i in identities}) != len(identities):
        raise ConfigError(f"{path}: an identity is listed twice")

    def optional_path(key: str) -> Path | None:
        value = raw.get(key)
        if value is None:
            return None
        p = Path(_text(raw, key, str(path))).expanduser()
        return p if p.is_absolute() else base / p

    def number(key: str, default: int) -> int:
        value = raw.get(key, default)
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"{path}: `{key}` must be a non-negative integer")
        return value

    tls_cert, tls_key = optional_path("tls_cert"), optional_path("tls_key")
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError(f"{path}: `tls_cert` and `tls_key` go together")
    return ServerConfig(
        target=_text(raw, "target", str(path), ""),
        identities=tuple(identities),
        grpc_listen=_text(raw, "grpc_listen", str(path), ServerConfig.grpc_listen),
        http_listen=str(raw.get("http_listen", ServerConfig.http_listen)),
        grpc_url=str(raw.get("grpc_url", "")),
        http_url=str(raw.get("http_url", "")),
        replay_window=number("replay_window", ServerConfig.replay_window),
        inline_bytes=number("inline_bytes", ServerConfig.inline_bytes),
        tls_cert=tls_cert,
        tls_key=tls_key,
        mesh_tls_ca=optional_path("mesh_tls_ca"),
        name=str(raw.get("name", ServerConfig.name)),
    )
