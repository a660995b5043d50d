"""Server reflection under both names clients ask for: ``grpc.reflection.v1`` (what current grpcurl,
Postman and grpcui try first) and ``grpc.reflection.v1alpha``.

grpcio-reflection implements only v1alpha. The two versions define the same messages, field for
field, under another package name, so one servicer answers both: v1 is served through a generic
handler that reads and writes the v1alpha message types (identical bytes on the wire).
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

V1 = "grpc.reflection.v1.ServerReflection"
V1ALPHA = reflection.SERVICE_NAME
SERVICE_NAMES = (V1, V1ALPHA)


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Reflection of ``service_names`` (and of both reflection services) on ``server``."""
    servicer = ReflectionServicer([*service_names, *SERVICE_NAMES])
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(V1, {"ServerReflectionInfo": v1})])
