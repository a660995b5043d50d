// The SDK's bytes against the Python side's, for fixed inputs (vectors.json, made by
// `python -m tests.sdk_vectors`; tests/test_sdk_typescript.py checks it is current).
import assert from "node:assert/strict";
import { readFileSync, mkdtempSync, readFileSync as read } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import {
  CursorStore,
  SessionFile,
  SessionSigner,
  SigningKey,
  attemptKey,
  buildCommand,
  buildManifest,
  callProof,
  hashContent,
  pae,
  sessionProof,
  signEnvelope,
  signedManifest,
  statementFor,
} from "../dist/index.js";
import { SignedEnvelopeSchema } from "../dist/gen/missionweave/v1/common_pb.js";
import { CommandSchema } from "../dist/gen/missionweave/v1/command_pb.js";
import { MessagePostSchema } from "../dist/gen/missionweave/v1/conversation_pb.js";

const v = JSON.parse(readFileSync(new URL("./vectors.json", import.meta.url), "utf8"));
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const key = new SigningKey(Buffer.from(v.seed, "hex"));
const signer = new SessionSigner("ts-agent", 7n, key);
const fixed = { issuedAt: { $typeName: "google.protobuf.Timestamp", seconds: BigInt(v.issued_at.seconds), nanos: v.issued_at.nanos }, nonce: Buffer.from(v.nonce, "hex") };
const envelopeHex = (envelope) => hex(toBinary(SignedEnvelopeSchema, envelope));

test("a seed gives the public key PyNaCl derives", () => {
  assert.equal(hex(key.publicKey), v.public_key);
});

test("PAE is DSSE v1's, lengths in bytes", () => {
  assert.equal(hex(pae(v.pae.type, Buffer.from(v.pae.payload, "hex"))), v.pae.pae);
});

test("a signed envelope is byte for byte sign_envelope's", () => {
  assert.equal(envelopeHex(signEnvelope(Buffer.from(v.pae.payload, "hex"), v.pae.type, key, "ts-agent#session-7")), v.envelope);
});

test("a command serialises and signs as the Python SDK's", () => {
  const body = { case: "messagePost", value: create(MessagePostSchema, { conversationId: "conv_1", content: { text: "hi ✓", mentions: ["coord"] } }) };
  const command = buildCommand(signer, "grp_vectors", body, 2n, { commandId: "cmd_0001" });
  command.issuedAt = fixed.issuedAt;
  const bytes = toBinary(CommandSchema, command);
  assert.equal(hex(bytes), v.command.bytes);
  assert.equal(envelopeHex(signer.sign(bytes, "application/vnd.missionweave.v1.command+protobuf")), v.command.envelope);
});

test("a call proof and a HELLO proof are the Python SDK's", () => {
  const proof = callProof(signer, "/missionweave.v1.AuthorityService/GetGroupState", "127.0.0.1:50051", fixed);
  assert.equal(hex(proof), v.call_proof);
  assert.equal(envelopeHex(sessionProof(signer, "127.0.0.1:50051", fixed)), v.hello_proof);
});

test("a manifest's in-toto Statement and its signature are the Python SDK's", () => {
  const content = Buffer.from(v.manifest.content, "hex");
  const hashes = hashContent(content);
  const manifest = buildManifest(hashes, "text/plain", "ts-agent", { groupId: "grp_vectors", missionId: "msn_1", workItemId: "wi-1", leaseId: "lease-1", ownershipEpoch: 3n });
  manifest.createdAt = fixed.issuedAt;
  assert.equal(new TextDecoder().decode(statementFor(manifest, hashes.sha256Hex)), v.manifest.statement);
  assert.equal(envelopeHex(signedManifest(manifest, hashes.sha256Hex, signer)), v.manifest.envelope);
});

test("an idempotency key is attempt_key's", () => {
  const [mission, item, epoch, op] = v.attempt_key.parts;
  assert.equal(attemptKey(mission, item, BigInt(epoch), op), v.attempt_key.key);
  assert.notEqual(attemptKey(mission, item, BigInt(epoch + 1), op), v.attempt_key.key); // a new ownership, new keys
});

test("the cursor and session files are the Python SDK's, byte for byte", async () => {
  const dir = mkdtempSync(join(tmpdir(), "mwp-sdk-"));
  const store = new CursorStore(dir, "ts-agent", 0);
  await Promise.all([store.save("grp_b", 9n), store.save("grp_a", 42n)]);
  assert.equal(read(join(dir, "cursors.json"), "utf8"), v.cursors_file);
  assert.equal(new CursorStore(dir, "ts-agent").load("grp_a"), 42n); // read back
  await assert.rejects(store.save("grp_a", 41n), /backwards/); // never moves back
  const file = new SessionFile(join(dir, "session.json"), "ts-agent");
  file.save(signer);
  assert.equal(read(join(dir, "session.json"), "utf8"), v.session_file);
  assert.equal(file.load()?.sessionEpoch, 7n);
  assert.equal(new SessionFile(join(dir, "session.json"), "other").load(), undefined);
});
