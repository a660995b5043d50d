"""The names a mesh answers ``grpc.health.v1`` checks for: one per public service, and the Authority's
integrity (NOT_SERVING while a Group it loaded failed verification). The servers register them
(missionweave_server/mesh/server.py) and ``mwp health`` asks for each."""

from __future__ import annotations

from missionweave.v1 import (
    artifact_service_pb2,
    authority_service_pb2,
    gateway_service_pb2,
    membership_service_pb2,
    scheduling_service_pb2,
)

SERVICE_NAMES = {
    "authority": authority_service_pb2.DESCRIPTOR.services_by_name["AuthorityService"].full_name,
    "membership": membership_service_pb2.DESCRIPTOR.services_by_name["MembershipService"].full_name,
    "scheduling": scheduling_service_pb2.DESCRIPTOR.services_by_name["SchedulingService"].full_name,
    "artifacts": artifact_service_pb2.DESCRIPTOR.services_by_name["ArtifactService"].full_name,
    "gateway": gateway_service_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name,
}
# Health entry of the Authority's stored logs (docs/integrity.md): SERVING while every Group it has
# loaded or served verified, NOT_SERVING once one is refused as DATA_CORRUPTED; each such Group also
# gets an entry of its own, "<this>/<group id>", NOT_SERVING. The AuthorityService entry itself stays
# SERVING: every other Group is still served, and a restart would not repair the log.
INTEGRITY_HEALTH = "missionweave.authority.integrity"
