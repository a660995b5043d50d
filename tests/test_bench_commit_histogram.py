"""bench/delivery.py's per-phase report: the count of group commits, read from the Authority's
/metrics (the parse of the Prometheus text and the difference between two scrapes, D157's slow
commits), and the split of a phase's latency into its append leg."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from missionweave_server.observability import metrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
delivery = importlib.import_module("delivery")


def _exposition(latencies: list[float]) -> str:
    registry = CollectorRegistry()
    histogram = Histogram(
        "mwp_group_commit_latency_seconds",
        "as missionweave_server.observability.metrics",
        buckets=metrics.LATENCY_BUCKETS,
        registry=registry,
    )
    for seconds in latencies:
        histogram.observe(seconds)
    return generate_latest(registry).decode()


def test_commits_over_100_ms_and_the_slowest_bucket_between_two_scrapes() -> None:
    before = delivery.parse_commit_histogram(_exposition([0.001, 0.3]))
    after = delivery.parse_commit_histogram(_exposition([0.001, 0.3, 0.0007, 0.004, 0.09, 0.1001, 0.6]))
    assert after[float("inf")] == 7 and after[0.1] == 4  # cumulative, as exposed
    # Between them: 0.0007, 0.004, 0.09 (not over 100 ms), 0.1001 and 0.6 (over); the slowest's bucket is 1.0.
    assert delivery.commits_between(before, after) == (5, 2, 1.0)


def test_a_phase_without_commits_and_one_with_only_fast_ones() -> None:
    same = delivery.parse_commit_histogram(_exposition([0.002]))
    assert delivery.commits_between(same, same) == (0, 0, 0.0)
    fast = delivery.parse_commit_histogram(_exposition([0.002, 0.0003]))
    assert delivery.commits_between(same, fast) == (1, 0, 0.0005)


def test_every_phase_line_splits_off_the_append_leg_when_it_was_measured() -> None:
    """Each phase's line gives publish -> answered (the append durable) beside append -> delivery,
    so a reader sees which leg a latency is in; a phase with no answer recorded says nothing of it."""
    phase = delivery.Phase(
        "throughput", events=2, latencies={"all": [0.090, 0.096], "answered": [0.080, 0.088]}
    )
    assert "all p50 96.0 ms" in phase.line()
    assert "publish answered p50 88.0 ms, p99 88.0 ms" in phase.line()
    assert "publish answered" not in delivery.Phase("throughput", events=2, latencies={"all": [0.01]}).line()
