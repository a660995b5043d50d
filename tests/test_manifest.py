"""Signed Artifact manifests: in-toto Statement v1 in a DSSE envelope (MW-13.1-03, MW-13.1-06).

Interoperability is checked against an independent implementation (securesystemslib's DSSE
Envelope and its Ed25519 keys/signers, on top of `cryptography`), in both directions.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import blake3
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from missionweave.kernel.clock import to_timestamp
from missionweave.kernel.manifest import (
    MAX_ENVELOPE_BYTES,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    ManifestError,
    ManifestErrorCode,
    manifest_digest,
    manifest_ref,
    sign_manifest,
    statement_for,
    verify_manifest,
)
from missionweave.kernel.signing import pae, session_key_id, sign_envelope
from missionweave.v1 import artifact_service_pb2 as art
from missionweave.v1 import common_pb2

BLOB = b"quarterly revenue table, v3\n" * 100
B3 = blake3.blake3(BLOB).hexdigest()
SHA = hashlib.sha256(BLOB).hexdigest()
KEY_ID = session_key_id("agt_writer", 3)
RETRIEVAL_URI = f"s3://mwp-artifacts/blobs/{B3[:2]}/{B3}"

SIG_INVALID = ManifestErrorCode.MANIFEST_SIGNATURE_INVALID
MISMATCH = ManifestErrorCode.MANIFEST_MISMATCH
MALFORMED = ManifestErrorCode.MALFORMED_DIGEST


def digest(algorithm: str, hex_: str, size: int) -> common_pb2.Digest:
    return common_pb2.Digest(algorithm=algorithm, hex=hex_, size_bytes=size)


def full_manifest(data: bytes = BLOB) -> art.ArtifactManifest:
    """A manifest with every field set (MW-13.1-03)."""
    b3 = blake3.blake3(data).hexdigest()
    return art.ArtifactManifest(
        content_digest=digest("blake3", b3, len(data)),
        alias_digests=[digest("sha256", hashlib.sha256(data).hexdigest(), len(data))],
        media_type="text/csv",
        schema=art.ArtifactSchema(
            schema_digest=digest("blake3", "ab" * 32, 120), schema_id="urn:example:revenue", version="3"
        ),
        producer_agent_id="agt_writer",
        agent_card_version="1.4.0",
        mission_id="mis_01",
        group_id="grp_01",
        work_item_id="wi_07",
        source_artifacts=[digest("blake3", "cd" * 32, 4096), digest("blake3", "ef" * 32, 9)],
        components=[
            art.ComponentVersion(kind=art.COMPONENT_KIND_TOOL, name="pandoc", version="3.1"),
            art.ComponentVersion(kind=art.COMPONENT_KIND_MODEL, name="model-x", version="2025-01"),
            art.ComponentVersion(kind=art.COMPONENT_KIND_CAPABILITY, name="data.csv", version="1.2.0"),
        ],
        created_at=to_timestamp(datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)),
        classification=art.DATA_CLASSIFICATION_CONFIDENTIAL,
        size_bytes=len(data),
        retrieval_uri=f"s3://mwp-artifacts/blobs/{b3[:2]}/{b3}",
        lease_id="lea_42",
        ownership_epoch=5,
    )


@pytest.fixture
def producer() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
def envelope(producer: SigningKey) -> common_pb2.SignedEnvelope:
    return sign_manifest(full_manifest(), SHA, producer, KEY_ID)


def verify(envelope: common_pb2.SignedEnvelope, key: SigningKey, **overrides: Any) -> art.ArtifactManifest:
    kwargs: dict[str, Any] = {"expected_digest_hex": B3, "expected_size": len(BLOB)} | overrides
    return verify_manifest(envelope, key.verify_key.encode(), **kwargs)


def expect_error(
    code: ManifestErrorCode, envelope: common_pb2.SignedEnvelope, key: SigningKey, **kw: Any
) -> None:
    with pytest.raises(ManifestError) as info:
        verify(envelope, key, **kw)
    assert info.value.code is code, info.value


def sign_statement(
    statement: Any, key: SigningKey, payload_type: str = PAYLOAD_TYPE
) -> common_pb2.SignedEnvelope:
    """Signs an arbitrary (possibly wrong) statement with a valid signature, to test the checks after it."""
    payload = statement if isinstance(statement, bytes) else json.dumps(statement).encode()
    return sign_envelope(payload, payload_type, key, KEY_ID)


def good_statement() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(statement_for(full_manifest(), SHA))
    return result


# ------------------------------------------------------------------ the statement


@pytest.mark.req("MW-13.1-03", "MW-13.1-06")
def test_statement_layout_subject_by_hash_and_every_field_in_the_predicate() -> None:
    statement = json.loads(statement_for(full_manifest(), SHA))
    assert set(statement) == {"_type", "subject", "predicateType", "predicate"}
    assert statement["_type"] == STATEMENT_TYPE
    assert statement["predicateType"] == PREDICATE_TYPE
    assert statement["subject"] == [{"name": f"blake3:{B3}", "digest": {"blake3": B3, "sha256": SHA}}]
    predicate = statement["predicate"]
    assert set(predicate) == {f.name for f in art.ArtifactManifest.DESCRIPTOR.fields}
    # The URI is a location inside the predicate, never the subject's name (MW-13.1-06).
    assert predicate["retrieval_uri"] == RETRIEVAL_URI
    assert RETRIEVAL_URI not in json.dumps(statement["subject"])
    assert predicate["classification"] == "DATA_CLASSIFICATION_CONFIDENTIAL"
    assert predicate["created_at"] == "2023-11-14T22:13:20.123456Z"
    assert predicate["size_bytes"] == str(len(BLOB))  # proto3 JSON writes 64-bit integers as strings


@pytest.mark.req("MW-13.1-03")
def test_predicate_lists_every_field_even_when_left_at_its_default() -> None:
    minimal = art.ArtifactManifest(content_digest=digest("blake3", B3, len(BLOB)), size_bytes=len(BLOB))
    predicate = json.loads(statement_for(minimal, SHA))["predicate"]
    with_presence = {"schema", "created_at"}  # message fields: absent when unset
    assert set(predicate) == {f.name for f in art.ArtifactManifest.DESCRIPTOR.fields} - with_presence
    assert predicate["retrieval_uri"] == "" and predicate["source_artifacts"] == []


@pytest.mark.req("MW-13.1-03")
def test_statement_is_canonical_and_deterministic() -> None:
    first = statement_for(full_manifest(), SHA)
    copy = art.ArtifactManifest()
    copy.ParseFromString(full_manifest().SerializeToString())
    assert statement_for(copy, SHA) == first
    parsed = json.loads(first)
    assert json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() == first
    assert b"\n" not in first and b": " not in first and b", " not in first


def test_subject_sha256_is_the_hashlib_sha256_of_the_bytes(envelope: common_pb2.SignedEnvelope) -> None:
    subject = json.loads(envelope.payload)["subject"][0]
    assert subject["digest"]["sha256"] == hashlib.sha256(BLOB).hexdigest()
    assert subject["digest"]["blake3"] == blake3.blake3(BLOB).hexdigest()


# ------------------------------------------------------------------ sign and verify


@pytest.mark.req("MW-13.1-03")
def test_sign_then_verify_returns_the_manifest(
    producer: SigningKey, envelope: common_pb2.SignedEnvelope
) -> None:
    assert envelope.payload_type == PAYLOAD_TYPE
    assert [s.key_id for s in envelope.signatures] == [KEY_ID]
    assert verify(envelope, producer, producer_id="agt_writer") == full_manifest()


def test_another_valid_signature_beside_the_producers_is_fine(
    producer: SigningKey, envelope: common_pb2.SignedEnvelope
) -> None:
    other = SigningKey.generate()
    envelope.signatures.insert(0, sign_envelope(envelope.payload, PAYLOAD_TYPE, other, "x").signatures[0])
    assert verify(envelope, producer).work_item_id == "wi_07"


def test_manifest_digest_is_blake3_of_the_signed_payload(envelope: common_pb2.SignedEnvelope) -> None:
    assert manifest_digest(envelope) == blake3.blake3(envelope.payload).hexdigest()
    assert manifest_ref(envelope) == digest("blake3", manifest_digest(envelope), len(envelope.payload))
    other = sign_manifest(
        full_manifest(b"other bytes"),
        hashlib.sha256(b"other bytes").hexdigest(),
        SigningKey.generate(),
        KEY_ID,
    )
    assert manifest_digest(other) != manifest_digest(envelope)


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=256),
    text=st.text(max_size=40),
    epoch=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_any_manifest_round_trips_and_is_canonical(data: bytes, text: str, epoch: int) -> None:
    key = SigningKey(b"\x07" * 32)
    manifest = full_manifest(data)
    manifest.media_type = manifest.mission_id = manifest.retrieval_uri = text
    manifest.ownership_epoch = epoch
    env = sign_manifest(manifest, hashlib.sha256(data).hexdigest(), key, KEY_ID)
    b3 = blake3.blake3(data).hexdigest()
    assert (
        verify_manifest(env, key.verify_key.encode(), expected_digest_hex=b3, expected_size=len(data))
        == manifest
    )
    parsed = json.loads(env.payload)
    assert (
        json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() == env.payload
    )


# ------------------------------------------------------------------ interop with securesystemslib


def to_dsse_json(envelope: common_pb2.SignedEnvelope) -> dict[str, Any]:
    """Our protobuf envelope in DSSE's JSON form (base64 payload and signatures)."""
    return {
        "payload": base64.b64encode(envelope.payload).decode(),
        "payloadType": envelope.payload_type,
        "signatures": [
            {"keyid": s.key_id, "sig": base64.b64encode(s.sig).decode()} for s in envelope.signatures
        ],
    }


