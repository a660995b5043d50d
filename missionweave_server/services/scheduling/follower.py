"""Keeps one Worker's projection of one Group current: follows the Worker's member view of the
Group log through the Authority's internal contract (GroupLogService.FollowGroup) and folds it.

The sequences are the ones the gateway delivers to that Worker (visibility start, restricted
Conversations skipped), so the scheduler never learns more than the Worker may (MW-11.2-02); and
it asks for them in the SCHEDULING view, so the Authority sends each as scheduling metadata only,
never the signed event with its Mission content (MW-13.3-09, docs/decisions.md D120). The
projection is saved after each batch, so a restart resumes from its cursor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from missionweave.internal.v1 import group_log_pb2 as glpb
from missionweave.internal.v1 import group_log_pb2_grpc as glpb_grpc
from missionweave.kernel.errors import Rejected, from_proto
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave_server.services.scheduling.projection import GroupProjection

log = logging.getLogger(__name__)

RETRY_INITIAL_S, RETRY_CAP_S = 0.2, 5.0


class GroupFollower:
    """Follows one Group for one Worker until stopped, or until the Worker's Membership ends."""

    def __init__(
        self,
        group_log: glpb_grpc.GroupLogServiceAsyncStub,
        projection: GroupProjection,
        saved: Callable[[GroupProjection], Awaitable[None]],
        changed: Callable[[], None],
    ) -> None:
        self._group_log = group_log
        self.projection = projection
        self._saved = saved
        self._changed = changed
        self.caught_up = asyncio.Event()
        self.ended = False  # the Membership ended: nothing more will be served
        self.failure: Rejected | None = None  # a refusal that ends following (not a member, ...)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            p = self.projection
            self._task = asyncio.create_task(self._run(), name=f"schedule-follow-{p.worker_id}-{p.group_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def ready(self, timeout: float) -> None:  # noqa: ASYNC109 (a bounded wait for the first catch-up)
        """Wait until the projection has caught up with the Group's head once; raise what ended
        following if it ended before that (e.g. NOT_A_MEMBER)."""
        waiter = asyncio.ensure_future(self.caught_up.wait())
        try:
            await asyncio.wait(
                [waiter, *([self._task] if self._task else [])],
                timeout=timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiter.cancel()
        if self.failure is not None and not self.caught_up.is_set():
            raise self.failure

    async def _run(self) -> None:
        delay = RETRY_INITIAL_S
        p = self.projection
        while not self.ended:
            request = glpb.FollowGroupRequest(
                group_id=p.group_id,
                member_id=p.worker_id,
                after_sequence=p.sequence,
                view=glpb.FOLLOW_VIEW_SCHEDULING,
            )
            try:
                async for answer in self._group_log.FollowGroup(request):
                    delay = RETRY_INITIAL_S
                    await self._on(answer)
                    if self.ended:
                        return
            except grpc.aio.AioRpcError as err:
                rejection = rejection_from_rpc_error(err)
                if rejection is not None and err.code() in (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.NOT_FOUND,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ):
                    self.failure = from_proto(rejection)
                    self.ended = True
                    return
                log.info(
                    "following %s for %s broke (%s); again in %.1f s",
                    p.group_id,
                    p.worker_id,
                    err.code().name,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)

    async def _on(self, answer: glpb.FollowGroupResponse) -> None:
        p = self.projection
        kind = answer.WhichOneof("response")
        if kind == "started":
            p.advance(answer.started.effective_after_sequence)
            if answer.started.mission_owner_id:  # as of the head; replayed replacements may follow
                p.mission_owner_id = answer.started.mission_owner_id
            if p.sequence >= answer.started.head_sequence:
                self.caught_up.set()
        elif kind == "batch":
            for entry in answer.batch.entries:
                # A signed envelope is never read, should one come: only the metadata view is folded.
                if entry.HasField("scheduling_event"):
                    p.apply(entry.scheduling_event)
                else:
                    p.advance(entry.sequence)
            await self._saved(p)
            self._changed()
            if p.sequence >= answer.batch.head_sequence:
                self.caught_up.set()
        else:  # the Membership ended, or the history cannot be served: the queue stays as it was
            self.ended = True
            self.caught_up.set()
            log.info("stopped following %s for %s: %s", p.group_id, p.worker_id, kind)
