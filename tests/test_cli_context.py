"""``mwp context`` and ``--context``: saved connection options, and where each value comes from.

Offline behaviour runs ``mwp`` in-process (``missionweave.cli.main``); the live test runs it as a
subprocess against the ``bench`` mesh of tests/test_cli_mission.py. Every test has a context
directory of its own (MWP_CONTEXT_DIR) and none of the connection variables set.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from missionweave.cli import main
from missionweave.cli.app import build_parser
from missionweave.cli.common import client_tls
from missionweave.cli.context_store import OPTIONS, context_dir, context_environment
from missionweave.kernel.signing import generate_key, write_key
from tests.test_cli_mission import ROOT, Bench, Run
from tests.test_cli_mission import bench as bench  # the fixture

CLOSED = "127.0.0.1:1"  # nothing listens there: `mwp health` names the target it tried


@pytest.fixture
def ctx_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "contexts"
    monkeypatch.setenv("MWP_CONTEXT_DIR", str(directory))
    for name in ("MWP_CONTEXT", *(o.env for o in OPTIONS)):
        monkeypatch.delenv(name, raising=False)
    return directory


def mwp(capsys: pytest.CaptureFixture[str], *argv: str, expect: int = 0) -> Run:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == expect, f"mwp {' '.join(argv)} exited {code}, expected {expect}:\n{err}{out}"
    return Run(code, out, err)


def key_file(path: Path) -> Path:
    write_key(path, generate_key())
    return path


def test_add_ls_show_select_rm_round_trip(
    ctx_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = key_file(tmp_path / "alice.key")
    added = mwp(
        capsys,
        "context",
        "add",
        "prod",
        "--target",
        "mesh.example.com:50051",
        "--as",
        "alice",
        "--key",
        str(key),
        "--tls",
        "--tls-server-name",
        "mesh.internal",
        "--timeout",
        "4",
        "--description",
        "the production mesh",
        "--json",
    ).json()
    assert added == {
        "name": "prod",
        "file": str(ctx_dir / "prod.json"),
        "selected": False,
        "description": "the production mesh",
        "target": "mesh.example.com:50051",
        "identity": "alice",
        "key": str(key),
        "tls": True,
        "tls_server_name": "mesh.internal",
        "timeout": 4.0,
    }
    # The global flags before `context` are saved too.
    assert mwp(
        capsys, "--target", "127.0.0.1:50071", "context", "add", "local", "--select"
    ).stdout.splitlines() == [
        f"saved context local ({ctx_dir / 'local.json'})",
        "selected context local",
    ]
    mwp(capsys, "context", "add", "local", "--target", "elsewhere:1", expect=1)  # no silent overwrite
    assert json.loads((ctx_dir / "local.json").read_text())["target"] == "127.0.0.1:50071"

    listed = mwp(capsys, "context", "ls").stdout.splitlines()
    assert listed[0].split() == ["NAME", "TARGET", "IDENTITY", "DESCRIPTION"]
    assert listed[1].split() == ["*", "local", "127.0.0.1:50071", "-"]
    assert listed[2].split() == ["prod", "mesh.example.com:50051", "alice", "the", "production", "mesh"]
    document = mwp(capsys, "context", "ls", "--json").json()
    assert document["directory"] == str(ctx_dir) and document["selected"] == "local"
    assert [(c["name"], c["selected"]) for c in document["contexts"]] == [("local", True), ("prod", False)]

    selected = mwp(capsys, "context", "select", "prod", "--json").json()
    assert selected == {"selected": "prod"}
    shown = mwp(capsys, "context", "show").stdout  # the selected one
    assert shown.startswith("context prod (selected): the production mesh\n")
    rows = {line.split()[0]: line.split()[1:] for line in shown.splitlines()[4:]}
    assert rows["target"] == ["--target", "mesh.example.com:50051", "context", "prod"]
    assert rows["tls"] == ["--tls", "on", "context", "prod"]
    assert rows["tls_ca"] == ["--tls-ca", "-", "unset"]
    shown_local = mwp(capsys, "context", "show", "local", "--json").json()
    assert shown_local["name"] == "local" and shown_local["selected"] is False
    assert shown_local["effective"]["timeout"] == {"value": "10", "source": "default", "env": "MWP_TIMEOUT"}
    assert shown_local["effective"]["identity"] == {"value": None, "source": "unset", "env": "MWP_AS"}

    # --force replaces a context; removing the selected one leaves none selected.
    mwp(capsys, "context", "add", "prod", "--target", "other:1", "--force")
    assert json.loads((ctx_dir / "prod.json").read_text()) == {"description": "", "target": "other:1"}
    removed = mwp(capsys, "context", "rm", "prod", "--json").json()
    assert removed == {"removed": "prod", "was_selected": True}
    assert mwp(capsys, "context", "ls", "--json").json()["selected"] is None
    assert mwp(capsys, "context", "rm", "local").stdout == "removed context local\n"
    assert mwp(capsys, "context", "ls").stdout.startswith("no contexts in ")
    assert key.exists()  # a context only ever referenced it


def test_files_are_private_keys_referenced_and_writes_atomic(
    ctx_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file(tmp_path / "alice.key")
    monkeypatch.chdir(tmp_path)
    mwp(capsys, "context", "add", "dev", "--key", "alice.key", "--tls-ca", "ca.crt", "--select")
    assert stat.S_IMODE(ctx_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in ctx_dir.iterdir()) == ["dev.json", "selected"]  # the key was not copied
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in ctx_dir.iterdir())
    saved = json.loads((ctx_dir / "dev.json").read_text())
    assert saved["key"] == str(tmp_path / "alice.key") and saved["tls_ca"] == str(tmp_path / "ca.crt")
    # A file that does not exist yet is a note on stderr, not a refusal (mwp keygen may come later).
    assert mwp(capsys, "context", "add", "later", "--key", "nokey.key").stderr == (
        f"mwp: note: context 'later' names key file {tmp_path / 'nokey.key'}, which does not exist yet\n"
    )

    # A write that fails half-way leaves the previous file whole and no temporary file behind.
    def broken_write(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", broken_write)
    mwp(capsys, "context", "add", "dev", "--target", "new:1", "--force", expect=1)
    monkeypatch.undo()
    assert json.loads((ctx_dir / "dev.json").read_text()) == saved
    assert sorted(p.name for p in ctx_dir.iterdir()) == ["dev.json", "later.json", "selected"]


def test_the_context_directory_follows_the_environment(tmp_path: Path) -> None:
    assert context_dir({"MWP_CONTEXT_DIR": "/a", "XDG_CONFIG_HOME": "/b"}) == Path("/a")
    assert context_dir({"XDG_CONFIG_HOME": "/b"}) == Path("/b/missionweave/context")
    assert context_dir({}) == Path.home() / ".config" / "missionweave" / "context"


def test_the_suite_runs_without_the_users_contexts() -> None:
    """tests/conftest.py: a context selected on this machine cannot redirect the other CLI tests."""
    directory = Path(os.environ["MWP_CONTEXT_DIR"])
    assert directory != context_dir({k: v for k, v in os.environ.items() if k != "MWP_CONTEXT_DIR"})
    assert not any(directory.iterdir()) and "MWP_CONTEXT" not in os.environ


def test_a_flag_beats_the_environment_which_beats_the_context(
    ctx_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mwp(capsys, "context", "add", "closed", "--target", CLOSED, "--timeout", "5", "--select")
    mwp(capsys, "context", "add", "other", "--target", "127.0.0.1:2")
    mwp(capsys, "context", "add", "third", "--target", "127.0.0.1:3")
    # `mwp health` says which target it could not reach: that is the value in effect.
    assert mwp(capsys, "health", expect=3).stderr.startswith(f"mwp: cannot reach {CLOSED}: ")
    monkeypatch.setenv("MWP_CONTEXT", "other")  # $MWP_CONTEXT beats the selected one
    assert mwp(capsys, "health", expect=3).stderr.startswith("mwp: cannot reach 127.0.0.1:2: ")
    assert mwp(capsys, "--context", "third", "health", expect=3).stderr.startswith(
        "mwp: cannot reach 127.0.0.1:3: "
    )
    monkeypatch.setenv("MWP_TARGET", "127.0.0.1:4")  # the environment beats any context
    assert mwp(capsys, "--context", "third", "health", expect=3).stderr.startswith(
        "mwp: cannot reach 127.0.0.1:4: "
    )
    assert mwp(capsys, "--target", "127.0.0.1:5", "health", expect=3).stderr.startswith(
        "mwp: cannot reach 127.0.0.1:5: "
    )

    monkeypatch.delenv("MWP_CONTEXT")
    monkeypatch.setenv("MWP_TIMEOUT", "7")
    effective = mwp(capsys, "--target", "127.0.0.1:5", "context", "show", "--json").json()["effective"]
    assert effective["target"] == {"value": "127.0.0.1:5", "source": "flag", "env": "MWP_TARGET"}
    assert effective["timeout"] == {"value": "7", "source": "env", "env": "MWP_TIMEOUT"}
    monkeypatch.delenv("MWP_TIMEOUT")
    assert mwp(capsys, "context", "show", "--json").json()["effective"]["timeout"]["source"] == "context"
    # The context's timeout bounds a command against a server that accepts and never answers.
    monkeypatch.delenv("MWP_TARGET")
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        mwp(capsys, "context", "add", "silent", "--target", f"127.0.0.1:{port}", "--timeout", "0.3")
        assert mwp(capsys, "--context", "silent", "health", expect=3).stderr == (
            f"mwp: no answer from 127.0.0.1:{port} within 0.3 s (--timeout)\n"
        )

    # The TLS options the same way, down to the ClientTLS a command dials with.
    ca, env_ca, flag_ca = (key_file(tmp_path / name) for name in ("ctx.pem", "env.pem", "flag.pem"))
    mwp(
        capsys, "context", "add", "tls", "--tls-ca", str(ca), "--tls-server-name", "mesh.internal", "--select"
    )

    def dialled(*argv: str) -> tuple[Path | None, str]:
        args = build_parser().parse_args([*argv, "health"])
        args.context_env = context_environment(args)
        tls = client_tls(args)
        assert tls is not None
        return tls.ca_file, tls.server_name

    assert dialled() == (ca, "mesh.internal")
    monkeypatch.setenv("MWP_TLS_CA", str(env_ca))
    assert dialled() == (env_ca, "mesh.internal")
    assert dialled("--tls-ca", str(flag_ca), "--tls-server-name", "x") == (flag_ca, "x")


def test_a_missing_key_file_or_unknown_context_is_one_line_exit_2(
    ctx_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone.key"
    mwp(
        capsys,
        "context",
        "add",
        "broken",
        "--target",
        CLOSED,
        "--as",
        "alice",
        "--key",
        str(gone),
        "--select",
    )
    for command in (["mission", "list"], ["health"]):
        failed = mwp(capsys, *command, expect=2)
        assert (
            failed.stdout == ""
            and failed.stderr == f"mwp: context 'broken' names key file {gone}, which does not exist\n"
        )
    # A key given by flag or variable is the one used: the context's is not looked at.
    alice = key_file(tmp_path / "alice.key")
    assert mwp(capsys, "mission", "list", "--as", "alice", "--key", str(alice), expect=3).stderr.startswith(
        f"mwp: cannot reach {CLOSED}"
    )
    monkeypatch.setenv("MWP_KEY", str(alice))
    mwp(capsys, "mission", "list", expect=3)
    monkeypatch.delenv("MWP_KEY")
    # Commands that reach no mesh, and the context commands, still work with a broken context.
    mwp(capsys, "keygen", str(tmp_path / "new.key"))
    assert "(missing)" in mwp(capsys, "context", "show").stdout

    # Unknown names, from --context, $MWP_CONTEXT or a selection whose file was deleted by hand.
    mwp(capsys, "context", "add", "spare")
    unknown = f"in {ctx_dir}; known: broken, spare\n"
    assert mwp(capsys, "--context", "nope", "health", expect=2).stderr == f"mwp: no context 'nope' {unknown}"
    monkeypatch.setenv("MWP_CONTEXT", "nope")
    assert mwp(capsys, "mission", "list", expect=2).stderr == f"mwp: no context 'nope' {unknown}"
    monkeypatch.delenv("MWP_CONTEXT")
    for command in (["show", "nope"], ["select", "nope"], ["rm", "nope"]):
        assert mwp(capsys, "context", *command, expect=2).stderr == f"mwp: no context 'nope' {unknown}"
    (ctx_dir / "broken.json").unlink()
    assert mwp(capsys, "health", expect=2).stderr == (
        f"mwp: the selected context 'broken' no longer exists in {ctx_dir}; known: spare\n"
    )
    for bad in ("../x", ".hidden", "a/b", ""):
        refused = mwp(capsys, "context", "add", bad, expect=2)
        assert refused.stderr.startswith(f"mwp: {bad!r} is not a context name")
    assert sorted(p.name for p in ctx_dir.iterdir()) == ["selected", "spare.json"]


async def test_a_selected_context_alone_reaches_a_live_mesh(bench: Bench, ctx_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MWP_TARGET"} | {"PYTHONPATH": str(ROOT)}

    async def mwp_(*argv: str) -> Run:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "missionweave.cli",
            *argv,
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        run = Run(proc.returncode or 0, out.decode(), err.decode())
        assert run.code == 0, f"mwp {' '.join(argv)} exited {run.code}:\n{run.stderr}{run.stdout}"
        return run

    await mwp_(
        "context",
        "add",
        "bench",
        "--target",
        bench.target,
        "--as",
        "alice",
        "--key",
        str(bench.keys["alice"]),
        "--select",
    )
    group = await bench.create()  # through --target and --as (acting commands name their signer)
    health = await mwp_("health")
    assert "missionweave.v1.AuthorityService" in health.stdout and "SERVING" in health.stdout
    missions = (await mwp_("mission", "list", "--json")).json()["missions"]  # read as the context's alice
    assert [(m["group_id"], m["owner_id"]) for m in missions] == [(group, "alice")]
