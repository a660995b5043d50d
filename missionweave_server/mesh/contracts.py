"""The contracts a process serves: the public services the front door can route, the service-to-service
contracts served beside them, and the names a process reports in health checking and reflection."""

from __future__ import annotations

from missionweave.internal.v1 import group_log_pb2, identities_pb2, publications_pb2
from missionweave.kernel.health_names import SERVICE_NAMES
from missionweave.v1 import (
    artifact_service_pb2,
    authority_service_pb2,
    membership_service_pb2,
    scheduling_service_pb2,
)

# The public services the front door can route (the gateway is the front door itself).
PUBLIC_DESCRIPTORS = {
    "authority": authority_service_pb2.DESCRIPTOR.services_by_name["AuthorityService"],
    "membership": membership_service_pb2.DESCRIPTOR.services_by_name["MembershipService"],
    "scheduling": scheduling_service_pb2.DESCRIPTOR.services_by_name["SchedulingService"],
    "artifacts": artifact_service_pb2.DESCRIPTOR.services_by_name["ArtifactService"],
}
# Service-to-service contracts each public service also serves (never routed to agents).
INTERNAL_SERVICE_NAMES = {
    "publications": publications_pb2.DESCRIPTOR.services_by_name["PublicationService"].full_name,
    "identities": identities_pb2.DESCRIPTOR.services_by_name["IdentityDirectoryService"].full_name,
    "group_log": group_log_pb2.DESCRIPTOR.services_by_name["GroupLogService"].full_name,
}


def health_names(services: tuple[str, ...]) -> list[str]:
    """The services a process serving ``services`` reports in health checking and reflection: the
    public ones, and the identity directory where membership is served (the other services' probes
    and operators ask for it by name)."""
    names = [SERVICE_NAMES[s] for s in services]
    if "membership" in services:
        names.append(INTERNAL_SERVICE_NAMES["identities"])
    if "authority" in services:
        names.append(INTERNAL_SERVICE_NAMES["group_log"])
    return names
