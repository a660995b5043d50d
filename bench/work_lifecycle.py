"""WorkItem lifecycle benchmark: complete WorkItem lifecycles per second over gRPC, with the echo anchor.

    PYTHONPATH=. .venv/bin/python bench/work_lifecycle.py            # default run (~1.5 minutes)
    PYTHONPATH=. .venv/bin/python bench/work_lifecycle.py --quick    # smoke run (~15 s)
    PYTHONPATH=. .venv/bin/python bench/work_lifecycle.py --lifecycles 2000 --concurrency 64 --groups 50

What it measures (issue #4, "Benchmark"): one lifecycle per WorkItem, every step a signed command
through unary ``ExecuteCommand`` (``--publish stream``: as a message on one of ``--streams`` open
``ExecuteCommandStream`` calls in turn, answers matched by request tag) that depends on the previous
step's result:

    work.authorize (Coordinator) -> work.offer (Coordinator) -> work.accept_offer (Worker)
    -> work.start (Worker) -> --renewals x work.renew_lease (Worker, reporting token usage)
    -> work.submit (Worker, an Artifact ref and Evidence) -> work.accept_result (Coordinator)

``--concurrency`` lifecycles run at once, each with one command in flight, over ``--groups`` Missions
(WorkItem i lives in Group i mod groups, so concurrent lifecycles share Groups and meet the
Authority's per-Group serialisation). Each Group is a Mission created by the human owner with a
Coordinator (1-hour lease) and a worker Membership granted by the owner.

Pre-signed before the timed loop: authorize, offer, accept_offer, start, the renewals and submit
(the offer id and lease id are client-chosen; the ownership epoch of a first acceptance is always 1,
which the loop checks on the accept_offer result). Signed inside the timed loop: accept_result,
because it cites the ``work.submitted`` event id from the submit result.

Anchor in the same run: the echo server of ``bench/authority.py`` (its own process, parsing the same
requests and answering canned bytes of our mean response size) at the same concurrency, over the
very requests the timed loop sent, unary or over as many streams as they were sent. At the end every
WorkItem must be VERIFIED (GetMissionProgress) and the sum of the Groups' heads (GetGroupState) must
equal the events acknowledged to this client.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for _p in (str(ROOT), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import grpc  # noqa: E402
from authority import (  # noqa: E402
    GRPC_OPTIONS,
    Child,
    CpuMeter,
    ProcTree,
    Progress,
    Run,
    SplitMesh,
    database_name,
    echo_stream_call,
    echo_unary_call,
    log,
    run_streamed,
    run_unary,
    spawn_echo,
    spawn_mesh,
)
from nacl.signing import SigningKey  # noqa: E402

from missionweave.kernel.transport import open_channel  # noqa: E402
from missionweave.sdk.artifacts import NO_AGENT_CARD, Described, Origin, hash_chunks, signed_manifest  # noqa: E402
from missionweave.sdk.client import MeshClient, SessionSigner, membership_epoch  # noqa: E402
from missionweave.v1 import authority_service_pb2 as pb  # noqa: E402
from missionweave.v1 import common_pb2, event_pb2, membership_pb2  # noqa: E402
from missionweave.v1 import work_pb2 as wp  # noqa: E402
from missionweave_server.edge.command_stream import CommandStream  # noqa: E402

PRESIGNED = (
    "work_authorize",
    "work_offer",
    "work_accept_offer",
    "work_start",
    "work_renew_lease",
    "work_submit",
)
IN_LOOP = ("work_accept_result",)
KINDS = (*PRESIGNED, *IN_LOOP)
LEASE_SECONDS = 600  # execution lease and start deadline: far longer than any lifecycle here
VERIFIED = wp.WORK_ITEM_STATE_VERIFIED


@dataclass
class Plan:
    """One WorkItem's lifecycle: the pre-signed requests in order, and what the loop signs itself."""

    index: int
    group_id: str
    work_item_id: str
    steps: list[tuple[str, pb.ExecuteCommandRequest]]
    # The deliverable its submission names and the worker's signed manifest: uploaded before the
    # timed loop, since a submission names only Artifacts the store holds (D161).
    deliverable: tuple[bytes, Any]


@dataclass
class Actors:
    coordinator: SessionSigner
    worker: SessionSigner
    coordinator_membership: dict[str, int]  # Group -> membership epoch
    worker_membership: dict[str, int]
    coordinator_epoch: dict[str, int]  # Group -> Coordinator epoch
    missions: dict[str, str] = field(default_factory=dict)  # Group -> Mission id


@dataclass
class Tally:
    """Everything the lifecycle loop counts besides the lifecycle Run itself."""

    per_kind: dict[str, Run] = field(default_factory=lambda: {k: Run(k) for k in KINDS})
    commands: int = 0
    events: int = 0
    sign_seconds: float = 0.0  # in-loop build + sign of accept_result
    failed_at: dict[str, int] = field(default_factory=dict)
    sent: list[pb.ExecuteCommandRequest] = field(default_factory=list)
    responses: list[pb.ExecuteCommandResponse] = field(default_factory=list)
    completed: set[str] = field(default_factory=set)  # "group/work_item" of lifecycles that finished
    finished_at: list[float] = field(default_factory=list)  # perf_counter() at each lifecycle's end, in order
    # (lifecycles completed, server CPU s, client CPU s) every CPU_SAMPLE_S of the timed loop
    cpu_samples: list[tuple[int, float, float]] = field(default_factory=list)
    # (perf_counter() at its end, CPU s) of each pass of the speed probe over its fixed work
    probe_samples: list[tuple[float, float]] = field(default_factory=list)


