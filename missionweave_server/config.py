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
| MWP_AUTHORITY_ADDR, ...  | (unset)                         | peer addresses when services run apart         |
| MWP_ADVERTISE_ADDR       | the listen address              | how peers reach this process (NOT_OWNER)       |
| MWP_MESH_ID              | (unset)                         | processes of one mesh share a data dir          |
| MWP_OWNERSHIP_LEASE_S    | 30                              | a Group's owner may be replaced this long after its last append |
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
| MWP_ACCESS_LOG_RATE      | 100                             | access-log lines/s, bursts of twice that (0: no access log) |
| MWP_MALLOC_TUNING        | true                            | `mwp serve` fixes glibc's malloc thresholds (missionweave_server/mesh/allocator.py) |

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
from dataclasses import dataclass, field
from pathlib import Path

from missionweave.kernel.env import DEFAULT_DATA_DIR, admin_key_file
from missionweave.kernel.env import env_flag as _flag
from missionweave.kernel.env import env_path as _path

# Where `mwp serve` serves its Prometheus metrics unless MWP_METRICS_LISTEN says otherwise.
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"

SERVICES = ("authority", "membership", "scheduling", "artifacts", "gateway")
NONCE_STORES = ("memory", "database")


@dataclass
class Settings:
    listen: str = "127.0.0.1:50051"
    data_dir: Path = DEFAULT_DATA_DIR
    database_url: str = ""
    authority_key: Path | None = None
    witness_dir: Path | None = None
    instance_id: str = "local"
    sqlite_synchronous: str = "FULL"
    services: tuple[str, ...] = SERVICES
    peers: dict[str, str] = field(default_factory=dict)
    # The address peers dial to reach this process (named in NOT_OWNER answers); default: listen.
    advertise: str = ""
    # How long an Authority's hold on a Group outlives its last append: after that another shard
    # may take the Group over (fenced by the writer epoch).
    ownership_lease_s: float = 30.0
    # Processes of one mesh share this id; a data dir held by another mesh is refused (mesh.lock).
    mesh_id: str = ""
    # Addresses (besides its own) a call proof may name as its audience: where clients dial the mesh.
    audience: str = ""
    mesh_token_file: Path | None = None
    # Where accepted proofs' nonces are remembered (missionweave_server/storage/replay.py, D118, D168): "database",
    # also in the database every replica of a service shares, so a proof accepted by one replica, or
    # by this process before a restart, is a replay; "memory", this process only: an explicit opt-out,
    # unsafe across restarts (a proof accepted just before one is accepted again after it).
    nonce_store: str = "database"
    log_level: str = "info"
    log_format: str = "json"
    grace_seconds: float = 10.0
    # Per-Group ingress token bucket (MW-8-16): sustained commands/s and burst. One Group's
    # sustained rate is bounded by its serial decisions anyway; this keeps a flood from filling
    # the shared group-commit queue ahead of every other Group.
    group_rate: float = 200.0
    group_burst: float = 400.0
    # Group commit under load (D51): a batch waits up to commit_linger_ms for more appends, and
    # goes once none arrived for commit_idle_ms or commit_batch are waiting; a lone append never waits.
    commit_linger_ms: float = 8.0
    commit_idle_ms: float = 1.0  # D149
    commit_batch: int = 32
    # Processes that check command signatures off the event loop (D52); 0 checks them inline.
    verify_workers: int = 1
    # TLS, server side (missionweave_server/edge/channels.py ServerTLS): certificate and key; a client CA
    # requires client certificates (mTLS). Plain text on a non-loopback address needs `insecure`.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    insecure: bool = False
    # An extra plain-text listener serving only grpc.health.v1 (kubelet's gRPC probes speak no TLS).
    health_listen: str = ""
    # `mwp serve --tls-auto`: a throw-away mesh CA and certificates in <data dir>/tls (mesh/certs.py).
    tls_auto: bool = False
    # TLS, client side (ClientTLS): on with `tls` or any of the others; also how a service dials its peers.
    tls: bool = False
    tls_ca: Path | None = None
    tls_client_cert: Path | None = None
    tls_client_key: Path | None = None
    tls_server_name: str = ""
    # The gateway's bounds on its streams (docs/gateway.md "Limits", missionweave_server/services/gateway/limits.py).
    gateway_max_streams: int = 10_000
    gateway_max_streams_per_identity: int = 8
    gateway_hello_timeout_s: float = 10.0
    gateway_stall_timeout_s: float = 30.0
    gateway_stream_buffer_bytes: int = 1024 * 1024
    # The bytes of blobs one identity may hold in the artifact store (issue 13 item 3, D77);
    # 0: no quota. Operators and mesh services have none.
    artifact_quota_bytes: int = 10 * 1024**3
    # The Organization's collaboration policy: how deep below its scope root a delegated WorkItem
    # may sit (MW-9.1-12); grants ask for at most this.
    max_delegation_depth: int = 3
    # The Organization's default maximum depth of a Mission tree (MW-14-05; root = 0): a deeper
    # child needs a recorded approval (MW-14-06).
    max_mission_depth: int = 2
    # How often an Authority reads the cross-Group outbox besides when its own appends wrote to it
    # (docs/subtasks.md); 0: this instance delivers no cross-Group links (others do).
    link_relay_poll_ms: int = 1000
    # Where this process serves its Prometheus metrics (missionweave_server/observability/metrics.py); "" serves none.
    # Off in a bare Settings() (tests start many meshes in one process); from_env, as `mwp serve`
    # reads it, defaults to DEFAULT_METRICS_LISTEN.
    metrics_listen: str = ""
    # Access-log lines a second at most (bursts of twice that); 0 writes none (missionweave_server/edge/access_log.py).
    access_log_rate: float = 100.0
    # Whether `mwp serve` fixes glibc's malloc thresholds for its process (missionweave_server/mesh/allocator.py, D148).
    malloc_tuning: bool = True

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
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if env is None else env)
        s = cls()
        s.listen = e.get("MWP_LISTEN", s.listen)
        s.data_dir = Path(e.get("MWP_DATA_DIR", str(s.data_dir)))
        s.database_url = e.get("MWP_DATABASE_URL", "")
        if e.get("MWP_AUTHORITY_KEY"):
            s.authority_key = Path(e["MWP_AUTHORITY_KEY"])
        if e.get("MWP_AUTHORITY_WITNESS_DIR"):
            s.witness_dir = Path(e["MWP_AUTHORITY_WITNESS_DIR"])
        s.instance_id = e.get("MWP_INSTANCE_ID", s.instance_id)
        s.sqlite_synchronous = e.get("MWP_SQLITE_SYNCHRONOUS", s.sqlite_synchronous).upper()
        if e.get("MWP_SERVICES"):
            s.services = tuple(x.strip() for x in e["MWP_SERVICES"].split(",") if x.strip())
        for name in SERVICES:
            addr = e.get(f"MWP_{name.upper()}_ADDR")
            if addr:
                s.peers[name] = addr
        s.advertise = e.get("MWP_ADVERTISE_ADDR", s.advertise)
        s.mesh_id = e.get("MWP_MESH_ID", s.mesh_id)
        s.audience = e.get("MWP_AUDIENCE", s.audience)
        if e.get("MWP_MESH_TOKEN_FILE"):
            s.mesh_token_file = Path(e["MWP_MESH_TOKEN_FILE"])
        s.nonce_store = e.get("MWP_NONCE_STORE", s.nonce_store).strip().lower() or s.nonce_store
        if s.nonce_store not in NONCE_STORES:
            raise ValueError(f"MWP_NONCE_STORE is one of {', '.join(NONCE_STORES)}, not {s.nonce_store!r}")
        s.ownership_lease_s = float(e.get("MWP_OWNERSHIP_LEASE_S", s.ownership_lease_s))
        s.group_rate = float(e.get("MWP_GROUP_RATE", s.group_rate))
        s.group_burst = float(e.get("MWP_GROUP_BURST", s.group_burst))
        s.commit_linger_ms = float(e.get("MWP_COMMIT_LINGER_MS", s.commit_linger_ms))
        s.commit_idle_ms = float(e.get("MWP_COMMIT_IDLE_MS", s.commit_idle_ms))
        s.commit_batch = int(e.get("MWP_COMMIT_BATCH", s.commit_batch))
        s.verify_workers = int(e.get("MWP_VERIFY_WORKERS", s.verify_workers))
        s.tls_cert = _path(e, "MWP_TLS_CERT")
        s.tls_key = _path(e, "MWP_TLS_KEY")
        s.tls_client_ca = _path(e, "MWP_TLS_CLIENT_CA")
        s.insecure = _flag(e, "MWP_INSECURE")
        s.health_listen = e.get("MWP_HEALTH_LISTEN", s.health_listen)
        s.tls_auto = _flag(e, "MWP_TLS_AUTO")
        s.tls = _flag(e, "MWP_TLS")
        s.tls_ca = _path(e, "MWP_TLS_CA")
        s.tls_client_cert = _path(e, "MWP_TLS_CLIENT_CERT")
        s.tls_client_key = _path(e, "MWP_TLS_CLIENT_KEY")
        s.tls_server_name = e.get("MWP_TLS_SERVER_NAME", s.tls_server_name)
        s.gateway_max_streams = int(e.get("MWP_GATEWAY_MAX_STREAMS", s.gateway_max_streams))
        s.gateway_max_streams_per_identity = int(
            e.get("MWP_GATEWAY_MAX_STREAMS_PER_IDENTITY", s.gateway_max_streams_per_identity)
        )
        s.gateway_hello_timeout_s = float(e.get("MWP_GATEWAY_HELLO_TIMEOUT_S", s.gateway_hello_timeout_s))
        s.gateway_stall_timeout_s = float(e.get("MWP_GATEWAY_STALL_TIMEOUT_S", s.gateway_stall_timeout_s))
        s.gateway_stream_buffer_bytes = int(e.get("MWP_GATEWAY_STREAM_BUFFER_BYTES", s.gateway_stream_buffer_bytes))
        s.artifact_quota_bytes = int(e.get("MWP_ARTIFACT_QUOTA_BYTES", s.artifact_quota_bytes))
        if s.artifact_quota_bytes < 0:
            raise ValueError("MWP_ARTIFACT_QUOTA_BYTES is a number of bytes (0: no quota)")
        s.max_delegation_depth = int(e.get("MWP_MAX_DELEGATION_DEPTH", s.max_delegation_depth))
        if not 0 <= s.max_delegation_depth <= 64:
            raise ValueError("MWP_MAX_DELEGATION_DEPTH is a depth of 0..64")
        s.max_mission_depth = int(e.get("MWP_MAX_MISSION_DEPTH", s.max_mission_depth))
        if not 1 <= s.max_mission_depth <= 64:
            raise ValueError("MWP_MAX_MISSION_DEPTH is a depth of 1..64")
        s.link_relay_poll_ms = int(e.get("MWP_LINK_RELAY_POLL_MS", s.link_relay_poll_ms))
        if s.link_relay_poll_ms < 0:
            raise ValueError("MWP_LINK_RELAY_POLL_MS is a number of milliseconds (0: deliver no links here)")
        s.metrics_listen = e.get("MWP_METRICS_LISTEN", DEFAULT_METRICS_LISTEN).strip()
        s.access_log_rate = float(e.get("MWP_ACCESS_LOG_RATE", s.access_log_rate))
        if s.access_log_rate < 0:
            raise ValueError("MWP_ACCESS_LOG_RATE is a number of lines a second (0: no access log)")
        if "MWP_MALLOC_TUNING" in e:
            s.malloc_tuning = _flag(e, "MWP_MALLOC_TUNING")
        s.log_level = e.get("MWP_LOG_LEVEL", s.log_level)
        s.log_format = e.get("MWP_LOG_FORMAT", s.log_format)
        return s