def from_dsse_json(data: dict[str, Any]) -> common_pb2.SignedEnvelope:
    return common_pb2.SignedEnvelope(
        payload=base64.b64decode(data["payload"]),
        payload_type=data["payloadType"],
        signatures=[
            common_pb2.Signature(key_id=s["keyid"], sig=base64.b64decode(s["sig"]))
            for s in data["signatures"]
        ],
    )


def sslib_key(key: SigningKey, keyid: str = KEY_ID) -> SSlibKey:
    public = key.verify_key.encode().hex()
    return SSlibKey(keyid=keyid, keytype="ed25519", scheme="ed25519", keyval={"public": public})


@pytest.mark.req("MW-13.1-03")
def test_securesystemslib_verifies_our_envelope(
    producer: SigningKey, envelope: common_pb2.SignedEnvelope
) -> None:
    theirs = Envelope.from_dict(to_dsse_json(envelope))
    assert theirs.pae() == pae(envelope.payload_type, envelope.payload)
    accepted = theirs.verify([sslib_key(producer)], threshold=1)
    assert list(accepted) == [KEY_ID]
    statement = json.loads(theirs.payload)
    assert statement["subject"][0]["digest"]["sha256"] == hashlib.sha256(BLOB).hexdigest()


@pytest.mark.req("MW-13.1-03")
def test_securesystemslib_rejects_our_envelope_when_tampered_or_signed_by_another_key(
    producer: SigningKey, envelope: common_pb2.SignedEnvelope
) -> None:
    tampered = to_dsse_json(envelope)
    tampered["payload"] = base64.b64encode(envelope.payload.replace(b"text/csv", b"text/tsv")).decode()
    with pytest.raises(VerificationError):
        Envelope.from_dict(tampered).verify([sslib_key(producer)], threshold=1)
    with pytest.raises(VerificationError):
        Envelope.from_dict(to_dsse_json(envelope)).verify([sslib_key(SigningKey.generate())], threshold=1)


