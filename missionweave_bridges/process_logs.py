"""Logging of a long-running bridge process: the kernel's structured logs (MWP_LOG_LEVEL,
MWP_LOG_FORMAT, as `mwp serve` and `mwp worker run`), without the HTTP client's line per request."""

from __future__ import annotations

import argparse
import logging

from missionweave.cli.common import environment
from missionweave.kernel import logs

# httpx and httpcore log every request at info: a bridge polling or streaming an A2A agent would
# write a line per call. Their warnings and errors still show.
QUIETED = ("httpx", "httpcore")


def configure(args: argparse.Namespace) -> None:
    env = environment(args)
    logs.configure(env.get("MWP_LOG_LEVEL") or "info", env.get("MWP_LOG_FORMAT") or "json")
    for name in QUIETED:
        logging.getLogger(name).setLevel(logging.WARNING)
