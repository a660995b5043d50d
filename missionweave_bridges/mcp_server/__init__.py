"""An MCP server: an LLM host acts as a Worker or a Coordinator under its own identity (``mwp mcp``)."""
