"""``mwp demo``'s command line: its flags (``register``), the admin key it signs the registrations
with, and ``cmd_demo``, the thin CLI around ``run_demo``: it prints the result, or, when the mesh
refuses a command, the timeline so far and the step it stopped at before the CLI prints the reason.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path

import grpc
from nacl.signing import SigningKey

from missionweave.cli.common import CliError, add_json_flag, client_tls, emit, target, to_dict
from missionweave.cli.demo.scenario import run_demo
from missionweave.cli.demo.timeline import Timeline
from missionweave.kernel.env import admin_key_file, data_dir_of
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key
from missionweave.sdk.client import MeshClient

DEFAULT_TARGET = "127.0.0.1:50051"


def _admin_key(args: argparse.Namespace) -> SigningKey:
    path = Path(args.admin_key or admin_key_file(data_dir_of(os.environ)))
    if not path.exists():
        raise CliError(
            f"no admin key at {path} (a mesh creates it when it first starts: `make run`); see --admin-key"
        )
    return read_key(path)


def _stopped(args: argparse.Namespace, timeline: Timeline, err: grpc.aio.AioRpcError) -> None:
    """A refused command: show how far the demo got (the CLI then prints the structured reason)."""
    rejection = rejection_from_rpc_error(err)
    if rejection is None and err.code() == grpc.StatusCode.UNAVAILABLE:
        return
    document = {
        "completed": False,
        "stopped_at": timeline.step,
        "rejection": to_dict(rejection)
        if rejection is not None
        else {"code": err.code().name, "message": err.details()},
        "timeline": [asdict(e) for e in timeline.entries],
    }
    lines = ["Timeline until the refusal", *timeline.lines()] if timeline.entries else []
    emit(args, [*lines, f"mwp demo stopped at {timeline.step}"], document)


async def cmd_demo(args: argparse.Namespace) -> int:
    admin_key = _admin_key(args)
    address = target(args)
    timeline = Timeline()
    async with MeshClient(address, client_tls(args)) as mesh:
        try:
            result = await run_demo(
                mesh,
                admin_key,
                target=address,
                tls=client_tls(args),
                admin_id=args.admin_id,
                timeline=timeline,
            )
        except grpc.aio.AioRpcError as err:
            _stopped(args, timeline, err)
            raise
    flag = "" if address == DEFAULT_TARGET else f"--target {address}"
    emit(args, result.lines(flag), {"completed": True, **result.document(flag)})
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser(
        "demo", help="run a complete small Mission against a running mesh (start one with `make run`)"
    )
    # SUPPRESS keeps the global `mwp --target X demo` when `demo --target` is not given.
    d.add_argument(
        "--target",
        default=argparse.SUPPRESS,
        help=f"server address (default $MWP_TARGET or {DEFAULT_TARGET})",
    )
    d.add_argument("--admin-key", help="the Organization admin key (default <data dir>/keys/admin.key)")
    d.add_argument("--admin-id", default="admin", help="the admin identity (default admin)")
    add_json_flag(d, "one JSON document: identities, timeline, progress")
    d.set_defaults(func=cmd_demo, runs_until_stopped=True)
