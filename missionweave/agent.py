"""Kept so ``from missionweave.agent import Agent`` keeps working: the SDK lives in missionweave.sdk."""

from missionweave.sdk.agent import *  # noqa: F403
from missionweave.sdk.agent import __all__  # noqa: F401
