"""``GroupWatch`` follows the Group's log as the MissionOwner for the whole demo: every event goes to
the timeline as it arrives, and the Coordinator waits here (``wait_for``, ``first_of``, at most
``WAIT_S`` each) for what the Workers' runtimes did.
"""

from __future__ import annotations

import asyncio

from missionweave.cli.common import CliError
from missionweave.cli.demo.timeline import Timeline
from missionweave.sdk.client import MeshClient
from missionweave.v1 import event_pb2

WAIT_S = 60.0  # the longest the Coordinator waits for a Worker to act


class GroupWatch:
    """Follows the Group's log as the MissionOwner: every event goes to the timeline as it arrives,
    and the Coordinator waits here for what the Workers' runtimes did."""

    def __init__(self, mesh: MeshClient, group_id: str, timeline: Timeline) -> None:
        self.mesh, self.group_id, self.timeline = mesh, group_id, timeline
        self.events: list[event_pb2.Event] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name=f"demo-watch-{self.group_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _follow(self) -> None:
        try:
            async for event in self.mesh.read_events(self.group_id, follow=True):
                self.timeline.record([event])
                async with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        finally:
            async with self._changed:  # a waiter learns that nothing more will come
                self._changed.notify_all()

    async def wait_for(self, payload: str, work_item_id: str = "", *, skip: int = 0) -> event_pb2.Event:
        """The ``skip``-th (from 0) event carrying ``payload`` for ``work_item_id``, once it arrived."""
        return await self.first_of((payload,), work_item_id, skip=skip)

    async def first_of(
        self, payloads: tuple[str, ...], work_item_id: str = "", offer_id: str = "", *, skip: int = 0
    ) -> event_pb2.Event:
        """The ``skip``-th (from 0) event carrying one of ``payloads`` for ``work_item_id`` (and
        ``offer_id``, where given), once it arrived."""
        payload = " or ".join(payloads)
        self.timeline.step = f"waiting for {payload} of {work_item_id or self.group_id}"

        def about(e: event_pb2.Event) -> bool:
            kind = e.WhichOneof("payload") or ""
            if kind not in payloads:
                return False
            body = getattr(e, kind)
            return (not work_item_id or getattr(body, "work_item_id", "") == work_item_id) and (
                not offer_id or getattr(body, "offer_id", "") == offer_id
            )

        def matching() -> list[event_pb2.Event]:
            return [e for e in self.events if about(e)]

        def ready() -> bool:
            return len(matching()) > skip or (self._task is not None and self._task.done())

        try:
            async with asyncio.timeout(WAIT_S), self._changed:
                await self._changed.wait_for(ready)
        except TimeoutError:
            raise CliError(f"the demo waited {WAIT_S:.0f} s for {payload} of {work_item_id}") from None
        found = matching()
        if len(found) > skip:
            return found[skip]
        assert self._task is not None
        self._task.result()  # the stream failed: its error
        raise CliError(f"the Group's event stream ended before {payload} of {work_item_id}")
