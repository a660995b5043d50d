"""Mutation score of the pure core against its fast tests (`make mutation`, docs/mutation.md).

mutmut (pinned in the `mutation` extra) generates the mutants of the files `[tool.mutmut]` names in
pyproject.toml and runs, for each, the fast core tests that call the mutated function. This script
adds what mutmut lacks: a reproducible seeded sample (`--sample N --seed S`), the score per file,
the survivors with their diffs, and the list of equivalent mutants (tests/mutation_equivalents.txt,
one `mutant-name  reason` per line) counted apart instead of silently excluded.

    python tools/mutation.py                      # every mutant (hours on 2 cores)
    python tools/mutation.py --sample 400         # 400 mutants drawn with --seed (default 19)
    python tools/mutation.py --only 'missionweave_server.services.authority.rules.work.start.*' --sample 100
    python tools/mutation.py --report-only        # the score of the last run's mutants again
    python tools/mutation.py --field-defaults     # state.py's dataclass defaults, which mutmut leaves alone

Exit status: 0 when the score reaches --target (default 85%), 1 below it, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents.txt"
LAST_RUN = MUTANTS / "last-run.json"

# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code); a timeout is a detection.
DETECTED = {
    1: "killed",
    3: "killed",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    36: "timeout",
}
SURVIVED = {0: "survived"}
NO_TESTS = {5: "no tests", 33: "no tests"}


def generate() -> None:
    """Write every mutant into mutants/ without running a test (mutmut's own generation step)."""
    code = (
        "import os; from pathlib import Path\n"
        "from mutmut.mutation.trampoline import set_mutant_under_test\n"
        "from mutmut.__main__ import copy_src_dir, copy_also_copy_files, setup_source_paths, create_mutants\n"
        "set_mutant_under_test('mutant_generation')\n"
        "Path('mutants').mkdir(exist_ok=True)\n"
        "copy_src_dir(); copy_also_copy_files(); setup_source_paths()\n"
        "s = create_mutants(os.cpu_count() or 2)\n"
        "print(f'generated mutants: {s.mutated} files mutated, {s.unmodified} unmodified')\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def meta_files() -> list[Path]:
    return sorted(MUTANTS.rglob("*.py.meta"))


def exit_codes() -> dict[str, tuple[str, int | None]]:
    """mutant name -> (source file, mutmut's exit code or None when not yet run)."""
    out: dict[str, tuple[str, int | None]] = {}
    for meta in meta_files():
        source = str(meta.relative_to(MUTANTS))[: -len(".meta")]
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = (source, code)
    return out


def equivalents() -> dict[str, str]:
    """Mutants shown to behave exactly as the original, each with the reason."""
    listed: dict[str, str] = {}
    if EQUIVALENTS.exists():
        for line in EQUIVALENTS.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(" ")
                if not reason.strip():
                    sys.exit(f"{EQUIVALENTS}: {name} has no reason")
                listed[name] = reason.strip()
    return listed


@dataclass
class FileScore:
    total: int = 0
    detected: int = 0
    survived: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    equivalent: int = 0
    other: int = 0

    @property
    def scored(self) -> int:
        return self.total - self.equivalent

    @property
    def score(self) -> float:
        return self.detected / self.scored if self.scored else 1.0


def report(names: list[str], *, diffs: bool, target: float, as_json: bool) -> int:
    codes = exit_codes()
    equiv = equivalents()
    stale = sorted(n for n in equiv if n not in codes)
    by_file: dict[str, FileScore] = defaultdict(FileScore)
    for name in names:
        source, code = codes[name]
        s = by_file[source]
        s.total += 1
        if name in equiv:
            s.equivalent += 1
        elif code in DETECTED:
            s.detected += 1
        elif code in SURVIVED:
            s.survived.append(name)
        elif code in NO_TESTS:
            s.no_tests.append(name)
        else:
            s.other += 1
    overall = FileScore()
    for s in by_file.values():
        overall.total += s.total
        overall.detected += s.detected
        overall.equivalent += s.equivalent
        overall.other += s.other
        overall.survived += s.survived
        overall.no_tests += s.no_tests
    if as_json:
        print(
            json.dumps(
                {
                    "files": {
                        f: {
                            "mutants": s.total,
                            "detected": s.detected,
                            "survived": s.survived,
                            "no_tests": s.no_tests,
                            "equivalent": s.equivalent,
                            "score": s.score,
                        }
                        for f, s in sorted(by_file.items())
                    },
                    "overall": {
                        "mutants": overall.total,
                        "detected": overall.detected,
                        "equivalent": overall.equivalent,
                        "score": overall.score,
                    },
                    "stale_equivalents": stale,
                },
                indent=2,
            )
        )
    else:
        width = max([len(f) for f in by_file] + [7])
        print(f"\n{'file':<{width}}  mutants  detected  survived  no tests  equivalent  score")
        for f, s in sorted(by_file.items()):
            print(
                f"{f:<{width}}  {s.total:7}  {s.detected:8}  {len(s.survived):8}  {len(s.no_tests):8}"
                f"  {s.equivalent:10}  {s.score:6.1%}"
            )
        print(
            f"{'overall':<{width}}  {overall.total:7}  {overall.detected:8}  {len(overall.survived):8}"
            f"  {len(overall.no_tests):8}  {overall.equivalent:10}  {overall.score:6.1%}"
        )
        if overall.other:
            print(
                f"({overall.other} mutants ended otherwise: not checked, interrupted or suspicious; "
                "they count as not detected)"
            )
        for name in overall.no_tests:
            print(f"no fast test calls the function of {name}")
        for name in overall.survived:
            print(f"survived: {name}")
            if diffs:
                shown = subprocess.run(
                    [str(Path(sys.executable).parent / "mutmut"), "show", name],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                print("\n".join("    " + line for line in shown.stdout.splitlines()[1:]))
        for name in stale:
            print(f"WARNING: {EQUIVALENTS.name} lists {name}, which is no longer a mutant")
        print(
            f"\nscore {overall.score:.1%} of {overall.scored} mutants (target {target:.0%}); "
            f"timeouts count as detected, equivalent mutants are left out of the ratio"
        )
    return 0 if overall.score >= target else 1


STATE = Path("missionweave_server/services/authority/state.py")


def mutmut_config() -> dict[str, list[str]]:
    """The `[tool.mutmut]` table: the same tests and tree for the field defaults as for mutmut."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["mutmut"]  # type: ignore[no-any-return]


def field_default_mutants(source: str) -> list[tuple[str, str]]:
    """(name, mutated source) for each literal default of a dataclass field in state.py.

    mutmut mutates inside functions only; a field default (``revision: int = 1``) is a rule too
    when evolve or a rule reads the field before anything sets it. Ints get +1, bools their
    negation, strings a marker, ``None`` and empty tuples a non-empty value of the same shape.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out: list[tuple[str, str]] = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value):
                continue
            v = node.value
            if not isinstance(v, ast.Constant):
                if isinstance(v, ast.Tuple) and not v.elts:
                    replacement = '("mutant",)'
                else:
                    continue  # field(default_factory=...): a fresh container, nothing literal to change
            elif isinstance(v.value, bool):
                replacement = repr(not v.value)
            elif isinstance(v.value, int):
                replacement = repr(v.value + 1)
            elif isinstance(v.value, str):
                replacement = repr("XX" + v.value + "XX")
            else:
                continue  # None: what a non-None stand-in would be depends on the field's type
            line = lines[node.lineno - 1]
            start, end = v.col_offset, v.end_col_offset
            assert v.lineno == v.end_lineno == node.lineno and end is not None
            mutated = lines[:]
            mutated[node.lineno - 1] = line[:start] + replacement + line[end:]
            out.append((f"state.{cls.name}.{node.target.id}={replacement}", "".join(mutated)))
    return out


def run_field_defaults(target: float, as_json: bool) -> int:
    """Each field-default mutant against the fast core tests, in a throw-away copy of the tree."""
    source = (ROOT / STATE).read_text()
    mutants = field_default_mutants(source)
    equiv = equivalents()
    cfg = mutmut_config()
    copied = [*cfg["source_paths"], *cfg["also_copy"], "pyproject.toml"]
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mwp-field-defaults-") as tmp:
        for name in copied:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, Path(tmp) / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, Path(tmp) / name)
        for i, (name, mutated) in enumerate(mutants, 1):
            if name in equiv:
                results[name] = "equivalent"
                continue
            (Path(tmp) / STATE).write_text(mutated)
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-x",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "--timeout",
                    "0",
                    *cfg["pytest_add_cli_args_test_selection"],
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                env={**os.environ, "MUTANT_UNDER_TEST": "field-defaults"},
            )
            results[name] = (
                "killed"
                if run.returncode == 1
                else "survived"
                if run.returncode == 0
                else f"exit {run.returncode}"
            )
            if not as_json:
                print(f"[{i}/{len(mutants)}] {name}: {results[name]}", flush=True)
    scored = [r for r in results.values() if r != "equivalent"]
    score = sum(r == "killed" for r in scored) / len(scored) if scored else 1.0
    if as_json:
        print(json.dumps({"mutants": results, "score": score}, indent=2))
    else:
        survivors = [n for n, r in results.items() if r not in ("killed", "equivalent")]
        print(
            f"\nstate.py field defaults: {len(mutants)} mutants, {len(scored) - len(survivors)} killed, "
            f"{len(results) - len(scored)} equivalent, score {score:.1%} (target {target:.0%})"
        )
        for name in survivors:
            print(f"survived: {name}")
    return 0 if score >= target else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sample", type=int, default=0, help="mutants to draw (0: every mutant)")
    parser.add_argument("--seed", type=int, default=19, help="seed of the sample")
    parser.add_argument("--only", action="append", default=[], help="fnmatch pattern of mutant names")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--no-diffs", action="store_true", help="list survivors without their diffs")
    parser.add_argument("--report-only", action="store_true", help="score the last run's mutants again")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.add_argument(
        "--field-defaults",
        action="store_true",
        help="state.py's dataclass field defaults instead of mutmut's mutants",
    )
    args = parser.parse_args()
    if args.field_defaults:
        return run_field_defaults(args.target, args.json)
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        print("mutmut is not installed: pip install -e '.[mutation]' (or make mutation)", file=sys.stderr)
        return 2

    if args.report_only:
        if not LAST_RUN.exists():
            print("no earlier run in mutants/", file=sys.stderr)
            return 2
        names = json.loads(LAST_RUN.read_text())
        return report(names, diffs=not args.no_diffs, target=args.target, as_json=args.json)

    # Results of an earlier run stand in mutmut for functions whose source did not change, even if
    # the tests did: start from a clean mutants/ so every mutant is judged by today's tests.
    shutil.rmtree(MUTANTS, ignore_errors=True)
    generate()
    names = sorted(exit_codes())
    if args.only:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in args.only)]
    if args.sample and args.sample < len(names):
        names = sorted(random.Random(args.seed).sample(names, args.sample))
    if not names:
        print("no mutant matches", file=sys.stderr)
        return 2
    print(f"running {len(names)} mutants of {len(exit_codes())} (seed {args.seed})", flush=True)
    LAST_RUN.write_text(json.dumps(names))
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "mutmut"),
            "run",
            "--max-children",
            str(args.max_children),
            *names,
        ],
        cwd=ROOT,
    )
    if run.returncode != 0:
        print(f"mutmut run failed with exit status {run.returncode}", file=sys.stderr)
        return 2
    return report(names, diffs=not args.no_diffs, target=args.target, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
