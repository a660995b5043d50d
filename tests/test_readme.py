"""The README's "Trying it" block, run as it stands against a fresh mesh: parsed from README.md, so
the two cannot drift. Every step must exit 0 (the `--follow` step runs until Ctrl-C, exit 130) and
say what the README says it does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import sys
from pathlib import Path

from missionweave_server.config import Settings
from tests.conftest import mesh_process_env

ROOT = Path(__file__).resolve().parent.parent
PLACEHOLDER = re.compile(r"<group id[^>]*>")


def sh_block(heading: str) -> str:
    """The first sh block under ``heading`` in README.md, as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading) :]
    return section[
        section.index("```sh\n") + len("```sh\n") : section.index("\n```", section.index("```sh\n"))
    ]


def trying_it_block() -> list[str]:
    """The commands of the first sh block under "## Trying it", continuation lines joined."""
    block = sh_block("## Trying it")
    commands: list[str] = []
    pending = ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        commands.append((pending + line).strip())
        pending = ""
    return [c for c in commands if c]


async def run(
    command: str, cwd: Path, env: dict[str, str], *, until_interrupted: float = 0
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=bool(until_interrupted),
    )
    if until_interrupted:
        await asyncio.sleep(until_interrupted)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def whole_mission(cwd: Path, env: dict[str, str]) -> str:
    """The "A whole Mission" block as one bash script (-e: the first failing step ends it), its two
    background Workers stopped with it whatever happens."""
    script = "set -euo pipefail\n" + sh_block("## A whole Mission")
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    logs = "".join(
        (cwd / f"worker-{i}.log").read_text()[-2000:] for i in (1, 2) if (cwd / f"worker-{i}.log").exists()
    )
    assert process.returncode == 0, (
        f"the whole-Mission block exited {process.returncode}:\n{err.decode()}{out.decode()}\n{logs}"
    )
    return out.decode()


async def test_the_readme_trying_it_block_runs_as_written(tmp_path: Path) -> None:
    from missionweave_server.mesh.server import start

    mesh = await start(Settings(listen="127.0.0.1:0", data_dir=tmp_path / ".missionweave", grace_seconds=1))
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    env = {
        **mesh_process_env(),
        "MWP_TARGET": f"127.0.0.1:{mesh.port}",
        "MWP_CONTEXT_DIR": os.environ[
            "MWP_CONTEXT_DIR"
        ],  # conftest's empty one: no context of this machine's
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }
    group = ""
    outputs: dict[str, str] = {}
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # the Workers' state: the user's, not the repository's
    try:
        for command in trying_it_block():
            if PLACEHOLDER.search(command):
                assert group, f"{command!r} needs the group id, printed by an earlier step"
                command = PLACEHOLDER.sub(group, command)
            if command.startswith("export "):  # what the reader's shell keeps for the next steps
                for assignment in shlex.split(command.split("#", 1)[0])[1:]:
                    name, _, value = assignment.partition("=")
                    env[name] = value
                continue
            follow = "--follow" in command
            code, out, err = await run(command, tmp_path, env, until_interrupted=3.0 if follow else 0)
            assert code == (130 if follow else 0), f"{command!r} exited {code}:\n{err}{out}"
            outputs[command.split("#", 1)[0].strip()] = out
            if command.startswith("mwp mission create"):
                group = out.strip().splitlines()[-1]
                assert group.startswith("grp_"), out
        whole = await whole_mission(tmp_path, env)
    finally:
        await mesh.stop(grace=1)
    assert "is submitted" in whole and "manifest signatures verified 1 of 1" in whole
    assert "approved submission" in whole and "✗" not in whole, whole[-3000:]
    state = tmp_path / "state" / "missionweave" / "workers"
    assert set(os.listdir(state)) == {"worker-1", "worker-2"}
    assert not [n for d in (tmp_path, tmp_path / "keys") for n in os.listdir(d) if n.endswith(".worker")]
    by_step = {
        c.split()[1] if c.startswith("mwp ") and len(c.split()) > 1 else c: o for c, o in outputs.items()
    }
    assert "missionweave.v1.AuthorityService" in by_step["health"] and "SERVING" in by_step["health"]
    follow_out = next(o for c, o in outputs.items() if "--follow" in c)
    assert '"type": "mission.created"' in follow_out  # JSON lines, until Ctrl-C
    shown = next(o for c, o in outputs.items() if c.startswith("mwp mission show"))
    assert "Q3 report" in shown and "coord" in shown
    listed = next(o for c, o in outputs.items() if c.startswith("mwp message list"))
    assert "kick-off" in listed
    # Keys in a private directory, each file 0600; the data dir private too.
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    assert all(k.stat().st_mode & 0o777 == 0o600 for k in (tmp_path / "keys").glob("*.key"))
    assert (tmp_path / ".missionweave").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / ".missionweave" / "missionweave.db").stat().st_mode & 0o777 == 0o600
