"""``mwp artifact ...``: put, get, stat, manifest, provenance and verify content-addressed blobs (spec 13.1).

A blob is named by its BLAKE3 hash *and* its size, written ``blake3:<64 hex>:<size>`` on the command
line: the server looks blobs up by both, so the hash alone is not enough. Files are streamed in
1 MiB chunks in both directions and never held whole in memory: ``put`` hashes the file in one
streaming pass, then uploads it reading chunk by chunk; ``get`` writes to a temporary file next to
the output and renames it only after the whole (server-verified) stream arrived and, for a full
download, re-hashed locally to the requested digest.

``put --manifest-for GROUP`` signs an ArtifactManifest (MW-13.1-03) with the actor's session key:
the same ``--as/--key`` session the other actor commands use. docs/cli.md documents every flag.

The package, one module per command: put.py, get.py, stat.py, manifest.py, provenance.py and
verify.py; arguments.py holds the argument types (digests), transfer.py the streaming, hashing,
safe file replacement and progress meter they share. ``register`` (here) adds the commands.
"""

from __future__ import annotations

import argparse

from missionweave import __version__
from missionweave.cli.artifact.arguments import non_negative, parse_component, parse_digest, public_key
from missionweave.cli.artifact.get import cmd_get
from missionweave.cli.artifact.manifest import cmd_manifest
from missionweave.cli.artifact.provenance import DIRECTIONS, cmd_provenance
from missionweave.cli.artifact.put import CLASSIFICATIONS, cmd_put
from missionweave.cli.artifact.stat import cmd_stat
from missionweave.cli.artifact.verify import cmd_verify
from missionweave.cli.common import add_json_flag, add_reader_flags

DIGEST_HELP = "blake3:<64 hex>:<size in bytes> (the size is part of the name)"


def _digest_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("digest", type=parse_digest, metavar="DIGEST", help=DIGEST_HELP)


def _progress_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--progress", action="store_true", help="always show the progress bar on stderr")


def _add_put(art: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = art.add_parser(
        "put", help="upload a file (streamed, verified by the store); optionally with a signed manifest"
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--media-type",
        help="RFC 6838 media type (default: guessed from the name, else application/octet-stream)",
    )
    _progress_flag(p)
    add_json_flag(p)
    m = p.add_argument_group("signed manifest (MW-13.1-03)")
    m.add_argument("--manifest-for", metavar="GROUP", help="sign a manifest for this Group's Mission")
    m.add_argument("--work-item", help="the WorkItem that produced it")
    m.add_argument("--as", dest="actor", help="the producer's identity id")
    m.add_argument("--key", help="the producer's key file (the session is saved next to it)")
    m.add_argument(
        "--source",
        action="append",
        type=parse_digest,
        metavar="DIGEST",
        help="a source Artifact (repeatable)",
    )
    m.add_argument("--classification", choices=sorted(CLASSIFICATIONS), default="internal")
    m.add_argument("--schema", default="none", help="schema id (default: none)")
    m.add_argument("--agent-card-version", default="1", help="the producer's Agent Card version (default: 1)")
    m.add_argument(
        "--component",
        action="append",
        type=parse_component,
        metavar="KIND:NAME:VERSION",
        help=f"tool|model|capability (repeatable; default tool:mwp-cli:{__version__})",
    )
    m.add_argument(
        "--retrieval-uri", help="where a copy can be fetched (default mwp://<target>/blake3:<hex>)"
    )
    m.add_argument("--lease-id", help="the execution lease it was produced under")
    m.add_argument("--ownership-epoch", type=int, default=0, help="the ownership epoch it was produced under")
    p.set_defaults(func=cmd_put)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    art = sub.add_parser(
        "artifact", help="content-addressed Artifacts: put, get, stat, manifest, provenance, verify"
    )
    arts = art.add_subparsers(dest="sub", required=True)
    _add_put(arts)

    g = arts.add_parser("get", help="download a blob (or a byte range) to a file, verified")
    _digest_arg(g)
    g.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="written only once complete and verified"
    )
    g.add_argument("--offset", type=non_negative, default=0, help="first byte (default 0)")
    g.add_argument("--length", type=non_negative, default=0, help="bytes to fetch (default 0: to the end)")
    _progress_flag(g)
    add_json_flag(g)
    add_reader_flags(g)
    g.set_defaults(func=cmd_get)

    s = arts.add_parser("stat", help="a blob's size, storage time, last verification and manifest count")
    _digest_arg(s)
    add_json_flag(s)
    add_reader_flags(s)
    s.set_defaults(func=cmd_stat)

    m = arts.add_parser("manifest", help="the signed manifests stored for a blob")
    _digest_arg(m)
    m.add_argument(
        "--verify", action="store_true", help="check each DSSE signature against the producer's key"
    )
    m.add_argument(
        "--public-key",
        type=public_key,
        help="hex Ed25519 key to verify with (default: the producer's registered key)",
    )
    m.add_argument("--work-item", help="only manifests for this WorkItem")
    m.add_argument("--producer", help="only manifests by this producer")
    add_json_flag(m)
    add_reader_flags(m)
    m.set_defaults(func=cmd_manifest)

    pv = arts.add_parser("provenance", help="the provenance graph around a blob, as a tree")
    _digest_arg(pv)
    pv.add_argument("--direction", choices=sorted(DIRECTIONS), default="both")
    pv.add_argument("--depth", type=int, default=8, help="how far to walk (1..32, default 8)")
    add_json_flag(pv)
    add_reader_flags(pv)
    pv.set_defaults(func=cmd_provenance)

    v = arts.add_parser("verify", help="download each blob through the verifying path and re-hash it")
    v.add_argument("digests", nargs="+", type=parse_digest, metavar="DIGEST", help=DIGEST_HELP)
    _progress_flag(v)
    add_json_flag(v)
    add_reader_flags(v)
    v.set_defaults(func=cmd_verify)
