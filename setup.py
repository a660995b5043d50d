"""Build hook: the protobuf modules are generated from protos/ by every build, never committed."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithProtos(build_py):
    def run(self) -> None:
        spec = importlib.util.spec_from_file_location(
            "mw_codegen", Path(__file__).parent / "missionweave" / "codegen.py"
        )
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate()
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
