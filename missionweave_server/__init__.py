"""The MissionWeave server (the ``missionweave-server`` distribution), standing on the client's kernel.

- ``services/``: the five services (authority, membership, scheduling, artifacts, gateway); none
  imports another, they talk only through the contracts in protos/;
- ``edge/``: the gRPC edge every service stands on (caller authentication, status details, access
  log, paging, routing to shards and peers);
- ``storage/``: databases, schema versions and migrations, replay of the event log;
- ``verification/``: the processes that check command signatures off the event loop;
- ``observability/``: metrics and tracing;
- ``mesh/``: the wiring, the only code that composes services (``mwp serve``, the split topology,
  backups and maintenance);
- ``commands/``: the server's ``mwp`` commands (serve, db, backup, verify), plugged into the client CLI.
"""
