"""The Python SDK: a client of the public contract only (docs/sdk.md).

``Agent`` runs an agent's event loop over the gateway; ``MeshClient`` signs and sends commands and
reads Groups; ``review`` is the Coordinator's review pipeline; ``idempotency`` derives the keys for
external side effects.
"""
