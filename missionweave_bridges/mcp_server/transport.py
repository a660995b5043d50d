"""Serving the MCP server: stdio (the host starts ``mwp mcp`` and owns its lifetime) or streamable
HTTP, where every request must carry ``Authorization: Bearer <token>``.

HTTP callers are authenticated with one shared bearer token, read from ``--token-file`` or
``$MWP_MCP_TOKEN`` (there is no unauthenticated HTTP mode, loopback included: any local process or
a browser page could otherwise act as the identity). The token stands for the identity ``mwp mcp``
acts as: whoever holds it acts as that identity, so it is as secret as the key. The comparison is
constant-time; a request without it, or with another one, gets 401 before the MCP layer sees it.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

from missionweave_bridges.http_bearer import ASGIApp, BearerGate

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16


def bearer_gate(app: ASGIApp, token: str) -> BearerGate:
    """HTTP requests need ``Authorization: Bearer <token>`` (compared in constant time)."""
    expected = f"Bearer {token}".encode()
    return BearerGate(
        app,
        lambda given: hmac.compare_digest(given.encode("latin-1", "replace"), expected),
        realm="mwp mcp",
        error={"error": "unauthorized", "error_description": "a bearer token is required"},
    )


async def serve_stdio(server: MCPServer[Any]) -> None:
    await server.run_stdio_async()


async def serve_http(server: MCPServer[Any], host: str, port: int, token: str) -> None:
    app = bearer_gate(server.streamable_http_app(host=host), token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    log.info("mwp mcp: streamable HTTP at http://%s:%d/mcp", host, port)
    await http.serve()
