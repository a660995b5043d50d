"""The HTTP side of a bridge's bearer tokens: an ASGI layer in front of the protocol SDK's app that
answers 401 (``WWW-Authenticate: Bearer``) before the app sees a request without an accepted token.
What a token stands for is the bridge's to say (``accepts``); lifespan and public paths pass."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BearerGate:
    """Passes an HTTP request whose ``Authorization`` value ``accepts`` takes; 401 otherwise."""

    def __init__(
        self,
        app: ASGIApp,
        accepts: Callable[[str], bool],
        *,
        realm: str,
        error: dict[str, str],
        public_paths: Collection[str] = (),
    ) -> None:
        self.app, self.accepts, self.public_paths = app, accepts, public_paths
        self.realm = f'Bearer realm="{realm}"'.encode()
        self.body = json.dumps(error).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.public_paths:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        if self.accepts(given):
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", self.realm),
                    (b"content-length", str(len(self.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self.body})