# How often the timed loop samples the server's and the client's CPU (the growth windows' costs).
CPU_SAMPLE_S = 0.5

# The speed probe: a process of its own that times, in CPU seconds, the same pure-Python work every
# PROBE_EVERY_S (~3 ms a pass, ~1% of a core). Its cost per pass is the machine's speed as the
# server and the client see it (a shared VM's neighbours, caches, frequency): a control for the
# growth windows, whose CPU per lifecycle moves with it when only the machine changed.
PROBE_EVERY_S = 0.25
PROBE_CODE = """
import sys, time
def work():
    table = {}
    for i in range(20000):
        table[i % 997] = table.get(i % 997, 0) + i
    return len(",".join(str(i) for i in range(3000))) + len(table)
while True:
    t = time.process_time()
    work()
    print(time.perf_counter(), time.process_time() - t, flush=True)  # CLOCK_MONOTONIC: the bench's clock too
    time.sleep(float(sys.argv[1]))
"""


# ====================================================================== building the commands


def contract(now: datetime) -> wp.WorkContract:
    from tests import builders

    c = builders.contract(now)
    c.time_policy.execution_lease_duration.FromSeconds(LEASE_SECONDS)
    c.time_policy.start_deadline.FromSeconds(LEASE_SECONDS)
    return c


def build_plans(
    first: int, count: int, group_ids: list[str], actors: Actors, now: datetime, renewals: int, usage: int
) -> list[Plan]:
    """Builds and signs every command of ``count`` lifecycles that does not depend on a result."""
    from tests import builders

    coord, worker = actors.coordinator, actors.worker
    plans = []
    for i in range(first, first + count):
        gid = group_ids[i % len(group_ids)]
        ce, cm, wm = (
            actors.coordinator_epoch[gid],
            actors.coordinator_membership[gid],
            actors.worker_membership[gid],
        )
        wi, offer_id, lease_id = f"wi-{i:07d}", f"offer-{i:07d}", f"lease-{i:07d}"

        def signed(
            signer: SessionSigner, kind: str, body: Any, epoch: int, gid: str = gid
        ) -> pb.ExecuteCommandRequest:
            return pb.ExecuteCommandRequest(
                command=signer.sign(signer.command(gid, kind, body, membership_epoch=epoch))
            )

        authorize = wp.WorkAuthorize(
            work_item_id=wi, title=f"bench task {i}", contract=contract(now), coordinator_epoch=ce
        )
        offer = wp.WorkOffer(
            work_item_id=wi,
            offer_id=offer_id,
            candidate_ids=[worker.identity_id],
            selection_criteria=[builders.selection(worker.identity_id)],
            coordinator_epoch=ce,
        )
        offer.expires_at.FromDatetime(now + timedelta(hours=1))
        steps = [
            ("work_authorize", signed(coord, "work_authorize", authorize, cm)),
            ("work_offer", signed(coord, "work_offer", offer, cm)),
            (
                "work_accept_offer",
                signed(
                    worker,
                    "work_accept_offer",
                    wp.WorkAcceptOffer(work_item_id=wi, offer_id=offer_id, contract_revision=1),
                    wm,
                ),
            ),
            (
                "work_start",
                signed(
                    worker,
                    "work_start",
                    wp.WorkStart(work_item_id=wi, ownership_epoch=1, lease_id=lease_id),
                    wm,
                ),
            ),
        ]
        for _ in range(renewals):
            renew = wp.WorkRenewLease(work_item_id=wi, lease_id=lease_id, ownership_epoch=1)
            if usage:
                renew.usage_delta.tokens = usage
            steps.append(("work_renew_lease", signed(worker, "work_renew_lease", renew, wm)))
        data = f"bench task {i}: all balances match\n".encode()
        hashes = hash_chunks([data])
        origin = Origin(gid, actors.missions[gid], wi, lease_id, 1, NO_AGENT_CARD)
        manifest = signed_manifest(Described(hashes, "text/plain", worker.identity_id, origin), worker)
        submit = wp.WorkSubmit(
            work_item_id=wi,
            lease_id=lease_id,
            ownership_epoch=1,
            contract_revision=1,
            artifacts=[common_pb2.ArtifactRef(digest=hashes.digest, media_type="text/plain")],
            evidence=[builders.evidence()],
            summary=f"bench task {i}: all balances match",
        )
        steps.append(("work_submit", signed(worker, "work_submit", submit, wm)))
        plans.append(Plan(i, gid, wi, steps, (data, manifest)))
    return plans


def commands_per_lifecycle(renewals: int) -> int:
    """authorize, offer, accept_offer, start, the renewals, submit, accept_result."""
    return 6 + renewals


def first_event(result: Any) -> event_pb2.Event:
    event = event_pb2.Event()
    event.ParseFromString(result.events[0].payload)
    return event


