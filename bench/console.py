"""Mission control's Mission page in Chromium: how soon a large Mission is usable, and whether the
page keeps up with a busy Group, each against the Python SDK doing the same reads in the same run.

    PYTHONPATH=. .venv/bin/python bench/console.py              # 1,000 WorkItems, 10,000 events, 5 runs, 20 s live (~3 min)
    PYTHONPATH=. .venv/bin/python bench/console.py --quick      # 200 WorkItems, 2,000 events, 2 runs, 5 s live
    PYTHONPATH=. .venv/bin/python bench/console.py --live-kind usage   # live: usage reports (the progress changes)
    PYTHONPATH=. .venv/bin/python bench/console.py --runs 1 --live-seconds 0 -v --trace /tmp/load.json   # profile

Needs Debian's Chromium (/usr/bin/chromium, or --chromium PATH), driven by the playwright package
(the bench extra; never `playwright install`), and the console built (`make console`; `MINIFY=0
node build.mjs` in console/ keeps the names readable in a profile).

Target (the console issue): the Mission page with 1,000 WorkItems and 10,000 events is usable in
<= 1 s on this machine (first paint and the full DAG), and live updates keep up with a Group at 100
events/s.

Seeding (not timed): a mesh in this process (its console on 127.0.0.1:0; no per-Group ingress limit,
which seeding would exceed), one Mission whose Group holds ``--workitems`` WorkItems authorized
layer by layer (``--layers`` layers; each WorkItem past the first depends on 1-3 of the layer before
it and, one in five, on one two layers back; every WorkItem of a layer has a dependant in the next),
the first layer carried to VERIFIED (offer, accept, start, two usage reports, a submission with its
uploaded deliverable, acceptance), 60% of the second active and 20% offered, then message posts in
the Mission's and the WorkItems' Conversations up to ``--events`` events, all through
``ExecuteCommandBatch``. The owner's key file is written for the page.

Load, ``--runs`` times (after one warm-up of each), side by side: Chromium (headless, signed in once
as the owner; each run a new tab, the session restored from IndexedDB as on a reload) navigates to
``#/mission/<group>``. An observer installed before the page's script stamps each milestone, in ms
from navigation start, when the frame showing it has been laid out (a ResizeObserver's first notice,
which comes after style and layout, before paint; a long task queued after that frame does not
delay it):
    header    the Mission's title in the page's h1
    dag       every WorkItem drawn (``--workitems`` g.node in svg.dag)
    timeline  the timeline's first row
    verified  the timeline's count line reports every event verified (signature and chain, in the page)
and, for the record, when the actions, the review and the Conversations are first drawn, and the
long tasks (>50 ms) before ``verified``. The anchor, in a process of its own after each page run:
the SDK (``MeshClient``, as an Observer member who sees the whole log) reads GetAuthorityKey,
GetMissionProgress and every event (ReadEvents, batches of 1,024) and checks each one as the page
does: ``AuthorityVerifier.event`` (the Authority's Ed25519 signature, then the parse) and the BLAKE3
chain link to the event before it. The page's medians are reported as ratios to the anchor's.

Live: a tab open on the Mission (scrolled to the top, as loaded) and fully verified; a driver process
sends commands making ``--live-rate`` events a second for ``--live-seconds`` (message posts, or with
``--live-kind usage`` work.renew_lease usage reports on the active WorkItems, which change the
progress; each its own ExecuteCommand, paced by the clock, not by the answers) and writes each
event's acknowledgement time; the page's observer stamps each event's row when the frame showing it
is laid out, and again when it shows verified; the anchor is an SDK process following the same Group
(ReadEvents follow=true, every event checked as above) that stamps each event when checked.
Reported: the lag acknowledgement -> row (p50/p99/max, wall clock), its median per fifth of the run
(a backlog grows from fifth to fifth), rows never shown (an event that came and went off the
timeline's first page of 200 during a stall), and the same for the SDK follower.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nacl.signing import SigningKey  # noqa: E402

from missionweave.kernel.eventlog import link_of  # noqa: E402
from missionweave.sdk.artifacts import NO_AGENT_CARD, Described, Origin, hash_chunks, signed_manifest  # noqa: E402
from missionweave.sdk.client import MeshClient, SessionSigner, membership_epoch  # noqa: E402
from missionweave.sdk.event_verification import AuthorityVerifier  # noqa: E402
from missionweave.v1 import authority_service_pb2 as pb  # noqa: E402
from missionweave.v1 import common_pb2, conversation_pb2, event_pb2, membership_pb2  # noqa: E402
from missionweave.v1 import work_pb2 as wp  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
LEASE_SECONDS = 3600
BATCH = 500  # commands per ExecuteCommandBatch (the call's limit is 512)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spread(values: list[float]) -> str:
    """min / median / max."""
    if not values:
        return "n/a"
    return f"{min(values):7.0f} / {statistics.median(values):7.0f} / {max(values):7.0f}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ====================================================================== seeding


@dataclass
class Seeded:
    group_id: str
    title: str
    head: int
    work_items: int
    edges: int
    owner_key_file: Path
    viewer_key_file: Path
    driver_key_file: Path
    driver_id: str
    driver_membership: int
    driver_session: int
    conversation_id: str
    active: list[str]
    states: dict[str, int] = field(default_factory=dict)


def _checked(results: list[Any], what: str) -> list[Any]:
    refused = [r for r in results if isinstance(r, Exception)]
    if refused:
        raise RuntimeError(f"{what}: {len(refused)} of {len(results)} refused, first {refused[0]!r}")
    return results


async def _batched(client: MeshClient, envelopes: list[common_pb2.SignedEnvelope], what: str) -> list[Any]:
    out: list[Any] = []
    for i in range(0, len(envelopes), BATCH):
        out += _checked(await client.execute_batch(envelopes[i : i + BATCH]), what)
    return out


def _key_file(path: Path, key: SigningKey) -> Path:
    path.write_text(key.encode().hex() + "\n")
    path.chmod(0o600)
    return path


def _contract(now: datetime, depends_on: list[str]) -> wp.WorkContract:
    from tests import builders

    c = builders.contract(now, depends_on=tuple(depends_on))
    c.time_policy.execution_lease_duration.FromSeconds(LEASE_SECONDS)
    c.time_policy.start_deadline.FromSeconds(LEASE_SECONDS)
    return c


def plan_dag(items: int, layers: int, rng: random.Random) -> list[list[tuple[str, list[str]]]]:
    """``layers`` layers of WorkItems (id, dependencies): fan-in from the layer before (1-3) and, one
    in five, one more from two layers back; every WorkItem of a layer has a dependant in the next
    one where it can (fan-out)."""
    per = [items // layers + (1 if i < items % layers else 0) for i in range(layers)]
    out: list[list[tuple[str, list[str]]]] = []
    n = 0
    for k, count in enumerate(per):
        layer: list[tuple[str, list[str]]] = []
        previous = [w for w, _ in out[k - 1]] if k else []
        unused = list(previous)
        rng.shuffle(unused)
        for _ in range(count):
            deps: set[str] = set()
            if previous:
                if unused:
                    deps.add(unused.pop())
                deps.update(rng.sample(previous, min(len(previous), rng.randint(0, 2))))
                if k >= 2 and rng.random() < 0.2:
                    deps.add(rng.choice(out[k - 2])[0])
            layer.append((f"wi-{k:02d}-{n:05d}", sorted(deps)))
            n += 1
        out.append(layer)
    return out


async def seed(target: str, admin_key: SigningKey, work: Path, args: argparse.Namespace) -> Seeded:
    from missionweave.kernel.clock import SystemClock
    from tests import builders

    rng = random.Random(7)
    now = SystemClock().now()
    client = MeshClient(target)
    try:
        keys = {name: SigningKey.generate() for name in ("alice", "coord", "worker", "viewer")}
        kinds = {"alice": common_pb2.IDENTITY_KIND_HUMAN, "viewer": common_pb2.IDENTITY_KIND_HUMAN}
        for name, key in keys.items():
            await client.register_identity(
                "admin",
                admin_key,
                name,
                kinds.get(name, common_pb2.IDENTITY_KIND_AGENT),
                bytes(key.verify_key),
            )
        alice = await client.open_session("alice", keys["alice"])
        coord = await client.open_session("coord", keys["coord"])
        worker = await client.open_session("worker", keys["worker"])
        gid = "grp_console_bench"
        title = "Reconcile the group ledgers (console bench)"
        budget = common_pb2.ResourceVector(
            currency="EUR", financial_micros=10**12, tokens=10**12, tool_calls=10**9
        )
        body = builders.mission_create("alice", "coord", now, budget=budget)
        body.definition.title = title
        body.coordinator_renewal.lease_duration.FromSeconds(LEASE_SECONDS)
        await client.execute(alice.sign(alice.command(gid, "mission_create", body)))
        for member, role in (
            ("worker", membership_pb2.MEMBER_ROLE_WORKER),
            ("viewer", membership_pb2.MEMBER_ROLE_OBSERVER),
        ):
            grant = membership_pb2.MembershipGrant(member_id=member, role=role, visibility_start_sequence=1)
            await client.execute(
                alice.sign(alice.command(gid, "membership_grant", grant, membership_epoch=1))
            )
        state = await client.group_state(gid)
        ce = state.mission.coordinator.coordinator_epoch
        cm, wm = membership_epoch(state, "coord"), membership_epoch(state, "worker")
        mission_id = state.mission.mission_id
        planning = state.mission.planning_conversation_id

        def as_coord(kind: str, body: Any) -> common_pb2.SignedEnvelope:
            return coord.sign(coord.command(gid, kind, body, membership_epoch=cm))

        def as_worker(kind: str, body: Any) -> common_pb2.SignedEnvelope:
            return worker.sign(worker.command(gid, kind, body, membership_epoch=wm))

        dag = plan_dag(args.workitems, args.layers, rng)
        for k, layer in enumerate(dag):
            await _batched(
                client,
                [
                    as_coord(
                        "work_authorize",
                        wp.WorkAuthorize(
                            work_item_id=wi,
                            title=f"Ledger {wi[6:]} (layer {k})",
                            contract=_contract(now, deps),
                            coordinator_epoch=ce,
                        ),
                    )
                    for wi, deps in layer
                ],
                f"authorizing layer {k}",
            )
        log(f"  authorized {args.workitems} WorkItems in {len(dag)} layers")

        # Progress: the first layer to VERIFIED, part of the second under way, some of it offered only.
        done = [wi for wi, _ in dag[0]]
        second = [wi for wi, _ in dag[1]] if len(dag) > 1 else []
        active = second[: len(second) * 6 // 10]
        offered = second[len(active) : len(active) + len(second) // 5]

        def offer(wi: str) -> common_pb2.SignedEnvelope:
            o = wp.WorkOffer(
                work_item_id=wi,
                offer_id=f"offer-{wi}",
                candidate_ids=["worker"],
                selection_criteria=[builders.selection("worker")],
                coordinator_epoch=ce,
            )
            o.expires_at.FromDatetime(now + timedelta(hours=1))
            return as_coord("work_offer", o)

        async def carry(wis: list[str], stage: str) -> None:
            """``wis`` offered to the worker, and with "active" or "verified" accepted, started and two
            usage reports made; with "verified" submitted (the deliverable uploaded) and accepted."""
            await _batched(client, [offer(wi) for wi in wis], "offers")
            if stage == "offered":
                return
            await _batched(
                client,
                [
                    as_worker(
                        "work_accept_offer",
                        wp.WorkAcceptOffer(work_item_id=wi, offer_id=f"offer-{wi}", contract_revision=1),
                    )
                    for wi in wis
                ],
                "acceptances",
            )
            await _batched(
                client,
                [
                    as_worker(
                        "work_start", wp.WorkStart(work_item_id=wi, ownership_epoch=1, lease_id=f"lease-{wi}")
                    )
                    for wi in wis
                ],
                "starts",
            )
            for _ in range(2):
                renewals = []
                for wi in wis:
                    renew = wp.WorkRenewLease(work_item_id=wi, lease_id=f"lease-{wi}", ownership_epoch=1)
                    renew.usage_delta.tokens = rng.randint(100, 2000)
                    renewals.append(as_worker("work_renew_lease", renew))
                await _batched(client, renewals, "usage reports")
            if stage == "active":
                return
            blobs = [f"ledger {wi}: all balances match\n".encode() for wi in wis]
            manifests = [
                signed_manifest(
                    Described(
                        hash_chunks([data]),
                        "text/plain",
                        "worker",
                        Origin(gid, mission_id, wi, f"lease-{wi}", 1, NO_AGENT_CARD),
                    ),
                    worker,
                )
                for wi, data in zip(wis, blobs, strict=True)
            ]
            _checked(await client.upload_many(blobs, manifests), "deliverables")
            submitted = await _batched(
                client,
                [
                    as_worker(
                        "work_submit",
                        wp.WorkSubmit(
                            work_item_id=wi,
                            lease_id=f"lease-{wi}",
                            ownership_epoch=1,
                            contract_revision=1,
                            artifacts=[
                                common_pb2.ArtifactRef(
                                    digest=hash_chunks([data]).digest, media_type="text/plain"
                                )
                            ],
                            evidence=[builders.evidence()],
                            summary=f"{wi}: all balances match",
                        ),
                    )
                    for wi, data in zip(wis, blobs, strict=True)
                ],
                "submissions",
            )
            events = [event_pb2.Event.FromString(r.events[0].payload) for r in submitted]
            await _batched(
                client,
                [
                    as_coord(
                        "work_accept_result",
                        wp.WorkAcceptResult(
                            work_item_id=wi, coordinator_epoch=ce, submission_event_id=e.event_id
                        ),
                    )
                    for wi, e in zip(wis, events, strict=True)
                ],
                "acceptances of results",
            )

        await carry(done, "verified")
        await carry(active, "active")
        await carry(offered, "offered")
        state = await client.group_state(gid)
        log(
            f"  WorkItems under way: {len(done)} verified, {len(active)} active, {len(offered)} offered; head #{state.head_sequence}"
        )

        # Messages up to --events: in the planning Conversation and the WorkItems' own.
        conversations = [c.conversation_id for c in state.conversations]
        missing = max(0, args.events - state.head_sequence)
        posts = []
        for i in range(missing):
            signer, epoch = (worker, wm) if i % 3 else (coord, cm)
            conversation = planning if i % 2 else rng.choice(conversations)
            text = f"progress note {i}: {rng.randint(1, 500)} of 500 rows reconciled"
            posts.append(
                signer.sign(
                    signer.command(
                        gid,
                        "message_post",
                        conversation_pb2.MessagePost(
                            conversation_id=conversation, content=conversation_pb2.MessageContent(text=text)
                        ),
                        membership_epoch=epoch,
                    )
                )
            )
        await _batched(client, posts, "message posts")
        state = await client.group_state(gid)
        progress = await client.authority.GetMissionProgress(pb.GetMissionProgressRequest(group_id=gid))
        states: dict[str, int] = {}
        for w in progress.work_items:
            name = wp.WorkItemState.Name(w.state).removeprefix("WORK_ITEM_STATE_").lower()
            states[name] = states.get(name, 0) + 1
        return Seeded(
            group_id=gid,
            title=title,
            head=state.head_sequence,
            work_items=len(progress.work_items),
            edges=sum(len(w.depends_on) for w in progress.work_items),
            owner_key_file=_key_file(work / "alice.key", keys["alice"]),
            viewer_key_file=_key_file(work / "viewer.key", keys["viewer"]),
            driver_key_file=_key_file(work / "worker.key", keys["worker"]),
            driver_id="worker",
            driver_membership=wm,
            driver_session=worker.session_epoch,
            conversation_id=planning,
            active=active,
            states=states,
        )
    finally:
        await client.channel.close()


# ====================================================================== the SDK side (child processes)


class ChainedVerifier:
    """What the page does to each event, with the SDK's verifier: the Authority's signature (then the
    parse), and the link to the event before it when that one was checked."""

    def __init__(self, verifier: AuthorityVerifier) -> None:
        self.verifier = verifier
        self.links: dict[int, bytes] = {}
        self.failed = 0

    def check(self, envelope: common_pb2.SignedEnvelope) -> event_pb2.Event:
        event = self.verifier.event(envelope)
        self.links[event.sequence] = link_of(envelope.payload, event)
        previous = self.links.get(event.sequence - 1)
        if previous is not None and event.previous_digest and previous != event.previous_digest:
            self.failed += 1
        return event


async def _reader(target: str, identity: str, key_file: str) -> SessionSigner:
    from missionweave.kernel.signing import read_key

    client = MeshClient(target)
    try:
        return await client.open_session(identity, read_key(key_file))
    finally:
        await client.channel.close()


async def child_anchor(a: argparse.Namespace) -> None:
    """One anchor run per line read on stdin: a JSON line of its milestones (ms) on stdout."""
    reader = await _reader(a.target, a.identity, a.key_file)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "run":
        t0 = time.perf_counter()
        client = MeshClient(a.target, reader=reader)
        out: dict[str, float] = {}
        try:
            key = await client.authority.GetAuthorityKey(pb.GetAuthorityKeyRequest())
            verifier = ChainedVerifier(
                AuthorityVerifier(key.key_id, key.public_key, {k.key_id: k.public_key for k in key.keys})
            )
            progress = await client.authority.GetMissionProgress(
                pb.GetMissionProgressRequest(group_id=a.group)
            )
            out["progress"] = (time.perf_counter() - t0) * 1000
            out["work_items"] = len(progress.work_items)
            count = 0
            call = client.authority.ReadEvents(pb.ReadEventsRequest(group_id=a.group, batch_size=1024))
            async for batch in call:
                for envelope in batch.events:
                    verifier.check(envelope)
                count += len(batch.events)
                if "first_batch" not in out:
                    out["first_batch"] = (time.perf_counter() - t0) * 1000
            out["verified"] = (time.perf_counter() - t0) * 1000
            out["events"] = count
            out["failed"] = verifier.failed
        finally:
            await client.channel.close()
        print(json.dumps(out), flush=True)


async def child_follower(a: argparse.Namespace) -> None:
    """Follows the Group after ``--after``: one line "<sequence> <wall-clock s>" per event checked."""
    reader = await _reader(a.target, a.identity, a.key_file)
    client = MeshClient(a.target, reader=reader)
    key = await client.authority.GetAuthorityKey(pb.GetAuthorityKeyRequest())
    verifier = ChainedVerifier(
        AuthorityVerifier(key.key_id, key.public_key, {k.key_id: k.public_key for k in key.keys})
    )
    print("ready", flush=True)
    call = client.authority.ReadEvents(
        pb.ReadEventsRequest(group_id=a.group, after_sequence=a.after, follow=True, batch_size=1024)
    )
    async for batch in call:
        lines = []
        for envelope in batch.events:
            event = verifier.check(envelope)
            lines.append(f"{event.sequence} {time.time():.6f}")
        print("\n".join(lines), flush=True)


async def child_driver(a: argparse.Namespace) -> None:
    """Sends commands making ``--rate`` events a second for ``--seconds`` once "go" is read on stdin, each by its own
    ExecuteCommand at its time on the clock: message posts (``--kind message``), or usage reports
    on the active WorkItems in turn (``--kind usage``: work.renew_lease with tokens used, which
    changes the Mission's progress). One line "<sequence> <wall-clock s at the answer>" per event."""
    from missionweave.kernel.signing import read_key

    # The worker's session of the seeding (its session key is its identity key): a new one would end
    # it, and with it the leases the usage reports renew.
    signer = SessionSigner(a.identity, a.session_epoch, read_key(a.key_file))
    client = MeshClient(a.target, reader=signer)
    count = int(a.rate * a.seconds)
    active = a.work_items.split(",") if a.work_items else []

    def body(i: int) -> tuple[str, Any]:
        if a.kind == "usage":
            wi = active[i % len(active)]
            renew = wp.WorkRenewLease(work_item_id=wi, lease_id=f"lease-{wi}", ownership_epoch=1)
            renew.usage_delta.tokens = 10 + i % 90
            return "work_renew_lease", renew
        text = f"live {i}: {i} rows reconciled"
        return "message_post", conversation_pb2.MessagePost(
            conversation_id=a.conversation, content=conversation_pb2.MessageContent(text=text)
        )

    # One command first (its events are not counted): how many events each makes, so that the
    # commands are paced to --rate events a second.
    first = await client.execute(
        signer.sign(signer.command(a.group, *body(count), membership_epoch=a.membership))
    )
    per = max(1, len(first.events))
    count = max(1, count // per)
    posts = [
        signer.sign(signer.command(a.group, *body(i), membership_epoch=a.membership)) for i in range(count)
    ]
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    refused = 0

    async def post(envelope: common_pb2.SignedEnvelope) -> None:
        nonlocal refused
        try:
            result = await client.execute(envelope)
        except Exception as exc:
            refused += 1
            print(f"refused {exc!r}"[:600].replace("\n", " "), file=sys.stderr, flush=True)
            return
        at = time.time()
        lines = (f"{event_pb2.Event.FromString(e.payload).sequence} {at:.6f}" for e in result.events)
        print("\n".join(lines), flush=True)

    t0 = time.perf_counter()
    tasks = []
    for i, envelope in enumerate(posts):
        delay = t0 + i * per / a.rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(post(envelope)))
    await asyncio.gather(*tasks)
    print(f"done {time.perf_counter() - t0:.3f} {refused}", flush=True)
    await client.channel.close()


async def spawn(role: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--role",
        role,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        limit=1 << 24,
    )


async def line_of(proc: asyncio.subprocess.Process, wait_s: float = 120) -> str:
    assert proc.stdout is not None
    got = await asyncio.wait_for(proc.stdout.readline(), wait_s)
    if not got:
        raise RuntimeError(f"a child process ended early (exit {await proc.wait()})")
    return got.decode().strip()


# ====================================================================== the page


# Installed before the page's own script: stamps each milestone at the frame that shows it.
OBSERVER = """
(() => {
  const expected = %(expected)s;
  const t = {};
  const asked = new Set();
  window.__mw = t;
  window.__longtasks = [];
  try {
    new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__longtasks.push([e.startTime, e.duration]); })
      .observe({ type: 'longtask', buffered: true });
  } catch (e) {}
  // When the frame that shows `el` has been laid out: a ResizeObserver's first notice comes in the
  // rendering step after style and layout (before paint), and a long task queued after that frame
  // does not delay it, as it would a task posted from requestAnimationFrame.
  const stamp = (name, el) => {
    if (asked.has(name)) return;
    asked.add(name);
    const seen = new ResizeObserver(() => { t[name] = performance.now(); seen.disconnect(); });
    seen.observe(el);
  };
  const check = () => {
    if (!asked.has('header')) {
      const h1 = document.querySelector('.mission-head h1');
      if (h1 && h1.textContent === expected.title) stamp('header', h1);
    }
    if (!asked.has('dag')) {
      const svg = document.querySelector('svg.dag');
      if (svg && svg.querySelectorAll('g.node').length >= expected.nodes) stamp('dag', svg.querySelector('g.nodes'));
    }
    if (!asked.has('timeline')) {
      const row = document.querySelector('ol.timeline li.event');
      if (row) stamp('timeline', row);
    }
    if (!asked.has('verified')) {
      const count = document.querySelector('#timeline-title ~ p[role=status]');
      const m = count && /(\\d+) verified/.exec(count.textContent || '');
      if (m && Number(m[1]) >= expected.events) stamp('verified', count);
    }
    // The panels drawn after the graph, for the record (not part of the target).
    for (const [name, selector] of [['actions', 'nav.actions'], ['review', '#review-title'], ['conversations', '#conv-title']]) {
      if (!asked.has(name) && document.querySelector(selector)) stamp(name, document.body);
    }
    if (asked.size === 7) observer.disconnect();
  };
  const observer = new MutationObserver(check);
  observer.observe(document, { subtree: true, childList: true, characterData: true });
})();
"""

# Installed on a loaded page for the live phase: each event row's first appearance and first
# verified mark, stamped at the frame that shows it, in wall-clock ms.
LIVE_OBSERVER = """
() => {
  const list = document.querySelector('ol.timeline');
  const seen = {}, verified = {};
  window.__live = { seen, verified };
  const fresh = { seen: new Set(), verified: new Set() };
  let asked = false;
  // Stamped when the frame showing them has been laid out (a ResizeObserver's first notice, as above).
  const flush = () => {
    const at = performance.timeOrigin + performance.now();
    for (const seq of fresh.seen) seen[seq] = at;
    for (const seq of fresh.verified) verified[seq] = at;
    fresh.seen.clear();
    fresh.verified.clear();
    asked = false;
  };
  new MutationObserver(() => {
    for (const li of list.children) {
      const seq = li.getAttribute('data-sequence');
      if (!seq) continue;
      if (!(seq in seen)) fresh.seen.add(seq);
      if (!(seq in verified) && li.querySelector('.mark-verified')) fresh.verified.add(seq);
    }
    if (!asked && (fresh.seen.size || fresh.verified.size)) {
      asked = true;
      const frame = new ResizeObserver(() => { frame.disconnect(); flush(); });
      frame.observe(list.firstElementChild || list);
    }
  }).observe(list, { childList: true, subtree: true, characterData: true });
  return list.children.length;
}
"""

MILESTONES = ("header", "dag", "timeline", "verified")
PANELS = ("actions", "review", "conversations")
WAIT_MAIN = "() => window.__mw && ['header', 'dag', 'timeline', 'verified'].every((m) => m in window.__mw)"


async def page_run(context: Any, url: str, timeout_s: float, trace: str = "") -> dict[str, Any]:
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    page = await context.new_page()
    try:
        if trace:
            await context.browser.start_tracing(page=page, path=trace, screenshots=False)
        await page.goto(url)
        await page.wait_for_function(WAIT_MAIN, timeout=timeout_s * 1000, polling=100)
        try:
            await page.wait_for_function(
                "() => Object.keys(window.__mw).length === 7", timeout=10_000, polling=100
            )
        except PlaywrightTimeout:
            pass
        marks: dict[str, Any] = await page.evaluate("() => window.__mw")
        marks["long_tasks_ms"] = await page.evaluate(
            "() => window.__longtasks.filter(([at]) => at < window.__mw.verified).reduce((s, [, d]) => s + d, 0)"
        )
        measures = await page.evaluate(
            "() => performance.getEntriesByType('measure').map(m => [m.name, m.startTime, m.duration])"
        )
        marks["measures"] = measures
        if trace:
            await context.browser.stop_tracing()
        return marks
    finally:
        await page.close()


async def sign_in(context: Any, base: str, seeded: Seeded) -> None:
    page = await context.new_page()
    await page.goto(base)
    await page.fill("#identity", "alice")
    await page.set_input_files("#keyfile", str(seeded.owner_key_file))
    await page.click("button[type=submit]")
    await page.wait_for_selector("text=Signed in as alice", timeout=30_000)
    await page.close()


# ====================================================================== the live phase


async def live_phase(
    context: Any, url: str, target: str, seeded: Seeded, args: argparse.Namespace
) -> dict[str, Any]:
    page = await context.new_page()
    await page.goto(url)
    await page.wait_for_function(WAIT_MAIN, timeout=120_000, polling=100)
    await page.evaluate(LIVE_OBSERVER)
    head = seeded.head
    follower = await spawn(
        "follower",
        "--target",
        target,
        "--identity",
        "viewer",
        "--key-file",
        str(seeded.viewer_key_file),
        "--group",
        seeded.group_id,
        "--after",
        str(head),
    )
    driver = await spawn(
        "driver",
        "--target",
        target,
        "--identity",
        seeded.driver_id,
        "--key-file",
        str(seeded.driver_key_file),
        "--group",
        seeded.group_id,
        "--conversation",
        seeded.conversation_id,
        "--membership",
        str(seeded.driver_membership),
        "--rate",
        str(args.live_rate),
        "--seconds",
        str(args.live_seconds),
        "--kind",
        args.live_kind,
        "--session-epoch",
        str(seeded.driver_session),
        "--work-items",
        ",".join(seeded.active),
    )
    try:
        assert await line_of(follower) == "ready" and await line_of(driver) == "ready"
        followed: dict[int, float] = {}

        async def follow() -> None:
            while True:
                line = await line_of(follower, wait_s=3600)
                seq, at = line.split()
                followed[int(seq)] = float(at)

        following = asyncio.create_task(follow())
        assert driver.stdin is not None
        driver.stdin.write(b"go\n")
        await driver.stdin.drain()
        acked: dict[int, float] = {}
        summary = ""
        while True:
            line = await line_of(driver, wait_s=args.live_seconds + 120)
            if line.startswith("done"):
                summary = line
                break
            seq, at = line.split()
            acked[int(seq)] = float(at)
        # Everything acknowledged should reach both within a few seconds; wait at most 30 s.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live = await page.evaluate("() => window.__live")
            if all(str(s) in live["seen"] for s in acked) and all(s in followed for s in acked):
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.0)  # the verified marks of the last rows
        live = await page.evaluate("() => window.__live")
        following.cancel()
    finally:
        for proc in (driver, follower):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        await page.close()
    _, wall_s, refused = summary.split()
    seen = {int(k): v / 1000 for k, v in live["seen"].items()}
    checked = {int(k): v / 1000 for k, v in live["verified"].items()}
    order = sorted(acked)
    return {
        "acked": len(acked),
        "refused": int(refused),
        "driver_seconds": float(wall_s),
        "page_row": [(seen[s] - acked[s]) * 1000 if s in seen else None for s in order],
        "page_verified": [(checked[s] - acked[s]) * 1000 if s in checked else None for s in order],
        "sdk": [(followed[s] - acked[s]) * 1000 if s in followed else None for s in order],
    }


