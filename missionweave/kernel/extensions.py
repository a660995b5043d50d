"""Command extensions this implementation knows (ExtensionBinding, missionweave/v1/common.proto).

The URN of each lives here once: the Authority supports it, the SDK binds it.
"""

from __future__ import annotations

from missionweave.v1 import command_pb2, common_pb2

# MW-11.5-07: every command a Worker buffered while the Group service was unreachable carries this
# critical binding; its data is a missionweave.v1.BoundedOfflineExecutionBinding.
BOUNDED_OFFLINE_EXECUTION = "urn:missionweaveprotocol:extension:bounded-offline-execution"


def bindings(command: command_pb2.Command, urn: str) -> list[common_pb2.ExtensionBinding]:
    """The command's bindings of ``urn`` (a well-formed command has at most one)."""
    return [b for b in command.extensions if b.urn == urn]