Execute = Callable[[pb.ExecuteCommandRequest], Awaitable[pb.ExecuteCommandResponse]]


def transport(args: argparse.Namespace) -> str:
    return f"{args.streams} ExecuteCommandStreams" if args.publish == "stream" else "unary ExecuteCommand"


class Streamed:
    """``ExecuteCommand`` over ``ExecuteCommandStream`` (``--publish stream``): each request's command
    a message on the next of a few open streams in turn, its answer returned as the unary call's
    response, a rejection raised as the unary call would. Several streams rather than one: grpcio
    spends 2-3x the CPU per message on one busy stream (bench/README, "Streamed lifecycles")."""

    def __init__(self, channel: Any, streams: int) -> None:
        self.publishers = [CommandStream(channel) for _ in range(streams)]
        self.turn = itertools.cycle(self.publishers)

    async def __call__(self, req: pb.ExecuteCommandRequest) -> pb.ExecuteCommandResponse:
        answer = await next(self.turn).execute(req.command)
        if answer.HasField("rejection"):
            reason = common_pb2.RejectionReason.Name(answer.rejection.reason)
            raise RuntimeError(f"rejected: {reason}: {answer.rejection.message}")
        return pb.ExecuteCommandResponse(result=answer.result)

    async def close(self) -> None:
        for publisher in self.publishers:
            publisher.cancel()


def describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        from missionweave.kernel.rejections import rejection_from_rpc_error

        rejection = rejection_from_rpc_error(exc)
        if rejection is not None:
            return f"{common_pb2.RejectionReason.Name(rejection.reason)}: {rejection.message}"
        return f"{exc.code().name}: {exc.details()}"
    return repr(exc)[:500]


# ====================================================================== the lifecycle loop


async def run_lifecycles(
    name: str,
    call: Execute,
    plans: list[Plan],
    actors: Actors,
    concurrency: int,
    max_seconds: float,
    tally: Tally,
    server: int | ProcTree = 0,
    keep_responses: bool = False,
) -> Run:
    """``concurrency`` tasks, each running the next lifecycle from a shared cursor to its end.

    Every request sent is kept in ``tally.sent`` (the echo anchor replays them), every response too
    with ``keep_responses`` (the echo anchor's canned response is one of our mean size).
    No new lifecycle starts after ``max_seconds``; those in flight finish.
    """
    run = Run(name)
    perf = time.perf_counter
    deadline = perf() + max_seconds
    cursor = iter(plans)
    coord = actors.coordinator

    async def step(kind: str, req: pb.ExecuteCommandRequest) -> pb.ExecuteCommandResponse:
        t0 = perf()
        resp = await call(req)
        tally.per_kind[kind].latencies.append(perf() - t0)
        tally.per_kind[kind].done += 1
        tally.commands += 1
        tally.events += len(resp.result.events)
        tally.sent.append(req)
        if keep_responses:
            tally.responses.append(resp)
        if resp.result.replayed:
            raise RuntimeError(f"{kind} was answered as a replay")
        return resp

    async def lifecycle(plan: Plan) -> None:
        kind = plan.steps[0][0]
        t0 = perf()
        try:
            submission = ""
            for kind, req in plan.steps:
                resp = await step(kind, req)
                if kind == "work_accept_offer":
                    epoch = first_event(resp.result).work_offer_accepted.ownership.ownership_epoch
                    if epoch != 1:
                        raise RuntimeError(f"ownership epoch {epoch}, the pre-signed commands cite 1")
                elif kind == "work_submit":
                    submission = first_event(resp.result).event_id
            kind = "work_accept_result"
            s0 = perf()
            gid = plan.group_id
            body = wp.WorkAcceptResult(
                work_item_id=plan.work_item_id,
                coordinator_epoch=actors.coordinator_epoch[gid],
                submission_event_id=submission,
            )
            req = pb.ExecuteCommandRequest(
                command=coord.sign(
                    coord.command(gid, kind, body, membership_epoch=actors.coordinator_membership[gid])
                )
            )
            tally.sign_seconds += perf() - s0
            await step(kind, req)
        except Exception as exc:
            run.errors += 1
            tally.per_kind[kind].errors += 1
            tally.failed_at[kind] = tally.failed_at.get(kind, 0) + 1
            run.first_error = run.first_error or f"{plan.work_item_id} at {kind}: {describe(exc)}"
            return
        run.latencies.append(perf() - t0)
        run.done += 1
        tally.completed.add(f"{plan.group_id}/{plan.work_item_id}")
        tally.finished_at.append(perf())

    async def worker() -> None:
        for plan in cursor:
            if perf() > deadline:
                return
            await lifecycle(plan)

    async def sample_cpu(tree: ProcTree) -> None:
        while True:
            total = sum(cpu for _, cpu in tree.snapshot().values())
            tally.cpu_samples.append((len(tally.finished_at), total, time.process_time()))
            await asyncio.sleep(CPU_SAMPLE_S)

    async def probe_speed() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PROBE_CODE, str(PROBE_EVERY_S), stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        try:
            while line := await proc.stdout.readline():
                at, cpu = line.split()
                tally.probe_samples.append((float(at), float(cpu)))
        finally:
            proc.kill()
            await proc.wait()

    with Progress(run, len(plans)), CpuMeter(run, server):
        samplers = (
            [asyncio.create_task(sample_cpu(server)), asyncio.create_task(probe_speed())]
            if isinstance(server, ProcTree)
            else []
        )
        t0 = perf()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = perf() - t0
        for sampler in samplers:
            sampler.cancel()
        await asyncio.gather(*samplers, return_exceptions=True)
    return run


