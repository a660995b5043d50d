"""Bridges between the MissionWeaveProtocol and the protocols agents already speak (docs/bridges.md):

- ``missionweave_bridges.a2a.worker``: an A2A agent serves WorkItems as a MissionWeave Worker
  (``mwp bridge a2a``);
- ``missionweave_bridges.a2a.server``: Missions and WorkItems as A2A tasks for A2A clients
  (``mwp bridge a2a-server``);
- ``missionweave_bridges.mcp_server``: an MCP server through which an LLM host acts as a Worker or a
  Coordinator under its own identity (``mwp mcp``).

They are clients of the public contracts (missionweave.sdk, missionweave.v1): nothing here imports
the server, and the server imports nothing here (the import-linter contracts in pyproject.toml)."""
