"""The MWP_* variables as ``Settings.from_env`` reads them (missionweave_server/config.py, D176): the
defaults, each kind of variable, and a malformed value refused with one line naming its variable,
which ``mwp serve`` prints as its one error line before it starts anything."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from missionweave.kernel.env import DEFAULT_DATA_DIR
from missionweave_server import config
from missionweave_server.config import DEFAULT_CONSOLE_LISTEN, DEFAULT_METRICS_LISTEN, SERVICES, Settings

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_of_a_bare_settings_and_of_an_empty_environment() -> None:
    bare = Settings()
    assert (bare.listen, bare.data_dir, bare.database_url, bare.instance_id) == (
        "127.0.0.1:50051",
        DEFAULT_DATA_DIR,
        "",
        "local",
    )
    assert (bare.services, bare.peers, bare.nonce_store, bare.sqlite_synchronous) == (
        SERVICES,
        {},
        "database",
        "FULL",
    )
    assert (bare.group_rate, bare.group_burst, bare.commit_batch, bare.verify_workers) == (
        200.0,
        400.0,
        32,
        1,
    )
    assert (bare.artifact_quota_bytes, bare.max_delegation_depth, bare.max_mission_depth) == (
        10 * 1024**3,
        3,
        2,
    )
    assert (bare.insecure, bare.tls, bare.tls_auto, bare.malloc_tuning) == (False, False, False, True)
    assert bare.tls_cert is bare.authority_key is bare.mesh_token_file is None
    assert bare.metrics_listen == ""  # off in a bare Settings(): tests start many meshes in one process
    assert bare.console_listen == "" and bare.console_hosts == ()  # the same for the web console
    assert bare.authority_key_path == DEFAULT_DATA_DIR / "keys" / "authority.key"
    assert bare.witness_dir_path == DEFAULT_DATA_DIR / "witness"
    assert bare.mesh_token_path == DEFAULT_DATA_DIR / "keys" / "mesh.token"
    assert bare.admin_key_path == DEFAULT_DATA_DIR / "keys" / "admin.key"
    assert bare.db_url.startswith("sqlite+aiosqlite:///") and bare.audiences == ["127.0.0.1:50051"]

    read = Settings.from_env({})
    assert read.metrics_listen == DEFAULT_METRICS_LISTEN  # what `mwp serve` serves unless told otherwise
    assert read.console_listen == DEFAULT_CONSOLE_LISTEN
    assert dataclasses.replace(read, metrics_listen="", console_listen="") == bare


def test_settings_stay_a_plain_dataclass_built_by_name_and_assigned() -> None:
    s = Settings(listen="127.0.0.1:0", data_dir=Path("/d"), grace_seconds=1)
    s.group_rate = 5.0
    s.services = ("gateway",)
    assert (s.listen, s.group_rate, s.services, s.grace_seconds) == ("127.0.0.1:0", 5.0, ("gateway",), 1)
    assert dataclasses.replace(s, instance_id="x").instance_id == "x"
    assert s.admin_key_path == Path("/d/keys/admin.key")


def test_each_kind_of_variable() -> None:
    s = Settings.from_env(
        {
            # text, kept as given (MWP_SQLITE_SYNCHRONOUS upper-cased, MWP_NONCE_STORE lower-cased)
            "MWP_LISTEN": "0.0.0.0:7000",
            "MWP_INSTANCE_ID": "auth-1",
            "MWP_DATABASE_URL": "postgresql://h/db",
            "MWP_SQLITE_SYNCHRONOUS": "normal",
            "MWP_NONCE_STORE": " Memory ",
            "MWP_LOG_LEVEL": "debug",
            "MWP_ADVERTISE_ADDR": "10.0.0.1:7000",
            "MWP_AUDIENCE": "front:443",
            "MWP_TLS_SERVER_NAME": "mesh",
            # paths
            "MWP_DATA_DIR": "/srv/mw",
            "MWP_AUTHORITY_KEY": "/k/authority.key",
            "MWP_TLS_CERT": "/t/c.pem",
            "MWP_TLS_KEY": "",
            "MWP_AUTHORITY_WITNESS_DIR": "/w",
            # numbers
            "MWP_GROUP_RATE": "2.5",
            "MWP_GROUP_BURST": " 7 ",
            "MWP_COMMIT_BATCH": "64",
            "MWP_VERIFY_WORKERS": "0",
            "MWP_GATEWAY_STREAM_BUFFER_BYTES": "2048",
            "MWP_ARTIFACT_QUOTA_BYTES": "0",
            "MWP_MAX_MISSION_DEPTH": "64",
            "MWP_ACCESS_LOG_RATE": "0",
            # yes/no flags: env_flag's spellings
            "MWP_INSECURE": "yes",
            "MWP_TLS": " On ",
            "MWP_TLS_AUTO": "0",
            "MWP_MALLOC_TUNING": "",
            # the comma list, the peers, and variables that are not this module's
            "MWP_SERVICES": " gateway, authority ,",
            "MWP_AUTHORITY_ADDR": "a:1",
            "MWP_GATEWAY_ADDR": "",
            "MWP_METRICS_LISTEN": " ",
            "MWP_S3_BUCKET": "blobs",
            "OTHER": "x",
        }
    )
    assert (s.listen, s.instance_id, s.database_url, s.sqlite_synchronous) == (
        "0.0.0.0:7000",
        "auth-1",
        "postgresql://h/db",
        "NORMAL",
    )
    assert (s.nonce_store, s.log_level, s.advertise, s.tls_server_name) == (
        "memory",
        "debug",
        "10.0.0.1:7000",
        "mesh",
    )
    assert s.audiences == ["front:443", "0.0.0.0:7000", "10.0.0.1:7000"]
    assert (s.data_dir, s.authority_key, s.tls_cert, s.witness_dir) == (
        Path("/srv/mw"),
        Path("/k/authority.key"),
        Path("/t/c.pem"),
        Path("/w"),
    )
    assert s.tls_key is None  # set but empty: none
    assert s.mesh_token_path == Path("/srv/mw/keys/mesh.token") and s.db_url == "postgresql://h/db"
    assert (s.group_rate, s.group_burst, s.commit_batch, s.verify_workers) == (2.5, 7.0, 64, 0)
    assert type(s.group_burst) is float and type(s.commit_batch) is int
    assert (
        s.gateway_stream_buffer_bytes,
        s.artifact_quota_bytes,
        s.max_mission_depth,
        s.access_log_rate,
    ) == (2048, 0, 64, 0.0)
    assert (s.insecure, s.tls, s.tls_auto, s.malloc_tuning) == (
        True,
        True,
        False,
        False,
    )  # MWP_MALLOC_TUNING= is "no"
    assert s.services == ("gateway", "authority") and s.peers == {"authority": "a:1"}
    assert s.metrics_listen == ""  # set but empty: no metrics
    assert (s.grace_seconds, s.gateway_max_streams) == (10.0, 10_000)  # untouched


def test_unset_or_empty_leave_the_default_where_they_did() -> None:
    s = Settings.from_env({"MWP_SERVICES": "", "MWP_NONCE_STORE": "  ", "MWP_AUTHORITY_KEY": ""})
    assert (s.services, s.nonce_store, s.authority_key, s.malloc_tuning) == (SERVICES, "database", None, True)


def test_from_env_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MWP_COMMIT_BATCH", "3")
    assert Settings.from_env().commit_batch == 3


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MWP_GROUP_RATE", "fast", "MWP_GROUP_RATE must be a number, not 'fast'"),
        ("MWP_COMMIT_IDLE_MS", "", "MWP_COMMIT_IDLE_MS must be a number, not ''"),
        ("MWP_COMMIT_BATCH", "1.5", "MWP_COMMIT_BATCH must be a whole number, not '1.5'"),
        ("MWP_GATEWAY_MAX_STREAMS", "lots", "MWP_GATEWAY_MAX_STREAMS must be a whole number, not 'lots'"),
        (
            "MWP_INSECURE",
            "maybe",
            "MWP_INSECURE must be one of 1, true, yes, on or 0, false, no, off, not 'maybe'",
        ),
        (
            "MWP_MALLOC_TUNING",
            "2",
            "MWP_MALLOC_TUNING must be one of 1, true, yes, on or 0, false, no, off, not '2'",
        ),
        ("MWP_MAX_MISSION_DEPTH", "0", "MWP_MAX_MISSION_DEPTH is a depth of 1..64"),
        ("MWP_MAX_DELEGATION_DEPTH", "65", "MWP_MAX_DELEGATION_DEPTH is a depth of 0..64"),
        ("MWP_ARTIFACT_QUOTA_BYTES", "-1", "MWP_ARTIFACT_QUOTA_BYTES is a number of bytes (0: no quota)"),
        (
            "MWP_LINK_RELAY_POLL_MS",
            "-1",
            "MWP_LINK_RELAY_POLL_MS is a number of milliseconds (0: deliver no links here)",
        ),
        (
            "MWP_ACCESS_LOG_RATE",
            "-0.5",
            "MWP_ACCESS_LOG_RATE is a number of lines a second (0: no access log)",
        ),
        ("MWP_NONCE_STORE", "disk", "MWP_NONCE_STORE is one of memory, database, not 'disk'"),
    ],
)
def test_a_malformed_value_is_refused_naming_its_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        Settings.from_env({variable: value})
    assert str(refused.value) == message


def test_every_malformed_variable_is_named_on_one_line() -> None:
    with pytest.raises(ValueError) as refused:
        Settings.from_env({"MWP_GROUP_RATE": "fast", "MWP_VERIFY_WORKERS": "two"})
    assert (
        str(refused.value)
        == "MWP_GROUP_RATE must be a number, not 'fast'; MWP_VERIFY_WORKERS must be a whole number, not 'two'"
    )


def test_every_variable_read_is_in_the_operators_table() -> None:
    """The module docstring is the operator's reference: a variable Settings reads is listed there
    (``MWP_GROUP_RATE / _BURST`` lists MWP_GROUP_BURST too)."""
    doc = config.__doc__ or ""
    listed = set(re.findall(r"MWP_[A-Z0-9_]+", doc))
    listed |= {
        first.rsplit("_", 1)[0] + suffix
        for first, suffix in re.findall(r"(MWP_[A-Z0-9_]+)\s*/\s*(_[A-Z0-9_]+)", doc)
    }
    read = set(config.variables().values())
    assert len(read) > 40 and "MWP_GROUP_RATE" in read  # the lookup did find them
    assert sorted(read - listed) == []


def test_serve_with_a_malformed_variable_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWP_")}
    env |= {"PYTHONPATH": str(ROOT), "MWP_DATA_DIR": str(tmp_path / "data"), "MWP_GROUP_RATE": "fast"}
    done = subprocess.run(
        [sys.executable, "-m", "missionweave.cli", "serve", "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == "mwp serve: MWP_GROUP_RATE must be a number, not 'fast'\n"
    assert done.stdout == ""
    assert not (tmp_path / "data").exists()  # refused before it held the data dir or started anything
