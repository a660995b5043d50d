"""The failures ``mwp`` reports itself, with their exit codes (the README's table)."""

from __future__ import annotations


class CliError(Exception):
    """A failure the CLI reports itself: ``mwp: <message>`` on stderr and ``exit_code``."""

    exit_code = 1


class UsageError(CliError):
    """The invocation is incomplete or inconsistent (exit code 2, like argparse's own errors)."""

    exit_code = 2