def lag_lines(name: str, lags: list[float | None], fifths: int = 5) -> list[str]:
    got = [x for x in lags if x is not None]
    missing = len(lags) - len(got)
    if not got:
        return [f"  {name:26s} nothing arrived ({missing} missing)"]
    per = max(1, len(lags) // fifths)
    trend = []
    for i in range(fifths):
        part = [x for x in lags[i * per : (i + 1) * per if i < fifths - 1 else None] if x is not None]
        trend.append(f"{statistics.median(part):.0f}" if part else "-")
    return [
        f"  {name:26s} p50 {pct(got, 0.5):7.0f}  p99 {pct(got, 0.99):7.0f}  max {max(got):7.0f} ms"
        f"  missing {missing}  median by fifth: {' / '.join(trend)} ms"
    ]


def kept_up(lags: list[float | None], slack_ms: float) -> bool:
    """Every event arrived, and the last fifth's median lag is within ``slack_ms`` of the first's."""
    if not lags or any(x is None for x in lags):
        return False
    per = max(1, len(lags) // 5)
    first = statistics.median([x for x in lags[:per] if x is not None])
    last = statistics.median([x for x in lags[-per:] if x is not None])
    return last <= first + slack_ms


# ====================================================================== the driver


async def main(args: argparse.Namespace) -> int:
    from playwright.async_api import async_playwright

    from missionweave.kernel.signing import read_key
    from missionweave_server.config import Settings
    from missionweave_server.mesh.server import start

    work = Path(tempfile.mkdtemp(prefix="mwp-console-bench-"))
    settings = Settings()
    settings.listen, settings.data_dir, settings.grace_seconds = "127.0.0.1:0", work / "data", 0.5
    settings.console_listen = "127.0.0.1:0"
    settings.database_url = args.database_url
    # Seeding sends a few thousand commands to one Group in seconds: above its ingress limit
    # (MW-8-16, 200 commands/s), which is not what is measured here. The live phase's 100/s is below it.
    settings.group_rate = 0
    load0 = os.getloadavg()
    mesh = await start(settings)
    try:
        assert mesh.console is not None
        target = f"127.0.0.1:{mesh.port}"
        log(
            f"mesh on {target}, console at {mesh.console.url} ({'PostgreSQL' if args.database_url else 'SQLite'})"
        )
        t0 = time.perf_counter()
        seeded = await seed(target, read_key(settings.admin_key_path), work, args)
        log(
            f"seeded in {time.perf_counter() - t0:.1f} s: {seeded.work_items} WorkItems, {seeded.edges} dependencies, "
            f"{seeded.head} events; states {seeded.states}"
        )
        url = f"{mesh.console.url}#/mission/{seeded.group_id}"
        expected = json.dumps({"title": seeded.title, "nodes": seeded.work_items, "events": seeded.head})
        page_runs: list[dict[str, Any]] = []
        anchor_runs: list[dict[str, float]] = []
        anchor = await spawn(
            "anchor",
            "--target",
            target,
            "--identity",
            "viewer",
            "--key-file",
            str(seeded.viewer_key_file),
            "--group",
            seeded.group_id,
        )
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=args.chromium, headless=True)
            context = await browser.new_context(viewport={"width": 1400, "height": 900})
            await sign_in(context, mesh.console.url, seeded)
            await context.add_init_script(OBSERVER % {"expected": expected})
            log("warm-up: one page load and one anchor run, not counted")
            await page_run(context, url, args.timeout)
            assert anchor.stdin is not None
            anchor.stdin.write(b"run\n")
            await anchor.stdin.drain()
            json.loads(await line_of(anchor))
            for run in range(args.runs):
                marks = await page_run(context, url, args.timeout, args.trace if run == 0 else "")
                page_runs.append(marks)
                anchor.stdin.write(b"run\n")
                await anchor.stdin.drain()
                sdk = json.loads(await line_of(anchor))
                anchor_runs.append(sdk)
                if sdk["events"] != seeded.head or sdk["failed"] or sdk["work_items"] != seeded.work_items:
                    raise RuntimeError(
                        f"the anchor read {sdk} (expected {seeded.head} events, {seeded.work_items} WorkItems)"
                    )
                log(
                    f"  run {run + 1}: page "
                    + ", ".join(f"{m} {marks[m]:.0f}" for m in MILESTONES)
                    + f" ms (long tasks {marks['long_tasks_ms']:.0f} ms; "
                    + ", ".join(f"{m} {marks[m]:.0f}" for m in PANELS if m in marks)
                    + f"); SDK progress {sdk['progress']:.0f}, verified {sdk['verified']:.0f} ms"
                )
                if args.verbose:
                    for name, at, took in marks["measures"]:
                        log(f"      {name}: {took:.1f} ms, {at:.0f} -> {at + took:.0f}")
            anchor.stdin.write(b"stop\n")
            await anchor.stdin.drain()
            await anchor.wait()
            live: dict[str, Any] | None = None
            if args.live_seconds > 0:
                what = "message posts" if args.live_kind == "message" else "usage reports"
                log(
                    f"live: {args.live_rate:g} {what}/s for {args.live_seconds:g} s with the page and an SDK follower open"
                )
                live = await live_phase(context, url, target, seeded, args)
            await browser.close()
    finally:
        await mesh.stop(grace=0.5)
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()

    # ------------------------------------------------------------ report
    print(
        f"\nMission page, {seeded.work_items:,} WorkItems ({seeded.edges:,} dependencies), {seeded.head:,} events; "
        f"{args.runs} runs, each a new tab; Chromium {args.chromium}; load average {load0[0]:.2f} before, {load1[0]:.2f} after"
    )
    print(f"{'ms from navigation start':36s} {'min / median / max':>27s}   {'median / anchor total':>22s}")
    sdk_total = statistics.median(r["verified"] for r in anchor_runs)
    for m in MILESTONES:
        values = [r[m] for r in page_runs]
        print(f"  page: {m:28s} {spread(values):>27s}   {statistics.median(values) / sdk_total:21.2f}x")
    print(f"  page: {'long tasks until verified':28s} {spread([r['long_tasks_ms'] for r in page_runs]):>27s}")
    for m in PANELS:
        print(f"  page, later panels: {m:14s} {spread([r[m] for r in page_runs if m in r]):>27s}")
    print(f"  anchor (SDK): {'GetMissionProgress':20s} {spread([r['progress'] for r in anchor_runs]):>27s}")
    print(
        f"  anchor (SDK): {'first batch checked':20s} {spread([r['first_batch'] for r in anchor_runs]):>27s}"
    )
    print(
        f"  anchor (SDK): {'every event checked':20s} {spread([r['verified'] for r in anchor_runs]):>27s}   {1.0:21.2f}x"
    )
    usable = max(
        statistics.median([r["header"] for r in page_runs]), statistics.median([r["dag"] for r in page_runs])
    )
    print(
        f"target: first paint and full DAG <= 1,000 ms: median {usable:.0f} ms -> {'met' if usable <= 1000 else 'NOT met'}"
    )
    if live is not None:
        print(
            f"\nlive ({args.live_kind}): {live['acked']:,} events acknowledged ({live['refused']} commands refused) in {live['driver_seconds']:.1f} s "
            f"({live['acked'] / live['driver_seconds']:.1f}/s); lag from each acknowledgement (wall clock):"
        )
        for line in (
            lag_lines("page: row shown", live["page_row"])
            + lag_lines("page: row shown verified", live["page_verified"])
            + lag_lines("anchor: SDK follower checked", live["sdk"])
        ):
            print(line)
        page_ok = kept_up(live["page_row"], 250.0)
        sdk_ok = kept_up(live["sdk"], 250.0)
        print(
            f"target: live updates keep up at {args.live_rate:g} events/s (every row shown, last fifth's median lag within 250 ms of the first's): "
            f"page {'met' if page_ok else 'NOT met'}, SDK follower {'yes' if sdk_ok else 'no'}"
        )
    return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workitems", type=int, default=1000)
    p.add_argument("--layers", type=int, default=10)
    p.add_argument(
        "--events", type=int, default=10_000, help="events in the Group in all (message posts fill up to it)"
    )
    p.add_argument("--runs", type=int, default=5, help="page loads (and anchor runs) measured")
    p.add_argument("--live-rate", type=float, default=100.0, help="message posts a second in the live phase")
    p.add_argument("--live-seconds", type=float, default=20.0, help="length of the live phase (0: none)")
    p.add_argument(
        "--live-kind",
        choices=("message", "usage"),
        default="message",
        help="what the live driver sends: message posts, or usage reports on the active WorkItems (which refresh the progress)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a page load may take")
    p.add_argument("--database-url", default="")
    p.add_argument("--chromium", default=CHROMIUM)
    p.add_argument("--quick", action="store_true", help="200 WorkItems, 2,000 events, 2 runs, 5 s live")
    p.add_argument(
        "--trace", default="", help="write a Chromium trace of the first measured page load to this file"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="the page's performance.measure entries too")
    # The child processes' own arguments.
    p.add_argument("--role", choices=("anchor", "follower", "driver"), help=argparse.SUPPRESS)
    for name in ("--target", "--identity", "--key-file", "--group", "--conversation"):
        p.add_argument(name, help=argparse.SUPPRESS)
    p.add_argument("--after", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--membership", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--kind", default="message", help=argparse.SUPPRESS)
    p.add_argument("--session-epoch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--work-items", default="", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.workitems, args.events, args.runs, args.live_seconds = 200, 2000, 2, 5.0
    return args


def preflight(args: argparse.Namespace) -> None:
    if not Path(args.chromium).exists():
        raise SystemExit(
            f"no Chromium at {args.chromium} (Debian: apt-get install chromium; or --chromium PATH)"
        )
    if not (ROOT / "missionweave_server" / "console" / "static" / "app.js").exists():
        raise SystemExit("the console is not built: run `make console` first")


if __name__ == "__main__":
    arguments = parse()
    roles = {"anchor": child_anchor, "follower": child_follower, "driver": child_driver}
    if arguments.role:
        asyncio.run(roles[arguments.role](arguments))
        sys.exit(0)
    preflight(arguments)
    sys.exit(asyncio.run(main(arguments)))
