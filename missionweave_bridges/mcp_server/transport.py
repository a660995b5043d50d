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
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
MIN_TOKEN_CHARS = 16


class BearerToken:
    """ASGI middleware: HTTP requests need ``Authorization: Bearer <token>``; lifespan passes."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = json.dumps(
                    {"error": "unauthorized", "error_description": "a bearer token is required"}
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="mwp mcp"'),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def serve_stdio(server: MCPServer[Any]) -> None:
    await server.run_stdio_async()


async def serve_http(server: MCPServer[Any], host: str, port: int, token: str) -> None:
    app = BearerToken(server.streamable_http_app(host=host), token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    log.info("mwp mcp: streamable HTTP at http://%s:%d/mcp", host, port)
    await http.serve()
