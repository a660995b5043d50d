"""Refused TLS handshakes out of gRPC's ``handshaker`` trace (missionweave/kernel/handshake_trace.py
turns it on): one JSON record per reason per interval, naming the peer's address and the TLS error,
with the count of those suppressed since. Read by the stderr relay (stderr_relay.py), so standard
library only, and imported there by path.

A failure is the trace's ``CallNextHandshakerLocked: error=<not OK>`` record: its error spans
several lines (gRPC's source-location trace) and the peer's address follows in its arguments
(``grpc.internal.endpoint_peer_address=ipv4:10.0.0.7:51234``), with the server's credentials when
the connection is one it accepted: the process's own calls to its peers are traced too, and their
failures are not logged here (a peer that does not answer is, elsewhere). The server sees why only when the
TLS layer itself refused: a client that does not trust the server's certificate just closes the
connection, and that is what is logged.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

INTERVAL_S = 60.0
FAILED = re.compile(r"CallNextHandshakerLocked: error=(?!OK\b)(.*)")
PEER = re.compile(r"endpoint_peer_address=([^,}\s]+)")
# In the arguments of a connection this server accepted (never in those of its own calls out).
SERVER_SIDE = "grpc.internal.server_credentials="
# The TLS error names that say why, and the reason logged for each (the first that matches).
REASONS = (
    ("WRONG_VERSION_NUMBER", "not_tls", "the client did not speak TLS (plain text to a TLS port?)"),
    ("HTTP_REQUEST", "not_tls", "the client did not speak TLS (plain text to a TLS port?)"),
    ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "no_client_certificate", "no client certificate (mTLS)"),
    ("CERTIFICATE_VERIFY_FAILED", "client_certificate_refused", "the client certificate does not verify"),
    ("ALERT", "alert_from_client", "the client refused the handshake"),
    (
        "Socket closed",
        "closed_by_client",
        "the client closed the connection in the handshake (does it trust this server's CA and name?)",
    ),
)


def classify(error: str) -> tuple[str, str]:
    for needle, reason, why in REASONS:
        if needle in error:
            return reason, why
    return "other", "the TLS handshake failed"


def is_trace(source: str, message: str) -> bool:
    """A line of the handshake trace (or the TLS layer's own note of a failure), not news itself."""
    return source.startswith(("handshaker.cc", "channel_trace.h", "ssl_transport_security.cc")) and (
        "andshake" in message
    )


@dataclass
class Failures:
    """Collects one failure at a time from the trace's lines and writes it, rate-limited."""

    emit: Callable[[dict[str, object]], None]
    interval_s: float = INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    _error: str | None = None
    _peer: str = ""
    _served: bool = False
    _last: dict[str, float] = field(default_factory=dict)
    _suppressed: dict[str, int] = field(default_factory=dict)

    def trace_line(self, message: str) -> None:
        """A trace record (its first line): a failure starts here, or the one before ends."""
        self.end()
        if (failed := FAILED.search(message)) is not None:
            self._error, self._peer = failed.group(1).strip(), ""
            self.more(message)

    def more(self, line: str) -> None:
        """A line continuing the current record: its arguments name the peer, and whether this is
        the server's side (its credentials) or one of this process's own calls to a peer."""
        if self._error is not None and (peer := PEER.search(line)):
            self._peer = peer.group(1)
            self._served = SERVER_SIDE in line
            self.end()

    def end(self) -> None:
        """The current record is complete: logged if it was a connection to this server."""
        if self._error is None:
            return
        error, peer, served, self._error, self._served = self._error, self._peer, self._served, None, False
        if not served:
            return
        reason, why = classify(error)
        now = self.clock()
        if reason in self._last and now - self._last[reason] < self.interval_s:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        record: dict[str, object] = {
            "level": "warning",
            "logger": "missionweave.tls",
            "msg": f"TLS handshake refused: {why}",
            "reason": reason,
            "peer": peer.removeprefix("ipv4:").removeprefix("ipv6:"),
            "error": error.split(": OK")[0][:300],
        }
        if suppressed := self._suppressed.pop(reason, 0):
            record["suppressed"] = suppressed
        self.emit(record)

    def close(self) -> None:
        """The counts still suppressed, when the relay ends: a burst is never silent."""
        self.end()
        for reason, count in sorted(self._suppressed.items()):
            self.emit(
                {
                    "level": "warning",
                    "logger": "missionweave.tls",
                    "msg": "TLS handshakes refused (not logged one by one)",
                    "reason": reason,
                    "suppressed": count,
                }
            )
        self._suppressed.clear()
