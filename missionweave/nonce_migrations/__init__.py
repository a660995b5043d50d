"""The nonces schema line's migrations, oldest first (missionweave/schema_versions.py)."""
