"""The kernel: what clients and servers both need, and nothing above it.

Ids, the clock, signing and call proofs (DSSE/PAE, Ed25519), the event chain, the command codec,
structured errors and their ``google.rpc.Status`` reading, client channels (TLS), provenance
manifests, uploads, and structured logging. No gRPC server code, no database, no metrics or
tracing SDK, no service (the import-linter contracts in pyproject.toml hold it so).
"""
