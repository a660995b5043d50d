"""MissionWeave: reference implementation of the MissionWeaveProtocol (MWP).

Shared building blocks live here, one module per concept: ``ids``, ``clock``, ``signing``,
``errors``, ``config`` and ``logs``. Services are in the top-level ``services``, ``artifactstore``
and ``gateway`` packages; the generated contract is ``missionweave.v1``.
"""

__version__ = "0.1.0"
