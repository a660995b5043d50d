"""``python -m simulation``: run seeds of the deterministic simulation (docs/simulation.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from simulation.run import DEFAULT_STEPS, run_seed
from simulation.stats import Stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation", description=__doc__)
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds to run (from --start)")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--trace", action="store_true", help="print each seed's whole trace")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="faulty steps per seed")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    total, failed, traces = Stats(), [], {}
    started = time.monotonic()  # for seeds per minute only: nothing in a run reads it
    for seed in seeds:
        result = run_seed(seed, args.steps)
        total.merge(result.stats)
        traces[seed] = result.trace_hash
        if args.trace:
            print("\n".join(result.trace))
        if not result.ok:
            failed.append(seed)
            print(result.report(), file=sys.stderr)
        elif not args.json:
            print(f"seed {seed} ok ({result.stats.steps} steps, trace {result.trace_hash[:16]})", flush=True)
    elapsed = time.monotonic() - started
    summary = {
        "seeds": len(seeds),
        "failed": failed,
        "seeds_per_minute": round(len(seeds) * 60 / elapsed, 1) if elapsed else None,
        "steps": total.steps,
        "faults": dict(sorted(total.faults.items())),
        "events": dict(sorted(total.events.items())),
        "invariant_checks": total.invariant_checks,
        "traces": traces,  # the sha256 of each seed's trace: equal on every replay
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"{len(seeds)} seeds, {len(failed)} failed{f' {failed}' if failed else ''}, {summary['seeds_per_minute']} seeds/min, "
            f"{total.steps} steps, {total.invariant_checks} invariant checks"
        )
        print("faults: " + ", ".join(f"{k} {v}" for k, v in sorted(total.faults.items())))
        print("events: " + ", ".join(f"{k} {v}" for k, v in sorted(total.events.items())))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
