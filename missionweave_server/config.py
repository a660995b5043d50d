"""Runtime configuration from environment variables, overridable by ``mwp serve`` flags.

| variable                 | default                         | meaning                                        |
|--------------------------|---------------------------------|------------------------------------------------|
| MWP_LISTEN               | 127.0.0.1:50051                 | gRPC listen address                            |
| MWP_DATA_DIR             | ./.missionweave                 | SQLite file, keys and blobs (embedded default) |
| MWP_DATABASE_URL         | sqlite under MWP_DATA_DIR       | or postgresql://user:pw@host/db (asyncpg)      |
| MWP_AUTHORITY_KEY        | $MWP_DATA_DIR/keys/authority.key| Ed25519 seed that signs events and snapshots   |
| MWP_INSTANCE_ID          | local                           | authority instance name (Group ownership)      |
| MWP_SQLITE_SYNCHRONOUS   | FULL                            | SQLite synchronous pragma (FULL or NORMAL)      |
| MWP_GROUP_RATE / _BURST  | 200 / 400                       | commands/s per Group at ingress (0: no limit)  |
| MWP_COMMIT_LINGER_MS     | 8                               | longest a group commit waits to fill (0: none) |
| MWP_COMMIT_IDLE_MS       | 1                               | ...ending once no append came for this long    |
| MWP_COMMIT_BATCH         | 32                              | ...or once this many appends wait              |
| MWP_VERIFY_WORKERS       | 1                               | processes checking command signatures (0: inline) |
| MWP_S3_BUCKET            | (unset: blobs on local disk)    | store artifact blobs in this S3 bucket         |
| MWP_S3_ENDPOINT / _REGION| AWS default                     | any S3-compatible endpoint (path-style)        |
| MWP_S3_CREATE_BUCKET     | false                           | create the bucket on first use                 |
| MWP_ARTIFACT_QUOTA_BYTES | 10737418240 (10 GiB)            | bytes of blobs one identity may hold (0: no quota; operators have none) |
| MWP_SERVICES             | all five                        | the services this process runs (comma list; serve --service) |
| MWP_AUTHORITY_ADDR, ...  | (unset)                         | peer addresses when services run apart         |
| MWP_ADVERTISE_ADDR       | the listen address              | how peers reach this process (NOT_OWNER)       |
| MWP_MESH_ID              | (unset)                         | processes of one mesh share a data dir          |
| MWP_OWNERSHIP_LEASE_S    | 30                              | a Group's owner may be replaced this long after its last append |
| MWP_REBALANCE_INTERVAL_S | 0 (5 for the split launcher's shards) | an Authority shard's heartbeat and hand-back round (0: off) |
| MWP_AUDIENCE             | (the listen/advertise address)  | more addresses call proofs may name (comma list: the front door's) |
| MWP_NONCE_STORE          | database                        | proof nonces: database (kept across restarts) or memory (unsafe, D168) |
| MWP_MESH_TOKEN_FILE      | $MWP_DATA_DIR/keys/mesh.token   | the secret mesh services prove themselves with (created if missing) |
| MWP_AUTHORITY_WITNESS_DIR| $MWP_DATA_DIR/witness           | the Authority's signed witness of the store, kept outside it (D173) |
| MWP_GATEWAY_MAX_STREAMS  | 10000                           | gateway streams open at once                   |
| MWP_GATEWAY_MAX_STREAMS_PER_IDENTITY | 8                   | ... per authenticated identity                 |
| MWP_GATEWAY_HELLO_TIMEOUT_S | 10                           | a stream without HELLO this long is closed     |
| MWP_GATEWAY_STALL_TIMEOUT_S | 30                           | a stream not reading this long is closed       |
| MWP_GATEWAY_STREAM_BUFFER_BYTES | 1048576                  | frames queued per stream, in bytes             |
| MWP_MAX_DELEGATION_DEPTH | 3                               | how deep delegated work may go below a grant's root |
| MWP_MAX_MISSION_DEPTH    | 2                               | default maximum depth of a Mission tree (root = 0) |
| MWP_LINK_RELAY_POLL_MS   | 1000                            | how often the cross-Group outbox is read (0: not here) |
| MWP_LOG_LEVEL / _FORMAT  | info / json                     | logging                                        |
| MWP_METRICS_LISTEN       | 127.0.0.1:9464 (`mwp serve`)    | Prometheus text format at /metrics (empty: off; off in a bare ``Settings()``) |
| MWP_CONSOLE_LISTEN       | 127.0.0.1:50080 (`mwp serve`)   | web console, where the gateway is served (empty: off; docs/console.md) |
| MWP_CONSOLE_HOSTS        | (none)                          | more Host names the console answers to (its name behind an Ingress) |
| MWP_ACCESS_LOG_RATE      | 100                             | access-log lines/s, bursts of twice that (0: no access log) |
| MWP_MALLOC_TUNING        | true                            | `mwp serve` fixes glibc's malloc thresholds (missionweave_server/mesh/allocator.py) |

Parsed by pydantic (D176): a malformed value stops ``mwp serve`` with one line naming its variable,
e.g. ``MWP_GROUP_RATE must be a number, not 'fast'``.

TLS (docs/tls.md). A server listens with TLS when it has a certificate; clients (``mwp``, the SDK's
``ClientTLS.from_env``, a service dialing its peers) speak TLS when any client setting is set:

| variable                 | flag                  | meaning                                                   |
|--------------------------|-----------------------|-----------------------------------------------------------|
| MWP_TLS_CERT / _KEY      | serve --tls-cert/-key | server certificate chain and private key (PEM)            |
| MWP_TLS_CLIENT_CA        | serve --tls-client-ca | require client certificates issued by this CA (mTLS)      |
| MWP_INSECURE             | serve --insecure      | allow plain text on a non-loopback listen address         |
| MWP_HEALTH_LISTEN        | serve --health-listen | extra plain-text port serving grpc.health.v1 only (probes)|
| MWP_TLS_AUTO             | serve --tls-auto      | make a throw-away mesh CA and certificates in the data dir|
| MWP_TLS                  | --tls                 | client: use TLS (the system's roots unless MWP_TLS_CA)    |
| MWP_TLS_CA               | --tls-ca              | client: CA bundle that verifies servers                   |
| MWP_TLS_CLIENT_CERT/_KEY | --tls-client-cert/-key| client: certificate and key presented for mTLS            |
| MWP_TLS_SERVER_NAME      | --tls-server-name     | client: name checked in the server certificate            |
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, get_type_hints

from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError, ValidationInfo
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUseDefault

from missionweave.kernel.env import DEFAULT_DATA_DIR, admin_key_file, env_flag
from missionweave.kernel.health_names import SERVICE_NAMES

# Where `mwp serve` serves its Prometheus metrics unless MWP_METRICS_LISTEN says otherwise.
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
DEFAULT_CONSOLE_LISTEN = "127.0.0.1:50080"

SERVICES = tuple(SERVICE_NAMES)  # authority, membership, scheduling, artifacts, gateway
NONCE_STORES = ("memory", "database")


# How Settings.from_env reads a field (D176): pydantic, through the annotations below. A field read from
# the environment is ``Annotated[<type>, Var("MWP_...") ...]``; plain construction (``Settings(...)``,
# ``dataclasses.replace``, attribute assignment) never looks at them: Settings stays a plain dataclass.
def Var(name: str) -> Any:
    """The environment variable a field is read from."""
    return Field(validation_alias=name)


def _unset_if_empty(value: object) -> object:
    """MWP_X= (set, but empty) leaves the field at its default, as if unset."""
    if value == "":
        raise PydanticUseDefault
    return value


def _flag(value: object, info: ValidationInfo) -> object:
    """A yes/no variable: missionweave.kernel.env.env_flag's spellings, and its message naming the variable."""
    if not isinstance(value, str):
        return value
    name = variables()[str(info.field_name)]
    return env_flag({name: value}, name)


