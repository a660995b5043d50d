"""A Mission's definition from the command line's flags: ``mwp mission create``, ``mwp mission
follow-up`` and the child Missions of ``mwp mission subtask`` share them."""

from __future__ import annotations

import argparse
from datetime import timedelta

from missionweave.kernel.clock import SystemClock, to_timestamp
from missionweave.v1 import common_pb2, mission_pb2


def add_definition_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--title", required=True)
    sp.add_argument("--objective", required=True)
    sp.add_argument("--done", action="append", required=True, help="a completion criterion (repeatable)")
    sp.add_argument("--coordinator", required=True, help="the Coordinator agent's identity id")
    sp.add_argument("--deadline-hours", type=float, default=72.0)
    sp.add_argument("--budget", type=float, default=0.0, help="financial budget in --currency units")
    sp.add_argument("--currency", default="EUR")
    sp.add_argument("--tokens", type=int, default=0)
    sp.add_argument("--tool-calls", type=int, default=0)
    sp.add_argument(
        "--lease-seconds", type=float, help="Coordinator lease length (default: the server's, 5 minutes)"
    )


def definition_from_args(args: argparse.Namespace, owner_id: str) -> mission_pb2.MissionDefinition:
    now = SystemClock().now()
    return mission_pb2.MissionDefinition(
        title=args.title,
        objective=args.objective,
        definition_of_done=[
            mission_pb2.CompletionCriterion(
                criterion_id=f"dod-{i + 1}", description=d, evidence_method="review", required=True
            )
            for i, d in enumerate(args.done)
        ],
        deadline=to_timestamp(now + timedelta(hours=args.deadline_hours)),
        budget=common_pb2.ResourceVector(
            currency=args.currency,
            financial_micros=int(args.budget * 1_000_000),
            tokens=args.tokens,
            tool_calls=args.tool_calls,
            wall_clock_ms=int(args.deadline_hours * 3_600_000),
        ),
        risk_policy=mission_pb2.RiskPolicy(risk_class=mission_pb2.RISK_CLASS_LOW),
        owner_id=owner_id,
    )


def renewal_policy(lease_seconds: float | None) -> mission_pb2.RenewalPolicy:
    """A Coordinator renewal policy; unset fields take the server's defaults."""
    policy = mission_pb2.RenewalPolicy()
    if lease_seconds is not None:
        policy.lease_duration.FromTimedelta(timedelta(seconds=lease_seconds))
    return policy
