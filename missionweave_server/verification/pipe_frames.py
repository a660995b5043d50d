"""Length-prefixed frames on the pipes between the server and its child processes.

A frame is a little-endian ``u32`` length and that many bytes. Shared by the signature worker
(``verify_worker.py``) and the SQLite writer (``missionweave_server/services/authority/writer_process.py``), both ends;
standard library only, so a child that imports it starts fast.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import sys
from typing import BinaryIO

U32 = struct.Struct("<I")


def end_with_the_pipe() -> None:
    """A child ends when its parent closes the pipe (or dies, which closes it). A Ctrl-C or SIGTERM
    reaches the whole process group: the child ignores it, so that the parent shuts it down in order
    instead of seeing it die (and taking that for a crash) in the middle of its own shutdown."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


# Runs the child's module after end_with_the_pipe: a Ctrl-C that lands while the child is still
# importing (the writer's imports take a few hundred ms) would otherwise kill it with a traceback.
_IGNORING_THEN_RUN = (
    "from missionweave_server.verification.pipe_frames import end_with_the_pipe\n"
    "end_with_the_pipe()\n"
    "import runpy\n"
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
)


def child_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args`` as a child that ends with its pipe
    (``end_with_the_pipe``) from its first statement on."""
    return [sys.executable, "-c", _IGNORING_THEN_RUN.format(module=module), *args]


def frame(body: bytes) -> bytes:
    return U32.pack(len(body)) + body


def read_frame(source: BinaryIO) -> bytes | None:
    """The next frame's body from a blocking stream; None once the other end closed it."""
    header = source.read(U32.size)
    if len(header) < U32.size:
        return None
    (length,) = U32.unpack(header)
    body = source.read(length)
    return body if len(body) == length else None


async def read_frame_async(reader: asyncio.StreamReader) -> bytes:
    """The next frame's body; ``asyncio.IncompleteReadError`` once the other end closed it."""
    (length,) = U32.unpack(await reader.readexactly(U32.size))
    return await reader.readexactly(length)
