"""The ``mwp`` command line: people's and operators' client of the public contract (docs/cli.md)."""

from missionweave.cli.app import main

__all__ = ["main"]
