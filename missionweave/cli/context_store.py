"""Saved connection contexts of ``mwp`` (in the manner of ``nats context``): named sets of the
connection options, one JSON file each, and which one is selected. (Unrelated to the protocol's
Context Packages: these live on the user's machine and never reach a mesh.)

A context stands where the environment stands, just below it: each value it holds is used only
when neither the flag nor its ``MWP_*`` variable gives one (D110). Commands that reach no mesh
(``serve``, ``keygen``, ``verify``, ``authority ...``) ignore contexts (D111).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from missionweave.cli.errors import CliError, UsageError
from missionweave.sdk.agent import write_json_atomic

DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Option:
    """One connection option: its key in a context file, the flag and ``argparse`` dest that name
    it on the command line, the variable it stands in for, and its kind of value."""

    name: str
    flag: str
    dest: str
    env: str
    kind: str  # "text", "path" (a file, stored absolute), "seconds" or "switch"
    what: str
    default: str | None = None


OPTIONS = (
    Option("target", "--target", "target", "MWP_TARGET", "text", "server address", DEFAULT_TARGET),
    Option(
        "timeout",
        "--timeout",
        "timeout",
        "MWP_TIMEOUT",
        "seconds",
        "seconds to wait for a silent server",
        f"{DEFAULT_TIMEOUT_S:g}",
    ),
    Option("tls", "--tls", "tls", "MWP_TLS", "switch", "use TLS", "off"),
    Option("tls_ca", "--tls-ca", "tls_ca", "MWP_TLS_CA", "path", "TLS CA bundle"),
    Option(
        "tls_client_cert",
        "--tls-client-cert",
        "tls_client_cert",
        "MWP_TLS_CLIENT_CERT",
        "path",
        "TLS client certificate",
    ),
    Option(
        "tls_client_key", "--tls-client-key", "tls_client_key", "MWP_TLS_CLIENT_KEY", "path", "TLS client key"
    ),
    Option(
        "tls_server_name",
        "--tls-server-name",
        "tls_server_name",
        "MWP_TLS_SERVER_NAME",
        "text",
        "name checked in the server certificate",
    ),
    Option("identity", "--as", "actor", "MWP_AS", "text", "identity reads are proven as"),
    Option("key", "--key", "key", "MWP_KEY", "path", "key file"),
)
BY_NAME = {o.name: o for o in OPTIONS}

# No path separators and no leading dot: a name is always one visible file in the directory.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
SELECTION_FILE = "selected"  # no .json suffix, so no context name can collide with it


def context_dir(env: Mapping[str, str] = os.environ) -> Path:
    """$MWP_CONTEXT_DIR, else $XDG_CONFIG_HOME/missionweave/context, else ~/.config/missionweave/context."""
    if env.get("MWP_CONTEXT_DIR"):
        return Path(env["MWP_CONTEXT_DIR"])
    config = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return config / "missionweave" / "context"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UsageError(
            f"{name!r} is not a context name: letters, digits, '_', '-' and '.', at most 64, not starting with '.'"
        )
    return name


@dataclass
class SavedContext:
    name: str
    description: str = ""
    values: dict[str, Any] = field(default_factory=dict)  # option name -> str | float | bool

    def document(self) -> dict[str, Any]:
        return {"description": self.description, **self.values}


EXPECTED = {
    "switch": "true or false",
    "seconds": "a number of seconds >= 0",
    "text": "a non-empty string",
    "path": "a non-empty string",
}


def _fits(kind: str, value: Any) -> bool:
    if kind == "switch":
        return isinstance(value, bool)
    if kind == "seconds":
        return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return isinstance(value, str) and bool(value)


def _checked_values(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The option values of a context file, each of the type its option needs (a hand-edited file
    is refused with the key that is wrong, never half-used)."""
    unknown = sorted(set(data) - set(BY_NAME) - {"description"})
    if unknown:
        raise UsageError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: description, {', '.join(BY_NAME)}"
        )
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name == "description" or value is None:
            continue
        kind = BY_NAME[name].kind
        if not _fits(kind, value):
            raise UsageError(f"{where}: {name} must be {EXPECTED[kind]}")
        values[name] = value
    return values


