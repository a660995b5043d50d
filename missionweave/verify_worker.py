"""Child process of ``missionweave.verifier``: checks batches of Ed25519 signatures.

Reads frames from stdin and answers each with one frame on stdout, in order, until stdin closes.
It imports nothing of the service on purpose (quick to start, nothing to share but the pipe).

    request  = u32 body length, then body: u32 count, count x (32-byte public key, 64-byte
               signature, u32 message length, message)
    response = u32 count, then count bytes: 1 where the signature verifies, else 0
"""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO

from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

U32 = struct.Struct("<I")
ITEM = struct.Struct("<32s64sI")


def verify_batch(body: bytes) -> bytes:
    """The response frame for one request body (see the module docstring)."""
    (count,) = U32.unpack_from(body, 0)
    offset = U32.size
    verdicts = bytearray(count)
    for i in range(count):
        key, sig, length = ITEM.unpack_from(body, offset)
        offset += ITEM.size
        message = body[offset : offset + length]
        offset += length
        try:
            crypto_sign_open(sig + message, key)
            verdicts[i] = 1
        except (BadSignatureError, ValueError):
            pass
    return U32.pack(count) + bytes(verdicts)


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    while True:
        header = source.read(U32.size)
        if len(header) < U32.size:
            return  # the parent closed the pipe (or went away): nothing left to answer
        (length,) = U32.unpack(header)
        body = source.read(length)
        if len(body) < length:
            return
        sink.write(verify_batch(body))
        sink.flush()


def main() -> None:
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer)
    except (BrokenPipeError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
