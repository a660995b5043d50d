"""The outgoing side of one agent stream: stream-level frames first, then the subscriptions' frames
(EVENT, FLOW, ...) interleaved fairly across Groups by deficit round robin over their bytes
(MW-8-16, MW-8-17). A Group's own frames keep their order.

Every Group has its own short queue, so a Group that produces faster than the agent reads fills
only its own queue and then waits (its subscription stops reading the log): the memory a stalled
agent costs is bounded by (Groups x ``frames_per_group``) frames, never by the log, and by
``max_bytes`` in all (producers wait while the queued frames reach it; an empty outbox always takes
one frame, however large, so a frame bigger than the budget still goes). Deficit round
robin (Shreedhar & Varghese) gives each backlogged Group the same number of bytes per round
whatever its frame sizes, so a Group sending big batches cannot crowd out one sending small ones.

With ``max_events_per_frame``, an EVENT frame put behind a queued EVENT frame of the same
subscription that it continues is merged into it (up to that many events, and while the merged
frame stays within one quantum, so neither the fairness nor the memory a stalled agent costs
changes: a queue still holds ``frames_per_group`` frames, and no merge makes one past a quantum): a Group whose agent
reads slower than the Group appends goes out in fewer, larger frames, each costing the gateway one
stream write and the agent one read and one signature check (a frame is one chain), instead of one
per event. The merged frame covers exactly the sequences of both, so credits are unchanged.
"""

from __future__ import annotations

import asyncio
from collections import deque

from missionweave.v1 import gateway_service_pb2 as pb

QUANTUM_BYTES = 16 * 1024
FRAMES_PER_GROUP = 2
CONTROL_FRAMES = 256


