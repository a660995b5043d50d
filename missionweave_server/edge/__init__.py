"""gRPC plumbing shared by every service's edge and every client: status mapping, in-process channels."""
