"""One seeded run of the simulation: the world, the fault schedule, the step loop and the verdict.

Everything comes from one ``random.Random(seed)`` and the simulated clock, and every collection
whose order matters is iterated sorted: the same seed gives the same trace, byte for byte.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from missionweave.v1 import command_pb2, common_pb2
from missionweave.v1 import membership_pb2 as mp
from missionweave_server.services.authority import decider
from missionweave_server.services.authority.rules.children import AUTHORITY_ACTOR
from missionweave_server.services.authority.state import GroupState
from simulation import invariants
from simulation.actors import Client, Coordinator, Delegate, Env, OfflineWorker, Owner, Reader, Worker
from simulation.clock import SimClock
from simulation.history import History
from simulation.invariants import World
from simulation.messages import Message
from simulation.network import Network, NetworkConfig
from simulation.processes import ArtifactStore, Authority, Bugs, Gateway, Process, Registry
from simulation.stats import Stats
from simulation.store import Store

try:  # written alongside (issue 40 part 4)
    from simulation import checker as _checker
except ImportError:  # pragma: no cover - only before simulation/checker.py exists
    _checker = None  # type: ignore[assignment]

GROUPS = 2
AUTHORITIES = 2
OWNERSHIP_TTL_MS = 1_500
DEFAULT_STEPS = 600
QUIET_STEPS = 300  # after the faults stop: everything heals, restarts and settles
TRACE_TAIL = 40
HUMAN, AGENT = common_pb2.IDENTITY_KIND_HUMAN, common_pb2.IDENTITY_KIND_AGENT


@dataclass(frozen=True)
class FaultRates:
    """Per-step probabilities of each injected fault (the network's own are in NetworkConfig)."""

    crash_authority: float = 0.004
    pause_authority: float = 0.003  # longer than the ownership lease: another instance takes over
    crash_gateway: float = 0.003
    crash_membership: float = 0.002
    partition: float = 0.01
    worker_offline: float = 0.01
    new_session: float = 0.01
    power_loss: float = 0.001


@dataclass
class Result:
    seed: int
    steps: int
    trace_hash: str
    stats: Stats
    violation: str = ""  # "<invariant>: <detail>", empty when the seed passed
    failed_step: int = -1
    trace_tail: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)  # the whole trace (its sha256 is trace_hash)

    @property
    def ok(self) -> bool:
        return not self.violation

    def report(self) -> str:
        lines = [f"seed {self.seed} FAILED at step {self.failed_step}: {self.violation}", "last trace lines:"]
        lines += [f"  {line}" for line in self.trace_tail]
        lines.append(f"replay: python -m simulation --seed {self.seed} --steps {self.steps}")
        return "\n".join(lines)


class Violation(Exception):
    pass


