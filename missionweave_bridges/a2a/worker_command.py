"""``mwp bridge a2a --config FILE``: one A2A agent as a MissionWeave Worker, until SIGINT or SIGTERM.

The bridge holds the MissionWeave identity of the agent it bridges (one identity per bridged agent,
docs/bridge-a2a-worker.md): every command, manifest and Agent Card is signed as that agent. It reads
the A2A Agent Card, publishes the matching MissionWeave Agent Card, and serves the Groups with the
Worker runtime, whose handler runs each WorkItem as an A2A task (missionweave_bridges/a2a/worker.py)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from missionweave.cli import serving_config
from missionweave.cli.common import (
    CliError,
    UsageError,
    add_json_flag,
    client_tls,
)
from missionweave.cli.serving_config import SERVING_KEYS, Serving
from missionweave.cli.worker import ObservedAgent, Unreachable, _print, observed
from missionweave.kernel import gc_policy
from missionweave.sdk.agent import AgentError, GatewayError
from missionweave.sdk.client import MeshClient
from missionweave.sdk.files import user_state_dir
from missionweave.sdk.worker import WorkerRuntime
from missionweave_bridges import process_logs
from missionweave_bridges.a2a.mapping import mission_card
from missionweave_bridges.a2a.task_journal import TaskJournal
from missionweave_bridges.a2a.worker import (
    TRANSPORTS,
    A2AWorker,
    BridgeError,
    MissingCredentials,
    open_client,
    resolve_card,
)

CONFIG_KEYS = {
    "agent_url": "the A2A agent's base URL (its card is at URL/.well-known/agent-card.json)",
    "transport": "grpc or jsonrpc (default: the first the card offers that the bridge speaks)",
    **SERVING_KEYS,
    "max_concurrency": "how many WorkItems the agent runs at once: its Agent Card's slots (default 1)",
    "publish_card": "publish the matching MissionWeave Agent Card at start (default true)",
    "credentials": (
        "a table: each security scheme of the agent's card that the bridge must satisfy = a file holding "
        "its credential (a bearer token, an API key), relative to the config file"
    ),
}


@dataclass(frozen=True)
class BridgeConfig(Serving):
    agent_url: str = ""
    transport: str = ""
    max_concurrency: int = 1
    publish_card: bool = True
    credentials: tuple[tuple[str, Path], ...] = ()  # (security scheme name, file holding its credential)

    def credential_values(self) -> dict[str, str]:
        """Each scheme's credential, read from its file (a UsageError naming a file that cannot be)."""
        values = {}
        for scheme, file in self.credentials:
            try:
                values[scheme] = file.read_text().strip()
            except OSError as err:
                raise UsageError(
                    f"{self.path}: credentials.{scheme}: cannot read {file}: {err.strerror or err}"
                ) from None
            if not values[scheme]:
                raise UsageError(f"{self.path}: credentials.{scheme}: {file} is empty")
        return values


def load_config(path: Path, args: argparse.Namespace) -> BridgeConfig:
    """The serving config (serving_config.py) and the A2A agent's part of it: the agent's identity is
    the bridge's (one MissionWeave identity per bridged agent); its state goes under bridges/."""
    serving, data = serving_config.read(
        path, args, CONFIG_KEYS, who="the bridged agent", default_state=user_state_dir() / "bridges"
    )
    agent_url = serving_config.text(data, "agent_url", path)
    if agent_url is None:
        raise UsageError(f"{path}: missing key agent_url (the A2A agent's base URL)")
    transport = serving_config.text(data, "transport", path) or ""
    if transport and transport not in TRANSPORTS:
        raise UsageError(f"{path}: transport must be one of {', '.join(TRANSPORTS)}")
    slots = data.get("max_concurrency", 1)
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 1024:
        raise UsageError(f"{path}: max_concurrency must be an integer from 1 to 1024")
    publish = data.get("publish_card", True)
    if not isinstance(publish, bool):
        raise UsageError(f"{path}: publish_card must be true or false")
    table = data.get("credentials", {})
    if not isinstance(table, dict) or not all(isinstance(v, str) and v for v in table.values()):
        raise UsageError(f'{path}: credentials must be a table of scheme = "FILE"')
    base = path.resolve().parent
    credentials = tuple((scheme, base / Path(file).expanduser()) for scheme, file in sorted(table.items()))
    return BridgeConfig(
        **vars(serving),
        agent_url=agent_url,
        transport=transport,
        max_concurrency=slots,
        publish_card=publish,
        credentials=credentials,
    )