@pytest.mark.req("MW-13.1-03")
def test_we_verify_an_envelope_signed_by_securesystemslib() -> None:
    private = Ed25519PrivateKey.generate()
    raw_public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    signer = CryptoSigner(private, SSlibKey.from_crypto(private.public_key(), keyid=KEY_ID))
    theirs = Envelope(payload=statement_for(full_manifest(), SHA), payload_type=PAYLOAD_TYPE, signatures={})
    theirs.sign(signer)
    ours = from_dsse_json(json.loads(json.dumps(theirs.to_dict())))
    manifest = verify_manifest(ours, raw_public, expected_digest_hex=B3, expected_size=len(BLOB))
    assert manifest == full_manifest()
    wrong = SigningKey.generate().verify_key.encode()
    with pytest.raises(ManifestError) as info:
        verify_manifest(ours, wrong, expected_digest_hex=B3, expected_size=len(BLOB))
    assert info.value.code is SIG_INVALID


# ------------------------------------------------------------------ bad input


@pytest.mark.req("MW-13.1-03")
def test_signature_by_a_key_that_is_not_the_producers(envelope: common_pb2.SignedEnvelope) -> None:
    expect_error(SIG_INVALID, envelope, SigningKey.generate())


def test_tampered_payload(producer: SigningKey, envelope: common_pb2.SignedEnvelope) -> None:
    envelope.payload = envelope.payload.replace(b"wi_07", b"wi_08")
    expect_error(SIG_INVALID, envelope, producer)


