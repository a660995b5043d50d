"""``mwp group snapshot``: operator snapshots, compaction and archival (MW-16-11, MW-7.4-01/02)."""

from __future__ import annotations

import argparse

from missionweave.cli.common import CliError, add_json_flag, add_reader_flags, emit, reading
from missionweave.kernel.signing import verify_signature
from missionweave.v1 import authority_service_pb2 as apb


async def cmd_snapshot(args: argparse.Namespace) -> int:
    request = apb.TakeSnapshotRequest(group_id=args.group, compact=args.compact, archival=args.archival)
    async with reading(args) as mesh:
        taken = await mesh.authority.TakeSnapshot(request)
        _, public_key = await mesh.authority_key()
    if not verify_signature(taken.snapshot, public_key):
        raise CliError(f"the snapshot of {args.group} does NOT verify with the Authority key")
    snapshot = apb.GroupSnapshot.FromString(taken.snapshot.payload)
    kind = "archival snapshot" if snapshot.archival else "snapshot"
    lines = [
        f"{kind} of {args.group} at sequence {taken.sequence}: signature verified",
        f"  digest blake3:{taken.digest.hex} ({taken.digest.size_bytes} bytes)",
    ]
    if args.compact:
        lines.append(
            f"  events 1..{taken.sequence} moved to the archive tier (never deleted; audits still read them)"
        )
    document = {
        "group_id": args.group,
        "sequence": taken.sequence,
        "digest": f"blake3:{taken.digest.hex}",
        "size_bytes": taken.digest.size_bytes,
        "archival": snapshot.archival,
        "compacted": args.compact,
        "verified": True,
    }
    emit(args, lines, document)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    group = sub.add_parser(
        "group", help="operator actions on a Group: snapshots and compaction"
    ).add_subparsers(dest="sub", required=True)
    s = group.add_parser("snapshot", help="take a signed snapshot of a Group (optionally compact or archive)")
    s.add_argument("--group", required=True)
    s.add_argument(
        "--compact", action="store_true", help="move the events up to the snapshot to the archive tier"
    )
    s.add_argument(
        "--archival", action="store_true", help="the final snapshot of a finished Mission (MW-7.4-02)"
    )
    add_json_flag(s)
    add_reader_flags(s)
    s.set_defaults(func=cmd_snapshot)
