"""Per-command cost of the pure core as a Group grows (issue 18 item 3): flat, or not?

    PYTHONPATH=. .venv/bin/python bench/core_growth.py                 # 100, 1,000 and 10,000 WorkItems (~1 min)
    PYTHONPATH=. .venv/bin/python bench/core_growth.py --sizes 100,1000 --repeat 200

For each size N it folds a Group holding N WorkItems, all delegated under one grant (so that every
per-grant figure covers all N), one of them running under a Worker's lease, and times ``decide``
alone (no I/O, no evolve) of:

    delegated authorize   a new WorkItem under the grant, by its grantee (MW-9.1-11 charge check)
    usage under a grant   a lease renewal reporting usage on the running WorkItem (grant cap check)
    with a provisional    a Coordinator's message post while a just-in-time Membership is open
                          (MW-8-06: the decider checks whether any such Membership ends)
    usage, provisional    the usage report again, while that Membership is open

It prints the median per-command microseconds per size and the ratio largest/smallest size; the
target is flat within noise (ratio ~1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from missionweave.kernel.clock import to_timestamp  # noqa: E402
from missionweave.kernel.errors import Rejected  # noqa: E402
from missionweave.v1 import command_pb2, common_pb2, membership_pb2  # noqa: E402
from missionweave.v1 import work_pb2 as wp  # noqa: E402
from missionweave_server.services.authority import decider  # noqa: E402
from missionweave_server.services.authority.state import GroupState, IdentityInfo  # noqa: E402
from tests import builders  # noqa: E402
from tests.offline_core import IDS, LEASE_ID, NOW, command, started, with_mission, work_contract  # noqa: E402

BIG = 10**15
CTX = decider.DecisionContext(
    NOW, {**IDS, "jit": IdentityInfo("jit", common_pb2.IDENTITY_KIND_AGENT, session_epoch=1)}
)


def _fold(state: GroupState, c: command_pb2.Command) -> GroupState:
    """Decide and evolve in place (the tests' helpers copy the state each time: quadratic here)."""
    events = decider.decide(state, c, CTX)
    assert not isinstance(events, Rejected), f"{c.WhichOneof('body')}: {events!r}"
    for event in events:
        decider.evolve(state, event)
    return state


def _authorize(work_item_id: str, grant_id: str) -> wp.WorkAuthorize:
    return wp.WorkAuthorize(
        work_item_id=work_item_id,
        title=work_item_id,
        contract=work_contract(tokens=10),
        parent_work_item_id="root",
        grant_id=grant_id,
    )


def group(size: int) -> tuple[GroupState, str]:
    """A Group of ``size`` WorkItems: the scope root, ``size - 2`` delegated ones and a running one."""
    state = with_mission(tokens=BIG, financial_micros=BIG, tool_calls=BIG)
    root = wp.WorkAuthorize(work_item_id="root", title="root", contract=work_contract(), coordinator_epoch=1)
    state = _fold(state, command(state, "work_authorize", root, "coord"))
    grant = membership_pb2.MembershipGrantDelegation(
        grantee_id="lead",
        target_work_item_id="root",
        max_descendant_depth=1,
        caps=common_pb2.ResourceVector(currency="EUR", financial_micros=BIG, tokens=BIG, tool_calls=BIG),
        allowed_capabilities=[membership_pb2.Capability(capability_id="code.python", version="3.11")],
        expires_at=to_timestamp(NOW + timedelta(hours=1)),
        coordinator_epoch=1,
    )
    state = _fold(state, command(state, "membership_grant_delegation", grant, "coord"))
    grant_id = next(iter(state.grants))
    for i in range(size - 2):
        state = _fold(state, command(state, "work_authorize", _authorize(f"wi-{i}", grant_id), "lead"))
    return started(
        state, "run", _authorize("run", grant_id).contract, grant_id=grant_id, parent="root"
    ), grant_id


def with_provisional(state: GroupState) -> GroupState:
    body = membership_pb2.MembershipGrant(
        member_id="jit",
        role=membership_pb2.MEMBER_ROLE_WORKER,
        provisional=True,
        expires_at=to_timestamp(NOW + timedelta(minutes=30)),
    )
    return _fold(state, command(state, "membership_grant", body, "coord"))


def per_command_us(state: GroupState, commands: list[command_pb2.Command]) -> float:
    """Median microseconds of one ``decide`` (each command accepted, none applied)."""
    times = []
    for c in commands:
        t0 = time.perf_counter()
        decision = decider.decide(state, c, CTX)
        times.append((time.perf_counter() - t0) * 1e6)
        assert not isinstance(decision, Rejected), decision
    return statistics.median(times)


def measure(size: int, repeat: int) -> dict[str, float]:
    state, grant_id = group(size)
    authorize = [
        command(state, "work_authorize", _authorize(f"new-{i}", grant_id), "lead") for i in range(repeat)
    ]
    renew = wp.WorkRenewLease(
        work_item_id="run",
        lease_id=LEASE_ID,
        ownership_epoch=1,
        usage_delta=common_pb2.ResourceVector(currency="EUR", tokens=1),
    )
    usage = [command(state, "work_renew_lease", renew, "worker") for _ in range(repeat)]
    figures = {
        "delegated authorize": per_command_us(state, authorize),
        "usage under a grant": per_command_us(state, usage),
    }
    state = with_provisional(state)
    assert state.mission is not None
    post = builders.message(state.mission.planning_conversation_id, "status")
    figures["with a provisional"] = per_command_us(
        state, [command(state, "message_post", post, "coord") for _ in range(repeat)]
    )
    figures["usage, provisional"] = per_command_us(
        state, [command(state, "work_renew_lease", renew, "worker") for _ in range(repeat)]
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,10000", help="WorkItems per Group, comma-separated")
    parser.add_argument("--repeat", type=int, default=300, help="timed decisions per command and size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    for size in sizes:
        results[size] = measure(size, args.repeat)
        print(f"built and measured {size} WorkItems", file=sys.stderr)
    names = list(results[sizes[0]])
    print(f"{'µs per decide':<22}" + "".join(f"{s:>12,}" for s in sizes) + f"{'largest/smallest':>18}")
    for name in names:
        row = [results[s][name] for s in sizes]
        print(f"{name:<22}" + "".join(f"{v:>12.1f}" for v in row) + f"{row[-1] / row[0]:>17.2f}x")


if __name__ == "__main__":
    main()