def test_payload_type_changed_after_signing(
    producer: SigningKey, envelope: common_pb2.SignedEnvelope
) -> None:
    envelope.payload_type = "application/json"
    expect_error(SIG_INVALID, envelope, producer)


def test_no_signature_or_a_truncated_one(producer: SigningKey, envelope: common_pb2.SignedEnvelope) -> None:
    envelope.signatures[0].sig = envelope.signatures[0].sig[:63]
    expect_error(SIG_INVALID, envelope, producer)
    del envelope.signatures[:]
    expect_error(SIG_INVALID, envelope, producer)


def test_malformed_public_key(envelope: common_pb2.SignedEnvelope) -> None:
    with pytest.raises(ManifestError) as info:
        verify_manifest(envelope, b"short", expected_digest_hex=B3, expected_size=len(BLOB))
    assert info.value.code is SIG_INVALID


def test_signed_with_a_wrong_payload_type(producer: SigningKey) -> None:
    expect_error(MISMATCH, sign_statement(good_statement(), producer, "application/json"), producer)


@pytest.mark.req("MW-13.1-03")
def test_wrong_subject_digest(producer: SigningKey, envelope: common_pb2.SignedEnvelope) -> None:
    other = blake3.blake3(b"some other blob").hexdigest()
    expect_error(MISMATCH, envelope, producer, expected_digest_hex=other)


@pytest.mark.req("MW-13.1-03")
def test_wrong_size(producer: SigningKey, envelope: common_pb2.SignedEnvelope) -> None:
    expect_error(MISMATCH, envelope, producer, expected_size=len(BLOB) + 1)


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b"not json", b"\xff\xfe{}", b"[]", b'"text"', b"NaN", b"[" * 5000 + b"]" * 5000],
    ids=["empty", "truncated", "words", "not-utf8", "array", "string", "nan", "deep"],
)
def test_garbage_json(producer: SigningKey, payload: bytes) -> None:
    expect_error(MISMATCH, sign_statement(payload, producer), producer)


def test_duplicate_keys_are_refused(producer: SigningKey) -> None:
    payload = statement_for(full_manifest(), SHA).replace(b'{"_type"', b'{"_type":"x","_type"', 1)
    expect_error(MISMATCH, sign_statement(payload, producer), producer)


def _set(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    statement = good_statement()
    target: Any = statement
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return statement


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("_type",), "https://in-toto.io/Statement/v0.1"),
        (("predicateType",), "https://slsa.dev/provenance/v1"),
        (("predicate",), "not an object"),
        (("subject",), []),
        (("subject", 0, "digest"), {"sha256": SHA}),
        (("subject", 0, "digest", "sha256"), "ABC"),
        (("subject", 0, "name"), RETRIEVAL_URI),  # a URI is never the subject's name (MW-13.1-06)
        (("predicate", "content_digest", "hex"), "00" * 32),
        (("predicate", "content_digest", "algorithm"), "sha256"),
        (("predicate", "size_bytes"), "1"),
        (("predicate", "alias_digests", 0, "hex"), "00" * 32),
        (("predicate", "classification"), ["DATA_CLASSIFICATION_PUBLIC"]),
        (("predicate", "created_at"), "yesterday"),
        (("predicate", "source_artifacts"), "cd" * 32),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else None,
)
@pytest.mark.req("MW-13.1-03", "MW-13.1-06")
def test_signed_statement_that_does_not_describe_the_blob(
    producer: SigningKey, path: tuple[Any, ...], value: Any
) -> None:
    expect_error(MISMATCH, sign_statement(_set(path, value), producer), producer)