def _comma_list(value: object) -> object:
    return tuple(x.strip() for x in value.split(",") if x.strip()) if isinstance(value, str) else value


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def _nonce_store(value: str) -> str:
    if value not in NONCE_STORES:
        raise ValueError(f"MWP_NONCE_STORE is one of {', '.join(NONCE_STORES)}, not {value!r}")
    return value


def _check(within: Callable[[Any], bool], message: str) -> AfterValidator:
    """A range check refusing a parsed value with ``message`` (which names the variable)."""

    def check(value: Any) -> Any:
        if not within(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


_UNSET_IF_EMPTY = BeforeValidator(_unset_if_empty)
_FLAG = BeforeValidator(_flag)


@dataclass
class Settings:
    listen: Annotated[str, Var("MWP_LISTEN")] = "127.0.0.1:50051"
    data_dir: Annotated[Path, Var("MWP_DATA_DIR")] = DEFAULT_DATA_DIR
    database_url: Annotated[str, Var("MWP_DATABASE_URL")] = ""
    authority_key: Annotated[Path | None, Var("MWP_AUTHORITY_KEY"), _UNSET_IF_EMPTY] = None
    witness_dir: Annotated[Path | None, Var("MWP_AUTHORITY_WITNESS_DIR"), _UNSET_IF_EMPTY] = None
    instance_id: Annotated[str, Var("MWP_INSTANCE_ID")] = "local"
    sqlite_synchronous: Annotated[str, Var("MWP_SQLITE_SYNCHRONOUS"), AfterValidator(str.upper)] = "FULL"
    services: Annotated[
        tuple[str, ...], Var("MWP_SERVICES"), BeforeValidator(_comma_list), _UNSET_IF_EMPTY
    ] = SERVICES
    # From MWP_<SERVICE>_ADDR, one variable a service (Settings.from_env).
    peers: dict[str, str] = field(default_factory=dict)
    # The address peers dial to reach this process (named in NOT_OWNER answers); default: listen.
    advertise: Annotated[str, Var("MWP_ADVERTISE_ADDR")] = ""
    # How long an Authority's hold on a Group outlives its last append: after that another shard
    # may take the Group over (fenced by the writer epoch).
    ownership_lease_s: Annotated[float, Var("MWP_OWNERSHIP_LEASE_S")] = 30.0
    # How often an Authority shard says it is up and hands the Groups it should not hold to the shard
    # that should (rebalance.py); 0: never. Off for one instance; the split launcher and the
    # Kubernetes manifests turn it on for their shards (SHARD_REBALANCE_S).
    rebalance_interval_s: Annotated[float, Var("MWP_REBALANCE_INTERVAL_S")] = 0.0
    # Processes of one mesh share this id; a data dir held by another mesh is refused (mesh.lock).
    mesh_id: Annotated[str, Var("MWP_MESH_ID")] = ""
    # Addresses (besides its own) a call proof may name as its audience: where clients dial the mesh.
    audience: Annotated[str, Var("MWP_AUDIENCE")] = ""
    mesh_token_file: Annotated[Path | None, Var("MWP_MESH_TOKEN_FILE"), _UNSET_IF_EMPTY] = None
    # Where accepted proofs' nonces are remembered (missionweave_server/storage/replay.py, D118, D168): "database",
    # also in the database every replica of a service shares, so a proof accepted by one replica, or
    # by this process before a restart, is a replay; "memory", this process only: an explicit opt-out,
    # unsafe across restarts (a proof accepted just before one is accepted again after it).
    nonce_store: Annotated[
        str,
        Var("MWP_NONCE_STORE"),
        _UNSET_IF_EMPTY,
        BeforeValidator(_lower),  # (before-validators run last first)
        AfterValidator(_nonce_store),
    ] = "database"
    log_level: Annotated[str, Var("MWP_LOG_LEVEL")] = "info"
    log_format: Annotated[str, Var("MWP_LOG_FORMAT")] = "json"
    grace_seconds: float = 10.0
    # Per-Group ingress token bucket (MW-8-16): sustained commands/s and burst. One Group's
    # sustained rate is bounded by its serial decisions anyway; this keeps a flood from filling
    # the shared group-commit queue ahead of every other Group.
    group_rate: Annotated[float, Var("MWP_GROUP_RATE")] = 200.0
    group_burst: Annotated[float, Var("MWP_GROUP_BURST")] = 400.0
    # Group commit under load (D51): a batch waits up to commit_linger_ms for more appends, and
    # goes once none arrived for commit_idle_ms or commit_batch are waiting; a lone append never waits.
    commit_linger_ms: Annotated[float, Var("MWP_COMMIT_LINGER_MS")] = 8.0
    commit_idle_ms: Annotated[float, Var("MWP_COMMIT_IDLE_MS")] = 1.0  # D149
    commit_batch: Annotated[int, Var("MWP_COMMIT_BATCH")] = 32
    # Processes that check command signatures off the event loop (D52); 0 checks them inline.
    verify_workers: Annotated[int, Var("MWP_VERIFY_WORKERS")] = 1
    # TLS, server side (missionweave_server/edge/channels.py ServerTLS): certificate and key; a client CA
    # requires client certificates (mTLS). Plain text on a non-loopback address needs `insecure`.
    tls_cert: Annotated[Path | None, Var("MWP_TLS_CERT"), _UNSET_IF_EMPTY] = None
    tls_key: Annotated[Path | None, Var("MWP_TLS_KEY"), _UNSET_IF_EMPTY] = None
    tls_client_ca: Annotated[Path | None, Var("MWP_TLS_CLIENT_CA"), _UNSET_IF_EMPTY] = None
    insecure: Annotated[bool, Var("MWP_INSECURE"), _FLAG] = False
    # An extra plain-text listener serving only grpc.health.v1 (kubelet's gRPC probes speak no TLS).
    health_listen: Annotated[str, Var("MWP_HEALTH_LISTEN")] = ""
    # `mwp serve --tls-auto`: a throw-away mesh CA and certificates in <data dir>/tls (mesh/certs.py).
    tls_auto: Annotated[bool, Var("MWP_TLS_AUTO"), _FLAG] = False
    # TLS, client side (ClientTLS): on with `tls` or any of the others; also how a service dials its peers.
    tls: Annotated[bool, Var("MWP_TLS"), _FLAG] = False
    tls_ca: Annotated[Path | None, Var("MWP_TLS_CA"), _UNSET_IF_EMPTY] = None
    tls_client_cert: Annotated[Path | None, Var("MWP_TLS_CLIENT_CERT"), _UNSET_IF_EMPTY] = None
    tls_client_key: Annotated[Path | None, Var("MWP_TLS_CLIENT_KEY"), _UNSET_IF_EMPTY] = None
    tls_server_name: Annotated[str, Var("MWP_TLS_SERVER_NAME")] = ""
    # The gateway's bounds on its streams (docs/gateway.md "Limits", missionweave_server/services/gateway/limits.py).
    gateway_max_streams: Annotated[int, Var("MWP_GATEWAY_MAX_STREAMS")] = 10_000
    gateway_max_streams_per_identity: Annotated[int, Var("MWP_GATEWAY_MAX_STREAMS_PER_IDENTITY")] = 8
    gateway_hello_timeout_s: Annotated[float, Var("MWP_GATEWAY_HELLO_TIMEOUT_S")] = 10.0
    gateway_stall_timeout_s: Annotated[float, Var("MWP_GATEWAY_STALL_TIMEOUT_S")] = 30.0
    gateway_stream_buffer_bytes: Annotated[int, Var("MWP_GATEWAY_STREAM_BUFFER_BYTES")] = 1024 * 1024
    # The bytes of blobs one identity may hold in the artifact store (issue 13 item 3, D77);
    # 0: no quota. Operators and mesh services have none.
    artifact_quota_bytes: Annotated[
        int,
        Var("MWP_ARTIFACT_QUOTA_BYTES"),
        _check(lambda n: n >= 0, "MWP_ARTIFACT_QUOTA_BYTES is a number of bytes (0: no quota)"),
    ] = 10 * 1024**3
    # The Organization's collaboration policy: how deep below its scope root a delegated WorkItem
    # may sit (MW-9.1-12); grants ask for at most this.
    max_delegation_depth: Annotated[
        int,
        Var("MWP_MAX_DELEGATION_DEPTH"),
        _check(lambda d: 0 <= d <= 64, "MWP_MAX_DELEGATION_DEPTH is a depth of 0..64"),
    ] = 3
    # The Organization's default maximum depth of a Mission tree (MW-14-05; root = 0): a deeper
    # child needs a recorded approval (MW-14-06).
    max_mission_depth: Annotated[
        int,
        Var("MWP_MAX_MISSION_DEPTH"),
        _check(lambda d: 1 <= d <= 64, "MWP_MAX_MISSION_DEPTH is a depth of 1..64"),
    ] = 2
    # How often an Authority reads the cross-Group outbox besides when its own appends wrote to it
    # (docs/subtasks.md); 0: this instance delivers no cross-Group links (others do).
    link_relay_poll_ms: Annotated[
        int,
        Var("MWP_LINK_RELAY_POLL_MS"),
        _check(
            lambda ms: ms >= 0,
            "MWP_LINK_RELAY_POLL_MS is a number of milliseconds (0: deliver no links here)",
        ),
    ] = 1000
    # Where this process serves its Prometheus metrics (missionweave_server/observability/metrics.py); "" serves none.
    # Off in a bare Settings() (tests start many meshes in one process); from_env, as `mwp serve`
    # reads it, defaults to DEFAULT_METRICS_LISTEN.
    metrics_listen: Annotated[str, Var("MWP_METRICS_LISTEN"), AfterValidator(str.strip)] = ""
    # Where the process serving the gateway serves the web console (missionweave_server/console, docs/console.md);
    # "" serves none. Off in a bare Settings(); from_env defaults to DEFAULT_CONSOLE_LISTEN.
    console_listen: Annotated[str, Var("MWP_CONSOLE_LISTEN"), AfterValidator(str.strip)] = ""
    # Host headers the console answers to besides its own address (its name behind an Ingress).
    console_hosts: Annotated[tuple[str, ...], Var("MWP_CONSOLE_HOSTS"), BeforeValidator(_comma_list)] = ()
    # Access-log lines a second at most (bursts of twice that); 0 writes none (missionweave_server/edge/access_log.py).
    access_log_rate: Annotated[
        float,
        Var("MWP_ACCESS_LOG_RATE"),
        _check(lambda r: r >= 0, "MWP_ACCESS_LOG_RATE is a number of lines a second (0: no access log)"),
    ] = 100.0
    # Whether `mwp serve` fixes glibc's malloc thresholds for its process (missionweave_server/mesh/allocator.py, D148).
    malloc_tuning: Annotated[bool, Var("MWP_MALLOC_TUNING"), _FLAG] = True

    @property
    def db_url(self) -> str:
        from missionweave_server.storage.db import sqlite_url

        return self.database_url or sqlite_url(self.data_dir)

    @property
    def authority_key_path(self) -> Path:
        return self.authority_key or self.data_dir / "keys" / "authority.key"

    @property
    def witness_dir_path(self) -> Path:
        """Where the Authority keeps its witness of the store: worth most on another volume than the database."""
        return self.witness_dir or self.data_dir / "witness"

    @property
    def mesh_token_path(self) -> Path:
        return self.mesh_token_file or self.data_dir / "keys" / "mesh.token"

    @property
    def audiences(self) -> list[str]:
        """What call proofs made for this mesh name: MWP_AUDIENCE's addresses and this process's own."""
        return [a for a in (*self.audience.split(","), self.listen, self.advertise) if a.strip()]

    @property
    def admin_key_path(self) -> Path:
        return admin_key_file(self.data_dir)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings the MWP_* variables of ``env`` (default: os.environ) give; a malformed one is a
        ValueError of one line naming it, e.g. "MWP_GROUP_RATE must be a number, not 'fast'"."""
        e = os.environ if env is None else env
        values: dict[str, object] = {k: v for k, v in e.items() if k.startswith("MWP_")}
        values.setdefault("MWP_METRICS_LISTEN", DEFAULT_METRICS_LISTEN)
        values.setdefault("MWP_CONSOLE_LISTEN", DEFAULT_CONSOLE_LISTEN)
        values["peers"] = {
            name: e[f"MWP_{name.upper()}_ADDR"] for name in SERVICES if e.get(f"MWP_{name.upper()}_ADDR")
        }
        try:
            return _from_variables().validate_python(values)
        except ValidationError as refused:
            raise ValueError("; ".join(_refusal(error) for error in refused.errors())) from None


@cache
def _from_variables() -> TypeAdapter[Settings]:
    return TypeAdapter(Settings)


@cache
def variables() -> dict[str, str]:
    """Each field read from the environment, and its variable: {"group_rate": "MWP_GROUP_RATE", ...}."""
    return {
        name: meta.validation_alias
        for name, hint in get_type_hints(Settings, include_extras=True).items()
        for meta in getattr(hint, "__metadata__", ())
        if isinstance(meta, FieldInfo) and isinstance(meta.validation_alias, str)
    }


_EXPECTED = {"int_parsing": "a whole number", "float_parsing": "a number"}


def _refusal(error: ErrorDetails) -> str:
    """One pydantic error as the operator reads it: the variable, what it must be, what it was."""
    name = ".".join(str(part) for part in error["loc"])
    if error["type"] == "value_error":  # a check of ours: its message names the variable
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if error["type"] in _EXPECTED:
        return f"{name} must be {_EXPECTED[error['type']]}, not {error['input']!r}"
    return f"{name}: {error['msg']}, not {error['input']!r}"
