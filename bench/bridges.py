"""Bridges benchmark (issue 43): what the A2A bridges cost beside what they stand on, in one run.

    PYTHONPATH=. .venv/bin/python bench/bridges.py            # default run (~1 minute)
    PYTHONPATH=. .venv/bin/python bench/bridges.py --quick    # smoke run

1. A WorkItem through `mwp bridge a2a`'s handler: offer -> submitted, one WorkItem at a time, the
   A2A agent of the tests (a2a-sdk's own server, JSON-RPC, streaming) completing at once with a text
   and a 2 KiB binary artifact. Anchor: the same Worker runtime with a native handler storing the
   same two Artifacts and the same Evidence. The ratio is the bridge's overhead per WorkItem (the
   A2A task, its stream, the journal).
2. GetTask on `mwp bridge a2a-server` for a WorkItem of a Group of --events events: the first call
   (every event read, verified and folded) and the next ones (the events since the previous answer).
   Anchor: the SDK reading the whole Group (ReadEvents, every event verified), as a client without
   the endpoint would.

An in-process mesh (SQLite, local blobs) and the A2A agent in this process; medians (min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from missionweave.sdk.agent import Agent  # noqa: E402
from missionweave.sdk.worker import Slot, WorkerRuntime, WorkResult  # noqa: E402
from missionweave.v1 import common_pb2  # noqa: E402
from missionweave.v1 import work_pb2 as wp  # noqa: E402
from tests.a2a_agents import BINARY, running_agent  # noqa: E402
from tests.conftest import World  # noqa: E402
from tests.in_process_world import world_at  # noqa: E402
from tests.test_missions import G  # noqa: E402
from tests.test_work_items import Flow, setup  # noqa: E402

SMALL_BUDGET = common_pb2.ResourceVector(currency="EUR", financial_micros=1_000, tokens=10, tool_calls=1)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ms ({min(values):.1f}-{max(values):.1f})"


async def native(slot: Slot) -> WorkResult:
    """The anchor's handler: the two Artifacts the A2A agent hands over, and one Evidence each criterion."""
    text = await slot.put(f"report for: {slot.contract.goal}".encode(), media_type="text/plain")
    binary = await slot.put(BINARY, media_type="application/octet-stream")
    evidence = [
        wp.Evidence(
            evidence_id=f"ev-{c.criterion_id}",
            criterion_id=c.criterion_id,
            method=wp.EVIDENCE_METHOD_TEST,
            result=wp.EVIDENCE_RESULT_PASS,
            summary="checked",
            artifacts=[text, binary],
        )
        for c in slot.contract.acceptance_criteria
    ]
    return WorkResult(evidence=evidence, summary="native")


async def per_work_item(w: World, flow: Flow, runtime: WorkerRuntime, prefix: str, count: int) -> list[float]:
    """offer -> submitted, one WorkItem at a time (authorized before the clock starts)."""
    for i in range(count):  # a small budget each, so that many fit in the Mission's
        await flow.authorize(f"{prefix}-{i}", goal=f"complete item {i}", budget=SMALL_BUDGET)
    timings = []
    for i in range(count):
        began = time.perf_counter()
        await flow.coord("work_offer", flow.offer_body(f"{prefix}-{i}", "worker-bot", seconds=600))
        async with asyncio.timeout(60):
            await runtime.submitted(len(runtime.completed) + 1)
        timings.append((time.perf_counter() - began) * 1000)
    return timings


async def served(
    w: World,
    state: Path,
    handler: Callable[[Slot], Awaitable[Any]],
    run: Callable[[WorkerRuntime], Awaitable[Any]],
) -> Any:
    async with Agent.connect(w.target, "worker-bot", w.worker.key, cursor_dir=state) as agent:
        runtime = WorkerRuntime(agent, handler)
        await runtime.serve([G])
        try:
            return await run(runtime)
        finally:
            await runtime.close()


