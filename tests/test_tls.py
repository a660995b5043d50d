"""TLS and mTLS on every server and client (issue 13, item 4; docs/tls.md).

Every test makes its own certificates (missionweave_server/mesh/certs.py, on the ``cryptography``
package): a mesh CA, a server certificate for 127.0.0.1 and localhost, client certificates naming
a mesh service or none, and a second, foreign CA. Covered: the Python SDK, the Agent SDK, the CLI
and the Node example over TLS; mTLS refusing clients without a certificate or with one from another
CA; a wrong server name refused (and the override that fixes it); plain text refused on a
non-loopback address without --insecure; the internal contracts answering only certificates that
name a mesh service; the plain-text health-only listener; and ``mwp serve --topology split --tls-auto``.

The spec catalogue (../shared/spec/REQUIREMENTS.md) has no transport-security requirement to name;
ARCHITECTURE principle 5 ("TLS and mTLS everywhere but loopback") is what these tests prove.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nacl.signing import SigningKey

from missionweave.internal.v1 import identities_pb2, identities_pb2_grpc
from missionweave.kernel.clock import SystemClock
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import read_key, write_key
from missionweave.kernel.transport import ClientTLS, open_channel
from missionweave.sdk.agent import Agent, AgentError
from missionweave.sdk.client import MeshClient, SessionSigner
from missionweave.v1 import authority_service_pb2, common_pb2
from missionweave_server.config import Settings
from missionweave_server.edge.channels import (
    LOCAL_PEER,
    PlaintextRefused,
    check_listen,
    is_loopback,
    peer_service_name,
)
from missionweave_server.edge.local import LocalContext
from missionweave_server.mesh import certs
from missionweave_server.mesh.topology import TopologyError, launcher_tls, plan
from tests import builders, test_node_agent
from tests.conftest import mesh_process_env, register
from tests.split_mesh import free_port, wait_serving

HEALTH = health_pb2.HealthCheckRequest()


@dataclass
class Pki:
    """Certificate files of one test: the mesh CA and what it issued, and a foreign CA's."""

    directory: Path
    ca: certs.Issued

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    def issue(
        self, name: str, *, hosts: tuple[str, ...] = (), service: str | None = None
    ) -> tuple[Path, Path]:
        return certs.issue(self.ca, name, hosts=hosts, service=service).write(self.directory, name)

    def client(self, name: str, service: str | None = None, **kw: Any) -> ClientTLS:
        cert, key = self.issue(name, service=service)
        return ClientTLS(self.ca_file, cert, key, **kw)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    directory = tmp_path / "pki"
    ca = certs.new_ca("test mesh CA")
    ca.write(directory, "ca")
    return Pki(directory, ca)


@pytest.fixture
def foreign(tmp_path: Path) -> Pki:
    directory = tmp_path / "foreign"
    ca = certs.new_ca("another CA")
    ca.write(directory, "ca")
    return Pki(directory, ca)


def tls_settings(
    tmp_path: Path,
    pki: Pki,
    *,
    mutual: bool = False,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    **kw: Any,
) -> Settings:
    cert, key = pki.issue("server", hosts=hosts, service="gateway")
    fields: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "data_dir": tmp_path / "data",
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        "grace_seconds": 1,
        "verify_workers": 0,
        "tls_cert": cert,
        "tls_key": key,
        "tls_client_ca": pki.ca_file if mutual else None,
    }
    return Settings(**{**fields, **kw})


@pytest.fixture
async def tls_mesh(tmp_path: Path, pki: Pki) -> AsyncIterator[Any]:
    from missionweave_server.mesh.server import start

    mesh = await start(tls_settings(tmp_path, pki))
    try:
        yield mesh
    finally:
        await mesh.stop(grace=0)


@pytest.fixture
async def mtls_mesh(tmp_path: Path, pki: Pki) -> AsyncIterator[Any]:
    from missionweave_server.mesh.server import start

    mesh = await start(tls_settings(tmp_path, pki, mutual=True))
    try:
        yield mesh
    finally:
        await mesh.stop(grace=0)


