"""The simulated network: every message between a client and a process passes through here.

Faults: a message may be dropped, duplicated or delayed (and so reordered against later ones), and
a node may be partitioned away for a while (everything to and from it is dropped). A message that
arrives at a crashed process is lost, as on a real connection to a dead process.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from simulation.clock import SimClock
from simulation.messages import Message
from simulation.stats import Stats


@dataclass(frozen=True)
class NetworkConfig:
    drop: float = 0.03
    duplicate: float = 0.03
    long_delay: float = 0.05  # beyond the usual 1..20 ms: overtaken by later messages
    min_ms: int = 1
    max_ms: int = 20
    long_max_ms: int = 1_500


@dataclass(order=True)
class Packet:
    deliver_at: int
    n: int  # the send order: ties on deliver_at break deterministically
    src: str = field(compare=False)
    dst: str = field(compare=False)
    message: Message = field(compare=False)


class Network:
    def __init__(self, rng: random.Random, clock: SimClock, stats: Stats, config: NetworkConfig) -> None:
        self.rng, self.clock, self.stats, self.config = rng, clock, stats, config
        self._queue: list[Packet] = []
        self._sent = 0
        self.isolated: dict[str, int] = {}  # node -> the time its partition heals

    def isolate(self, node: str, until_ms: int) -> None:
        self.isolated[node] = max(until_ms, self.isolated.get(node, 0))

    def cut_off(self, node: str) -> bool:
        healed = self.isolated.get(node)
        if healed is None:
            return False
        if healed <= self.clock.ms:
            del self.isolated[node]
            return False
        return True

    def send(self, src: str, dst: str, message: Message) -> None:
        if self.cut_off(src) or self.cut_off(dst):
            self.stats.fault("net.partitioned")
            return
        config, rng = self.config, self.rng
        if rng.random() < config.drop:
            self.stats.fault("net.drop")
            return
        copies = 1
        if rng.random() < config.duplicate:
            self.stats.fault("net.duplicate")
            copies = 2
        for _ in range(copies):
            delay = rng.randint(config.min_ms, config.max_ms)
            if rng.random() < config.long_delay:
                self.stats.fault("net.delay")
                delay += rng.randint(config.max_ms, config.long_max_ms)
            self._sent += 1
            heapq.heappush(self._queue, Packet(self.clock.ms + delay, self._sent, src, dst, message))

    def due(self) -> list[Packet]:
        """The packets whose time has come, in delivery order; those into a partition are lost."""
        out: list[Packet] = []
        while self._queue and self._queue[0].deliver_at <= self.clock.ms:
            packet = heapq.heappop(self._queue)
            if self.cut_off(packet.dst) or self.cut_off(packet.src):
                self.stats.fault("net.partitioned")
                continue
            out.append(packet)
        return out

    def in_flight(self) -> int:
        return len(self._queue)
