"""`mwp bridge a2a-server` as a command: its configuration file, `--new-token`, and the process
itself serving an A2A client beside a live mesh until SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import ClientCallContext
from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import TransportProtocol
from nacl.signing import SigningKey

from missionweave.kernel.signing import write_key
from missionweave.v1 import common_pb2, membership_pb2
from missionweave_bridges.a2a.server_config import ConfigError, hash_token, load
from tests.conftest import World
from tests.test_missions import G, create

ROOT = Path(__file__).resolve().parent.parent
HASH = hash_token("secret-token")


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "a2a.toml"
    path.write_text(body)
    return path


def test_the_configuration_maps_each_token_to_one_identity(tmp_path: Path) -> None:
    config = load(
        write(
            tmp_path,
            f'target = "127.0.0.1:50051"\n[[identity]]\nid = "ann"\nkey_file = "ann.key"\ntoken_sha256 = "{HASH}"\n'
            f'[[identity]]\nid = "bob"\nkey_file = "/abs/bob.key"\ntoken_sha256 = "{hash_token("other")}"\n',
        )
    )
    assert config.identities[0].key_file == tmp_path / "ann.key"  # relative to the file
    assert config.identities[1].key_file == Path("/abs/bob.key")
    assert config.grpc_listen.startswith("127.0.0.1:") and config.http_listen.startswith("127.0.0.1:")
    assert config.identity_for("Bearer secret-token") == "ann"
    assert config.identity_for("bearer other") == "bob"
    for refused in ("Bearer wrong", "secret-token", "Basic secret-token", "Bearer ", ""):
        assert config.identity_for(refused) is None


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ('target = "m"\n', "at least one"),
        (f'target = 5\n[[identity]]\nid = "a"\nkey_file = "k"\ntoken_sha256 = "{HASH}"\n', "target"),
        ('target = "m"\n[[identity]]\nid = "a"\nkey_file = "k"\ntoken_sha256 = "secret-token"\n', "64 hex"),
        (
            f'target = "m"\n[[identity]]\nid = "a"\nkey_file = "k"\ntoken_sha256 = "{HASH}"\n'
            f'[[identity]]\nid = "b"\nkey_file = "k"\ntoken_sha256 = "{HASH}"\n',
            "same token",
        ),
        (
            f'target = "m"\ntls_cert = "c.pem"\n[[identity]]\nid = "a"\nkey_file = "k"\ntoken_sha256 = "{HASH}"\n',
            "go together",
        ),
    ],
)
def test_a_configuration_that_cannot_be_served_is_refused(tmp_path: Path, body: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        load(write(tmp_path, body))


async def ann_bot(world: World, tmp_path: Path, *, member_of_g: bool) -> None:
    """ann-bot registered with its key in ``tmp_path/ann.key``; with ``member_of_g``, a Worker of the
    Mission G (created here)."""
    key = SigningKey.generate()
    await world.client.register_identity(
        "admin", world.keys["admin"], "ann-bot", common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
    )
    write_key(tmp_path / "ann.key", key)
    if member_of_g:
        await create(world, lease_seconds=3600)
        grant = membership_pb2.MembershipGrant(member_id="ann-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
        await world.run(world.owner, G, "membership_grant", grant, membership_epoch=1)


async def mwp(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_new_token_prints_a_token_and_the_hash_to_configure() -> None:
    code, out, _ = await mwp("bridge", "a2a-server", "--new-token")
    assert code == 0
    token = re.search(r"not stored\): (\S+)", out)
    digest = re.search(r'token_sha256 = "([0-9a-f]{64})"', out)
    assert token and digest and hash_token(token.group(1)) == digest.group(1)


async def test_the_process_serves_a_member_until_sigterm(world: World, tmp_path: Path) -> None:
    await ann_bot(world, tmp_path, member_of_g=True)
    config = write(
        tmp_path,
        'grpc_listen = "127.0.0.1:0"\nhttp_listen = "127.0.0.1:0"\n'
        f'[[identity]]\nid = "ann-bot"\nkey_file = "ann.key"\ntoken_sha256 = "{HASH}"\n',
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "--target",  # the mesh from `mwp`'s own flag: the config names none
        world.target,
        "bridge",
        "a2a-server",
        "--config",
        str(config),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        ports = re.search(r"gRPC on port (\d+), JSON-RPC and the Agent Card on port (\d+)", line)
        assert ports, line
        async with httpx.AsyncClient(timeout=30) as http:
            card = await A2ACardResolver(http, f"http://127.0.0.1:{ports.group(2)}").get_agent_card()
            client = ClientFactory(
                ClientConfig(
                    streaming=False,
                    supported_protocol_bindings=[TransportProtocol.GRPC],
                    grpc_channel_factory=grpc.aio.insecure_channel,
                    httpx_client=http,
                )
            ).create(card)
            task = await client.get_task(
                a2a.GetTaskRequest(id=f"mission:{G}"),
                context=ClientCallContext(service_parameters={"Authorization": "Bearer secret-token"}),
            )
            await client.close()
        assert task.status.state == a2a.TASK_STATE_WORKING
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_an_unreachable_mesh_or_an_address_in_use_ends_the_start_with_one_line(
    world: World, tmp_path: Path
) -> None:
    await ann_bot(world, tmp_path, member_of_g=False)
    served = f'[[identity]]\nid = "ann-bot"\nkey_file = "ann.key"\ntoken_sha256 = "{HASH}"\n'
    config = write(tmp_path, 'grpc_listen = "127.0.0.1:0"\nhttp_listen = "127.0.0.1:0"\n' + served)
    code, _, err = await mwp("--target", "127.0.0.1:9", "bridge", "a2a-server", "--config", str(config))
    assert code == 3 and "cannot reach the mesh at 127.0.0.1:9" in err and "Traceback" not in err
    # The mesh's own port is taken: refused before any session is opened (a session would fence the
    # identity's others), for the gRPC and for the HTTP address alike.
    mesh_port = world.target
    for listen in (
        f'grpc_listen = "{mesh_port}"\n',
        f'grpc_listen = "127.0.0.1:0"\nhttp_listen = "{mesh_port}"\n',
    ):
        config = write(tmp_path, listen + served)
        code, _, err = await mwp("--target", world.target, "bridge", "a2a-server", "--config", str(config))
        assert code == 1 and "cannot listen: " in err and mesh_port in err and "Traceback" not in err
    assert (await world.client.identity("ann-bot")).session_epoch == 0  # no session was ever opened


async def test_the_example_client_proposes_and_follows_through_the_running_endpoint(
    world: World, tmp_path: Path
) -> None:
    """examples/a2a/propose_and_follow.py against `mwp bridge a2a-server` as docs/bridge-a2a-server.md runs them."""
    await ann_bot(world, tmp_path, member_of_g=True)
    config = write(
        tmp_path,
        'grpc_listen = "127.0.0.1:0"\nhttp_listen = "127.0.0.1:0"\n'
        f'[[identity]]\nid = "ann-bot"\nkey_file = "ann.key"\ntoken_sha256 = "{HASH}"\n',
    )
    (tmp_path / "token").write_text("secret-token\n")
    endpoint = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "missionweave.cli", "--target", world.target, "bridge", "a2a-server",
        "--config", str(config), cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert endpoint.stdout is not None
        started = (await asyncio.wait_for(endpoint.stdout.readline(), 30)).decode()
        ports = re.search(r"JSON-RPC and the Agent Card on port (\d+)", started)
        assert ports, started
        run = [
            sys.executable, str(ROOT / "examples" / "a2a" / "propose_and_follow.py"),
            "--url", f"http://127.0.0.1:{ports.group(1)}", "--token-file", str(tmp_path / "token"),
            "--group", G, "--text", "Draft the audit letter", "--seconds", "2",
        ]  # fmt: skip
        for attempt in (1, 2):  # the same message id twice: the same proposal task, one command
            client = await asyncio.create_subprocess_exec(
                *run, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(client.communicate(), 60)
            assert client.returncode == 0, (out + err).decode()[-3000:]
            printed = out.decode()
            proposal = re.search(r"task +(proposal:\S+) +TASK_STATE_SUBMITTED +PROPOSED", printed)
            assert proposal, printed
            assert re.search(r"mission:\S+ +TASK_STATE_WORKING +MISSION_STATE_ACTIVE", printed), printed
            if attempt == 1:
                first = proposal.group(1)
            assert proposal.group(1) == first
        log = [e async for e in world.client.read_events(G)]
        assert sum(e.WhichOneof("payload") == "work_proposed" for e in log) == 1
    finally:
        endpoint.send_signal(signal.SIGTERM)
        await asyncio.wait_for(endpoint.wait(), 30)
