"""Generate the Python protobuf/gRPC modules (with typed .pyi stubs) from ``protos/``.

The generated files land next to this package in ``missionweave/v1/`` (the public contract) and
``missionweave/internal/v1/`` (service-to-service contracts) and are never committed or edited by
hand; ``setup.py`` runs this on every build and ``make`` runs it before tests.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT = ROOT


def proto_files() -> list[Path]:
    public = (PROTO_ROOT / "missionweave" / "v1").glob("*.proto")
    internal = (PROTO_ROOT / "missionweave" / "internal" / "v1").glob("*.proto")
    return sorted([*public, *internal])


def _existing(path: Path) -> str | None:
    return str(path) if path.exists() else None


def generate() -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={OUT}",
        f"--grpc_python_out={OUT}",
    ]
    bindir = Path(sys.executable).parent
    mypy_plugin = shutil.which("protoc-gen-mypy") or _existing(bindir / "protoc-gen-mypy")
    mypy_grpc_plugin = shutil.which("protoc-gen-mypy_grpc") or _existing(bindir / "protoc-gen-mypy_grpc")
    if mypy_plugin and mypy_grpc_plugin:
        args += [
            f"--plugin=protoc-gen-mypy={mypy_plugin}",
            f"--plugin=protoc-gen-mypy_grpc={mypy_grpc_plugin}",
            f"--mypy_out={OUT}",
            f"--mypy_grpc_out={OUT}",
        ]
    else:  # mypy-protobuf missing: protoc's own .pyi stubs still give editors the types
        args += [f"--pyi_out={OUT}"]
    args += [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


if __name__ == "__main__":
    generate()
    print(
        f"generated {len(proto_files())} proto files into missionweave/v1 and missionweave/internal/v1",
        file=sys.stderr,
    )
