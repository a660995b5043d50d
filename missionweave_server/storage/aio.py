"""asyncio helpers shared by the services."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

log = logging.getLogger("missionweave_server.storage.aio")

P = ParamSpec("P")
T = TypeVar("T")


def finish_on_cancel(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Let a database call run to its end when its caller is cancelled, then cancel the caller.

    A task cancelled inside SQLAlchemy's async pool has its connection terminated by a background
    task; with aiosqlite that task can wait forever once the engine is disposed (seen as a hung
    shutdown). On SQLite, a statement interrupted before its last row (an INSERT ... RETURNING, a
    SELECT in a transaction that wrote) leaves the closed connection holding the file's write lock
    until the garbage collector frees its cursor: every other writer fails "database is locked".
    Short database calls are cheaper to finish than to interrupt: the caller still gets its
    CancelledError, right after the call returns the connection to the pool; a failure of the call
    meanwhile is logged here (one line), since no one else will read it.
    """

    @functools.wraps(fn)
    async def run_to_end(*args: P.args, **kwargs: P.kwargs) -> T:
        call = asyncio.ensure_future(fn(*args, **kwargs))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            while not call.done():  # later cancels too wait for the call: it is short, and bounded
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([call])
            failure = None if call.cancelled() else call.exception()  # retrieved: nobody else will
            if failure is not None:
                log.error(
                    "a database call failed after its caller was cancelled",
                    extra={
                        "call": getattr(fn, "__qualname__", repr(fn)),
                        "error": f"{type(failure).__name__}: {failure}",
                    },
                )
            raise

    return run_to_end


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a helper task and wait until it has ended, without swallowing a cancellation of the
    caller itself."""
    if task is None or task.done():
        return
    if not task.cancelling():  # a second cancel would interrupt the first one's clean-up
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # we are being cancelled ourselves: never swallow that
