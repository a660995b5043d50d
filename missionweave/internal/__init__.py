"""Service-to-service contracts (protos/missionweave/internal/v1/): never served to agents; see docs/internal-contracts.md."""
