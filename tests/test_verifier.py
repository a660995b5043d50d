"""Command signature checks off the event loop (missionweave_server/verification/verifier.py, D52).

Every verdict must be exactly libsodium's: batched through a worker process, redone inline when a
worker dies, and answered at shutdown. The Authority's own use of it (a command with a wrong
signature is refused and writes nothing) is covered through gRPC in test_grpc_authority.py, whose
mesh runs with the default worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
from nacl.signing import SigningKey

from missionweave.kernel.signing import COMMAND_TYPE, sign_envelope
from missionweave_server.verification.pipe_frames import U32, frame
from missionweave_server.verification.verifier import SignatureVerifier
from missionweave_server.verification.verify_worker import ITEM, verify_batch

KEY = SigningKey(b"\x07" * 32)
PUBLIC = bytes(KEY.verify_key)
OTHER = bytes(SigningKey(b"\x09" * 32).verify_key)


def signed(i: int) -> tuple[bytes, bytes]:
    message = b"command-%d" % i
    return message, KEY.sign(message).signature


def tampered(signature: bytes) -> bytes:
    return bytes([signature[0] ^ 1]) + signature[1:]


@pytest.fixture
async def verifier() -> AsyncIterator[SignatureVerifier]:
    v = SignatureVerifier(1)
    await v.start()
    try:
        yield v
    finally:
        await v.close()


async def test_worker_verdicts_match_libsodium_for_good_bad_and_malformed_signatures(
    verifier: SignatureVerifier,
) -> None:
    """MW-8-02 rests on this: only a signature that verifies with the session key is accepted."""
    checks = []
    expected = []
    for i in range(40):
        message, sig = signed(i)
        if i % 4 == 0:
            checks.append((message, sig, PUBLIC))
            expected.append(True)
        elif i % 4 == 1:
            checks.append((message + b"!", sig, PUBLIC))  # payload changed after signing
            expected.append(False)
        elif i % 4 == 2:
            checks.append((message, tampered(sig), PUBLIC))
            expected.append(False)
        else:
            checks.append((message, sig, OTHER))  # someone else's key
            expected.append(False)
    verdicts = await asyncio.gather(*(verifier.verify(*c) for c in checks))
    assert verdicts == expected
    assert verifier.inline == 0 and 1 <= verifier.batches < len(checks)  # batched, all in the worker
    # Wrong lengths never reach the worker and never verify.
    message, sig = signed(99)
    assert not await verifier.verify(message, sig[:63], PUBLIC)
    assert not await verifier.verify(message, sig, PUBLIC[:31])


async def test_verify_envelope_checks_the_dsse_encoding_of_the_payload(verifier: SignatureVerifier) -> None:
    envelope = sign_envelope(b"payload bytes", COMMAND_TYPE, KEY, "alice#session-1")
    assert await verifier.verify_envelope(envelope, PUBLIC)
    envelope.payload = b"payload byteS"
    assert not await verifier.verify_envelope(envelope, PUBLIC)
    envelope.ClearField("signatures")
    assert not await verifier.verify_envelope(envelope, PUBLIC)


async def test_a_dead_worker_loses_no_verdict_and_checks_go_on_inline(verifier: SignatureVerifier) -> None:
    worker = verifier._workers[0]
    os.kill(worker.process.pid, signal.SIGKILL)
    await worker.process.wait()
    good, bad = signed(1), signed(2)
    verdicts = await asyncio.wait_for(
        asyncio.gather(
            verifier.verify(good[0], good[1], PUBLIC), verifier.verify(bad[0], tampered(bad[1]), PUBLIC)
        ),
        10,
    )
    assert verdicts == [True, False]
    assert verifier.workers == 0 and verifier.inline >= 2


async def test_close_answers_waiting_checks_and_stops_the_worker() -> None:
    verifier = SignatureVerifier(1)
    await verifier.start()
    process = verifier._workers[0].process
    message, sig = signed(3)
    waiting = asyncio.ensure_future(verifier.verify(message, sig, PUBLIC))
    await asyncio.sleep(0)  # queued, not yet sent (the gather timer has not fired)
    await verifier.close()
    assert await waiting is True
    assert process.returncode is not None
    assert await verifier.verify(message, sig, PUBLIC) is True  # after close: inline


async def test_without_workers_every_check_is_inline() -> None:
    verifier = SignatureVerifier(0)
    await verifier.start()
    message, sig = signed(4)
    assert await verifier.verify(message, sig, PUBLIC)
    assert not await verifier.verify(message, tampered(sig), PUBLIC)
    assert verifier.inline == 2 and verifier.batches == 0
    await verifier.close()


def test_worker_frame_format() -> None:
    """The pipe protocol of verify_worker.py: count, then key, signature, length, message each."""
    (m1, s1), (m2, s2) = signed(5), signed(6)
    body = U32.pack(2) + ITEM.pack(PUBLIC, s1, len(m1)) + m1 + ITEM.pack(PUBLIC, tampered(s2), len(m2)) + m2
    assert verify_batch(body) == frame(b"\x01\x00")
