"""The getting-started pages (docs/getting-started*.md), run as written against a fresh mesh: the
once-only block of docs/getting-started.md, then the sh blocks of each language page's section
"Run it against `make run`", as one bash script (-e: the first failing step ends it). The pages are
parsed, so they cannot drift from what runs. (Installing a toolchain, a page's other blocks, is
what `make test` and .ci/run do before.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from missionweave_server.config import Settings
from tests.conftest import mesh_process_env
from tests.test_go_agent import go_agent  # noqa: F401  (the fixture: builds the Go agent)
from tests.test_node_agent import node  # noqa: F401  (the fixture: Node.js 20+, or the skip rule)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
RUN_SECTION = "Run it against `make run`"
PAGES = ["getting-started-python.md", "getting-started-typescript.md", "getting-started-go.md"]


def blocks(page: str, language: str, *, section: str = "") -> list[str]:
    """The page's fenced blocks of ``language``, in order, as written; only those under the level-2
    headings that contain ``section`` when it is given."""
    parts = re.split(r"^## ", (DOCS / page).read_text(), flags=re.MULTILINE)
    chosen = [p for p in parts if section in p.split("\n", 1)[0]] if section else parts
    return [body for part in chosen for lang, body in FENCE.findall(part) if lang == language]


def test_the_python_page_shows_the_example_handler_whole() -> None:
    """The handler the page shows is examples/first_worker.py's code (its docstring aside)."""
    shown = blocks("getting-started-python.md", "python")[0]
    source = (ROOT / "examples" / "first_worker.py").read_text()
    code = source[source.index('"""', 3) + 3 :].lstrip("\n")
    assert shown == code


def tails(directory: Path) -> str:
    """The end of every log the page's commands wrote (a background Worker's, say)."""
    return "".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(directory.glob("*.log")))


async def run_page(page: str, tmp_path: Path) -> str:
    """The once-only block, then every sh block of ``page``, in one bash, against a fresh mesh."""
    from missionweave_server.mesh.server import start

    mesh = await start(Settings(listen="127.0.0.1:0", data_dir=tmp_path / ".missionweave", grace_seconds=1))
    for name in (".venv", "examples", "build", "sdks"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        **mesh_process_env(),
        "MWP_TARGET": f"127.0.0.1:{mesh.port}",
        "MWP_CONTEXT_DIR": os.environ["MWP_CONTEXT_DIR"],  # conftest's empty one
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "XDG_STATE_HOME": str(tmp_path / "state"),  # the Worker's state: the user's, not the repository's
    }
    script = "\n".join(
        ["set -euo pipefail", *blocks("getting-started.md", "sh"), *blocks(page, "sh", section=RUN_SECTION)]
    )
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # the page's background Worker goes with the process group
    )
    try:
        out, err = await asyncio.wait_for(
            process.communicate(), 150
        )  # inside pytest-timeout, so the group is killed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        await mesh.stop(grace=1)
    logs = tails(tmp_path)
    assert process.returncode == 0, (
        f"{page} exited {process.returncode}:\n{err.decode()}{out.decode()}\n{logs}"
    )
    return out.decode()


async def test_the_python_page_runs_as_written(tmp_path: Path) -> None:
    out = await run_page("getting-started-python.md", tmp_path)
    assert "manifest signatures verified 1 of 1" in out and "approved submission" in out, out[-3000:]
    assert "✗" not in out, out[-3000:]


async def test_the_typescript_page_runs_as_written(node: str, tmp_path: Path) -> None:  # noqa: F811
    out = await run_page("getting-started-typescript.md", tmp_path)
    assert "manifest signatures verified 1 of 1" in out and "approved submission" in out, out[-3000:]
    assert "✗" not in out, out[-3000:]
    finished = [json.loads(line) for line in (tmp_path / "worker-ts.out").read_text().splitlines()]
    assert [(f["work_item_id"], f["outcome"]) for f in finished] == [("report", "submitted")]


async def test_the_go_page_runs_as_written(go_agent: Path, tmp_path: Path) -> None:  # noqa: F811
    out = await run_page("getting-started-go.md", tmp_path)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    # As the page says: agent-go sees the Group from its grant on, its message last; cora all of it.
    assert [line["sequence"] for line in lines] == [6, 7, 1, 2, 3, 4, 5, 6, 7], lines
    assert lines[:2] == lines[-2:] and lines[0]["type"] == "membership.granted"
    assert (lines[1]["type"], lines[1]["actor_id"]) == ("message.posted", "agent-go")


@pytest.mark.parametrize("page", ["getting-started.md", *PAGES])
def test_every_page_has_a_run_section_and_links_to_files_that_exist(page: str) -> None:
    text = (DOCS / page).read_text()
    if page != "getting-started.md":
        assert blocks(page, "sh", section=RUN_SECTION), f"{page} has no sh block under '{RUN_SECTION}'"
    for target in re.findall(r"\]\(([^)#]+)[)#]", text):
        if "://" not in target:
            assert (DOCS / target).exists(), f"{page}: {target} is linked but does not exist"
