"""Bad input at every RPC (issue 13 item 7): garbage bytes, truncated and wrong-type messages, deep
JSON, oversized requests and envelopes with too many signatures, sent as raw bytes over a real gRPC
channel into every RPC of every public and internal service. The RPCs are enumerated from the
generated descriptors, so a new RPC is covered without touching this file.

Each answer must be structured: a request that does not parse is INVALID_ARGUMENT with a MALFORMED
Rejection; anything else is OK or a status carrying a Rejection (or gRPC's own RESOURCE_EXHAUSTED
for a message over the transport limit), never UNKNOWN or INTERNAL. Nothing is written, nothing is
logged at error level with a traceback, and every stream that receives a malformed message ends
with an error.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from sqlalchemy import func, select

import missionweave.internal.v1
import missionweave.v1
import missionweave_server.services.artifacts.schema
import missionweave_server.services.authority.schema
import missionweave_server.services.gateway.schema
import missionweave_server.services.membership.schema
from missionweave.kernel.rejections import rejection_from_rpc_error
from missionweave.kernel.signing import MAX_SIGNATURES
from missionweave.kernel.transport import open_channel
from missionweave.sdk.client import register_identity_envelope
from missionweave.sdk.credentials import CallProofs
from missionweave.v1 import (
    common_pb2,
    membership_pb2,
    membership_service_pb2,
    membership_service_pb2_grpc,
    mission_pb2,
)
from missionweave.v1 import gateway_service_pb2 as gpb
from missionweave_server.edge.callers import MeshServiceChannel
from missionweave_server.services.authority import ingress
from tests import builders
from tests.conftest import World
from tests.test_gateway import hello
from tests.test_gateway_remote import no_local_log_reads, split  # noqa: F401 (fixtures)
from tests.test_missions import G, create

R = common_pb2.RejectionReason
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
STREAM_END_S = 10.0  # a stream given a malformed message must end within this
SIGNATURES = 20_000


def all_services() -> list[ServiceDescriptor]:
    """Every service of the public (missionweave.v1) and internal (missionweave.internal.v1) contracts."""
    found: dict[str, ServiceDescriptor] = {}
    for package in (missionweave.v1, missionweave.internal.v1):
        for info in pkgutil.iter_modules(package.__path__):
            if info.name.endswith("_pb2"):
                module = importlib.import_module(f"{package.__name__}.{info.name}")
                for service in module.DESCRIPTOR.services_by_name.values():
                    found[service.full_name] = service
    return [found[name] for name in sorted(found)]


METHODS = [method for service in all_services() for method in service.methods]


def message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)  # type: ignore[no-any-return]


def populated(descriptor: Descriptor, depth: int = 0) -> Message:
    """An instance with every scalar field set and nested messages filled a few levels down."""
    message = message_class(descriptor)()
    for field in descriptor.fields:
        if field.containing_oneof is not None and message.WhichOneof(field.containing_oneof.name):
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry or depth >= 3:
                continue
            value = populated(field.message_type, depth + 1)
            if _repeated(field):
                getattr(message, field.name).add().CopyFrom(value)
            else:
                getattr(message, field.name).CopyFrom(value)
            continue
        value = _scalar(field)
        if _repeated(field):
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    return message


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _scalar(field: FieldDescriptor) -> Any:
    if field.type == FieldDescriptor.TYPE_STRING:
        return "grp_fuzz"
    if field.type == FieldDescriptor.TYPE_BYTES:
        return b"\x01" * 16
    if field.type == FieldDescriptor.TYPE_BOOL:
        return True
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return 1.5
    return 7


def envelope_paths(descriptor: Descriptor, depth: int = 0) -> Iterator[tuple[FieldDescriptor, ...]]:
    """The paths to every SignedEnvelope field, a few levels down."""
    for field in descriptor.fields:
        if field.message_type is None or field.message_type.GetOptions().map_entry or depth >= 3:
            continue
        if field.message_type.full_name == "missionweave.v1.SignedEnvelope":
            yield (field,)
        else:
            for rest in envelope_paths(field.message_type, depth + 1):
                yield (field, *rest)


def with_envelope(descriptor: Descriptor, path: tuple[FieldDescriptor, ...], envelope: Message) -> Message:
    message = message_class(descriptor)()
    target = message
    for field in path:
        target = getattr(target, field.name).add() if _repeated(field) else getattr(target, field.name)
    target.CopyFrom(envelope)
    return message


def parses(method: MethodDescriptor, raw: bytes) -> bool:
    try:
        message_class(method.input_type).FromString(raw)
    except DecodeError:
        return False
    return True


def garbage(method: MethodDescriptor) -> list[tuple[str, bytes]]:
    """Inputs for one RPC: (name, bytes)."""
    rng = random.Random(f"{method.full_name}")
    valid = populated(method.input_type).SerializeToString()
    others = [m for m in METHODS if m.input_type is not method.input_type]
    other = rng.choice(others)
    cases = [
        ("varint overflow", b"\xff" * 11),
        ("field number 0", b"\x00\x01"),
        ("truncated", valid[: max(1, len(valid) - 3)]),
        ("truncated length", b"\x0a\x7f" + b"x" * 10),
        ("invalid utf-8", _first_string_field_with(method.input_type, b"\xff\xfe\xfd")),
        ("wrong type", populated(other.input_type).SerializeToString()),
        ("deeply nested", _nested(method.input_type, 300)),
    ]
    for i in range(8):
        cases.append((f"random {i}", rng.randbytes(rng.randint(1, 512))))
    return [(name, raw) for name, raw in cases if raw]


def _first_string_field_with(descriptor: Descriptor, value: bytes) -> bytes:
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            return _tag(field.number, 2) + _varint(len(value)) + value
    return b""


def _nested(descriptor: Descriptor, depth: int) -> bytes:
    """A message field nested ``depth`` times into itself (or into field 1)."""
    field = next((f for f in descriptor.fields if f.message_type is not None), None)
    number = field.number if field is not None else 1
    inner = b""
    for _ in range(depth):
        inner = _tag(number, 2) + _varint(len(inner)) + inner
    return inner


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# ------------------------------------------------------------ calling with raw bytes


@dataclass
class Answer:
    code: grpc.StatusCode
    details: str
    rejection: common_pb2.Rejection | None
    responses: list[bytes]


def proven_channel(w: World, options: list[tuple[str, int]] | None = None) -> Any:
    """A channel whose calls prove a caller (the owner's call proofs and the mesh token), so that
    garbage reaches every RPC's parsing instead of stopping at authentication (which refuses an
    unproven caller before reading a stream: tests/test_read_authorization.py)."""
    token = w.settings.mesh_token_path.read_bytes().strip()
    channel = open_channel(
        w.target, options=options or (), interceptors=CallProofs(w.target, w.owner).interceptors
    )
    return MeshServiceChannel(channel, token)


async def call(
    channel: grpc.aio.Channel, method: MethodDescriptor, requests: list[bytes], *, follow_s: float = 0.5
) -> Answer:
    """One call with raw request bytes; a server stream is read until it ends (or ``follow_s`` for
    streams that follow forever, answered DEADLINE_EXCEEDED)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    responses: list[bytes] = []
    try:
        if method.client_streaming:

            async def stream() -> Any:
                for raw in requests:
                    yield raw

            if method.server_streaming:
                streaming = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
                async for answer in streaming(stream(), timeout=STREAM_END_S):
                    responses.append(answer)
            else:
                upload = channel.stream_unary(path, request_serializer=None, response_deserializer=None)
                responses.append(await upload(stream(), timeout=STREAM_END_S))
        elif method.server_streaming:
            streaming = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
            async for answer in streaming(requests[0], timeout=follow_s):
                responses.append(answer)
        else:
            unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            responses.append(await unary(requests[0], timeout=STREAM_END_S))
    except grpc.aio.AioRpcError as err:
        return Answer(err.code(), err.details() or "", rejection_from_rpc_error(err), responses)
    return Answer(grpc.StatusCode.OK, "", None, responses)


