"""A Download's wire bytes built around its data, and verification times written behind the reads
(D142): the bytes are protobuf's own, and a time noted is shown at once, written once, never moved
back, and kept through a failed write and a stop."""

from __future__ import annotations

import asyncio
import os

import pytest

from missionweave.sdk.client import blob_digest
from missionweave.v1 import artifact_service_pb2 as apb
from missionweave_server.services.artifacts.download_frame import download_frame
from missionweave_server.services.artifacts.verified_marks import VerifiedMarks
from tests.conftest import World

MiB = 1024 * 1024


@pytest.mark.parametrize("offset", [0, 1, 127, 128, 16_383, 16_384, 3 * MiB, 2**40 + 5])
@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_384, MiB])
def test_a_download_frame_is_byte_for_byte_what_protobuf_serializes(offset: int, size: int) -> None:
    data = os.urandom(size)
    frame = download_frame(offset, data)
    assert frame == apb.DownloadResponse(offset=offset, data=data).SerializeToString()
    parsed = apb.DownloadResponse.FromString(frame)
    assert (parsed.offset, parsed.data) == (offset, data)


async def test_noted_times_show_at_once_and_are_written_once_with_the_latest() -> None:
    written: list[dict[str, int]] = []

    async def write(marks: dict[str, int]) -> None:
        written.append(dict(marks))

    marks = VerifiedMarks(write, delay_s=0.05)
    marks.note("a", 10)
    marks.note("a", 30)
    marks.note("a", 20)  # an older time never replaces a newer one
    marks.note("b", 5)
    assert marks.overlay("a", 0) == 30 and marks.overlay("b", 7) == 7 and marks.overlay("c", 3) == 3
    assert written == []  # behind the reads, not in them
    await asyncio.sleep(0.2)
    assert written == [{"a": 30, "b": 5}]  # one write for everything noted within the delay
    await marks.close()
    assert written == [{"a": 30, "b": 5}]  # nothing pending: nothing written again


async def test_a_failed_write_keeps_the_times_for_the_next_and_a_stop_writes_them() -> None:
    written: list[dict[str, int]] = []
    failing = True

    async def write(marks: dict[str, int]) -> None:
        if failing:
            raise OSError("database unavailable")
        written.append(dict(marks))

    marks = VerifiedMarks(write, delay_s=0.05)
    marks.note("a", 10)
    await asyncio.sleep(0.15)  # a write failed (and is tried again after the delay)
    assert written == [] and marks.overlay("a", 0) == 10  # still shown while it waits
    marks.note("a", 11)
    failing = False
    await marks.close()
    assert written[-1] == {"a": 11}


async def test_a_download_records_its_verification_time_in_the_index(world: World) -> None:
    """The index holds the time of the last whole read once the marks are written, and a write
    never moves a stored time back."""
    w = world
    data = os.urandom(4096)
    digest = blob_digest(data)
    await w.client.upload(data)
    index = w.mesh.artifacts.index  # type: ignore[attr-defined]
    stored_at = (await index.blob(digest.hex)).verified_us
    w.clock.advance(seconds=60)
    assert await w.client.download(digest) == data
    shown = (await w.client.artifacts.Stat(apb.StatRequest(digest=digest))).last_verified_at
    assert shown.ToMicroseconds() - stored_at >= 60_000_000  # shown before it is written
    await index.marks.flush()
    fresh = type(index)(index.engine)  # another reader of the same database, with no marks of its own
    assert (await fresh.blob(digest.hex)).verified_us == shown.ToMicroseconds()
    await index._write_marks({digest.hex: stored_at})  # an older time arriving late
    assert (await fresh.blob(digest.hex)).verified_us == shown.ToMicroseconds()
