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

from missionweave_server.console.relay import (
    MESSAGE_FRAME,
    METHODS,
    Refusal,
    Relay,
    frame,
    refusal_of,
    trailer,
)
from missionweave_server.edge.access_log import TokenBucket

log = logging.getLogger("missionweave_server.console")

# A request body larger than this is refused 413 before it is read (the mesh's own message cap is 4 MiB).
MAX_REQUEST_BYTES = 4 * 1024 * 1024
# A unary call the mesh has not answered in this long is given up (the page shows DEADLINE_EXCEEDED).
# Both timeouts are read at each call, so a test may lower them.
UNARY_TIMEOUT_S = 30.0
# A browser that takes longer than this to take one streamed frame is dropped: its mesh stream is
# cancelled and its connection closed (a stalled tab must not hold a mesh stream open).
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
    # Lines a second about refused calls, bursts of twice that (MWP_ACCESS_LOG_RATE, as the access
    # log's); 0 writes none.
    log_rate: float = 100.0


class CallLog:
    """The relay's own lines (logger ``missionweave_server.console``): one at info per refused call,
    naming the method, the outcome (the gRPC code, or the relay's own refusal) and the HTTP status,
    rate limited as the access log is (a flood of refusals cannot fill the disk: the next line written
    carries ``suppressed``); an answered call at debug only (the mesh's access log has a line for it).
    Never a header: a call proof is a bearer credential for its 30 seconds."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.bucket = TokenBucket(rate, 2 * rate)
        self.suppressed = 0

    def refused(self, method: str, outcome: str, status: int) -> None:
        if self.rate <= 0 or not log.isEnabledFor(logging.INFO):
            return
        if not self.bucket.take():
            self.suppressed += 1
            return
        extra: dict[str, object] = {"method": method[:200], "outcome": outcome, "status": status}
        if self.suppressed:
            extra["suppressed"], self.suppressed = self.suppressed, 0
        log.info("console call refused", extra=extra)

    def answered(self, method: str, outcome: str = "OK") -> None:
        log.debug("console call", extra={"method": method, "outcome": outcome})


def build_app(relay: Relay, config: ConsoleConfig) -> web.Application:
    calls = CallLog(config.log_rate)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[_guard(config, calls)])
    # On every answer, the handlers' and aiohttp's own (404, 405, 413, ...), streams included.
    app.on_response_prepare.append(_security_headers)
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

    def refuse(method: str, code: str, message: str, status: int) -> web.Response:
        calls.refused(method, code, status)
        return web.json_response({"code": code, "message": message}, status=status)

    async def call(request: web.Request) -> web.StreamResponse:
        method = "/" + request.match_info["service"] + "/" + request.match_info["method"]
        streaming = METHODS.get(method)
        if streaming is None:
            return refuse(method, "UNIMPLEMENTED", f"the console does not relay {method}", 404)
        if request.headers.get(CONSOLE_HEADER) != "1":
            return refuse(method, "PERMISSION_DENIED", f"the {CONSOLE_HEADER} header is required", 403)
        proof = request.headers.get("X-MWP-Call-Proof", "")
        try:
            call_proof = base64.b64decode(proof, validate=True) if proof else None
        except binascii.Error:
            return refuse(method, "INVALID_ARGUMENT", "X-MWP-Call-Proof is not base64", 400)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            calls.refused(method, "TOO_LARGE", 413)
            raise
        if streaming:
            return await _relay_stream(request, relay, method, body, call_proof, calls)
        try:
            response = await relay.unary(method, body, call_proof, UNARY_TIMEOUT_S)
        except grpc.RpcError as err:
            refusal, status = refusal_of(err), _http_status(err)
            calls.refused(method, refusal.code, status)
            return web.json_response(refusal.document(), status=status)
        calls.answered(method)
        return web.Response(body=response, content_type="application/x-protobuf")

    async def no_icon(_: web.Request) -> web.Response:
        # The page has no icon; a 404 would be an error in every browser's console.
        return web.Response(status=204)

    app.router.add_get("/", index)
    app.router.add_get("/favicon.ico", no_icon)
    app.router.add_get("/api/config", settings)
    app.router.add_post("/rpc/{service}/{method}", call)
    if root.is_dir():  # else not built: the page says so (503), and the mesh serves on
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
    request: web.Request, relay: Relay, method: str, body: bytes, call_proof: bytes | None, calls: CallLog
) -> web.StreamResponse:
    """The mesh's messages as frames, then the trailer. The mesh stream ends with the browser's: a
    browser that goes away cancels this handler (the runner cancels handlers on a lost connection)
    and one that takes no frame for STREAM_WRITE_TIMEOUT_S is dropped."""
    response = web.StreamResponse(headers={"Content-Type": "application/x-mwp-frames"})
    await response.prepare(request)
    call = relay.stream(method, body, call_proof)
    refusal: Refusal | None = None
    try:
        try:
            async for message in call:
                await _write(response, frame(MESSAGE_FRAME, message))
        except grpc.RpcError as err:
            refusal = refusal_of(err)
        await _write(response, trailer(refusal))
        await response.write_eof()
    except TimeoutError:  # a stalled reader: its connection goes too, or aiohttp would wait on it
        call.cancel()
        if request.transport is not None:
            request.transport.abort()
        calls.refused(method, "BROWSER_STALLED", 200)
        return response
    except ConnectionResetError:  # gone while a frame was written
        calls.answered(method, "BROWSER_LEFT")
        return response
    except asyncio.CancelledError:  # gone while the mesh was quiet (the runner cancels the handler)
        calls.answered(method, "BROWSER_LEFT")
        raise
    finally:
        call.cancel()  # whatever ended the relay ends the mesh stream at once
    if refusal is not None:
        calls.refused(method, refusal.code, 200)
    else:
        calls.answered(method)
    return response


async def _write(response: web.StreamResponse, data: bytes) -> None:
    await asyncio.wait_for(response.write(data), STREAM_WRITE_TIMEOUT_S)


async def _security_headers(_: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


def _guard(config: ConsoleConfig, calls: CallLog):  # type: ignore[no-untyped-def]
    @web.middleware
    async def guard(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if config.hosts and request.host not in config.hosts:
            calls.refused(request.path, "MISDIRECTED", 421)
            return web.json_response(
                {
                    "code": "PERMISSION_DENIED",
                    "message": f"this console does not answer to host {request.host!r}",
                },
                status=421,
            )
        return await handler(request)

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
    log_rate: float = 100.0,
) -> ConsoleServer:
    """Serves the console at ``host:port`` (port 0 picks one); an address it cannot bind raises OSError."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    wildcard = host in ("0.0.0.0", "::")
    # Until its own names are known (the port, when 0 asks for one), a console that will answer only
    # some Hosts answers none: never any Host for the moment between binding and naming.
    config = ConsoleConfig(audience, {*hosts, *(() if wildcard else (_UNNAMED,))}, log_rate)
    # handler_cancellation: a browser that leaves (a closed tab, a Mission page left) cancels its
    # handler, and with it the mesh call, at once, not at the Group's next event. shutdown_timeout: a
    # stop cancels what is still open after this long (aiohttp waits 60 s); browsers resume from their cursors.
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
    if not wildcard:  # its own address, and on loopback every spelling of loopback
        names = {host, *_LOOPBACK} if host in _LOOPBACK else {host}
        config.hosts.update(_host_port(name, port) for name in names)
        config.hosts.discard(_UNNAMED)
    scheme = "https" if tls is not None else "http"
    shown = "127.0.0.1" if wildcard else (f"[{host}]" if ":" in host else host)
    return ConsoleServer(runner, port, f"{scheme}://{shown}:{port}/", relay_channel)


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_UNNAMED = " "  # no Host header is a space


def _host_port(host: str, port: int) -> str:
    """``host:port`` as a Host header spells it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
