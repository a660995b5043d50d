"""Reading settings from environment variables: one spelling of yes/no flags and paths for the
server's configuration (missionweave_server/config.py) and a client's TLS (missionweave/kernel/transport.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")


def env_path(env: Mapping[str, str], name: str) -> Path | None:
    return Path(env[name]) if env.get(name) else None


def env_flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(
        f"{name} must be one of {', '.join(TRUE)} or {', '.join(v for v in FALSE if v)}, not {value!r}"
    )


# The data directory a local mesh keeps its store and keys in (``MWP_DATA_DIR``); a client on the same
# machine finds the Organization admin's key there (``mwp demo``, ``mwp identity register``).
DEFAULT_DATA_DIR = Path(".missionweave")


def data_dir_of(env: Mapping[str, str]) -> Path:
    return Path(env.get("MWP_DATA_DIR") or DEFAULT_DATA_DIR)


def admin_key_file(data_dir: Path) -> Path:
    """Where a mesh keeps the Organization admin's key (created at its first start)."""
    return data_dir / "keys" / "admin.key"