async def check(target: str, tls: ClientTLS | None, *, deadline_s: float = 5) -> int:
    async with open_channel(target, tls) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(HEALTH, timeout=deadline_s)
    return int(answer.status)


async def refused(target: str, tls: ClientTLS | None) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await check(target, tls, deadline_s=3)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    return caught.value


async def create_mission(client: MeshClient, admin_key: SigningKey, group_id: str) -> SessionSigner:
    """Registers alice and coord-bot, and has alice create a Mission: a signed command end to end."""
    owner = await register(client, admin_key, "alice", common_pb2.IDENTITY_KIND_HUMAN)
    coordinator = await register(client, admin_key, "coord-bot", common_pb2.IDENTITY_KIND_AGENT)
    body = builders.mission_create("alice", "coord-bot", SystemClock().now())
    await client.execute(owner.sign(owner.command(group_id, "mission_create", body)))
    assert (await client.group_state(group_id)).head_sequence >= 1
    return coordinator


# ------------------------------------------------------------------ settings and the listen rule


def test_loopback_addresses() -> None:
    for address in ("127.0.0.1:50051", "127.0.0.2:1", "[::1]:50051", "localhost:50051", "unix:/tmp/mwp.sock"):
        assert is_loopback(address), address
    for address in ("0.0.0.0:50051", "[::]:50051", ":50051", "10.1.2.3:50051", "mesh.example:50051"):
        assert not is_loopback(address), address


def test_plain_text_is_refused_off_loopback_unless_insecure(pki: Pki, tmp_path: Path) -> None:
    check_listen("127.0.0.1:0", None)  # the embedded default
    with pytest.raises(
        PlaintextRefused, match=r"refusing to listen in plain text on 0\.0\.0\.0:50051.*--insecure"
    ):
        check_listen("0.0.0.0:50051", None)
    check_listen("0.0.0.0:50051", None, insecure=True)
    settings = tls_settings(tmp_path, pki, listen="0.0.0.0:50051")
    from missionweave_server.edge.channels import ServerTLS

    check_listen(settings.listen, ServerTLS.from_settings(settings))  # TLS may listen anywhere


def test_settings_from_the_environment(tmp_path: Path) -> None:
    env = {
        "MWP_TLS_CERT": "/tls/tls.crt",
        "MWP_TLS_KEY": "/tls/tls.key",
        "MWP_TLS_CLIENT_CA": "/tls/ca.crt",
        "MWP_TLS_CA": "/tls/ca.crt",
        "MWP_TLS_CLIENT_CERT": "/tls/c.crt",
        "MWP_TLS_CLIENT_KEY": "/tls/c.key",
        "MWP_TLS_SERVER_NAME": "gateway.example",
        "MWP_INSECURE": "true",
        "MWP_HEALTH_LISTEN": "0.0.0.0:50052",
    }
    s = Settings.from_env(env)
    assert (s.tls_cert, s.tls_key, s.tls_client_ca) == (
        Path("/tls/tls.crt"),
        Path("/tls/tls.key"),
        Path("/tls/ca.crt"),
    )
    assert s.insecure and s.health_listen == "0.0.0.0:50052"
    assert ClientTLS.from_env(env) == ClientTLS(
        Path("/tls/ca.crt"), Path("/tls/c.crt"), Path("/tls/c.key"), "gateway.example"
    )
    assert ClientTLS.from_env({}) is None  # plain text unless asked for
    assert ClientTLS.from_env({"MWP_TLS": "1"}) == ClientTLS()  # the system's roots
    with pytest.raises(ValueError, match="MWP_INSECURE"):
        Settings.from_env({"MWP_INSECURE": "perhaps"})
    with pytest.raises(ValueError, match="--tls-client-key"):
        ClientTLS.from_env({"MWP_TLS_CLIENT_CERT": "/tls/c.crt"})


async def test_start_refuses_plain_text_off_loopback_before_opening_anything(tmp_path: Path) -> None:
    from missionweave_server.mesh.server import start

    settings = Settings(
        listen="0.0.0.0:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
    )
    with pytest.raises(PlaintextRefused):
        await start(settings)
    assert not (tmp_path / "mw.db").exists()  # refused before the database was touched


