"""What an agent author's process loads with the Python SDK (issue 41): the kernel and the SDK,
nothing of a server. Importing it starts no metrics or tracing machinery and loads no store,
migration, object-store or service code (the import-linter contract says the same of the code;
this checks what actually ends up in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_ONLY = (
    "prometheus_client",
    "opentelemetry",
    "sqlalchemy",
    "aiosqlite",
    "asyncpg",
    "alembic",
    "boto3",
    "botocore",
    "cryptography",
    "pydantic",
    "pydantic_core",
    "missionweave_server",
    "missionweave.cli",
    "missionweave.internal",
)


def test_importing_every_sdk_module_loads_nothing_of_a_server() -> None:
    probe = (
        "import json, pkgutil, importlib, sys\n"
        "import missionweave.sdk as sdk\n"
        "for m in pkgutil.iter_modules(sdk.__path__):\n"
        "    importlib.import_module('missionweave.sdk.' + m.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(done.stdout)
    assert "missionweave.sdk.agent" in loaded and "grpc" in loaded  # the probe did import the SDK
    server = [m for m in loaded if any(m == s or m.startswith(s + ".") for s in SERVER_ONLY)]
    assert server == [], f"the SDK loads server machinery: {server}"
