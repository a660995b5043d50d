"""Reading settings from environment variables: one spelling of paths and yes/no flags for the
server's configuration (missionweave/config.py) and a client's TLS (missionweave/transport.py)."""

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
    raise ValueError(f"{name} must be one of {', '.join(TRUE)} or {', '.join(v for v in FALSE if v)}, not {value!r}")
