"""``mwp artifact get``: downloads a blob, or a byte range of it, into a temporary file next to the
output, renamed onto it only once the whole stream arrived (the server verifies the blob) and, for a
full download, re-hashed locally to the requested digest; on a mismatch the output is not written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from missionweave.cli.artifact.arguments import digest_text
from missionweave.cli.artifact.transfer import TransferError, progress, receive, replacing
from missionweave.cli.common import emit, reading


async def cmd_get(args: argparse.Namespace) -> int:
    digest, output = args.digest, Path(args.output)
    total = args.length or max(0, digest.size_bytes - args.offset)
    try:
        with replacing(output) as fh, progress(args, "get", total) as bar:
            async with reading(args) as mesh:
                rehashed = await receive(mesh, digest, args.offset, args.length, fh.write, bar)
    except TransferError as err:
        raise TransferError(f"refused: {err}; {output} was not written") from None
    check = "re-hashed locally" if rehashed else "range; the server verified the whole blob"
    lines = [f"wrote {output}: {total} bytes of {digest_text(digest)} from offset {args.offset} ({check})"]
    document = {
        "output": str(output),
        "digest": digest_text(digest),
        "offset": args.offset,
        "length": total,
        "rehashed": rehashed,
    }
    emit(args, lines, document)
    return 0
