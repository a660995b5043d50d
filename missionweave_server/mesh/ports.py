"""Every port a process was asked to serve, checked before anything starts (docs/operations.md
"Start-up"): one in use ends the start-up in one line naming it, instead of a process that serves
on without it. The gRPC listener is bound last, after these checks, so a failure leaves nothing
listening; the checks themselves hold no port (see ``check_port_free``), so a port can still be
taken before its bind: ``bound_as_checked`` then names it in the same line."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from missionweave_server.config import Settings
from missionweave_server.edge.channels import ListenError, check_port_free


@dataclass(frozen=True)
class Port:
    address: str  # host:port; empty: not asked for
    role: str  # what serves there, as the message says it: "gRPC", "metrics of authority-0"
    moved_by: str  # how an operator gives it another address (or none)


def serve_ports(settings: Settings, *, console: bool) -> list[Port]:
    """The ports one ``mwp serve`` process serves with ``settings`` (the console only where asked)."""
    ports = [
        Port(settings.listen, "gRPC", "--listen or MWP_LISTEN"),
        Port(settings.health_listen, "health", "--health-listen or MWP_HEALTH_LISTEN, '' for none"),
        Port(settings.metrics_listen, "metrics", "--metrics-listen or MWP_METRICS_LISTEN, '' for none"),
    ]
    if console:
        ports.append(Port(settings.console_listen, "console", "--console-listen, or --no-console for none"))
    return ports


def check_ports(ports: Iterable[Port]) -> None:
    """Raises ``ListenError`` for the first port asked for that cannot be served."""
    for port in ports:
        if not port.address:
            continue
        try:
            check_port_free(port.address, port.role)
        except ListenError as taken:
            raise ListenError(f"{taken}; give it another address ({port.moved_by})") from None


@contextmanager
def bound_as_checked(port: Port) -> Iterator[None]:
    """Around the bind of ``port``'s listener: a bind failing because the port was taken since
    ``check_ports`` raises the check's own error (the port, its role, how to move it) instead of the
    listener's (gRPC's says only "cannot listen on ADDRESS")."""
    try:
        yield
    except OSError:
        check_ports([port])  # raises when a server now listens there
        raise
