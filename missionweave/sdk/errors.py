"""The root of the SDK's exceptions, in a module of its own so that the SDK's file helpers can raise it
without importing the agent (``missionweave.sdk.agent`` re-exports it)."""

from __future__ import annotations


class AgentError(Exception):
    """Base class of every error the SDK raises."""
