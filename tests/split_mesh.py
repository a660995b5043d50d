"""The split topology in one test process: every service started by its own ``start()`` on a port of
its own, reaching the others only over gRPC through the addresses it is given, the client talking
to the gateway's one address. The same wiring as ``mwp serve --topology split`` (which the
process-level tests in test_topology.py and test_shards.py start as real processes)."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from missionweave.kernel.clock import Clock
from missionweave_server.config import Settings

ORDER = ("membership", "artifacts", "scheduling", "authority", "gateway")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class SplitMesh:
    """Looks like one mesh to the tests: ``port`` is the gateway's, the rest is the Authority's."""

    parts: dict[str, Any]
    peer_addresses: dict[str, str]  # each back service's own address

    @property
    def port(self) -> int:
        return int(self.parts["gateway"].port)

    @property
    def settings(self) -> Settings:
        return self.parts["gateway"].settings  # type: ignore[no-any-return]

    @property
    def gateway(self) -> Any:
        return self.parts["gateway"].gateway

    @property
    def blobstore(self) -> Any:
        return self.parts["artifacts"].blobstore

    @property
    def artifacts(self) -> Any:
        return self.parts["artifacts"].artifacts

    def __getattr__(self, name: str) -> Any:
        # Tests that look inside the Authority (its store, its cache) see the Authority process's.
        return getattr(self.parts["authority"], name)

    async def stop(self, grace: float | None = None) -> None:
        for part in reversed(
            list(self.parts.values())
        ):  # the front door first, the Authority before its peers
            await part.stop(grace)


async def start_split(base: Settings, clock: Clock, replicas: dict[str, int] | None = None) -> SplitMesh:
    """Every service in its own mesh; ``replicas`` runs more than one of a stateless service (parts
    ``name``, ``name-1``, ...; its peers are given every replica's address).

    The ports are picked free before the parts start one after another, so something else (another
    test's server, a port handed out meanwhile) can take one in between: then the whole mesh starts
    again on fresh ports, a few times at most."""
    from missionweave_server.edge.channels import ListenError

    for attempt in range(3):
        try:
            return await _start_split(base, clock, replicas)
        except ListenError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


async def _start_split(base: Settings, clock: Clock, replicas: dict[str, int] | None) -> SplitMesh:
    from missionweave_server.mesh.server import start

    counts = {name: (replicas or {}).get(name, 1) for name in ORDER}
    listen = {
        (name if i == 0 else f"{name}-{i}"): (name, i, f"127.0.0.1:{free_port()}")
        for name in ORDER
        for i in range(counts[name])
    }
    gateway = listen["gateway"][2]
    peers = {
        name: ",".join(address for service, _, address in listen.values() if service == name)
        for name in ORDER
        if name != "gateway"
    }
    parts: dict[str, Any] = {}
    try:
        for part, (name, i, address) in listen.items():
            settings = replace(
                base,
                listen=address,
                services=(name,),
                peers=dict(peers),
                instance_id=f"{name}-{i}",
                audience=gateway,  # clients dial the front door: their proofs name it
            )
            parts[part] = await start(settings, clock)
    except BaseException:
        for part in reversed(list(parts.values())):
            await part.stop(0)
        raise
    return SplitMesh(parts, peers)


async def wait_serving(
    launcher: asyncio.subprocess.Process, limit_s: float = 90, addresses: dict[str, str] | None = None
) -> dict[str, int]:
    """Waits for ``mwp serve --topology split``'s "serving" line; the pid of each process it started
    (and, into ``addresses``, the address each listens on)."""
    assert launcher.stderr is not None
    seen = ""
    async with asyncio.timeout(limit_s):
        while "split topology serving" not in seen:
            line = (await launcher.stderr.readline()).decode()
            assert line, seen  # the launcher ended before serving
            seen += line
    started = re.findall(r"starting (\S+) +pid (\d+) +on (\S+)", seen)
    if addresses is not None:
        addresses.update({name: address for name, _, address in started})
    return {name: int(pid) for name, pid, _ in started}


async def launch_split(
    data_dir: Path, database_url: str, shards: int, env: dict[str, str]
) -> tuple[asyncio.subprocess.Process, str]:
    """``mwp serve --topology split --shards N`` as a process on a free port, its stderr piped (read it,
    or ``wait_serving`` it); the process and the front door's address."""
    address = f"127.0.0.1:{free_port()}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "missionweave.cli", "serve", "--topology", "split", "--shards", str(shards),
        "--listen", address, "--data-dir", str(data_dir), "--database-url", database_url,
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )  # fmt: skip
    return process, address
