"""Commands other distributions add to ``mwp``: the server's (serve, db, backup, verify, authority)
come with ``missionweave-server`` through the ``missionweave.cli`` entry point group, so that the
client distribution stays a client (docs/decisions.md D175).

An entry point names an object with ``register(sub)``, which adds its subcommands to the parser, and
optionally ``around(command, run)``, which runs every other command (the server's wraps each in a
trace when tracing is on)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Protocol

GROUP = "missionweave.cli"
# What `mwp` says for a server command when no server distribution is installed.
SERVER_COMMANDS = ("serve", "db", "backup", "restore", "verify", "authority")


class Extension(Protocol):
    def register(self, sub: argparse._SubParsersAction) -> None: ...  # type: ignore[type-arg]


def installed() -> list[Extension]:
    """Every extension installed in this environment, in entry point name order."""
    return [point.load() for point in sorted(entry_points(group=GROUP), key=lambda p: p.name)]


def register_all(sub: argparse._SubParsersAction, extensions: list[Extension]) -> None:  # type: ignore[type-arg]
    for extension in extensions:
        extension.register(sub)
    for name in SERVER_COMMANDS:
        if name not in sub.choices:
            missing = sub.add_parser(
                name, help="(needs the server distribution, missionweave-server)", add_help=False
            )
            missing.add_argument("rest", nargs=argparse.REMAINDER)
            missing.set_defaults(func=_not_installed(name), ignores_contexts=True)


def around(extensions: list[Extension], command: str, run: Callable[[], int]) -> int:
    """``run`` inside every extension's ``around`` (outermost first)."""
    for extension in reversed(extensions):
        wrap = getattr(extension, "around", None)
        if wrap is not None:
            run = functools.partial(wrap, command, run)
    return run()


def _not_installed(name: str) -> Callable[[argparse.Namespace], int]:
    def refuse(args: argparse.Namespace) -> int:
        print(
            f"mwp {name}: this command runs a server; install the server distribution: "
            "pip install missionweave-server (from a checkout: pip install ./client .)",
            file=sys.stderr,
        )
        return 2

    return refuse
