"""The artifacts schema line's migrations, oldest first (missionweave_server/storage/schema_versions.py)."""
