"""Ed25519 verification of command signatures, off the event loop (docs/decisions.md D52).

The Authority's event loop is the one saturated core under load (gRPC, asyncio and the decider
all run on it), while a libsodium check costs ~50 µs of it per command. ``SignatureVerifier``
sends the checks, in batches, to worker processes over pipes (``verify_worker.py``): the loop pays
for packing a batch and reading back one byte per signature, and the other core does the maths.
A thread would not do: each check would have to win the GIL back from the busy loop.

Batches form by themselves: each worker has at most one batch outstanding, and whatever arrives
meanwhile goes as the next batch when the answer comes back. With no workers (``workers=0``), or
when every worker has died, checks run inline, so a verdict is never lost nor guessed: a worker
that dies takes no answer with it (its outstanding checks are redone inline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field

from missionweave.kernel.signing import pae
from missionweave.v1 import common_pb2
from missionweave_server.verification.pipe_frames import U32, child_command, frame, read_frame_async
from missionweave_server.verification.verify_worker import ITEM
from missionweave_server.verification.verify_worker import check as verify_inline

log = logging.getLogger("missionweave_server.verification.verifier")

# Bounds one frame (and so the latency a check can wait behind): about 2 ms of libsodium work.
MAX_BATCH = 128
CLOSE_TIMEOUT_S = 5.0
# How long a check waits for others to share its frame when a worker is idle. Commands reach the
# loop one by one; without the wait most frames carried one check and cost the loop as much as the
# check itself (measured: 52 µs per check alone, 7-15 µs in frames of 8-64).
GATHER_S = 0.001


@dataclass
class _Check:
    future: asyncio.Future[bool]
    message: bytes
    signature: bytes
    public_key: bytes


@dataclass
class _Worker:
    process: asyncio.subprocess.Process
    in_flight: deque[list[_Check]] = field(default_factory=deque)
    reader: asyncio.Task[None] | None = None
    alive: bool = True


class SignatureVerifier:
    def __init__(self, workers: int = 0, *, gather_s: float = GATHER_S) -> None:
        self.workers_wanted = workers
        self.gather_s = gather_s
        self._timer: asyncio.TimerHandle | None = None
        self._workers: list[_Worker] = []
        self._pending: list[_Check] = []
        self._next = 0
        self.batches = 0  # frames sent to workers (for tests and benchmarks)
        self.inline = 0  # checks done on the loop

    @property
    def workers(self) -> int:
        return sum(w.alive for w in self._workers)

    async def start(self) -> None:
        for _ in range(self.workers_wanted):
            process = await asyncio.create_subprocess_exec(
                *child_command("missionweave_server.verification.verify_worker"),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            worker = _Worker(process)
            worker.reader = asyncio.create_task(
                self._read_answers(worker), name=f"verify-worker-{process.pid}"
            )
            self._workers.append(worker)
        if self._workers:
            log.info("signature verification workers started", extra={"workers": len(self._workers)})

    async def close(self) -> None:
        """Answer every check still waiting, then stop the workers."""
        workers, self._workers = self._workers, []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for worker in workers:
            if worker.alive:
                self._lost(worker, quiet=True)
            if worker.reader is not None:
                worker.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker.reader
            if worker.process.stdin is not None:
                worker.process.stdin.close()
            try:
                await asyncio.wait_for(worker.process.wait(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                worker.process.kill()
                await worker.process.wait()
        self._answer_inline(self._pending)
        self._pending = []

    async def verify_envelope(self, envelope: common_pb2.SignedEnvelope, public_key: bytes) -> bool:
        """Whether the envelope's first signature verifies with ``public_key`` over its DSSE PAE."""
        if not envelope.signatures:
            return False
        return await self.verify(
            pae(envelope.payload_type, envelope.payload), envelope.signatures[0].sig, public_key
        )

    async def verify(self, message: bytes, signature: bytes, public_key: bytes) -> bool:
        if len(signature) != 64 or len(public_key) != 32:
            return False
        if not self.workers:
            self.inline += 1
            return verify_inline(message, signature, public_key)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append(_Check(future, message, signature, public_key))
        if len(self._pending) == 1 and self._timer is None:
            self._timer = loop.call_later(self.gather_s, self._dispatch)
        return await future

    async def verify_many(self, checks: list[tuple[bytes, bytes, bytes]]) -> list[bool]:
        """Verdicts for many (message, signature, public key) checks at once, in order: the
        Authority's check of a log it loads or serves. One future per check, no task, and the
        frames go at once (no gathering wait: the batch is already here)."""
        if not self.workers:
            self.inline += len(checks)
            return [verify_inline(m, s, k) for m, s, k in checks]
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[bool]] = []
        for message, signature, public_key in checks:
            future: asyncio.Future[bool] = loop.create_future()
            if len(signature) != 64 or len(public_key) != 32:
                future.set_result(False)
            else:
                self._pending.append(_Check(future, message, signature, public_key))
            futures.append(future)
        if self._pending:
            if self._timer is not None:
                self._timer.cancel()
            self._dispatch()
        return list(await asyncio.gather(*futures))

    def _dispatch(self) -> None:
        """Give waiting checks to an idle worker; busy ones take them when they answer."""
        self._timer = None
        alive = [w for w in self._workers if w.alive]
        if not alive:
            self._answer_inline(self._pending)
            self._pending = []
            return
        for _ in range(len(alive)):
            if not self._pending:
                return
            worker = alive[self._next % len(alive)]
            self._next += 1
            if not worker.in_flight:
                self._send(worker)

    def _send(self, worker: _Worker) -> None:
        batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        parts = [U32.pack(len(batch))]
        for check in batch:
            parts.append(ITEM.pack(check.public_key, check.signature, len(check.message)))
            parts.append(check.message)
        assert worker.process.stdin is not None
        worker.in_flight.append(batch)
        worker.process.stdin.write(frame(b"".join(parts)))
        self.batches += 1

    async def _read_answers(self, worker: _Worker) -> None:
        stdout = worker.process.stdout
        assert stdout is not None
        try:
            while True:
                verdicts = await read_frame_async(stdout)
                batch = worker.in_flight.popleft()
                for check, verdict in zip(batch, verdicts, strict=True):
                    if not check.future.done():
                        check.future.set_result(verdict == 1)
                if self._pending:
                    self._send(worker)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError):
            self._lost(worker)

    def _lost(self, worker: _Worker, *, quiet: bool = False) -> None:
        worker.alive = False
        if not quiet:
            log.error(
                "signature verification worker died; its checks are redone on the event loop",
                extra={
                    "pid": worker.process.pid,
                    "returncode": worker.process.returncode,
                    "workers_left": self.workers,
                },
            )
        while worker.in_flight:
            self._answer_inline(worker.in_flight.popleft())
        if self._pending:
            self._dispatch()

    def _answer_inline(self, checks: list[_Check]) -> None:
        for check in checks:
            if not check.future.done():
                self.inline += 1
                check.future.set_result(verify_inline(check.message, check.signature, check.public_key))
