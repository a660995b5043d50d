"""Versioned schemas (issue 39, docs/upgrades.md): every table comes from a migration, and a store is
served only at the revision its code knows."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, inspect, select, text

from missionweave_server.mesh.schemas import LINES
from missionweave_server.storage import schema_versions
from missionweave_server.storage.db import make_engine
from missionweave_server.storage.schema_versions import SchemaLine, SchemaMismatch, State
from tests.test_cli_serve import ROOT, free_port, mwp, wait_healthy


def _differences(conn: Connection, line: SchemaLine) -> list[object]:
    context = MigrationContext.configure(
        conn,
        opts={
            "compare_type": True,
            "include_name": lambda name, kind, _parent: kind != "table" or name in line.tables,
        },
    )
    return list(compare_metadata(context, line.metadata))


@pytest.mark.parametrize("name", list(LINES))
async def test_each_line_built_by_its_migrations_is_the_schema_its_code_declares(
    db_url: str, name: str
) -> None:
    """A change to a service's tables without its migration fails here (on SQLite and PostgreSQL)."""
    line = LINES[name]
    engine = make_engine(db_url)
    try:
        await schema_versions.prepare(engine, [line])
        async with engine.connect() as conn:
            assert await conn.run_sync(_differences, line) == []
            assert (await conn.run_sync(schema_versions.read_status, line)).state is State.CURRENT
    finally:
        await engine.dispose()


def test_every_migration_says_whether_it_runs_online() -> None:
    for line in LINES.values():
        steps = schema_versions.steps(line, None)
        assert steps and steps[0].revision == f"{line.name}_0001"
        assert all(isinstance(step.online, bool) and step.description for step in steps)


# ------------------------------------------------------------------ the mechanism, on a line of its own

SAMPLE = MetaData()
Table("sample", SAMPLE, Column("k", Integer, primary_key=True), Column("a", String(20), nullable=False))

MIGRATIONS = {
    "0001_first.py": (
        "sample_0001",
        None,
        True,
        """
        op.create_table("sample", sa.Column("k", sa.Integer, primary_key=True),
                        sa.Column("a", sa.String(20), nullable=False))
    """,
    ),
    "0002_column_b.py": (
        "sample_0002",
        "sample_0001",
        True,
        """
        with op.batch_alter_table("sample") as batch:
            batch.add_column(sa.Column("b", sa.String(20), nullable=True))
        op.execute("UPDATE sample SET b = a || '!'")
    """,
    ),
    "0003_offline.py": (
        "sample_0003",
        "sample_0002",
        False,
        """
        op.execute("UPDATE sample SET a = upper(a)")
    """,
    ),
}


def release(tmp_path: Path, name: str, files: list[str], *, broken: str | None = None) -> SchemaLine:
    """The sample line as a release with ``files`` would ship it (``broken``: that migration raises
    after its first statement)."""
    directory = tmp_path / name
    directory.mkdir()
    for file in files:
        revision, down, online, body = MIGRATIONS[file]
        failure = "\n    raise RuntimeError('half-way')" if file == broken else ""
        (directory / file).write_text(
            f'"""{file}"""\nimport sqlalchemy as sa\nfrom alembic import op\n\n'
            f"revision = {revision!r}\ndown_revision = {down!r}\nonline = {online}\n\n\n"
            f"def upgrade() -> None:\n{textwrap.indent(textwrap.dedent(body).strip(), '    ')}{failure}\n"
        )
    return SchemaLine("sample", SAMPLE, directory)


async def _revision(engine, line: SchemaLine) -> str | None:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.run_sync(schema_versions.read_status, line)).revision