class ContextStore:
    """The context directory: ``NAME.json`` per context and ``selected`` naming the selected one.
    The directory is 0700 and every file 0600; every write is a temporary file renamed into place."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def file(self, name: str) -> Path:
        return self.directory / f"{check_name(name)}.json"

    def names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.stem for p in self.directory.glob("*.json") if _NAME.match(p.stem))

    def unknown(self, name: str, lead: str = "") -> UsageError:
        """The error for a context name that names no context, listing those there are."""
        known = self.names()
        listed = f"known: {', '.join(known)}" if known else "none is saved yet (mwp context add NAME ...)"
        return UsageError(f"{lead or f'no context {name!r}'} in {self.directory}; {listed}")

    def load(self, name: str) -> SavedContext:
        path = self.file(name)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise self.unknown(name) from None
        except (OSError, ValueError) as err:
            raise UsageError(f"context {name!r}: cannot read {path}: {err}") from None
        if not isinstance(data, dict):
            raise UsageError(f"context {name!r}: {path} does not hold a JSON object")
        description = data.get("description") or ""
        if not isinstance(description, str):
            raise UsageError(f"context {name!r}: {path}: description must be a string")
        return SavedContext(name, description, _checked_values(data, f"context {name!r}: {path}"))

    def _write(self, path: Path, document: dict[str, Any]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # it names the user's key files
        write_json_atomic(path, document)

    def save(self, context: SavedContext, *, force: bool) -> Path:
        path = self.file(context.name)
        if path.exists() and not force:
            raise CliError(f"context {context.name!r} already exists ({path}); --force replaces it")
        self._write(path, context.document())
        return path

    def selected(self) -> str | None:
        try:
            data = json.loads((self.directory / SELECTION_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise UsageError(
                f"cannot read the selected context from {self.directory / SELECTION_FILE}: {err}"
            ) from None
        name = data.get("context") if isinstance(data, dict) else None
        return name if isinstance(name, str) and name else None

    def select(self, name: str) -> None:
        if not self.file(name).exists():
            raise self.unknown(name)
        self._write(self.directory / SELECTION_FILE, {"context": name})

    def remove(self, name: str) -> bool:
        """Deletes the context; True when it was the selected one (then nothing is selected)."""
        path = self.file(name)
        if not path.exists():
            raise self.unknown(name)
        was_selected = self.selected() == name
        if was_selected:
            (self.directory / SELECTION_FILE).unlink()
        path.unlink()
        return was_selected


def store() -> ContextStore:
    return ContextStore(context_dir())


def chosen(args: argparse.Namespace, contexts: ContextStore, name: str | None = None) -> SavedContext | None:
    """The context in use: ``name``, else --context, else $MWP_CONTEXT, else the selected one (None: none)."""
    name = name or getattr(args, "context", None) or os.environ.get("MWP_CONTEXT") or None
    if name is not None:
        return contexts.load(name)
    selected = contexts.selected()
    if selected is None:
        return None
    if selected not in contexts.names():
        raise contexts.unknown(selected, f"the selected context {selected!r} no longer exists")
    return contexts.load(selected)


@dataclass(frozen=True)
class Effective:
    value: str | None
    source: str  # "flag", "env", "context", "default" or "unset"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def effective(args: argparse.Namespace, context: SavedContext | None) -> dict[str, Effective]:
    """Each option's value and where it comes from: flag > environment > context > default."""
    out: dict[str, Effective] = {}
    for o in OPTIONS:
        flag = getattr(args, o.dest, None)
        if flag is not None:
            out[o.name] = Effective(_text(flag), "flag")
        elif os.environ.get(o.env):
            out[o.name] = Effective(os.environ[o.env], "env")
        elif context is not None and o.name in context.values:
            out[o.name] = Effective(_text(context.values[o.name]), "context")
        else:
            out[o.name] = Effective(o.default, "default" if o.default is not None else "unset")
    return out


def missing_file(option: Option, value: str | None) -> bool:
    return option.kind == "path" and value is not None and not Path(value).exists()


def context_environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``MWP_*`` variables the context in use supplies for this invocation: only those no flag
    and no variable already gives. A file it names that does not exist is a UsageError naming
    the context and the file (a value a flag or variable overrides is not looked at)."""
    context = chosen(args, store())
    if context is None:
        return {}
    supplied: dict[str, str] = {}
    for name, resolved in effective(args, context).items():
        if resolved.source != "context":
            continue
        option = BY_NAME[name]
        if missing_file(option, resolved.value):
            raise UsageError(
                f"context {context.name!r} names {option.what} {resolved.value}, which does not exist"
            )
        supplied[option.env] = resolved.value or ""
    return supplied
