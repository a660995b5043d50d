"""Generated protobuf modules for package missionweave.v1 (built from protos/, never edited)."""
