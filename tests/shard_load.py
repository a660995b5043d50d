"""Load for the shard tests: every Group gets one message after another, each sent until acknowledged,
and the check that every Group's log holds exactly what was acknowledged."""

from __future__ import annotations

import asyncio

from missionweave.sdk.client import MeshClient, SessionSigner
from tests import builders
from tests.test_shards import post_until_acknowledged


class Load:
    """Each Group gets one message after another, each sent until acknowledged (same command id)."""

    def __init__(self, client: MeshClient, owner: SessionSigner, conversations: dict[str, str]) -> None:
        self.client, self.owner, self.conversations = client, owner, conversations
        self.acknowledged: dict[str, list[tuple[str, int]]] = {g: [] for g in conversations}
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._one(g)) for g in conversations]

    async def _one(self, group: str) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            text = f"{group} message {n}"
            body = builders.message(self.conversations[group], text)
            envelope = self.owner.sign(self.owner.command(group, "message_post", body, membership_epoch=1))
            sequence = await post_until_acknowledged(self.client, self.owner, envelope)
            self.acknowledged[group].append((text, sequence))
            await asyncio.sleep(0.05)

    def count(self) -> int:
        return sum(len(v) for v in self.acknowledged.values())

    async def reached(self, n: int) -> bool:
        return self.count() >= n

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def assert_logs_match(client: MeshClient, load: Load) -> None:
    """No gap and no repeat in any Group's log (one writer at a time, whatever moved), and every
    acknowledged command in it once, at the sequence its acknowledgement gave."""
    for group, sent in load.acknowledged.items():
        events = [e async for e in client.read_events(group)]
        assert [e.sequence for e in events] == list(range(1, len(events) + 1)), group
        posted = [e.sequence for e in events if e.type == "message.posted"]
        assert posted == [sequence for _, sequence in sent], group
