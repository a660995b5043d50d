"""``mwp worker queue``: a Worker's own queue of one Group, as its scheduler holds it (spec 11.1)."""

from __future__ import annotations

import argparse

from missionweave.cli.common import columns, emit, enum_label, reading, reading_command, to_dict, when
from missionweave.v1 import scheduling_service_pb2 as pb
from missionweave.v1 import scheduling_service_pb2_grpc as pb_grpc
from missionweave.v1 import work_pb2 as wp


async def cmd_queue(args: argparse.Namespace) -> int:
    """The caller's own scheduler only: a Worker sees its queue, nobody else's (MW-11.1-03)."""
    async with reading(args) as mesh:
        queue = (await pb_grpc.SchedulingServiceStub(mesh.channel).GetQueue(pb.GetQueueRequest(group_id=args.group))).queue
    rows = [["#", "work item", "state", "epoch", "eligible", "class", "deadline", "checkpoint"]]
    for e in queue.entries:
        rows.append([
            str(e.group_position or "-"),
            e.work_item_id,
            enum_label(wp.WorkItemState, e.state, "WORK_ITEM_STATE_").lower(),
            str(e.ownership_epoch),
            "yes" if e.eligible else f"no ({e.ineligible_reason})" if e.ineligible_reason else "no",
            enum_label(pb.PriorityClass, e.ordering.priority_class, "PRIORITY_CLASS_").lower(),
            when(e.ordering.deadline) if e.ordering.HasField("deadline") else "-",
            e.latest_checkpoint_id or "-",
        ])
    lines = [
        f"{args.actor}'s queue of {queue.group_id} at sequence {queue.projected_sequence}: weight {queue.weight}, "
        f"{queue.slots_in_use} of {queue.slot_quota} slots in use",
        *(columns(rows) if queue.entries else ["(empty)"]),
    ]
    emit(args, lines, to_dict(queue))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    worker = sub.add_parser("worker", help="a Worker's own scheduler").add_subparsers(dest="sub", required=True)
    q = reading_command(worker.add_parser("queue", help="your queue of one Group: order, eligibility, slots (read as --as)"))
    q.set_defaults(func=cmd_queue)
