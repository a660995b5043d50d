"""Build of the ``missionweave`` distribution (the Python client) from ../missionweave.

The protobuf modules are generated from ../protos by every build (missionweave/codegen.py), never
committed."""

import importlib.util
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent.parent / "missionweave"


class BuildWithProtos(build_py):
    def run(self) -> None:
        spec = importlib.util.spec_from_file_location("mw_codegen", SOURCE / "codegen.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate()
        super().run()


setup(
    cmdclass={"build_py": BuildWithProtos},
    packages=["missionweave", *(f"missionweave.{p}" for p in find_packages(str(SOURCE)))],
    package_dir={"missionweave": "../missionweave"},
)
