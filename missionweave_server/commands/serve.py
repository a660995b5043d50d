"""``mwp serve``: start the mesh (every service in this process, one of them, or the split topology)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from missionweave.cli.common import with_client_tls_flags
from missionweave.kernel import logs
from missionweave.kernel.health_names import SERVICE_NAMES


def cmd_serve(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `mwp` registers this command at every start.
    from missionweave_server.config import Settings
    from missionweave_server.mesh.allocator import tune_allocator
    from missionweave_server.mesh.datadir_lock import DataDirHeld, hold
    from missionweave_server.observability import grpc_core, tracing

    try:
        settings = Settings.from_env()
    except ValueError as malformed:  # an MWP_* variable that does not parse: the message names it (D176)
        print(f"mwp serve: {malformed}", file=sys.stderr)
        return 1
    if args.listen:
        settings.listen = args.listen
    if args.data_dir:
        settings.data_dir = Path(args.data_dir)
    if args.database_url:
        settings.database_url = args.database_url
    if args.service:
        settings.services = tuple(args.service)
    if args.no_console:
        args.console_listen = ""
    for name in ("tls_cert", "tls_key", "tls_client_ca", "health_listen", "metrics_listen", "console_listen"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    settings.insecure = settings.insecure or args.insecure
    settings.tls_auto = settings.tls_auto or args.tls_auto
    with_client_tls_flags(settings, args)  # how this process dials its peers
    if args.topology == "split" and not settings.mesh_id:
        settings.mesh_id = f"mesh-{os.urandom(6).hex()}"  # its children are let into the data dir by it
    try:
        lock = hold(settings.data_dir, settings.mesh_id)
    except DataDirHeld as held:
        print(f"mwp serve: {held}", file=sys.stderr)
        return 1
    # Before gRPC starts: its C core's lines become records too, in either log format.
    grpc_core.route_grpc_core(settings.log_format)
    logs.configure(settings.log_level, settings.log_format, tracing.TraceIds())
    if settings.malloc_tuning:
        tune_allocator()
    try:
        if args.topology == "split":
            from missionweave_server.mesh.topology import run_split

            return asyncio.run(run_split(settings, shards=args.shards))
        from missionweave_server.mesh.server import serve_forever

        tracing.setup(tracing.service_name_for(settings.services))  # OTEL_TRACES_EXPORTER (D107)

        if settings.tls_auto:
            from missionweave_server.mesh.certs import auto_server_tls

            ca = auto_server_tls(settings)
            print(
                f"mwp serve: TLS with a throw-away CA: clients verify the server with --tls-ca {ca}",
                file=sys.stderr,
            )
        asyncio.run(serve_forever(settings))
        return 0
    except (
        OSError,
        ValueError,
    ) as refused:  # a port in use, an unreadable key, a database that cannot be opened
        grpc_core.end_grpc_core_route()  # gRPC's lines about it first: this one is the last
        print(f"mwp serve: {refused}", file=sys.stderr)
        return 1
    finally:
        lock.release()


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("serve", help="start the mesh (all services, or --service NAME ...)")
    s.add_argument(
        "--service", action="append", choices=tuple(SERVICE_NAMES), help="run only this service (repeatable)"
    )
    s.add_argument("--listen", help="listen address (default $MWP_LISTEN or 127.0.0.1:50051)")
    s.add_argument("--data-dir", help="data directory (default $MWP_DATA_DIR or ./.missionweave)")
    s.add_argument("--database-url", help="database URL (default SQLite in the data directory)")
    s.add_argument(
        "--topology",
        choices=("single", "split"),
        default="single",
        help="single: every service in this process (default); split: each service in a process of its own, "
        "the gateway on --listen as the one address (docs/operations.md)",
    )
    s.add_argument(
        "--shards", type=int, default=1, help="with --topology split: Authority shard processes (default 1)"
    )
    t = s.add_argument_group(
        "TLS (docs/tls.md); `mwp --tls-ca ... serve` sets how this server dials its peers"
    )
    t.add_argument(
        "--tls-cert", type=Path, help="serve TLS with this certificate chain (PEM) (default $MWP_TLS_CERT)"
    )
    t.add_argument("--tls-key", type=Path, help="...and its private key (PEM) (default $MWP_TLS_KEY)")
    t.add_argument(
        "--tls-client-ca",
        type=Path,
        help="require client certificates issued by this CA (mTLS); the internal contracts then answer only "
        "certificates naming a mesh service (default $MWP_TLS_CLIENT_CA)",
    )
    t.add_argument(
        "--tls-auto",
        action="store_true",
        help="make a throw-away mesh CA and certificates in <data dir>/tls and serve TLS with them; split: "
        "mTLS between the processes (default $MWP_TLS_AUTO)",
    )
    t.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain text on an address other hosts can reach (default $MWP_INSECURE; loopback never needs it)",
    )
    t.add_argument(
        "--health-listen",
        help="also serve grpc.health.v1 alone, in plain text, on this address (probes; default $MWP_HEALTH_LISTEN)",
    )
    t.add_argument(
        "--metrics-listen",
        help="serve Prometheus metrics on this address, '' for none (default $MWP_METRICS_LISTEN or 127.0.0.1:9464)",
    )
    c = s.add_argument_group("web console (docs/console.md)")
    c.add_argument(
        "--console-listen",
        help="serve the web console on this address, where the gateway is served "
        "(default $MWP_CONSOLE_LISTEN or 127.0.0.1:50080)",
    )
    c.add_argument("--no-console", action="store_true", help="serve no web console (as --console-listen '')")
    s.set_defaults(func=cmd_serve, runs_until_stopped=True, ignores_contexts=True)