def structured(method: MethodDescriptor, answer: Answer, unimplemented: bool) -> str | None:
    """Why ``answer`` is not a structured answer, or None."""
    if answer.code == grpc.StatusCode.OK:
        return None
    if answer.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        return f"{answer.code.name}: {answer.details}"
    if answer.code == grpc.StatusCode.UNIMPLEMENTED and unimplemented:
        return None  # the RPC is not implemented yet (documented: SchedulingService)
    if (
        answer.code == grpc.StatusCode.DEADLINE_EXCEEDED
        and method.server_streaming
        and not method.client_streaming
    ):
        return None  # a follow stream that was still following
    if answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in answer.details:
        return None  # gRPC's own transport limit (4 MiB), documented in docs/errors.md
    if answer.rejection is None:
        return f"{answer.code.name} without a Rejection: {answer.details}"
    return None


def malformed(answer: Answer) -> bool:
    return (
        answer.code == grpc.StatusCode.INVALID_ARGUMENT
        and answer.rejection is not None
        and answer.rejection.reason == R.REJECTION_REASON_MALFORMED
    )


# ------------------------------------------------------------ what must not change


async def row_counts(w: World) -> dict[str, int]:
    engine = w.mesh.engine  # type: ignore[attr-defined]
    counts = {}
    async with engine.connect() as conn:
        schemas = (
            missionweave_server.services.authority.schema,
            missionweave_server.services.membership.schema,
            missionweave_server.services.artifacts.schema,
            missionweave_server.services.gateway.schema,
        )
        for schema in schemas:
            for table in schema.METADATA.sorted_tables:
                counts[table.name] = (
                    await conn.execute(select(func.count()).select_from(table))
                ).scalar_one()
    return counts