def test_mwp_serve_refuses_plain_text_off_loopback(tmp_path: Path) -> None:
    import subprocess

    env = mesh_process_env()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "missionweave.cli",
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stderr
    assert "refusing to listen in plain text on 0.0.0.0:0" in done.stderr and "--insecure" in done.stderr


# ------------------------------------------------------------------ server authentication


async def test_sdk_round_trip_over_tls_and_plain_text_clients_fail(tls_mesh: Any, pki: Pki) -> None:
    target = f"127.0.0.1:{tls_mesh.port}"
    async with MeshClient(target, ClientTLS(pki.ca_file)) as client:
        await create_mission(client, read_key(tls_mesh.settings.admin_key_path), "grp_tls")
        key = await client.authority.GetAuthorityKey(authority_service_pb2.GetAuthorityKeyRequest())
        assert key.public_key == tls_mesh.authority.public_key
    await refused(target, None)  # a plain-text client cannot talk to a TLS server
    await refused(target, ClientTLS())  # the system's roots do not know the test CA


async def test_a_server_certificate_from_another_ca_or_for_another_name_is_refused(
    tls_mesh: Any, pki: Pki, foreign: Pki
) -> None:
    target = f"127.0.0.1:{tls_mesh.port}"
    await refused(target, ClientTLS(foreign.ca_file))
    await refused(target, ClientTLS(pki.ca_file, server_name="authority.elsewhere.example"))
    assert (
        await check(f"localhost:{tls_mesh.port}", ClientTLS(pki.ca_file))
        == health_pb2.HealthCheckResponse.SERVING
    )


async def test_the_server_name_override_checks_the_name_the_certificate_carries(
    tmp_path: Path, pki: Pki
) -> None:
    from missionweave_server.mesh.server import start

    mesh = await start(tls_settings(tmp_path, pki, hosts=("gateway.mesh.example",)))
    try:
        target = f"127.0.0.1:{mesh.port}"
        await refused(target, ClientTLS(pki.ca_file))  # the certificate does not name 127.0.0.1
        assert await check(target, ClientTLS(pki.ca_file, server_name="gateway.mesh.example")) == 1
    finally:
        await mesh.stop(grace=0)


# ------------------------------------------------------------------ mutual TLS


async def test_mtls_refuses_clients_without_a_certificate_or_with_one_from_another_ca(
    mtls_mesh: Any, pki: Pki, foreign: Pki
) -> None:
    target = f"127.0.0.1:{mtls_mesh.port}"
    await refused(target, ClientTLS(pki.ca_file))  # no client certificate
    foreign_cert, foreign_key = foreign.issue("stranger", service="gateway")
    await refused(
        target, ClientTLS(pki.ca_file, foreign_cert, foreign_key)
    )  # the server does not trust its CA
    agent = pki.client("agent-1")  # the mesh CA, no service named: a public client
    assert await check(target, agent) == health_pb2.HealthCheckResponse.SERVING
    async with MeshClient(target, agent) as client:
        await create_mission(client, read_key(mtls_mesh.settings.admin_key_path), "grp_mtls")


