"""Generated protobuf modules for package missionweave.internal.v1 (built from protos/, never edited)."""