async def _publish_card(config: BridgeConfig, mesh: MeshClient, agent: ObservedAgent, card: Any) -> str:
    """The MissionWeave Agent Card of the bridged agent, signed with the session the runtime uses.
    A card the mesh already holds under this version is answered as stored; a different card under
    the same version is refused (versions only grow): said, and the card in force stays."""
    ours = mission_card(
        card, agent_id=config.identity, max_concurrency=config.max_concurrency, endpoint=config.agent_url
    )
    mesh.read_as(agent.session)
    try:
        answer = await mesh.publish_agent_card(ours)
    except grpc.aio.AioRpcError as err:
        raise CliError(
            f"the mesh refused the Agent Card {ours.card_version} of {config.identity}: {err.details()} "
            "(a changed A2A card needs a new version in its `version`)"
        ) from None
    return answer.published.card.card_version


async def cmd_a2a(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config), args)
    key = serving_config.read_identity_key(config)
    process_logs.configure(args)
    gc_policy.for_long_running_process()
    try:
        card = await resolve_card(config.agent_url, timeout_s=config.connect_timeout)
        client = open_client(card, config.transport, config.credential_values())
    except MissingCredentials as err:
        raise UsageError(f"{config.path}: {err}") from None
    except BridgeError as err:
        raise Unreachable(str(err)) from None
    tls = client_tls(args)
    state = config.state_dir
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with MeshClient(config.target, tls) as mesh:
            agent = ObservedAgent(
                config.target,
                config.identity,
                key,
                cursor_dir=state,
                tls=tls,
                connect_timeout=config.connect_timeout,
            )
            # A new session on every start (docs/bridge-a2a-worker.md "Restarts"): it fences the
            # previous process's leases at once (SESSION_REPLACED, ownership kept) and the scheduler
            # places that work again, so the handler re-attaches to its A2A task now. Reusing the
            # saved session would leave the work under a dead process's live lease until it lapsed.
            (agent.directory / "session.json").unlink(missing_ok=True)
            try:
                await agent.start()
            except GatewayError as err:
                raise CliError(f"the gateway refused {config.identity}: {err}") from None
            except AgentError as err:
                raise Unreachable(f"cannot reach {config.target}: {err}") from None
            journal = TaskJournal(agent.directory / "a2a-tasks.jsonl")
            runtime = WorkerRuntime(agent, observed(A2AWorker(client, card, journal, config.identity)))
            try:
                card_version = await _publish_card(config, mesh, agent, card) if config.publish_card else ""
                await runtime.serve(list(config.groups))
                _print(
                    args,
                    [
                        f"mwp bridge a2a: {card.name} ({config.agent_url}) works as {config.identity} in "
                        f"{', '.join(config.groups)} at {config.target} with {runtime.slots} slot(s); "
                        "Ctrl-C or SIGTERM stops it"
                    ],
                    {
                        "event": "started",
                        "identity": config.identity,
                        "agent": card.name,
                        "agent_url": config.agent_url,
                        "transport": client_transport(card, config.transport),
                        "groups": list(config.groups),
                        "card_version": card_version,
                        "slots": runtime.slots,
                        "session_epoch": agent.session.session_epoch,
                        "state_dir": str(state),
                    },
                )
                await stop.wait()
            finally:
                await runtime.close()
                await agent.close()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await client.close()
    done = list(runtime.completed)
    _print(
        args,
        [f"mwp bridge a2a: stopped after {len(done)} submission(s)"],
        {"event": "stopped", "submitted": [{"group_id": g, "work_item_id": w} for g, w in done]},
    )
    return 0


def client_transport(card: Any, wanted: str) -> str:
    """The transport the client speaks: the configured one, else the card's first the bridge speaks."""
    if wanted:
        return wanted
    names = {v: k for k, v in TRANSPORTS.items()}
    return next(
        (names[i.protocol_binding] for i in card.supported_interfaces if i.protocol_binding in names), ""
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "a2a",
        help="run an A2A agent as a Worker: each WorkItem becomes an A2A task (until Ctrl-C/SIGTERM)",
    )
    p.add_argument(
        "--config",
        required=True,
        help="the TOML config (docs/bridge-a2a-worker.md: agent_url, identity, key, groups, ...)",
    )
    serving_config.add_arguments(p, "the bridged agent's")
    add_json_flag(p, "machine output: one JSON document per line (started, stopped)")
    p.set_defaults(func=cmd_a2a, runs_until_stopped=True)