def test_two_subjects_are_refused(producer: SigningKey) -> None:
    statement = good_statement()
    statement["subject"].append(statement["subject"][0])
    expect_error(MISMATCH, sign_statement(statement, producer), producer)


def test_unknown_fields_are_ignored_as_in_toto_requires(producer: SigningKey) -> None:
    statement = _set(("predicate", "x_future_field"), {"any": "thing"})
    statement["x_extension"] = 1
    assert verify(sign_statement(statement, producer), producer) == full_manifest()


def test_an_unknown_enum_value_reads_as_unspecified(producer: SigningKey) -> None:
    # A newer producer's classification is not guessed: it reads as UNSPECIFIED, which policy refuses
    # or treats as the most restrictive (docs/manifests.md).
    statement = _set(("predicate", "classification"), "DATA_CLASSIFICATION_FUTURE_LEVEL")
    manifest = verify(sign_statement(statement, producer), producer)
    assert manifest.classification == art.DATA_CLASSIFICATION_UNSPECIFIED


def test_producer_agent_id_must_be_the_signer_when_given(
    producer: SigningKey, envelope: common_pb2.SignedEnvelope
) -> None:
    expect_error(MISMATCH, envelope, producer, producer_id="agt_someone_else")


def test_oversized_envelope(producer: SigningKey) -> None:
    statement = _set(("predicate", "media_type"), "x" * MAX_ENVELOPE_BYTES)
    expect_error(MISMATCH, sign_statement(statement, producer), producer)
    manifest = full_manifest()
    manifest.media_type = "x" * MAX_ENVELOPE_BYTES
    with pytest.raises(ManifestError) as info:
        sign_manifest(manifest, SHA, producer, KEY_ID)
    assert info.value.code is MISMATCH


@pytest.mark.parametrize(
    "bad", ["", B3.upper(), B3[:-1], B3 + "0", "../../etc/passwd", "g" * 64, f"blake3:{B3}", B3 + "\n"]
)
def test_malformed_expected_digest(
    producer: SigningKey, envelope: common_pb2.SignedEnvelope, bad: str
) -> None:
    expect_error(MALFORMED, envelope, producer, expected_digest_hex=bad)


def test_producer_side_refuses_malformed_or_inconsistent_digests(producer: SigningKey) -> None:
    cases: list[tuple[ManifestErrorCode, art.ArtifactManifest, str]] = []
    cases.append((MALFORMED, full_manifest(), SHA.upper()))
    no_digest = full_manifest()
    no_digest.ClearField("content_digest")
    cases.append((MALFORMED, no_digest, SHA))
    sha_identity = full_manifest()
    sha_identity.content_digest.algorithm = "sha256"
    cases.append((MALFORMED, sha_identity, SHA))
    path_like = full_manifest()
    path_like.content_digest.hex = "../" * 21 + "a"
    cases.append((MALFORMED, path_like, SHA))
    wrong_size = full_manifest()
    wrong_size.size_bytes += 1
    cases.append((MISMATCH, wrong_size, SHA))
    cases.append((MISMATCH, full_manifest(), "00" * 32))  # disagrees with the sha256 alias
    for code, manifest, sha in cases:
        with pytest.raises(ManifestError) as info:
            sign_manifest(manifest, sha, producer, KEY_ID)
        assert info.value.code is code, (manifest, sha)


def test_error_codes_are_artifact_error_codes() -> None:
    for code in ManifestErrorCode:
        assert art.ArtifactErrorCode.Name(code.proto) == code.artifact_error == f"ARTIFACT_ERROR_CODE_{code}"
