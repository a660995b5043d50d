"""How services are added to a gRPC server: through generic handlers only (D154)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import grpc


def generic_handlers_only(server: grpc.aio.Server) -> grpc.aio.Server:
    """``server`` for the generated ``add_*Servicer_to_server`` functions (and any other adder of
    handlers): ``GenericHandlersOnly``, typed as the server it stands for, which is all those
    functions use of it."""
    return cast(grpc.aio.Server, GenericHandlersOnly(server))


class GenericHandlersOnly:
    """A ``grpc.aio.Server`` as the generated ``add_*Servicer_to_server`` functions see it: each
    service's generic handler is added, its registered-method handlers are not.

    grpcio's asyncio server keeps one pending request task per registered method and, for every
    call that arrives, waits on all of them (``asyncio.wait``, FIRST_COMPLETED): with the mesh's ~50
    methods that is ~50 done-callbacks added and removed and ~50 coroutine checks per RPC. Through
    the generic handlers one task waits for any call, and the method is found by a dict lookup per
    service."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        """Left out on purpose: the same handlers came through ``add_generic_rpc_handlers``."""