class Tracebacks(logging.Handler):
    """Every record at error level or above, and the malformed-request warnings."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[logging.LogRecord] = []
        self.malformed: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors.append(record)
        if record.getMessage() == "malformed request refused":
            self.malformed.append(record)


@pytest.fixture
def tracebacks() -> Iterator[Tracebacks]:
    from missionweave_server.edge.status import malformed_log

    malformed_log.reset()  # the rate limit is per process: an earlier test's records must not hide these
    handler = Tracebacks()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


async def unimplemented_methods(channel: grpc.aio.Channel) -> set[str]:
    """Unary RPCs that answer a well-formed empty request UNIMPLEMENTED (not implemented yet)."""
    out = set()
    for method in METHODS:
        if not method.client_streaming and not method.server_streaming:
            answer = await call(channel, method, [b""])
            if answer.code == grpc.StatusCode.UNIMPLEMENTED:
                out.add(method.full_name)
    return out


def assert_no_tracebacks(tracebacks: Tracebacks) -> None:
    bad = [r for r in tracebacks.errors if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad[:5]]


# ------------------------------------------------------------ the tests


def test_every_service_is_enumerated() -> None:
    names = {s.full_name for s in all_services()}
    assert {"missionweave.v1.AuthorityService", "missionweave.v1.GatewayService"} <= names
    assert {
        "missionweave.internal.v1.GroupLogService",
        "missionweave.internal.v1.IdentityDirectoryService",
    } <= names
    assert len(METHODS) >= 30


async def test_garbage_into_every_rpc_is_refused_structured(world: World, tracebacks: Tracebacks) -> None:
    w = world
    await create(w)
    before = await row_counts(w)
    head = (await w.client.group_state(G)).head_sequence
    channel = proven_channel(w)
    try:
        unimplemented = await unimplemented_methods(channel)
        failures = []
        for method in METHODS:
            for name, raw in garbage(method):
                answer = await call(channel, method, [raw])
                problem = structured(method, answer, method.full_name in unimplemented)
                if problem is None and not parses(method, raw) and not malformed(answer):
                    problem = f"does not parse, answered {answer.code.name} {answer.rejection}"
                if (
                    problem is None
                    and method.client_streaming
                    and not parses(method, raw)
                    and answer.code == grpc.StatusCode.OK
                ):
                    problem = "stream did not end with an error"
                if problem:
                    failures.append(f"{method.full_name} <- {name}: {problem}")
        assert not failures, "\n".join(failures)
    finally:
        await channel.close()
    assert await row_counts(w) == before
    assert (await w.client.group_state(G)).head_sequence == head
    assert_no_tracebacks(tracebacks)
    # Logged at warning level, rate limited: at most one record per RPC here (10 s interval).
    assert tracebacks.malformed
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in tracebacks.malformed)
    per_rpc: dict[str, int] = {}
    for r in tracebacks.malformed:
        per_rpc[r.rpc] = per_rpc.get(r.rpc, 0) + 1  # type: ignore[attr-defined]
    assert max(per_rpc.values()) <= 2, per_rpc


async def test_oversized_and_many_signatures_are_refused(world: World, tracebacks: Tracebacks) -> None:
    """Every RPC: a request over the transport limit, and an envelope carrying 20,000 signatures
    (about 1.6 MB) wherever the request has a SignedEnvelope, around a command that would otherwise
    be accepted. Nothing is accepted, nothing written."""
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    before = await row_counts(w)
    channel = proven_channel(w, options=[("grpc.max_send_message_length", 8 * MAX_MESSAGE_BYTES)])
    signed = w.signed(w.owner, G, "message_post", builders.message(conv, "hi"), membership_epoch=1)
    crowded = crowd(signed, SIGNATURES)
    assert crowded.ByteSize() > 1_000_000
    try:
        unimplemented = await unimplemented_methods(channel)
        failures = []
        for method in METHODS:
            cases = [
                ("oversized", b"\x0a" + _varint(MAX_MESSAGE_BYTES + 10) + b"x" * (MAX_MESSAGE_BYTES + 10))
            ]
            for path in envelope_paths(method.input_type):
                cases.append(
                    (
                        f"{SIGNATURES} signatures at {'.'.join(f.name for f in path)}",
                        with_envelope(method.input_type, path, crowded).SerializeToString(),
                    )
                )
            for name, raw in cases:
                answer = await call(channel, method, [raw])
                problem = structured(method, answer, method.full_name in unimplemented)
                if (
                    problem is None
                    and name != "oversized"
                    and answer.code == grpc.StatusCode.OK
                    and not method.server_streaming
                ):
                    problem = _accepted_envelope(method, answer)
                if problem:
                    failures.append(f"{method.full_name} <- {name}: {problem}")
        assert not failures, "\n".join(failures)
    finally:
        await channel.close()
    assert await row_counts(w) == before
    assert_no_tracebacks(tracebacks)


def crowd(envelope: common_pb2.SignedEnvelope, signatures: int) -> common_pb2.SignedEnvelope:
    out = common_pb2.SignedEnvelope()
    out.CopyFrom(envelope)
    for _ in range(signatures):
        out.signatures.add(key_id=envelope.signatures[0].key_id, sig=b"\x00" * 64)
    return out


async def test_the_command_limit_covers_the_whole_envelope_and_signatures_are_bounded(world: World) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    before = await row_counts(w)

    async def refusal(envelope: common_pb2.SignedEnvelope) -> common_pb2.Rejection:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await w.client.execute(envelope)
        rejection = rejection_from_rpc_error(info.value)
        assert rejection is not None, info.value
        return rejection

    signed = w.signed(w.owner, G, "message_post", builders.message(conv, "hi"), membership_epoch=1)
    many = await refusal(crowd(signed, SIGNATURES))
    assert (many.reason, many.metadata["field"]) == (R.REJECTION_REASON_MALFORMED, "signatures")
    assert (await refusal(crowd(signed, MAX_SIGNATURES))).reason == R.REJECTION_REASON_MALFORMED
    # A payload under the limit in an envelope over it (signatures padded): the envelope counts.
    body = builders.message(conv, "x" * 16_000)
    near = w.signed(w.owner, G, "message_post", body, membership_epoch=1)
    near.signatures.add(key_id="x", sig=b"\x00" * (ingress.MAX_COMMAND_BYTES - len(near.payload)))
    assert len(near.payload) < ingress.MAX_COMMAND_BYTES < near.ByteSize()
    assert (await refusal(near)).reason == R.REJECTION_REASON_TOO_LARGE
    assert await row_counts(w) == before
    # Organization requests too (Membership).
    envelope = register_identity_envelope(
        "admin",
        w.keys["admin"],
        membership_pb2.Identity(
            identity_id="crowd-bot", kind=common_pb2.IDENTITY_KIND_AGENT, public_key=b"\x01" * 32
        ),
    )
    stub = membership_service_pb2_grpc.MembershipServiceStub(w.client.channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.RegisterIdentity(
            membership_service_pb2.RegisterIdentityRequest(command=crowd(envelope, SIGNATURES))
        )
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_MALFORMED
    assert await row_counts(w) == before


def _accepted_envelope(method: MethodDescriptor, answer: Answer) -> str | None:
    """An OK answer to an envelope with too many signatures must refuse it inside (batches answer a
    Rejection per command)."""
    out = message_class(method.output_type).FromString(answer.responses[0])
    text = str(out)
    if "rejection" in text or "withheld" in text or not text:
        return None
    return f"accepted: {text[:200]}"


async def test_signed_command_with_deep_json_is_malformed(world: World, tracebacks: Tracebacks) -> None:
    w = world
    conv = (await create(w)).mission.planning_conversation_id
    before = await row_counts(w)
    deep = '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}"  # 10 KiB: under the size limit
    for data in (deep, '{"a": ' + "[" * 65 + "]" * 65 + "}"):
        body = builders.message(conv, "deep", data_json=data)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await w.run(w.owner, G, "message_post", body, membership_epoch=1)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        rejection = rejection_from_rpc_error(info.value)
        assert rejection is not None and rejection.reason == R.REJECTION_REASON_MALFORMED, rejection
        assert rejection.metadata["field"] == "body.message_post.content.data_json"
    directive = mission_pb2.MissionIssueDirective(directive="deep", parameters_json=deep)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await w.run(w.owner, G, "mission_issue_directive", directive, membership_epoch=1)
    rejection = rejection_from_rpc_error(info.value)
    assert rejection is not None and rejection.reason == R.REJECTION_REASON_MALFORMED, rejection
    ok = builders.message(conv, "shallow", data_json='{"a": ' + "[" * 60 + "]" * 60 + "}")
    await w.run(w.owner, G, "message_post", ok, membership_epoch=1)
    assert (await row_counts(w))["events"] == before["events"] + 1
    assert_no_tracebacks(tracebacks)


async def test_every_stream_ends_with_an_error_after_a_malformed_message(
    world: World, tracebacks: Tracebacks
) -> None:
    """A well-formed first message (where one exists), then garbage: the stream answers an error and
    ends, for every client-streaming RPC."""
    w = world
    await create(w)
    firsts: dict[str, list[bytes]] = {
        "missionweave.v1.GatewayService.Connect": [
            gpb.ConnectRequest(frame=gpb.ClientFrame(hello=hello(w, w.owner))).SerializeToString()
        ],
    }
    channel = proven_channel(w)
    try:
        streams = [m for m in METHODS if m.client_streaming]
        assert streams
        for method in streams:
            for lead in ([], firsts.get(method.full_name, [])):
                started = asyncio.get_running_loop().time()
                answer = await call(channel, method, [*lead, b"\xff" * 11, b"\x00\x01"])
                assert asyncio.get_running_loop().time() - started < STREAM_END_S
                assert malformed(answer), (method.full_name, answer.code, answer.details)
        # 200 at once, as the issue saw them stay open.
        connect = next(m for m in streams if m.name == "ExecuteCommandStream")
        answers = await asyncio.gather(*(call(channel, connect, [b"\xff" * 11]) for _ in range(200)))
        assert all(malformed(a) for a in answers)
    finally:
        await channel.close()
    assert_no_tracebacks(tracebacks)


async def test_gateway_frames_that_do_not_parse_end_the_stream(world: World) -> None:
    """A Connect stream answers an undecodable message with a fatal ERROR frame (MALFORMED_FRAME)
    before its status."""
    w = world
    channel = grpc.aio.insecure_channel(w.target)
    try:
        connect = channel.stream_stream(
            "/missionweave.v1.GatewayService/Connect", request_serializer=None, response_deserializer=None
        )
        good = gpb.ConnectRequest(frame=gpb.ClientFrame(hello=hello(w, w.owner))).SerializeToString()

        async def frames() -> Any:
            yield good
            yield b"\xff" * 11

        seen = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for raw in connect(frames(), timeout=STREAM_END_S):
                seen.append(gpb.ConnectResponse.FromString(raw).frame)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        kinds = [f.WhichOneof("frame") for f in seen]
        assert kinds[0] == "welcome" and kinds[-1] == "error", kinds
        assert seen[-1].error.fatal and seen[-1].error.code == gpb.GATEWAY_ERROR_CODE_MALFORMED_FRAME
    finally:
        await channel.close()


async def test_garbage_through_the_front_door_is_refused_by_the_peer(
    split: Any,  # noqa: F811 (the fixture imported above)
    tracebacks: Tracebacks,
) -> None:
    """A gateway-only mesh forwards the bytes of the public services it does not serve to their peer
    (here an Authority and Membership in another process): the peer's MALFORMED answer comes back
    unchanged, streams end with it, and internal contracts are not reachable at all."""
    w = split.world
    routed = {
        "missionweave.v1.AuthorityService",
        "missionweave.v1.MembershipService",
        "missionweave.v1.GatewayService",
    }
    channel = proven_channel(w)
    try:
        failures = []
        for method in METHODS:
            service = method.containing_service.full_name
            answer = await call(channel, method, [b"\xff" * 11])
            if service.startswith("missionweave.internal."):
                if answer.code != grpc.StatusCode.UNIMPLEMENTED:
                    failures.append(f"{method.full_name}: internal, answered {answer.code.name}")
            elif service in routed and not malformed(answer):
                failures.append(f"{method.full_name}: {answer.code.name} {answer.details} {answer.rejection}")
        assert not failures, "\n".join(failures)
    finally:
        await channel.close()
    assert_no_tracebacks(tracebacks)