async def test_with_mtls_the_internal_contracts_answer_only_mesh_service_certificates(
    mtls_mesh: Any, pki: Pki
) -> None:
    target = f"127.0.0.1:{mtls_mesh.port}"
    request = identities_pb2.GetIdentitiesRequest(identity_ids=["admin"])
    async with open_channel(target, pki.client("agent-2")) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await identities_pb2_grpc.IdentityDirectoryServiceStub(channel).GetIdentities(request, timeout=5)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        rejection = rejection_from_rpc_error(caught.value)
        assert rejection is not None and "internal contract" in rejection.message
        # A stream is refused the same way (the gateways' FollowGroup, the directory's watch).
        watch = identities_pb2_grpc.IdentityDirectoryServiceStub(channel).WatchIdentities(
            identities_pb2.WatchIdentitiesRequest(), timeout=5
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await watch.read()
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with open_channel(target, pki.client("gw", service="gateway")) as channel:
        answer = await identities_pb2_grpc.IdentityDirectoryServiceStub(channel).GetIdentities(
            request, timeout=5
        )
    assert [i.identity_id for i in answer.identities] == ["admin"]


async def test_peer_service_name_reads_the_certificate(pki: Pki, tmp_path: Path) -> None:
    """The helper other servicers use: the service a verified client certificate names, ``local`` in
    process, None for a certificate that names none."""
    assert peer_service_name(LocalContext(None)) == LOCAL_PEER
    seen: list[str | None] = []

    class Probe(health_pb2_grpc.HealthServicer):
        async def Check(self, request: Any, context: Any) -> Any:
            seen.append(peer_service_name(context))
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    from missionweave_server.edge.channels import ServerTLS, add_listener

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(Probe(), server)
    cert, key = pki.issue("probe", hosts=("127.0.0.1",))
    port = add_listener(server, "127.0.0.1:0", ServerTLS(cert, key, pki.ca_file))
    await server.start()
    try:
        for name, service in (("c1", "membership"), ("c2", None), ("c3", "not-a-service")):
            await check(f"127.0.0.1:{port}", pki.client(name, service))
    finally:
        await server.stop(0)
    assert seen == ["membership", None, None]


# ------------------------------------------------------------------ the health-only listener


async def test_the_health_listener_serves_plain_text_health_and_nothing_else(
    tmp_path: Path, pki: Pki
) -> None:
    from missionweave_server.mesh.server import start

    health_port = free_port()
    mesh = await start(tls_settings(tmp_path, pki, mutual=True, health_listen=f"127.0.0.1:{health_port}"))
    try:
        async with open_channel(f"127.0.0.1:{health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            name = "missionweave.v1.AuthorityService"
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await identities_pb2_grpc.IdentityDirectoryServiceStub(channel).GetIdentities(
                    identities_pb2.GetIdentitiesRequest(identity_ids=["admin"]), timeout=5
                )
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await mesh.stop(grace=0)


# ------------------------------------------------------------------ the CLI and the Agent SDK


async def mwp(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Runs the CLI as a process while this test's event loop keeps serving the mesh."""
    base = mesh_process_env()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        *args,
        env={**base, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_cli_over_tls_and_mtls_from_flags_and_environment(
    mtls_mesh: Any, pki: Pki, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{mtls_mesh.port}"
    client = pki.client("cli-user")
    assert client.cert_file is not None and client.key_file is not None
    flags = [
        "--target",
        target,
        "--tls-ca",
        str(pki.ca_file),
        "--tls-client-cert",
        str(client.cert_file),
        "--tls-client-key",
        str(client.key_file),
    ]
    code, out, err = await mwp(*flags, "health")
    assert code == 0, err
    assert "missionweave.v1.GatewayService" in out and "SERVING" in out
    # The same from MWP_TLS_*; a signed command end to end: register an identity as the admin.
    env = {
        "MWP_TARGET": target,
        "MWP_TLS_CA": str(pki.ca_file),
        "MWP_TLS_CLIENT_CERT": str(client.cert_file),
        "MWP_TLS_CLIENT_KEY": str(client.key_file),
    }
    key_file = tmp_path / "bob.key"
    write_key(key_file, SigningKey.generate())
    code, out, err = await mwp(
        "identity",
        "register",
        "bob",
        "--kind",
        "human",
        "--key-file",
        str(key_file),
        "--admin-key",
        str(mtls_mesh.settings.admin_key_path),
        env=env,
    )
    assert code == 0 and "registered bob" in out, err
    # Without a client certificate the server cannot be reached (exit 3, the handshake's reason).
    code, _, err = await mwp("--target", target, "--tls-ca", str(pki.ca_file), "health")
    assert code != 0
    code, _, err = await mwp("--target", target, "health")  # plain text
    assert code != 0


async def test_an_agent_connects_over_tls(tls_mesh: Any, pki: Pki, tmp_path: Path) -> None:
    target = f"127.0.0.1:{tls_mesh.port}"
    tls = ClientTLS(pki.ca_file)
    async with MeshClient(target, tls) as client:
        admin_key = read_key(tls_mesh.settings.admin_key_path)
        key = SigningKey.generate()
        await client.register_identity(
            "admin", admin_key, "worker-1", common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
        )
    async with Agent.connect(
        target, "worker-1", key, cursor_dir=tmp_path / "state", tls=tls, connect_timeout=20
    ) as agent:
        assert agent.connected
    with pytest.raises(AgentError, match="could not connect"):  # plain text never gets a WELCOME
        await Agent.connect(target, "worker-1", key, cursor_dir=tmp_path / "state2", connect_timeout=3)


# ------------------------------------------------------------------ the Node example


node = test_node_agent.node  # the same fixture: `node` and `make node-deps`, or MWP_SKIP_NODE=1


async def test_the_node_agent_over_tls_and_mtls(
    mtls_mesh: Any, pki: Pki, foreign: Pki, node: str, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{mtls_mesh.port}"
    async with MeshClient(target, pki.client("setup")) as client:
        coordinator = await create_mission(client, read_key(mtls_mesh.settings.admin_key_path), "grp_node")
        session_key = SigningKey.generate()
        signer = await client.open_session("coord-bot", coordinator.key, session_key)
    key_file = tmp_path / "coord.session.key"
    write_key(key_file, session_key)

    async def run(*tls: str) -> tuple[int, list[dict[str, Any]], str]:
        process = await asyncio.create_subprocess_exec(
            node,
            str(test_node_agent.AGENT_JS),
            "--target",
            target,
            "--agent",
            "coord-bot",
            "--session-epoch",
            str(signer.session_epoch),
            "--key-file",
            str(key_file),
            "--group",
            "grp_node",
            "--until-sequence",
            "1",
            "--timeout",
            "20",
            *tls,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=mesh_process_env(),
        )
        out, err = await asyncio.wait_for(process.communicate(), 40)
        lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        return int(process.returncode or 0), lines, err.decode()

    client_tls = pki.client("node-agent")
    cert, key = str(client_tls.cert_file), str(client_tls.key_file)
    code, lines, err = await run(
        "--tls-ca", str(pki.ca_file), "--tls-client-cert", cert, "--tls-client-key", key
    )
    assert code == 0, err
    assert lines and lines[0]["sequence"] == 1 and lines[0]["type"] == "mission.created"
    code, lines, err = await run("--tls-ca", str(pki.ca_file))  # no client certificate: refused
    assert code == 1 and lines == [] and "GetAuthorityKey" in err, err
    code, lines, err = await run(
        "--tls-ca", str(foreign.ca_file), "--tls-client-cert", cert, "--tls-client-key", key
    )
    assert code == 1 and lines == [], err  # the gateway's certificate is not from the CA it trusts


# ------------------------------------------------------------------ the split topology


def test_the_split_plan_passes_tls_settings_to_every_process(tmp_path: Path) -> None:
    settings = Settings(
        listen="127.0.0.1:50099",
        tls_cert=Path("/t/s.crt"),
        tls_key=Path("/t/s.key"),
        tls_client_ca=Path("/t/ca.crt"),
        tls_ca=Path("/t/ca.crt"),
        tls_client_cert=Path("/t/c.crt"),
        tls_client_key=Path("/t/c.key"),
        health_listen="127.0.0.1:50100",
    )
    for child in plan(settings, 1, "mesh-t"):
        assert child.env["MWP_TLS_CERT"] == "/t/s.crt" and child.env["MWP_TLS_CLIENT_CA"] == "/t/ca.crt"
        assert child.env["MWP_TLS_CLIENT_CERT"] == "/t/c.crt" and child.env["MWP_TLS_AUTO"] == "0"
        assert child.env["MWP_HEALTH_LISTEN"] == ("127.0.0.1:50100" if child.name == "gateway" else "")
    with pytest.raises(TopologyError, match="--tls-ca"):
        launcher_tls(replace(settings, tls_ca=None, tls_client_cert=None, tls_client_key=None))
    with pytest.raises(PlaintextRefused):
        launcher_tls(Settings(listen="0.0.0.0:50099"))


async def test_split_topology_with_tls_auto(tmp_path: Path) -> None:
    """``mwp serve --topology split --tls-auto``: agents reach the gateway over TLS; the processes
    talk mTLS among themselves; a back service refuses a caller without a certificate, and refuses
    the internal contracts to a certificate of the mesh CA that names no service."""
    port = free_port()
    data = tmp_path / "data"
    env = {
        **mesh_process_env(),
        "MWP_VERIFY_WORKERS": "0",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        "--topology",
        "split",
        "--tls-auto",
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(data),
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        addresses: dict[str, str] = {}
        await wait_serving(process, addresses=addresses)
        ca_file = data / "tls" / "ca.crt"
        target = f"127.0.0.1:{port}"
        async with MeshClient(target, ClientTLS(ca_file)) as client:  # through the gateway to every service
            await create_mission(client, read_key(data / "keys" / "admin.key"), "grp_split_tls")
        await refused(target, None)
        membership = addresses["membership"]
        await refused(membership, ClientTLS(ca_file))  # mTLS: no client certificate
        launcher = ClientTLS(ca_file, data / "tls" / "launcher.crt", data / "tls" / "launcher.key")
        assert await check(membership, launcher) == health_pb2.HealthCheckResponse.SERVING
        async with open_channel(membership, launcher) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await identities_pb2_grpc.IdentityDirectoryServiceStub(channel).GetIdentities(
                    identities_pb2.GetIdentitiesRequest(identity_ids=["admin"]), timeout=5
                )
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


# ------------------------------------------------------------------ the Kubernetes certificates


MAKE_CERTS = Path(__file__).resolve().parent.parent / "k8s" / "make-tls-certs.sh"


@pytest.fixture
def k8s_certs(tmp_path: Path) -> Path:
    """The certificates k8s/make-tls-certs.sh makes (with openssl), as docs/tls.md tells operators to."""
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    out = tmp_path / "k8s-tls"
    subprocess.run(
        ["bash", str(MAKE_CERTS), str(out), "mwp.example.com"], check=True, capture_output=True, timeout=60
    )
    assert (out / "secrets.yaml").read_text().count("kind: Secret") == 5
    return out


async def test_the_kubernetes_certificate_recipe_makes_certificates_the_mesh_accepts(
    tmp_path: Path, k8s_certs: Path
) -> None:
    """k8s/make-tls-certs.sh: a service's certificate serves under its cluster DNS name (a shard's
    wildcard under its pod's), and the gateway's, presented as a client certificate, names the gateway."""
    from missionweave_server.mesh.server import start

    out = k8s_certs
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'mw.db'}",
        grace_seconds=1,
        verify_workers=0,
        tls_cert=out / "membership.crt",
        tls_key=out / "membership.key",
        tls_client_ca=out / "ca.crt",
    )
    mesh = await start(settings)
    try:
        target = f"127.0.0.1:{mesh.port}"
        gateway = ClientTLS(
            out / "ca.crt",
            out / "gateway.crt",
            out / "gateway.key",
            server_name="membership.missionweave.svc.cluster.local",
        )
        async with open_channel(target, gateway) as channel:
            answer = await identities_pb2_grpc.IdentityDirectoryServiceStub(channel).GetIdentities(
                identities_pb2.GetIdentitiesRequest(identity_ids=["admin"]), timeout=5
            )
        assert [i.identity_id for i in answer.identities] == ["admin"]
        await refused(target, replace(gateway, server_name="membership.elsewhere.svc.cluster.local"))
    finally:
        await mesh.stop(grace=0)
    # The shards' wildcard: any authority-N under the headless Service, and nothing else.
    from grpc_health.v1.health import aio as health_aio

    from missionweave_server.edge.channels import ServerTLS, add_listener

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    port = add_listener(
        server, "127.0.0.1:0", ServerTLS(out / "authority.crt", out / "authority.key", out / "ca.crt")
    )
    await server.start()
    try:
        shard = "authority-2.authority-headless.missionweave.svc.cluster.local"
        assert await check(f"127.0.0.1:{port}", replace(gateway, server_name=shard)) == 1
        await refused(
            f"127.0.0.1:{port}", replace(gateway, server_name="authority-2.missionweave.svc.cluster.local")
        )
    finally:
        await server.stop(0)
