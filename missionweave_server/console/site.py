"""The console's HTTP side (aiohttp): the page's files, its configuration and the relay's routes.

Requests are answered only when they name this console by its own address (``Host``: against DNS
rebinding) and, for the relay, carry the ``X-MWP-Console`` header (a cross-site page cannot send it
without a CORS preflight, which is never granted). The page may load nothing but its own files
(Content-Security-Policy). None of this is what keeps a caller from reading or acting: the call
proofs and signed commands the mesh checks are (docs/console.md, "Threat model").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import ssl
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import grpc
from aiohttp import web

from missionweave_server.console.relay import MESSAGE_FRAME, METHODS, Relay, frame, refusal_of, trailer

log = logging.getLogger("missionweave_server.console")

# A request body larger than this is refused 413 before it is read (the mesh's own message cap is 4 MiB).
MAX_REQUEST_BYTES = 4 * 1024 * 1024
# A unary call the mesh has not answered in this long is given up (the page shows DEADLINE_EXCEEDED).
UNARY_TIMEOUT_S = 30.0
# A browser that takes longer than this to take one streamed frame is dropped (a stalled tab must
# not hold a mesh stream open).
STREAM_WRITE_TIMEOUT_S = 30.0
CONSOLE_HEADER = "X-MWP-Console"
SHUTDOWN_S = 0.5

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def static_dir() -> Path:
    return Path(str(resources.files("missionweave_server.console") / "static"))


@dataclass
class ConsoleConfig:
    # What the page signs as a call proof's audience: the address the relay dials.
    audience: str
    # Host headers this console answers to: its own address (loopback spellings of it too) and
    # MWP_CONSOLE_HOSTS; empty answers any (a wildcard address behind an Ingress, without MWP_CONSOLE_HOSTS).
    hosts: set[str]


def build_app(relay: Relay, config: ConsoleConfig) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[_guard(config)])
    root = static_dir()

    async def index(_: web.Request) -> web.StreamResponse:
        if not (root / "app.js").is_file():
            return web.Response(
                status=503,
                text="The web console was not built into this installation: run `make console` in the "
                "checkout (Node.js 20+ and npm), then restart the mesh.\n",
            )
        return web.FileResponse(root / "index.html")

    async def settings(_: web.Request) -> web.Response:
        return web.json_response({"audience": config.audience, "methods": sorted(METHODS)})

    async def call(request: web.Request) -> web.StreamResponse:
        method = "/" + request.match_info["service"] + "/" + request.match_info["method"]
        streaming = METHODS.get(method)
        if streaming is None:
            return web.json_response(
                {"code": "UNIMPLEMENTED", "message": f"the console does not relay {method}"}, status=404
            )
        if request.headers.get(CONSOLE_HEADER) != "1":
            return web.json_response(
                {"code": "PERMISSION_DENIED", "message": f"the {CONSOLE_HEADER} header is required"},
                status=403,
            )
        proof = request.headers.get("X-MWP-Call-Proof", "")
        try:
            call_proof = base64.b64decode(proof, validate=True) if proof else None
        except binascii.Error:
            return web.json_response(
                {"code": "INVALID_ARGUMENT", "message": "X-MWP-Call-Proof is not base64"}, status=400
            )
        body = await request.read()
        if streaming:
            return await _relay_stream(request, relay, method, body, call_proof)
        try:
            response = await relay.unary(method, body, call_proof, UNARY_TIMEOUT_S)
        except grpc.RpcError as err:
            return web.json_response(refusal_of(err).document(), status=_http_status(err))
        return web.Response(body=response, content_type="application/x-protobuf")

    async def no_icon(_: web.Request) -> web.Response:
        # The page has no icon; a 404 would be an error in every browser's console.
        return web.Response(status=204)

    app.router.add_get("/", index)
    app.router.add_get("/favicon.ico", no_icon)
    app.router.add_get("/api/config", settings)
    app.router.add_post("/rpc/{service}/{method}", call)
    app.router.add_static("/static/", root, follow_symlinks=False)
    return app


def _http_status(err: grpc.RpcError) -> int:
    code = err.code() if isinstance(err, grpc.aio.AioRpcError) else None
    return {
        grpc.StatusCode.UNAUTHENTICATED: 401,
        grpc.StatusCode.PERMISSION_DENIED: 403,
        grpc.StatusCode.NOT_FOUND: 404,
        grpc.StatusCode.INVALID_ARGUMENT: 400,
        grpc.StatusCode.FAILED_PRECONDITION: 409,
        grpc.StatusCode.ALREADY_EXISTS: 409,
        grpc.StatusCode.ABORTED: 409,
        grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
        grpc.StatusCode.UNAVAILABLE: 503,
        grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    }.get(code, 500)  # type: ignore[arg-type]


async def _relay_stream(
    request: web.Request, relay: Relay, method: str, body: bytes, call_proof: bytes | None
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-mwp-frames"})
    await response.prepare(request)
    call = relay.stream(method, body, call_proof)
    try:
        refusal = None
        try:
            async for message in call:
                await asyncio.wait_for(response.write(frame(MESSAGE_FRAME, message)), STREAM_WRITE_TIMEOUT_S)
        except grpc.RpcError as err:
            refusal = refusal_of(err)
        await asyncio.wait_for(response.write(trailer(refusal)), STREAM_WRITE_TIMEOUT_S)
        await response.write_eof()
    except (ConnectionResetError, TimeoutError):
        log.info("a console stream's browser went away", extra={"method": method})
    finally:
        call.cancel()  # a browser that left ends the mesh stream at once
    return response


def _guard(config: ConsoleConfig):  # type: ignore[no-untyped-def]
    @web.middleware
    async def guard(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if config.hosts and request.host not in config.hosts:
            return web.json_response(
                {
                    "code": "PERMISSION_DENIED",
                    "message": f"this console does not answer to host {request.host!r}",
                },
                status=421,
            )
        response = await handler(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    return guard


@dataclass
class ConsoleServer:
    runner: web.AppRunner
    port: int
    url: str
    relay_channel: grpc.aio.Channel

    async def stop(self) -> None:
        # The relayed calls first: a stream follows its Group until cancelled, and aiohttp would wait
        # for the open ones (60 s, then 60 s more after cancelling their requests) before giving up.
        await self.relay_channel.close()
        await self.runner.cleanup()


async def serve_console(
    address: str,
    relay_channel: grpc.aio.Channel,
    audience: str,
    *,
    hosts: tuple[str, ...] = (),
    tls: ssl.SSLContext | None = None,
) -> ConsoleServer:
    """Serves the console at ``host:port`` (port 0 picks one); an address it cannot bind raises OSError."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    config = ConsoleConfig(audience, set())
    # handler_cancellation: a browser that leaves (a closed tab, a Mission page left) ends its
    # relayed mesh stream at once, not at the Group's next event. shutdown_timeout: a stop cancels
    # what is still open after this long (aiohttp waits 60 s by default); browsers resume from their cursors.
    runner = web.AppRunner(
        build_app(Relay(relay_channel), config),
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, int(port_text), ssl_context=tls, reuse_address=True)
    try:
        await site.start()
    except OSError as failed:
        await runner.cleanup()
        raise OSError(f"the console cannot listen on {address}: {failed.strerror or failed}") from None
    port = int(runner.addresses[0][1])  # the bound port, when 0 asked for one
    wildcard = host in ("0.0.0.0", "::")
    if hosts or not wildcard:
        config.hosts.update(hosts)
        names = {host, "127.0.0.1", "localhost", "[::1]"} if host in _LOOPBACK else {host}
        config.hosts.update(f"{name}:{port}" for name in names - {"0.0.0.0", "::"})
    scheme = "https" if tls is not None else "http"
    shown = "127.0.0.1" if wildcard else (f"[{host}]" if ":" in host else host)
    return ConsoleServer(runner, port, f"{scheme}://{shown}:{port}/", relay_channel)


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