async def bridge_vs_native(w: World, flow: Flow, tmp: Path, count: int) -> None:
    from missionweave_bridges.a2a.task_journal import TaskJournal
    from missionweave_bridges.a2a.worker import A2AWorker, open_client, resolve_card

    anchor = await served(w, tmp / "native", native, lambda r: per_work_item(w, flow, r, "native", count))
    async with running_agent(bindings=("JSONRPC",)) as agent:
        card = await resolve_card(agent.url)
        client = open_client(card, "jsonrpc")
        journal = TaskJournal(tmp / "journal.jsonl")
        try:
            bridged = await served(
                w,
                tmp / "bridged",
                A2AWorker(client, card, journal, "worker-bot"),
                lambda r: per_work_item(w, flow, r, "a2a", count),
            )
        finally:
            await client.close()
    ratio = statistics.median(bridged) / statistics.median(anchor)
    print(f"1. offer -> submitted, {count} WorkItems one at a time")
    print(f"   through mwp bridge a2a's handler: {spread(bridged)}")
    print(f"   anchor, native handler:           {spread(anchor)}")
    print(f"   ratio {ratio:.2f}x")


async def get_task(w: World, flow: Flow, tmp: Path, events: int, calls: int) -> None:
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.auth import AuthInterceptor
    from a2a.types import a2a_pb2 as a2a
    from nacl.signing import SigningKey

    from missionweave.kernel.signing import write_key
    from missionweave.v1 import membership_pb2
    from missionweave_bridges.a2a.server_app import start as start_endpoint
    from missionweave_bridges.a2a.server_config import ServedIdentity, ServerConfig, hash_token
    from tests import builders
    from tests.test_bridge_a2a_server import Token

    key = SigningKey.generate()
    await w.client.register_identity(
        "admin", w.keys["admin"], "ann-bot", common_pb2.IDENTITY_KIND_AGENT, bytes(key.verify_key)
    )
    write_key(tmp / "ann.key", key)
    grant = membership_pb2.MembershipGrant(member_id="ann-bot", role=membership_pb2.MEMBER_ROLE_WORKER)
    await w.run(w.owner, G, "membership_grant", grant, membership_epoch=1)
    await flow.authorize("followed", budget=SMALL_BUDGET)
    conversation = (await w.client.group_state(G)).mission.planning_conversation_id
    for i in range(events):
        await flow.coord("message_post", builders.message(conversation, f"note {i}"))
    head = (await w.client.group_state(G)).head_sequence
    config = ServerConfig(
        identities=(ServedIdentity("ann-bot", tmp / "ann.key", hash_token("bench-token")),),
        target=w.target,
        grpc_listen="127.0.0.1:0",
        http_listen="",
    )
    endpoint = await start_endpoint(config)
    import grpc

    client = ClientFactory(
        ClientConfig(
            streaming=False,
            supported_protocol_bindings=["GRPC"],
            grpc_channel_factory=grpc.aio.insecure_channel,
        )
    ).create(endpoint.card, interceptors=[AuthInterceptor(Token("bench-token"))])
    request = a2a.GetTaskRequest(id=f"workitem:{G}/followed")
    try:
        firsts, nexts, anchors = [], [], []
        for _ in range(calls):
            endpoint.handler._folds.clear()
            began = time.perf_counter()
            await client.get_task(request)
            firsts.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            await client.get_task(request)
            nexts.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            read = [e async for e in w.client.read_events(G)]
            anchors.append((time.perf_counter() - began) * 1000)
            assert len(read) == head
    finally:
        await client.close()
        await endpoint.stop(grace=0.5)
    print(f"2. GetTask of a WorkItem in a Group of {head} events, {calls} rounds")
    print(f"   first call (every event read, verified, folded): {spread(firsts)}")
    print(f"   next call (the events since the last answer):    {spread(nexts)}")
    print(f"   anchor, the SDK reading the whole Group:         {spread(anchors)}")
    print(
        f"   ratios to the anchor: first {statistics.median(firsts) / statistics.median(anchors):.2f}x, "
        f"next {statistics.median(nexts) / statistics.median(anchors):.3f}x"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--work-items", type=int, default=30)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=7)
    args = parser.parse_args()
    count, events, calls = (5, 200, 3) if args.quick else (args.work_items, args.events, args.calls)
    with tempfile.TemporaryDirectory(prefix="mwp-bench-bridges-") as scratch:
        tmp = Path(scratch)
        w = await world_at(tmp)
        try:
            flow = await setup(w)
            await bridge_vs_native(w, flow, tmp, count)
            await get_task(w, flow, tmp, events, calls)
        finally:
            await w.client.channel.close()
            await w.mesh.stop(grace=1)  # type: ignore[attr-defined]


if __name__ == "__main__":
    asyncio.run(main())