class Simulation:
    def __init__(
        self,
        seed: int,
        steps: int = DEFAULT_STEPS,
        bugs: Bugs | None = None,
        faults: FaultRates | None = None,
        network: NetworkConfig | None = None,
    ) -> None:
        self.seed, self.steps = seed, steps
        self.bugs = bugs or Bugs()
        self.rates = faults or FaultRates()
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.stats = Stats()
        self.history = History()
        self._trace: list[str] = []
        self._hash = hashlib.sha256()
        self.step = 0
        self.faulty = True
        self.network = Network(self.rng, self.clock, self.stats, network or NetworkConfig())
        self.store = Store(OWNERSHIP_TTL_MS)
        self._build()

    # ------------------------------------------------------------ the world

    def _build(self) -> None:
        identities: dict[str, int] = {}
        self.group_ids = [f"grp_{g}" for g in range(GROUPS)]
        cast: dict[str, dict[str, str]] = {}
        for g, group_id in enumerate(self.group_ids):
            names = {
                "owner": f"own{g}",
                "coordinator": f"co{g}",
                "standby": f"co{g}s",
                "party": f"w{g}a",
                "worker": f"w{g}b",
                "offline": f"w{g}off",
                "jit": f"w{g}jit",
                "delegate": f"dl{g}",
            }
            cast[group_id] = names
            for role, name in names.items():
                identities[name] = HUMAN if role == "owner" else AGENT
        self.registry = Registry("membership", identities)
        self.artifacts = ArtifactStore("artifacts")
        authority_names = [f"auth{i}" for i in range(AUTHORITIES)]
        self.authorities = [
            Authority(
                n,
                self.clock,
                self.store,
                self.registry,
                self.artifacts,
                self.stats,
                self.bugs,
                self._accepted,
            )
            for n in authority_names
        ]
        self.gateway = Gateway("gateway", self.store, self.bugs)
        self.processes: dict[str, Process] = {
            p.name: p for p in [self.registry, self.artifacts, self.gateway, *self.authorities]
        }
        self.inbox: dict[str, list[tuple[str, Message]]] = {name: [] for name in self.processes}
        self.env = Env(
            self.rng,
            self.clock,
            self.network.send,
            self.history,
            self.store,
            authority_names,
            self.stats,
            self.trace,
            self.network.cut_off,
        )
        self.clients: dict[str, Client | Reader] = {}
        readers: list[Reader] = []
        restricted: dict[str, frozenset[str]] = {}
        self.offline: list[str] = []
        for group_id in self.group_ids:
            n = cast[group_id]
            workers = [n["party"], n["worker"], n["offline"], n["jit"]]
            work_items = [f"wi-{i}" for i in range(1, 6)]
            members = {
                n["party"]: mp.MEMBER_ROLE_WORKER,
                n["worker"]: mp.MEMBER_ROLE_WORKER,
                n["offline"]: mp.MEMBER_ROLE_WORKER,
                n["jit"]: mp.MEMBER_ROLE_WORKER,
                n["delegate"]: mp.MEMBER_ROLE_WORK_DELEGATE,
            }
            actors: list[Client] = [
                Owner(
                    n["owner"],
                    group_id,
                    self.env,
                    (n["coordinator"], n["standby"]),
                    members,
                    n["party"],
                    n["jit"],
                ),
                Coordinator(n["coordinator"], group_id, self.env, work_items, workers, n["delegate"]),
                Coordinator(n["standby"], group_id, self.env, work_items, workers, n["delegate"]),
                Worker(n["party"], group_id, self.env),
                Worker(n["worker"], group_id, self.env),
                Worker(n["jit"], group_id, self.env),
                OfflineWorker(n["offline"], group_id, self.env),
                Delegate(n["delegate"], group_id, self.env, workers),
            ]
            for actor in actors:
                self.clients[actor.name] = actor
            for member in (n["party"], n["worker"], n["jit"], n["delegate"], n["coordinator"]):
                reader = Reader(member, group_id, self.env, self.bugs.trust_batches)
                self.clients[reader.name] = reader
                readers.append(reader)
            # Either Coordinator, whichever holds the lease when it reads (a superset: see the doc).
            restricted[f"cv-restricted-{group_id}"] = frozenset(
                {n["party"], n["owner"], n["coordinator"], n["standby"]}
            )
            self.offline.append(n["offline"])
        self.world = World(self.store, self.artifacts, readers, self.env.acknowledged, restricted)

    def trace(self, text: str) -> None:
        line = f"{self.step} t={self.clock.ms} {text}"
        self._trace.append(line)
        self._hash.update(line.encode() + b"\n")

    def _accepted(self, instance: str, state: GroupState | None, command: command_pb2.Command) -> None:
        stale = invariants.stale_epochs(state, command, self.registry.sessions.get(command.actor_id, 0))
        if stale:
            self.world.found.append(
                f"{instance} accepted {command.command_id} with stale epochs: {'; '.join(stale)}"
            )

    # ------------------------------------------------------------ faults

    def _inject(self) -> None:
        rng, rates, now = self.rng, self.rates, self.clock.ms
        for authority in self.authorities:
            if authority.up and rng.random() < rates.crash_authority:
                self._crash(authority, rng.randint(300, 2_000))
            elif authority.running(now) and rng.random() < rates.pause_authority:
                authority.paused_until_ms = now + rng.randint(
                    OWNERSHIP_TTL_MS + 100, 2 * OWNERSHIP_TTL_MS + 500
                )
                self.stats.fault("pause.authority")
                self.trace(f"FAULT pause {authority.name} until {authority.paused_until_ms}")
        if self.gateway.up and rng.random() < rates.crash_gateway:
            self._crash(self.gateway, rng.randint(200, 1_500))
        if self.registry.up and rng.random() < rates.crash_membership:
            self._crash(self.registry, rng.randint(200, 1_500))
        if rng.random() < rates.partition:
            node = rng.choice(sorted(self.processes) + sorted(self.clients))
            self.network.isolate(node, now + rng.randint(200, 2_000))
            self.stats.fault("partition")
            self.trace(f"FAULT partition {node}")
        if rng.random() < rates.worker_offline:
            node = rng.choice(self.offline)
            self.network.isolate(node, now + rng.randint(1_000, 5_000))
            self.stats.fault("worker.offline")
            self.trace(f"FAULT offline {node}")
        if rng.random() < rates.new_session:
            # A replacement runtime of a Worker opened a session: the running one is fenced and
            # learns it only when its next command (or retry) is refused SESSION_EPOCH_STALE.
            name = rng.choice(sorted(n for n, c in self.clients.items() if isinstance(c, Worker)))
            self.registry.sessions[name] += 1
            self.stats.fault("session.replaced")
            self.trace(f"FAULT new session {name} {self.registry.sessions[name]}")
        if rng.random() < rates.power_loss:
            lost = self.store.power_loss()
            self.world.epoch_owners.clear()  # epochs in the lost tail were never told to anyone
            self.stats.fault("power_loss")
            self.trace(f"FAULT power loss: {lost} unsynced events lost")
            for process in sorted(self.processes.values(), key=lambda p: p.name):
                if process.up:
                    self._crash(process, rng.randint(200, 1_000), counted=False)

    def _crash(self, process: Process, down_ms: int, counted: bool = True) -> None:
        if isinstance(process, Authority):
            process.crash()
        process.up = False
        process.restart_at_ms = self.clock.ms + down_ms
        self.inbox[process.name].clear()
        if counted:
            self.stats.fault(f"crash.{process.name.rstrip('0123456789')}")
        self.trace(f"FAULT crash {process.name} until {process.restart_at_ms}")

    def _restart(self) -> None:
        for name in sorted(self.processes):
            process = self.processes[name]
            if not process.up and (process.restart_at_ms <= self.clock.ms or not self.faulty):
                process.up = True
                self.trace(f"restart {name}")
            if not self.faulty:
                process.paused_until_ms = 0

    # ------------------------------------------------------------ the loop

    def _deliver(self) -> None:
        for packet in self.network.due():
            process = self.processes.get(packet.dst)
            if process is None:
                self.clients[packet.dst].receive(packet.message)
            elif process.up:
                self.inbox[packet.dst].append((packet.src, packet.message))
        now = self.clock.ms
        for name in sorted(self.processes):
            process = self.processes[name]
            if process.running(now):
                inbox, self.inbox[name] = self.inbox[name], []
                for _, message in inbox:
                    process.handle(message, self.network.send)

    def _background(self) -> None:
        now, rng = self.clock.ms, self.rng
        for authority in self.authorities:
            if authority.running(now) and (rng.random() < 0.6 or not self.faulty):
                authority.fence_sessions()
                authority.group_commit(self.network.send)
        if rng.random() < 0.5 or not self.faulty:
            self.store.sync()
        for authority in self.authorities:
            if authority.running(now):
                authority.answer_synced(self.network.send)

    def _check(self) -> None:
        for invariant in invariants.INVARIANTS:
            self.stats.invariant_checks += 1
            found = invariant(self.world)
            if found:
                raise Violation(f"{invariant.__name__}: {found[0]}")

    def run(self) -> Result:
        try:
            for step in range(self.steps + QUIET_STEPS):
                self.step = step
                if self.step == self.steps:
                    self.faulty = False
                    self.network.config = NetworkConfig(drop=0, duplicate=0, long_delay=0)
                    self.network.isolated.clear()
                    self.trace("faults stop")
                self.clock.advance(self.rng.randint(5, 25))
                if self.faulty:
                    self._inject()
                self._restart()
                self._deliver()
                self._background()
                for name in sorted(self.clients):
                    self.clients[name].tick()
                self._check()
                self.stats.steps += 1
            self._final_check()
        except Violation as violation:
            return self._result(str(violation))
        return self._result("")

    def _final_check(self) -> None:
        """After the quiet tail: each owner's cache and a replay of each log equal the store's fold
        (decide never changed a state it was given; evolve is deterministic), then the history."""
        for authority in self.authorities:
            for group_id in sorted(authority.owned):
                owned, row = authority.owned[group_id], self.store.rows[group_id]
                self.stats.invariant_checks += 1
                if not owned.pending and owned.state is not None and owned.state.head_sequence == row.head:
                    if owned.state != row.state:
                        raise Violation(
                            f"cache_equals_store: {authority.name}'s state of {group_id} differs from the log's"
                        )
        for group_id in self.group_ids:
            stored = self.store.row(group_id)
            events = stored.events if stored is not None else []
            self.stats.invariant_checks += 1
            if stored is not None and decider.fold(events) != stored.state:
                raise Violation(
                    f"replay_equals_live: a replay of {group_id}'s log differs from its live fold"
                )
            self.history.final_logs[group_id] = [
                (e.sequence, "" if e.actor_id == AUTHORITY_ACTOR else e.causing_command_id) for e in events
            ]
        if _checker is None:
            return
        anomalies = _checker.check(self.history)
        self.stats.invariant_checks += 1
        if anomalies:
            first = anomalies[0]
            raise Violation(
                f"history checker: {len(anomalies)} anomalies, first {first.kind}: {first.detail}"
            )

    def _result(self, violation: str) -> Result:
        self.trace(f"end {violation or 'ok'}")
        return Result(
            self.seed,
            self.steps,
            self._hash.hexdigest(),
            self.stats,
            violation,
            self.step if violation else -1,
            self._trace[-TRACE_TAIL:],
            self._trace,
        )


def run_seed(
    seed: int, steps: int = DEFAULT_STEPS, bugs: Bugs | None = None, faults: FaultRates | None = None
) -> Result:
    return Simulation(seed, steps, bugs, faults).run()