def growth_windows(
    tally: Tally, concurrency: int, share: float = 0.1
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The first and the last ``share`` of the completed lifecycles (completion indexes), in steady
    state: the ``concurrency`` completions at either end are left out (the first of them carry the
    ramp-up, a whole lifecycle's latency before anything completes; the last the ramp-down, when no
    new lifecycle competes with them)."""
    n = len(tally.finished_at)
    k = max(1, int(n * share))
    if n < 2 * (k + concurrency) + 1:
        return None
    return (concurrency, concurrency + k), (n - concurrency - k - 1, n - concurrency - 1)


def growth_rates(tally: Tally, concurrency: int) -> tuple[float, float]:
    """Lifecycles/s over the growth windows."""
    windows = growth_windows(tally, concurrency)
    if windows is None:
        return float("nan"), float("nan")
    ends = tally.finished_at
    first, last = ((b - a) / (ends[b] - ends[a]) for a, b in windows)
    return first, last


def growth_speeds(tally: Tally, concurrency: int) -> tuple[float, float] | None:
    """The speed probe's mean CPU seconds per pass over each growth window (None without samples)."""
    windows = growth_windows(tally, concurrency)
    if windows is None:
        return None
    out = []
    for a, b in windows:
        start, end = tally.finished_at[a], tally.finished_at[b]
        passes = [cpu for at, cpu in tally.probe_samples if start <= at <= end]
        if not passes:
            return None
        out.append(statistics.fmean(passes))
    return out[0], out[1]


def growth_costs(tally: Tally, concurrency: int) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """(server, client) CPU seconds per lifecycle over each growth window, from the samples nearest
    its ends. What the server does per lifecycle, against the client's fixed work per lifecycle:
    both move together when the machine's speed does (a shared VM's), only the server's when its
    own work grows."""
    windows, samples = growth_windows(tally, concurrency), tally.cpu_samples
    if windows is None or len(samples) < 4:
        return None

    def nearest(index: int) -> tuple[int, float, float]:
        return min(samples, key=lambda s: abs(s[0] - index))

    out = []
    for a, b in windows:
        (n0, s0, c0), (n1, s1, c1) = nearest(a), nearest(b)
        if n1 <= n0 or s1 <= s0 or c1 <= c0:
            return None
        out.append(((s1 - s0) / (n1 - n0), (c1 - c0) / (n1 - n0)))
    return out[0], out[1]


# ====================================================================== the driver


async def setup(
    client: MeshClient, data_dir: Path, group_ids: list[str], run_id: str, unique_names: bool, now: datetime
) -> tuple[Actors, int]:
    """Identities, sessions, one Mission per Group and the worker's Membership; returns the events made."""
    from missionweave.kernel.signing import read_key
    from tests import builders

    admin_key_path = data_dir / "keys" / "admin.key"
    if not admin_key_path.exists():
        raise SystemExit(
            f"no admin key at {admin_key_path}: pass --data-dir of the server that bootstrapped it"
        )
    admin_key = read_key(admin_key_path)
    suffix = f"-{run_id}" if unique_names else ""
    names = {
        "owner": f"alice{suffix}",
        "coordinator": f"coordinator-bot{suffix}",
        "worker": f"worker-bot{suffix}",
    }
    kinds = {"owner": common_pb2.IDENTITY_KIND_HUMAN}
    signers: dict[str, SessionSigner] = {}
    for role, name in names.items():
        key = SigningKey.generate()
        await client.register_identity(
            "admin", admin_key, name, kinds.get(role, common_pb2.IDENTITY_KIND_AGENT), bytes(key.verify_key)
        )
        signers[role] = await client.open_session(name, key)
    owner, coord, worker = signers["owner"], signers["coordinator"], signers["worker"]

    events = 0
    budget = common_pb2.ResourceVector(
        currency="EUR", financial_micros=10**12, tokens=10**12, tool_calls=10**9
    )

    async def create(gid: str) -> pb.GroupState:
        nonlocal events
        body = builders.mission_create(owner.identity_id, coord.identity_id, now, budget=budget)
        body.coordinator_renewal.lease_duration.FromSeconds(3600)
        # (await first, then add: ``events += len(await ...)`` would read ``events`` before awaiting)
        created = await client.execute(owner.sign(owner.command(gid, "mission_create", body)))
        events += len(created.events)
        grant = membership_pb2.MembershipGrant(
            member_id=worker.identity_id, role=membership_pb2.MEMBER_ROLE_WORKER
        )
        granted = await client.execute(
            owner.sign(owner.command(gid, "membership_grant", grant, membership_epoch=1))
        )
        events += len(granted.events)
        return await client.group_state(gid)

    actors = Actors(coord, worker, {}, {}, {}, {})
    for start in range(0, len(group_ids), 16):
        chunk = group_ids[start : start + 16]
        for gid, state in zip(chunk, await asyncio.gather(*(create(g) for g in chunk)), strict=True):
            actors.coordinator_membership[gid] = membership_epoch(state, coord.identity_id)
            actors.worker_membership[gid] = membership_epoch(state, worker.identity_id)
            actors.coordinator_epoch[gid] = state.mission.coordinator.coordinator_epoch
            actors.missions[gid] = state.mission.mission_id
            if not (actors.coordinator_membership[gid] and actors.worker_membership[gid]):
                raise RuntimeError(f"Group {gid}: the Coordinator or the worker holds no Membership")
    return actors, events


async def drive(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from missionweave.kernel import ids
    from missionweave.kernel.clock import SystemClock

    r: dict[str, Any] = {}
    run_id = ids.new_id("b")[2:10]
    data_dir = Path(args.data_dir) if args.data_dir else work / "data"
    store = "PostgreSQL" if args.database_url else "SQLite"
    if args.growth:
        # A few Groups grown to 10,000 WorkItems within the replay window take more than the
        # per-Group ingress limit (MW-8-16, 200 commands/s by default): it is the growth under test.
        os.environ.setdefault("MWP_GROUP_RATE", "0")
        log(
            f"growth mode: MWP_GROUP_RATE={os.environ['MWP_GROUP_RATE']} for the server (0: no per-Group ingress limit)"
        )
    profile_out = work / "server.prof"
    mesh: Child | SplitMesh
    if args.shards:
        log(f"starting the split topology with {args.shards} Authority shard(s) ({store} store)")
        mesh = SplitMesh(args.shards, data_dir, work / "server.stderr", args.database_url)
        meter = ProcTree(mesh.proc.pid, "launcher", mesh.names, database_name(args.database_url))
    else:
        log(f"starting our server ({store} store) in a separate process")
        mesh = spawn_mesh(data_dir, work, args.database_url, profile_out if args.profile_server else None)
        # Every process of the server: its signature worker and SQLite writer too.
        meter = ProcTree(mesh.proc.pid, "server", pg_database=database_name(args.database_url))
    log(f"  server pid {mesh.proc.pid}, port {mesh.port}")
    try:
        client = MeshClient(f"127.0.0.1:{mesh.port}")
        group_ids = [f"grp_wl_{run_id}_{g:03d}" for g in range(args.groups)]
        now = SystemClock().now()
        log(f"creating {args.groups} Missions (owner, Coordinator, worker Membership)")
        actors, setup_events = await setup(
            client, data_dir, group_ids, run_id, bool(args.database_url or args.data_dir), now
        )

        warm = min(500, max(args.groups, args.lifecycles // 20))
        if args.growth:  # every Group ends with ``--growth`` WorkItems, the warm-up's included
            args.lifecycles = args.growth * args.groups - warm
        total = warm + args.lifecycles
        per = commands_per_lifecycle(args.renewals)
        log(
            f"building and signing {total:,} lifecycles x {per} commands = {total * per:,} (outside the timed loop)"
        )
        t0 = time.perf_counter()
        plans: list[Plan] = []
        for start in range(0, total, 1000):
            plans += build_plans(
                start, min(1000, total - start), group_ids, actors, now, args.renewals, args.usage_tokens
            )
            if total > 2000:
                log(f"  signed {len(plans):,}/{total:,} lifecycles")
        sign_s = time.perf_counter() - t0
        r["client_sign_rate"] = total * per / sign_s
        log(
            f"  {total * per:,} commands in {sign_s:.1f}s ({r['client_sign_rate']:,.0f}/s client-side build+sign)"
        )
        log(f"uploading {total:,} deliverables with their manifests (outside the timed loop, D161)")
        for start in range(0, total, 500):
            chunk = plans[start : start + 500]
            answers = await client.upload_many(
                [p.deliverable[0] for p in chunk], [p.deliverable[1] for p in chunk]
            )
            refused = [a for a in answers if isinstance(a, Exception)]
            if refused:
                raise RuntimeError(f"uploading the deliverables failed: {refused[0]!r}")

        stub = client.authority
        publisher = Streamed(client.channel, args.streams) if args.publish == "stream" else None
        execute: Execute = stub.ExecuteCommand if publisher is None else publisher
        log(f"warm-up: {warm} lifecycles, {args.concurrency} concurrent, {transport(args)}")
        warm_tally = Tally()
        warm_run = await run_lifecycles(
            "warm-up",
            execute,
            plans[:warm],
            actors,
            args.concurrency,
            args.max_seconds,
            warm_tally,
            keep_responses=True,
        )
        if warm_run.errors:
            raise RuntimeError(f"warm-up failed: {warm_run.first_error}")

        _profile_toggle(mesh, args)
        log(
            f"timed: {args.lifecycles:,} lifecycles, {args.concurrency} concurrent, over {args.groups} Groups"
        )
        tally = Tally()
        lifecycles = await run_lifecycles(
            "lifecycles",
            execute,
            plans[warm:],
            actors,
            args.concurrency,
            args.max_seconds,
            tally,
            meter,
        )
        if publisher is not None:
            await publisher.close()
        _profile_toggle(mesh, args)
        log(f"  {lifecycles.line()}")

        # ------------------------------------------------------------ consistency check
        log("consistency check: GetMissionProgress and GetGroupState of every Group")
        states = await asyncio.gather(*(client.group_state(g) for g in group_ids))
        progress = await asyncio.gather(
            *(stub.GetMissionProgress(pb.GetMissionProgressRequest(group_id=g)) for g in group_ids)
        )
        items = {
            f"{g}/{w.work_item_id}": w.state
            for g, p in zip(group_ids, progress, strict=True)
            for w in p.work_items
        }
        completed = warm_tally.completed | tally.completed
        r["check"] = {
            "heads": sum(s.head_sequence for s in states),
            "acked": setup_events + warm_tally.events + tally.events,
            "work_items": len(items),
            "verified": sum(1 for s in items.values() if s == VERIFIED),
            "completed": len(completed),
            "completed_not_verified": sum(1 for k in completed if items.get(k) != VERIFIED),
            "max_items_per_group": max(len(p.work_items) for p in progress),
        }
        await client.channel.close()
    finally:
        out = mesh.stop()
    stats = [line for line in out.splitlines() if line.startswith("STATS")]
    r["server_stats"] = stats[0][6:] if stats else ""
    if args.profile_server and profile_out.exists():
        r["profile"] = profile_out

    # ------------------------------------------------------------ echo anchor (same requests, same concurrency)
    sizes = [len(x.SerializeToString()) for x in warm_tally.responses]
    mean_response = statistics.mean(sizes)
    canned = min(warm_tally.responses, key=lambda x: abs(len(x.SerializeToString()) - mean_response))
    r["request_bytes"] = statistics.mean(
        len(x.SerializeToString()) for x in tally.sent[:5000] or warm_tally.sent
    )
    r["response_bytes"] = mean_response
    r["canned_bytes"] = len(canned.SerializeToString())
    echo_reqs = tally.sent[: args.echo_calls] or warm_tally.sent
    log(
        f"echo anchor: {len(echo_reqs):,} of the requests just sent, {args.concurrency} concurrent clients; "
        f"canned response {r['canned_bytes']} B (our mean {mean_response:.0f} B)"
    )
    # The stream echo answers the request's tag followed by these bytes (field 1 left out).
    stream_rest = pb.ExecuteCommandStreamResponse(command_id=canned.result.command_id, result=canned.result)
    echo = spawn_echo(work, canned.SerializeToString(), stream_rest.SerializeToString())
    try:
        channel = open_channel(f"127.0.0.1:{echo.port}", options=GRPC_OPTIONS)
        if args.publish == "stream":
            # As many streams, with as many commands in flight in all as lifecycles ran at once.
            def tagged(reqs: list[pb.ExecuteCommandRequest]) -> list[pb.ExecuteCommandStreamRequest]:
                return [
                    pb.ExecuteCommandStreamRequest(command=q.command, request_tag=i + 1)
                    for i, q in enumerate(reqs)
                ]

            streams = echo_stream_call(channel)
            window = -(-args.concurrency // args.streams)
            await run_streamed(
                "warm-up", streams, tagged(warm_tally.sent[:1000]), args.streams, window, args.max_seconds
            )
            echo_run = await run_streamed(
                "echo streamed",
                streams,
                tagged(echo_reqs),
                args.streams,
                window,
                args.max_seconds,
                lambda x: x.result.group_revision > 0,
                echo.proc.pid,
            )
        else:
            call = echo_unary_call(channel)
            await run_unary("warm-up", call, warm_tally.sent[:1000], args.concurrency, args.max_seconds)
            echo_run = await run_unary(
                "echo unary",
                call,
                echo_reqs,
                args.concurrency,
                args.max_seconds,
                lambda x: x.result.group_revision > 0,
                echo.proc.pid,
            )
        log(f"  {echo_run.line()}")
        await channel.close()
    finally:
        echo.stop()

    r.update(lifecycles=lifecycles, tally=tally, echo=echo_run, warm=warm)
    return r


def _profile_toggle(mesh: Child | SplitMesh, args: argparse.Namespace) -> None:
    if args.profile_server:
        import signal

        os.kill(mesh.proc.pid, signal.SIGUSR1)


# ====================================================================== the report


def report(args: argparse.Namespace, r: dict[str, Any]) -> bool:
    """Prints the figures; returns whether the consistency check passed."""
    lc: Run = r["lifecycles"]
    t: Tally = r["tally"]
    echo: Run = r["echo"]
    c: dict[str, int] = r["check"]
    secs = lc.seconds or float("nan")
    cmd_rate = t.commands / secs
    per = commands_per_lifecycle(args.renewals)
    store = "PostgreSQL" if args.database_url else "SQLite (WAL, synchronous=FULL)"
    topology = (
        f"split, {args.shards} Authority shard(s) behind the gateway" if args.shards else "single process"
    )

    print()
    print(
        f"MissionWeave WorkItem lifecycle benchmark - {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"grpcio {grpc.__version__}"
    )
    print(
        f"topology: {topology}; store: {store}; {args.lifecycles:,} lifecycles ({r['warm']} more as warm-up), {args.concurrency} concurrent, "
        f"over {args.groups} Groups (up to {c['max_items_per_group']} WorkItems per Group at the end)"
    )
    print(
        f"lifecycle: authorize -> offer -> accept_offer -> start -> {args.renewals} x renew_lease"
        f"{f' ({args.usage_tokens} tokens of usage each)' if args.usage_tokens else ''} -> submit -> accept_result "
        f"= {per} signed commands, each waiting for the previous result ({transport(args)})"
    )
    print(
        f"pre-signed before the timed loop: {', '.join(PRESIGNED)} (client build+sign {r['client_sign_rate']:,.0f}/s); "
        f"signed in the timed loop: {', '.join(IN_LOOP)} (needs the submit result's event id; "
        f"{t.sign_seconds / max(1, lc.done) * 1e6:,.0f} us per lifecycle)"
    )
    print(
        f"request {r['request_bytes']:.0f} B mean, response {r['response_bytes']:.0f} B mean; "
        f"server and client are separate processes"
    )
    print()
    rows = [
        ("lifecycles", f"{lc.rate:,.1f} /s", lc.pct(50), lc.pct(99), lc.errors),
        (
            "commands (all kinds)",
            f"{cmd_rate:,.0f} cmd/s",
            _pooled(t, 50),
            _pooled(t, 99),
            sum(k.errors for k in t.per_kind.values()),
        ),
        ("events appended", f"{t.events / secs:,.0f} ev/s", None, None, None),
    ]
    for kind in KINDS:
        k = t.per_kind[kind]
        rows.append((f"  {kind}", f"{k.done / secs:,.0f} cmd/s", k.pct(50), k.pct(99), k.errors))
    rows.append(
        (
            f"anchor: echo, {'streamed' if args.publish == 'stream' else 'unary'}",
            f"{echo.rate:,.0f} calls/s",
            echo.pct(50),
            echo.pct(99),
            echo.errors,
        )
    )
    w = max(len(x[0]) for x in rows)
    print(f"{'figure':<{w}}  {'value':>14}  {'p50 ms':>8}  {'p99 ms':>8}  {'errors':>6}")
    print("-" * (w + 44))
    for name, value, p50, p99, err in rows:
        f50 = f"{p50:.1f}" if p50 is not None else ""
        f99 = f"{p99:.1f}" if p99 is not None else ""
        print(f"{name:<{w}}  {value:>14}  {f50:>8}  {f99:>8}  {'' if err is None else err:>6}")
    print()
    ratio = f"{cmd_rate / echo.rate:.0%}" if echo.rate else "n/a"
    print(f"commands/s / echo calls/s: {ratio}  (lifecycles/s x {per} / echo calls/s)")
    n = max(1, lc.done)
    print(
        f"CPU per lifecycle: server {lc.server_cpu / n * 1e3:.2f} ms ({lc.server_cpu / secs:.0%} of a core), "
        f"client {lc.client_cpu / n * 1e3:.2f} ms ({lc.client_cpu / secs:.0%}); per command: server "
        f"{lc.server_cpu / max(1, t.commands) * 1e6:,.0f} us, client {lc.client_cpu / max(1, t.commands) * 1e6:,.0f} us"
    )
    if lc.server_cpu_by:
        by = ", ".join(f"{name} {cpu / n * 1e3:.2f} ms" for name, cpu in sorted(lc.server_cpu_by.items()))
        print(
            f"server CPU per lifecycle by process: {by}"
            + (f"; PostgreSQL backends {lc.pg_cpu / n * 1e3:.2f} ms" if lc.pg_cpu else "")
        )
    print(f"echo anchor CPU: {echo.cpu_line()}")
    first, last = growth_rates(t, args.concurrency)
    print(
        f"growth: first 10% of lifecycles {first:,.1f}/s, last 10% {last:,.1f}/s, ratio last/first {last / first:.2f} "
        f"(target >= 0.90) as each Group grew to {c['max_items_per_group']:,} WorkItems"
    )
    costs = growth_costs(t, args.concurrency)
    if costs is not None:
        (s0, c0), (s1, c1) = costs
        print(
            f"growth: CPU per lifecycle, first 10% -> last 10%: server {s0 * 1e3:.2f} -> {s1 * 1e3:.2f} ms "
            f"(x{s1 / s0:.2f}), client {c0 * 1e3:.2f} -> {c1 * 1e3:.2f} ms (x{c1 / c0:.2f}, the same work throughout: "
            f"the machine's drift); server/client {s0 / c0:.2f} -> {s1 / c1:.2f} (x{(s1 / c1) / (s0 / c0):.2f}, flat = 1.00)"
        )
    speeds = growth_speeds(t, args.concurrency)
    if speeds is not None and costs is not None:
        (p0, p1), ((s0, c0), (s1, c1)) = speeds, costs
        print(
            f"growth: speed probe (the same pure-Python work in its own process), CPU per pass {p0 * 1e3:.2f} -> "
            f"{p1 * 1e3:.2f} ms (x{p1 / p0:.2f}: the machine's drift); CPU per lifecycle over the probe's: server "
            f"x{(s1 / s0) / (p1 / p0):.2f}, client x{(c1 / c0) / (p1 / p0):.2f} (flat = 1.00)"
        )
    stats = dict(kv.split("=") for kv in str(r["server_stats"]).split())
    batch = (
        f" (mean group-commit batch {int(stats['appends']) / int(stats['batches']):.1f} appends)"
        if stats.get("batches") and int(stats["batches"])
        else ""
    )
    print(f"server store: {r['server_stats']}{batch}")
    print()
    heads_ok = c["heads"] == c["acked"]
    items_ok = c["completed_not_verified"] == 0 and c["verified"] == c["work_items"] == c["completed"]
    print(
        f"check: {c['verified']:,} of {c['work_items']:,} WorkItems VERIFIED (GetMissionProgress), "
        f"{c['completed']:,} lifecycles completed (warm-up included), {c['completed_not_verified']} completed but not VERIFIED "
        f"-> {'consistent' if items_ok else 'MISMATCH'}"
    )
    print(
        f"check: sum of Group heads {c['heads']:,} vs events acknowledged to this client {c['acked']:,} "
        f"-> {'consistent' if heads_ok else 'MISMATCH'}"
    )
    if lc.first_error:
        print(f"first error: {lc.first_error}  (failed at: {t.failed_at})")
    if echo.first_error:
        print(f"first echo error: {echo.first_error}")
    return heads_ok and items_ok and not lc.errors


def _pooled(t: Tally, p: float) -> float:
    pooled = Run("all", latencies=[x for k in t.per_kind.values() for x in k.latencies])
    return pooled.pct(p)


def main() -> int:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lifecycles", type=int, default=10000, help="timed WorkItem lifecycles (default 10000)")
    p.add_argument("--concurrency", type=int, default=64, help="lifecycles in flight (default 64)")
    p.add_argument(
        "--groups", type=int, default=50, help="Missions (Groups) the WorkItems spread over (default 50)"
    )
    p.add_argument(
        "--renewals", type=int, default=3, help="work.renew_lease commands per lifecycle (default 3)"
    )
    p.add_argument(
        "--usage-tokens",
        type=int,
        default=100,
        help="tokens of usage each renewal reports; 0 = none (default 100)",
    )
    p.add_argument(
        "--publish",
        choices=("unary", "stream"),
        default="unary",
        help="how the client sends each command: unary ExecuteCommand (default) or as a message on one of "
        "--streams ExecuteCommandStreams in turn, answers matched by request tag; the echo anchor does the same",
    )
    p.add_argument(
        "--streams",
        type=int,
        default=16,
        help="open ExecuteCommandStreams with --publish stream (default 16)",
    )
    p.add_argument("--echo-calls", type=int, default=20000, help="calls in the echo anchor (default 20000)")
    p.add_argument(
        "--max-seconds", type=float, default=150.0, help="no new lifecycle after this (default 150)"
    )
    p.add_argument("--quick", action="store_true", help="smoke run (~15 s): 2000 lifecycles, 5000 echo calls")
    p.add_argument("--database-url", default="", help="postgresql://... instead of the embedded SQLite store")
    p.add_argument(
        "--growth",
        type=int,
        default=0,
        help="run until every Group holds this many WorkItems (replaces --lifecycles; e.g. 10000 with --groups 4)",
    )
    p.add_argument(
        "--shards",
        type=int,
        default=0,
        help="0: the single-process server (default); N: mwp serve --topology split --shards N (N > 1 needs --database-url)",
    )
    p.add_argument("--data-dir", default="", help="server data dir (default: a temp dir, removed afterwards)")
    p.add_argument("--profile-server", action="store_true", help="cProfile the server during the timed loop")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (server stderr, profile)")
    args = p.parse_args()
    if args.quick:
        args.lifecycles = min(args.lifecycles, 2000)
        args.echo_calls = min(args.echo_calls, 5000)
        args.max_seconds = min(args.max_seconds, 20.0)
    if args.shards > 1 and not args.database_url:
        p.error("--shards > 1 needs --database-url (more than one Authority shard needs PostgreSQL, D60)")
    if args.shards and args.profile_server:
        p.error("--profile-server profiles the single-process server only")
    if (
        args.lifecycles < 1
        or args.concurrency < 1
        or args.groups < 1
        or args.streams < 1
        or args.renewals < 0
    ):
        p.error(
            "--lifecycles, --concurrency, --groups and --streams must be positive, --renewals not negative"
        )
    # Pre-signed commands carry their issued_at; the Authority refuses them after its 5-minute replay window.
    args.max_seconds = min(args.max_seconds, 240.0)

    work = Path(tempfile.mkdtemp(prefix="mwp-bench-wl-"))
    t0 = time.perf_counter()
    ok = False
    try:
        results = asyncio.run(drive(args, work))
        ok = report(args, results)
        if args.profile_server and results.get("profile"):
            import pstats

            print("\nserver profile (timed loop only), top 35 by cumulative time:")
            pstats.Stats(str(results["profile"])).sort_stats("cumulative").print_stats(35)
            pstats.Stats(str(results["profile"])).sort_stats("tottime").print_stats(25)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    log(f"done in {time.perf_counter() - t0:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
