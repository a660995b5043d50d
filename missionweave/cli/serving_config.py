"""What every long-running serving command reads from its TOML config (`mwp worker run`, and the
bridges' `mwp bridge a2a`): the mesh, the identity and its key, the Groups, the state directory and
the connect timeout, with --as/--key/--group, the global --target and MWP_* filling what the file
leaves out. Every problem is a UsageError naming the file and the key, so nothing reaches the mesh
half-configured."""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from missionweave.cli.common import UsageError, environment, target
from missionweave.kernel.signing import read_key

# The keys every serving config may hold, and what each means (a command's --help and errors list them).
SERVING_KEYS = {
    "target": "the mesh address (the global --target overrides it; default $MWP_TARGET, else 127.0.0.1:50051)",
    "identity": "the identity id it serves as (default: --as, else $MWP_AS)",
    "key": "its key file, relative to the config file (default: --key, else $MWP_KEY)",
    "groups": "the Group ids to serve (a non-empty list; --group replaces it)",
    "state_dir": (
        "its session, cursors and unsent outputs (default: $MWP_STATE_DIR, else $XDG_STATE_HOME/missionweave, "
        "else ~/.local/state/missionweave)"
    ),
    "connect_timeout": "seconds to reach the mesh before giving up (default 10)",
}


def add_arguments(parser: argparse.ArgumentParser, who: str) -> None:
    """The flags that override a serving config's identity, key and Groups (``who``: "the Worker's")."""
    parser.add_argument("--as", dest="actor", help=f"{who} identity id (overrides the config's identity)")
    parser.add_argument("--key", help="its key file (overrides the config's key)")
    parser.add_argument(
        "--group",
        action="append",
        metavar="GROUP",
        help="a Group to serve (repeatable; replaces the config's groups)",
    )


@dataclass(frozen=True)
class Serving:
    path: Path
    target: str
    identity: str
    key: Path
    groups: tuple[str, ...]
    state_dir: Path
    connect_timeout: float


def text(data: dict[str, Any], name: str, where: Path) -> str | None:
    value = data.get(name)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise UsageError(f"{where}: {name} must be a non-empty string")
    return value


def read(
    path: Path, args: argparse.Namespace, known: dict[str, str], *, who: str, default_state: Path
) -> tuple[Serving, dict[str, Any]]:
    """The common part of the config at ``path`` and the whole table (for the command's own keys).
    ``known`` is every key the command takes; ``who`` names the identity in errors ("the Worker")."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise UsageError(f"cannot read the config file {path}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path} is not valid TOML: {err}") from None
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise UsageError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    base = path.resolve().parent
    env = environment(args)
    identity = getattr(args, "actor", None) or text(data, "identity", path) or env.get("MWP_AS")
    if not identity:
        raise UsageError(f"{path}: missing key identity ({who}'s identity id; or pass --as)")
    key_text = text(data, "key", path)
    if getattr(args, "key", None):
        key = Path(args.key)
    elif key_text:
        key = base / key_text
    elif env.get("MWP_KEY"):
        key = Path(env["MWP_KEY"])
    else:
        raise UsageError(f"{path}: missing key key ({who}'s key file; or pass --key)")
    groups = list(getattr(args, "group", None) or ()) or data.get("groups")
    if groups is None:
        raise UsageError(f"{path}: missing key groups (the Group ids to serve; or pass --group)")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, str) and g for g in groups):
        raise UsageError(f"{path}: groups must be a non-empty list of Group ids")
    if len(set(groups)) != len(groups):
        raise UsageError(f"{path}: groups names a Group twice")
    timeout = data.get("connect_timeout", 10)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise UsageError(f"{path}: connect_timeout must be a positive number of seconds")
    state = text(data, "state_dir", path)
    serving = Serving(
        path=path,
        target=getattr(args, "target", None) or text(data, "target", path) or target(args),
        identity=identity,
        key=key,
        groups=tuple(groups),
        state_dir=base / state if state else default_state,
        connect_timeout=float(timeout),
    )
    return serving, data


def read_identity_key(config: Serving) -> SigningKey:
    """The identity's key, or a UsageError saying what is wrong with the file."""
    try:
        return read_key(config.key)
    except FileNotFoundError:
        raise UsageError(
            f"{config.path}: the key file {config.key} does not exist (mwp keygen creates one)"
        ) from None
    except PermissionError as err:
        raise UsageError(f"{config.path}: the key file {config.key} cannot be used: {err}") from None
    except OSError as err:
        raise UsageError(
            f"{config.path}: cannot read the key file {config.key}: {err.strerror or err}"
        ) from None
    except ValueError:
        raise UsageError(f"{config.path}: {config.key} is not a key file (mwp keygen writes one)") from None
