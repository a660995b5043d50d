"""The ``mwp`` command line: people's and operators' client of the public contract (docs/cli.md)."""

import sys

from missionweave.kernel.handshake_trace import trace_handshakes
from missionweave.kernel.logs import quiet_grpc_core

trace_handshakes(sys.argv)  # `mwp serve` logs refused TLS handshakes: before grpc is imported
quiet_grpc_core()  # before anything imports grpc (missionweave.kernel.logs)

from missionweave.cli.app import main  # noqa: E402

__all__ = ["main"]
