"""The ``mwp`` command line: people's and operators' client of the public contract (docs/cli.md)."""

from missionweave.kernel.logs import quiet_grpc_core

quiet_grpc_core()  # before anything imports grpc (missionweave.kernel.logs)

from missionweave.cli.app import main  # noqa: E402

__all__ = ["main"]