class Outbox:
    def __init__(
        self,
        *,
        quantum: int = QUANTUM_BYTES,
        frames_per_group: int = FRAMES_PER_GROUP,
        control_frames: int = CONTROL_FRAMES,
        max_bytes: int | None = None,
        max_events_per_frame: int = 0,
    ) -> None:
        self._quantum = quantum
        self._frames_per_group = frames_per_group
        self._control_limit = control_frames
        self._max_bytes = max_bytes
        self._max_events = max_events_per_frame
        self._bytes = 0  # of every frame queued
        self._control: deque[tuple[pb.ServerFrame, int]] = deque()
        self._events: dict[str, deque[tuple[pb.ServerFrame, int]]] = {}
        self._active: deque[str] = deque()  # Groups with queued frames, in round-robin order
        self._deficit: dict[str, int] = {}
        self._ready = asyncio.Event()  # something to send, or the end
        self._room = asyncio.Event()  # a frame left (or the end): producers re-check their limit
        self._ended = False

    # ------------------------------------------------------------ producers

    async def put_control(self, frame: pb.ServerFrame) -> None:
        size = frame.ByteSize()
        while not self._ended and (len(self._control) >= self._control_limit or self._over(size)):
            await self._wait_for_room()
        if not self._ended:
            self._control.append((frame, size))
            self._bytes += size
            self._ready.set()

    async def put_group(self, group_id: str, frame: pb.ServerFrame) -> None:
        """Queue a frame of one of ``group_id``'s subscriptions; waits while that Group's queue is full."""
        size = frame.ByteSize()
        if self._merged(group_id, frame, size):
            return
        while not self._ended and (
            len(self._events.get(group_id, ())) >= self._frames_per_group or self._over(size)
        ):
            await self._wait_for_room()
        if self._ended:
            return
        queue = self._events.setdefault(group_id, deque())
        if not queue:
            self._active.append(group_id)
            self._deficit.setdefault(group_id, 0)
        queue.append((frame, size))
        self._bytes += size
        self._ready.set()

    def _merged(self, group_id: str, frame: pb.ServerFrame, size: int) -> bool:
        """Merges ``frame`` into the last frame queued for ``group_id`` if that is an EVENT frame of
        the same subscription that ``frame`` continues, within the event and byte limits."""
        queue = self._events.get(group_id)
        if not self._max_events or not queue or self._ended or frame.WhichOneof("frame") != "event":
            return False
        queued, queued_size = queue[-1]
        before, after = queued.event, frame.event
        if (
            queued.WhichOneof("frame") != "event"
            or before.subscription_id != after.subscription_id
            or before.last_sequence + 1 != after.first_sequence
            or len(before.events) + len(after.events) > self._max_events
            or queued_size + size > self._quantum
            or self._over(size)
        ):
            return False
        before.events.extend(after.events)
        before.skipped.extend(after.skipped)
        before.last_sequence = after.last_sequence
        before.head_sequence = max(before.head_sequence, after.head_sequence)
        before.credits_remaining = after.credits_remaining
        merged_size = queued.ByteSize()
        queue[-1] = (queued, merged_size)
        self._bytes += merged_size - queued_size
        self._ready.set()
        return True

    def _over(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes would take the queued bytes past the budget (never when
        nothing is queued)."""
        return self._max_bytes is not None and self._bytes > 0 and self._bytes + size > self._max_bytes

    def force_control(self, frame: pb.ServerFrame) -> None:
        """Queue a stream-level frame now, whatever the limits and even after ``end``: the one frame
        that refuses a stream before anything else was queued."""
        size = frame.ByteSize()
        self._control.append((frame, size))
        self._bytes += size
        self._ready.set()

    async def _wait_for_room(self) -> None:
        self._room.clear()
        await self._room.wait()

    def end(self, *, drop: bool = False) -> None:
        """No more frames: ``get`` returns None once what is queued is sent (at once with ``drop``:
        the dropped frames were never sent, so no cursor covers them and they are replayed)."""
        self._ended = True
        if drop:
            self._control.clear()
            self._events.clear()
            self._active.clear()
            self._deficit.clear()
            self._bytes = 0
        self._ready.set()
        self._room.set()

    # ------------------------------------------------------------ consumer

    async def get(self) -> pb.ServerFrame | None:
        """The next frame to write, or None when the stream is to end."""
        taken = await self.get_sized()
        return None if taken is None else taken[0]

    async def get_sized(self) -> tuple[pb.ServerFrame, int] | None:
        """``get``, with the frame's size in bytes."""
        while True:
            taken = self.take_ready()
            if taken is not None:
                return taken
            if self._ended:
                return None
            self._ready.clear()
            await self._ready.wait()

    def take_ready(self, max_size: int | None = None) -> tuple[pb.ServerFrame, int] | None:
        """The frame ``get`` would return next, with its size, if one is queued and it is at most
        ``max_size`` bytes; None otherwise. Never waits: what joins a batch already being sent."""
        taken = self._next(max_size)
        if taken is not None:
            self._room.set()
        return taken

    def _next(self, max_size: int | None = None) -> tuple[pb.ServerFrame, int] | None:
        if self._control:
            frame, size = self._control[0]
            if max_size is not None and size > max_size:
                return None
            self._control.popleft()
            self._bytes -= size
            return frame, size
        while self._active:
            group_id = self._active[0]
            queue = self._events[group_id]
            frame, size = queue[0]
            if self._deficit[group_id] < size:
                # Not enough credit this round: top up and let the next Group go first.
                self._deficit[group_id] += self._quantum
                self._active.rotate(-1)
                continue
            if max_size is not None and size > max_size:
                return None
            self._deficit[group_id] -= size
            self._bytes -= size
            queue.popleft()
            if not queue:
                self._active.popleft()
                del self._events[group_id]
                del self._deficit[group_id]  # an idle Group does not bank credit
            return frame, size
        return None

    # ------------------------------------------------------------ introspection

    @property
    def queued_frames(self) -> int:
        return len(self._control) + sum(len(q) for q in self._events.values())

    @property
    def queued_bytes(self) -> int:
        return self._bytes
