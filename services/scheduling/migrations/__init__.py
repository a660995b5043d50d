"""The scheduling schema line's migrations, oldest first (missionweave/schema_versions.py)."""
