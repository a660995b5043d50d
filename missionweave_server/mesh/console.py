"""Where the process serving the gateway also serves the web console (MWP_CONSOLE_LISTEN, docs/console.md).

The console relays to this process's own public listener through an ordinary client channel, so
its calls pass the same authentication, authorization, limits and access log as any other client's.
"""

from __future__ import annotations

import ssl

from missionweave.kernel.transport import ClientTLS, open_channel
from missionweave_server.config import Settings
from missionweave_server.console.site import ConsoleServer, serve_console
from missionweave_server.edge.channels import ServerTLS


def check_console_tls(settings: Settings, server_tls: ServerTLS | None, peer_tls: ClientTLS | None) -> None:
    """Before anything starts: a console that could not dial this mesh ends the start-up now."""
    if settings.console_listen and server_tls is not None and peer_tls is None:
        raise ValueError(
            "the console (MWP_CONSOLE_LISTEN) dials this mesh over TLS and needs its CA: set MWP_TLS_CA "
            "(and a client certificate where clients must present one), or --console-listen '' for no console"
        )


async def start_console(
    settings: Settings, port: int, server_tls: ServerTLS | None, peer_tls: ClientTLS | None
) -> ConsoleServer:
    host = settings.listen.rsplit(":", 1)[0].strip("[]")
    target_host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "localhost") else host
    target = f"{target_host}:{port}"
    channel = open_channel(target, peer_tls if server_tls is not None else None)
    tls: ssl.SSLContext | None = None
    if server_tls is not None:  # the page is served as the rest: over TLS, with the mesh's certificate
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(server_tls.cert_file, server_tls.key_file)
    try:
        return await serve_console(
            settings.console_listen, channel, target, hosts=settings.console_hosts, tls=tls
        )
    except BaseException:
        await channel.close()
        raise
