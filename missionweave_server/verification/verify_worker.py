"""Child process of ``missionweave_server.verification.verifier``: checks batches of Ed25519 signatures.

Reads frames from stdin and answers each with one frame on stdout, in order, until stdin closes.
It imports nothing of the service on purpose (quick to start, nothing to share but the pipe).

    request  = a frame (missionweave_server/verification/pipe_frames.py) of: u32 count, count x (32-byte public key,
               64-byte signature, u32 message length, message)
    response = a frame of count bytes: 1 where the signature verifies, else 0
"""

from __future__ import annotations

import struct
import sys
from typing import BinaryIO

from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from missionweave_server.verification.pipe_frames import U32, end_with_the_pipe, frame, read_frame

ITEM = struct.Struct("<32s64sI")


def check(message: bytes, signature: bytes, public_key: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s Ed25519 signature of ``message`` (libsodium)."""
    if len(signature) != 64 or len(public_key) != 32:
        return False
    try:
        crypto_sign_open(signature + message, public_key)
        return True
    except (BadSignatureError, ValueError):
        return False


def verify_batch(body: bytes) -> bytes:
    """The response frame for one request body (see the module docstring)."""
    (count,) = U32.unpack_from(body, 0)
    offset = U32.size
    verdicts = bytearray(count)
    for i in range(count):
        key, sig, length = ITEM.unpack_from(body, offset)
        offset += ITEM.size
        verdicts[i] = check(body[offset : offset + length], sig, key)
        offset += length
    return frame(bytes(verdicts))


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    while (body := read_frame(source)) is not None:  # None: the parent closed the pipe
        sink.write(verify_batch(body))
        sink.flush()


def main() -> None:
    end_with_the_pipe()
    try:
        serve(sys.stdin.buffer, sys.stdout.buffer)
    except (BrokenPipeError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
