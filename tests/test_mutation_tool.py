"""tools/mutation.py (make mutation, docs/mutation.md): the field-default mutants it makes and how
it scores a run, on made-up result files (mutmut itself is not run here)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SOURCE = """from dataclasses import dataclass, field

@dataclass
class Item:
    revision: int = 1
    open: bool = True
    title: str = ""
    tags: tuple[str, ...] = ()
    owner: str | None = None
    offers: dict[str, int] = field(default_factory=dict)
"""


def test_one_mutant_per_literal_default_each_changing_only_its_own_line(tool: ModuleType) -> None:
    mutants = dict(tool.field_default_mutants(SOURCE))
    assert sorted(mutants) == sorted(
        [
            "state.Item.revision=2",
            "state.Item.open=False",
            "state.Item.title='XXXX'",
            'state.Item.tags=("mutant",)',
        ]
    )
    original = SOURCE.splitlines()
    for name, mutated in mutants.items():
        ast.parse(mutated)
        changed = [i for i, (a, b) in enumerate(zip(original, mutated.splitlines(), strict=True)) if a != b]
        assert len(changed) == 1, name


def test_every_literal_default_of_state_py_is_a_mutant(tool: ModuleType) -> None:
    names = [
        n
        for n, _ in tool.field_default_mutants(
            (ROOT / "missionweave_server/services/authority/state.py").read_text()
        )
    ]
    assert "state.WorkItemState.revision=2" in names and "state.WorkItemState.attempts=1" in names
    assert len(names) == len(set(names))


def test_score_leaves_equivalents_out_and_counts_no_tests_and_timeouts(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mutants = tmp_path / "mutants"
    (mutants / "services").mkdir(parents=True)
    codes = {
        "m.x_f__mutmut_1": 1,
        "m.x_f__mutmut_2": 0,
        "m.x_f__mutmut_3": 33,
        "m.x_f__mutmut_4": 36,
        "m.x_f__mutmut_5": 0,
    }
    (mutants / "services" / "core.py.meta").write_text(json.dumps({"exit_code_by_key": codes}))
    equivalents = tmp_path / "equivalents.txt"
    equivalents.write_text("# header\nm.x_f__mutmut_5  the mutated default is never read\n")
    monkeypatch.setattr(tool, "MUTANTS", mutants)
    monkeypatch.setattr(tool, "EQUIVALENTS", equivalents)
    status = tool.report(sorted(codes), diffs=False, target=0.85, as_json=True)
    report = json.loads(capsys.readouterr().out)
    file = report["files"]["services/core.py"]
    # killed + timeout of the 4 not listed as equivalent; "no tests" is a survivor of the ratio
    assert (file["detected"], file["equivalent"], file["no_tests"], file["survived"]) == (
        2,
        1,
        ["m.x_f__mutmut_3"],
        ["m.x_f__mutmut_2"],
    )
    assert report["overall"]["score"] == pytest.approx(0.5)
    assert status == 1
