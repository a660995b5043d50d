"""Build of the ``missionweave-bridges`` distribution from ../missionweave_bridges."""

from pathlib import Path

from setuptools import find_packages, setup

SOURCE = Path(__file__).resolve().parent.parent / "missionweave_bridges"

setup(
    packages=["missionweave_bridges", *(f"missionweave_bridges.{p}" for p in find_packages(str(SOURCE)))],
    package_dir={"missionweave_bridges": "../missionweave_bridges"},
)
