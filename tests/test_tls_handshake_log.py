"""`mwp serve` logs every refused TLS handshake with its reason and the peer's address, one line per
reason per interval (missionweave_server/observability/handshakes.py): real clients against a real
server process with mTLS, its stderr read as the operator reads it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from missionweave_server.observability import handshakes
from tests.conftest import polled
from tests.test_cli_serve import ROOT, free_port
from tests.test_tls import Pki, foreign, pki

__all__ = ["foreign", "pki"]  # the certificate fixtures, from test_tls.py


def tls_records(log: Path) -> list[dict[str, object]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("logger") == "missionweave.tls":
                out.append(record)
    return out


@pytest.fixture
def mtls_serve(tmp_path: Path, pki: Pki) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    yield from serve_with_mtls(tmp_path, pki, {})


@pytest.fixture
def mtls_serve_text(tmp_path: Path, pki: Pki) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    yield from serve_with_mtls(tmp_path, pki, {"MWP_LOG_FORMAT": "text"})


def serve_with_mtls(
    tmp_path: Path, pki: Pki, extra: dict[str, str]
) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    cert, key = pki.issue("server", hosts=("127.0.0.1", "localhost"), service="gateway")
    port, log = free_port(), tmp_path / "serve.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MWP_", "GRPC_"))},
        "PYTHONPATH": str(ROOT),
        "MWP_DATA_DIR": str(tmp_path / "data"),
        "MWP_METRICS_LISTEN": "",
        "MWP_CONSOLE_LISTEN": "",
        "MWP_VERIFY_WORKERS": "0",
        "MWP_TLS_CERT": str(cert),
        "MWP_TLS_KEY": str(key),
        "MWP_TLS_CLIENT_CA": str(pki.ca_file),
        **extra,
    }
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "missionweave.cli", "serve", "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        yield f"127.0.0.1:{port}", log, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(60)


async def health(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, as another client's
    channel = (
        grpc.aio.insecure_channel(target, own)
        if credentials is None
        else grpc.aio.secure_channel(target, credentials, own)
    )
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        return err.code()
    finally:
        await channel.close()


async def logged(log: Path, reason: str) -> dict[str, object]:
    async with asyncio.timeout(20):
        while True:
            found = [r for r in tls_records(log) if r.get("reason") == reason]
            if found:
                return found[0]
            await asyncio.sleep(0.2)


async def test_each_refused_handshake_is_logged_with_its_reason_and_a_burst_in_few_lines(
    mtls_serve: tuple[str, Path, subprocess.Popen[bytes]], pki: Pki, foreign: Pki
) -> None:
    target, log, proc = mtls_serve
    cert, key = pki.issue("alice")
    trusted = grpc.ssl_channel_credentials(pki.ca_file.read_bytes(), key.read_bytes(), cert.read_bytes())

    async def serving() -> bool:  # to a client with the mesh's CA and a certificate
        return await health(target, trusted) == grpc.StatusCode.OK

    await polled(serving, limit_s=60, every_s=0.3)
    assert tls_records(log) == []  # a handshake that succeeds is no news

    assert await health(target, None) == grpc.StatusCode.UNAVAILABLE  # plain text to a TLS port
    plain = await logged(log, "not_tls")
    no_cert = grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
    assert await health(target, no_cert) == grpc.StatusCode.UNAVAILABLE
    missing = await logged(log, "no_client_certificate")
    other_ca = grpc.ssl_channel_credentials(foreign.ca_file.read_bytes())
    assert await health(target, other_ca) == grpc.StatusCode.UNAVAILABLE
    distrusted = await logged(log, "closed_by_client")  # the client saw a CA it does not trust
    for record in (plain, missing, distrusted):
        assert str(record["peer"]).startswith("127.0.0.1:") and record["level"] == "warning", record

    # A burst of 50 plain-text clients: a bounded number of lines, every refusal counted.
    await asyncio.gather(*(health(target, None) for _ in range(50)))
    await asyncio.sleep(1)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 60) == 0
    not_tls = [r for r in tls_records(log) if r.get("reason") == "not_tls"]
    assert len(not_tls) <= 2, not_tls  # the first, and the count suppressed since, at exit
    counted = len(not_tls) + sum(int(r.get("suppressed", 0)) for r in not_tls)  # type: ignore[call-overload]
    assert counted >= 51, not_tls
    assert not any(r.get("logger") == "grpc.core" for r in map(json.loads, _json_lines(log)))


async def test_with_text_logs_a_refused_handshake_is_one_text_line_with_its_reason(
    mtls_serve_text: tuple[str, Path, subprocess.Popen[bytes]], pki: Pki
) -> None:
    target, log, proc = mtls_serve_text
    cert, key = pki.issue("alice")
    trusted = grpc.ssl_channel_credentials(pki.ca_file.read_bytes(), key.read_bytes(), cert.read_bytes())

    async def serving() -> bool:
        return await health(target, trusted) == grpc.StatusCode.OK

    await polled(serving, limit_s=60, every_s=0.3)
    assert await health(target, None) == grpc.StatusCode.UNAVAILABLE  # plain text to a TLS port

    async def logged_as_text() -> bool:
        return any(" WARNING missionweave.tls: " in line and "reason=not_tls" in line for line in lines())

    def lines() -> list[str]:
        return log.read_text().splitlines()

    await polled(logged_as_text, limit_s=20, every_s=0.2)
    (line,) = [line for line in lines() if "reason=not_tls" in line]
    assert "peer=127.0.0.1:" in line, line
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 60) == 0
    # Neither JSON nor the core's raw trace among the lines: the operator's text log only.
    assert not [line for line in lines() if line.startswith("{") or handshakes_trace_line(line)], lines()


def handshakes_trace_line(line: str) -> bool:
    return line[:1] in "IWEF" and line[1:5].isdigit() and "]" in line


def _json_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("{")]


def test_a_failure_spread_over_trace_lines_is_one_record_then_rate_limited() -> None:
    """The trace's shape as grpcio writes it: the error, its source-location lines, then the
    arguments naming the peer; a second failure within the interval is only counted, and a failed
    call of this process's own (no server credentials in its arguments) is not logged."""
    out: list[dict[str, object]] = []
    now = [0.0]
    failures = handshakes.Failures(out.append, interval_s=60, clock=lambda: now[0])
    server_side = (
        "grpc.internal.endpoint_peer_address=ipv4:10.1.2.3:4444, grpc.internal.server_credentials=0x5"
    )
    for _ in range(3):
        failures.trace_line(
            "CallNextHandshakerLocked: error=UNKNOWN: Ssl handshake failed: "
            "SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:PEER_DID_NOT_RETURN_A_CERTIFICATE: OK"
        )
        failures.more("=== Source Location Trace: === ")
        failures.more(f" shutdown=false index=2, args={{endpoint=0x1, {server_side}}}")
        now[0] += 1
    failures.trace_line("CallNextHandshakerLocked: error=UNKNOWN: Failed to connect to remote host")
    failures.more(" shutdown=false index=1, args={grpc.internal.endpoint_peer_address=ipv4:10.9.9.9:50051}")
    now[0] += 60
    failures.trace_line("CallNextHandshakerLocked: error=UNAVAILABLE: Handshake read failed (Socket closed)")
    failures.more(f" args={{{server_side}}}")
    failures.close()
    assert [(r["reason"], r.get("peer"), r.get("suppressed")) for r in out] == [
        ("no_client_certificate", "10.1.2.3:4444", None),
        ("closed_by_client", "10.1.2.3:4444", None),
        ("no_client_certificate", None, 2),  # the count suppressed, at the end
    ]
