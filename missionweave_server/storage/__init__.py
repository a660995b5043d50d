"""Databases (SQLAlchemy: SQLite embedded, PostgreSQL at scale), schema versions and their migrations, and replay of the event log."""