@pytest.fixture
async def sample_engine(db_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(db_url)
    drop = SchemaLine("sample", SAMPLE, Path("."))
    async with engine.begin() as conn:
        await conn.run_sync(schema_versions.drop_line, drop)
    yield engine
    async with engine.begin() as conn:
        await conn.run_sync(schema_versions.drop_line, drop)
    await engine.dispose()


async def test_a_store_is_served_only_at_the_revision_its_code_knows(sample_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    old = release(tmp_path, "v1", ["0001_first.py"])
    new = release(tmp_path, "v2", ["0001_first.py", "0002_column_b.py"])
    await schema_versions.prepare(sample_engine, [old])  # an empty store: installed
    async with sample_engine.begin() as conn:
        await conn.execute(text("INSERT INTO sample (k, a) VALUES (1, 'kept')"))
    with pytest.raises(
        SchemaMismatch, match=r"sample_0001 and this release needs sample_0002: run `mwp db upgrade`"
    ):
        await schema_versions.prepare(sample_engine, [new])
    [(before, steps)] = await schema_versions.upgrade(sample_engine, [new])
    assert before.state is State.BEHIND and [s.revision for s in steps] == ["sample_0002"]
    await schema_versions.prepare(sample_engine, [new])
    async with sample_engine.connect() as conn:
        assert (await conn.execute(text("SELECT k, a, b FROM sample"))).all() == [(1, "kept", "kept!")]
    with pytest.raises(SchemaMismatch, match=r"does not know .* a newer release wrote them"):
        await schema_versions.prepare(sample_engine, [old])  # the older release refuses the newer store
    with pytest.raises(SchemaMismatch, match="newer release"):
        await schema_versions.upgrade(sample_engine, [old])


async def test_a_migration_that_fails_half_way_leaves_the_store_as_it_was(
    sample_engine, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    await schema_versions.prepare(sample_engine, [release(tmp_path, "v1", ["0001_first.py"])])
    async with sample_engine.begin() as conn:
        await conn.execute(text("INSERT INTO sample (k, a) VALUES (1, 'x')"))
    broken = release(tmp_path, "v2", ["0001_first.py", "0002_column_b.py"], broken="0002_column_b.py")
    with pytest.raises(RuntimeError, match="half-way"):
        await schema_versions.upgrade(sample_engine, [broken])
    assert await _revision(sample_engine, broken) == "sample_0001"
    async with sample_engine.connect() as conn:
        columns = await conn.run_sync(lambda c: [col["name"] for col in inspect(c).get_columns("sample")])
    assert columns == ["k", "a"]  # the column added before the failure is gone with it


async def test_a_migration_that_cannot_run_online_waits_for_offline(sample_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    await schema_versions.prepare(sample_engine, [release(tmp_path, "v1", ["0001_first.py"])])
    v3 = release(tmp_path, "v3", ["0001_first.py", "0002_column_b.py", "0003_offline.py"])
    with pytest.raises(SchemaMismatch, match=r"sample_0003 cannot run while the services serve.*--offline"):
        await schema_versions.upgrade(sample_engine, [v3])
    assert await _revision(sample_engine, v3) == "sample_0001"  # refused before anything ran, 0002 too
    applied: list[tuple[str, str]] = []
    await schema_versions.upgrade(
        sample_engine, [v3], offline_ok=True, progress=lambda *step: applied.append(step)
    )
    assert applied == [("sample", "sample_0002"), ("sample", "sample_0003")]
    assert await _revision(sample_engine, v3) == "sample_0003"


async def test_replicas_upgrading_at_once_run_each_migration_once(
    sample_engine, db_url: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    await schema_versions.prepare(sample_engine, [release(tmp_path, "v1", ["0001_first.py"])])
    async with sample_engine.begin() as conn:
        await conn.execute(text("INSERT INTO sample (k, a) VALUES (1, 'x')"))
    v2 = release(tmp_path, "v2", ["0001_first.py", "0002_column_b.py"])
    engines = [make_engine(db_url) for _ in range(3)]
    try:
        results = await asyncio.gather(*(schema_versions.upgrade(e, [v2]) for e in engines))
    finally:
        for engine in engines:
            await engine.dispose()
    assert sorted(len(steps) for [(_, steps)] in results) == [0, 0, 1]
    async with sample_engine.connect() as conn:
        assert (await conn.execute(select(text("b")).select_from(text("sample")))).scalar() == "x!"


def test_a_migration_without_its_online_declaration_is_refused(tmp_path: Path) -> None:
    line = release(tmp_path, "v1", ["0001_first.py"])
    path = line.migrations / "0001_first.py"
    path.write_text(path.read_text().replace("online = True\n", ""))
    with pytest.raises(RuntimeError, match="does not declare `online: bool`"):
        schema_versions.steps(line, None)


# ------------------------------------------------------------------ the operator's view


def test_serve_refuses_a_store_of_an_older_schema_until_db_upgrade(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {**os.environ, "MWP_DATA_DIR": str(data), "PYTHONPATH": str(ROOT), "MWP_METRICS_LISTEN": ""}

    async def unversioned_store() -> None:  # as release 0.1.0 left it: its tables, no version tables
        engine = make_engine(f"sqlite+aiosqlite:///{data / 'missionweave.db'}")
        await schema_versions.prepare(engine, LINES.values())
        async with engine.begin() as conn:
            for line in LINES.values():
                await conn.execute(text(f"DROP TABLE {line.version_table}"))
        await engine.dispose()

    data.mkdir(mode=0o700)
    asyncio.run(unversioned_store())
    serve = [sys.executable, "-m", "missionweave.cli", "serve", "--listen", f"127.0.0.1:{free_port()}"]
    refused = subprocess.run(serve, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("mwp serve: the membership tables were made before versioned schemas")
        and "run `mwp db upgrade`" in last
    )

    status = mwp("db", "status", env=env, check=False)
    assert status.returncode == 1 and "unversioned" in status.stdout and "mwp db upgrade" in status.stdout
    # Since membership_0002 (grants, D170) an upgrade from 0.1.0 needs the services stopped.
    online_only = mwp("db", "upgrade", env=env, check=False)
    assert (
        online_only.returncode == 1
        and "membership_0002" in online_only.stderr
        and "--offline" in online_only.stderr
    )
    upgraded = mwp("db", "upgrade", "--offline", env=env)
    assert (
        f"{len(LINES) + 3} migration(s)" in upgraded.stdout
    )  # each line's 0001; membership, authority, artifacts 0002
    assert mwp("db", "status", env=env).returncode == 0
    assert "0 migration(s)" in mwp("db", "upgrade", env=env).stdout  # nothing left to do

    port = free_port()
    proc = subprocess.Popen(
        [*serve[:-1], f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(f"127.0.0.1:{port}", env)
    finally:
        proc.kill()
        proc.wait(10)
