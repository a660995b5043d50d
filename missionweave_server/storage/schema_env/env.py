"""Alembic's environment, for writing a new migration only (``make migration``): upgrades and status
run through ``missionweave_server.storage.schema_versions`` without it. The caller passes the connection and the
schema line in ``config.attributes``."""

from alembic import context

config = context.config
line = config.attributes["line"]
context.configure(
    connection=config.attributes["connection"],
    target_metadata=line.metadata,
    version_table=line.version_table,
    render_as_batch=config.attributes["connection"].dialect.name == "sqlite",
    # Only this line's tables: the others in the same database belong to other services.
    include_name=lambda name, kind, _parent: kind != "table" or name in line.tables,
)
with context.begin_transaction():
    context.run_migrations()
