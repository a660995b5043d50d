#!/usr/bin/env node
// A MissionWeave agent in Node.js, built only on @grpc/grpc-js, @grpc/proto-loader and Node's crypto.
//
// It proves that nothing in the MissionWeaveProtocol is Python-specific: the agent reads the same
// .proto files as the Python SDK, speaks the frame protocol of GatewayService.Connect (documented at
// the top of protos/missionweave/v1/gateway_service.proto) and checks the same signatures.
//
//   HELLO (session-key proof) -> WELCOME -> SUBSCRIBE -> EVENT ... -> ACK (cursor + credits) ...
//
// Every event is verified against the Authority's Ed25519 key its signature names (the current key,
// or one it rotated away from: GetAuthorityKey's key history) before it is read, released in
// sequence order exactly once, printed as one JSON line on stdout, and acknowledged. With
// --until-sequence the agent exits 0 once the gateway has stored an ACK at or beyond that sequence;
// without it the agent follows the Group until Ctrl-C. Diagnostics go to stderr.
//
// Deliberately left out (the Python SDK in missionweave/agent.py has them): reconnecting, a durable
// cursor file, CURSOR_TOO_OLD snapshot restore and sending commands. Restart with
// --after-sequence <last sequence printed> to resume.
//
// Usage: node agent.js --agent coord --session-epoch 1 --key-file coord.key --group grp_...
//        (node agent.js --help lists every flag and its environment variable)
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const CLIENT_VERSION = 'missionweave-node-example/0.1.0';

// Payload types: part of what is signed, so they must match missionweave/kernel/signing.py byte for byte.
const HELLO_PROOF_TYPE = 'application/vnd.missionweave.v1.hello-proof+protobuf';
const EVENT_TYPE = 'application/vnd.missionweave.v1.event+protobuf';
const KEY_ROTATION_TYPE = 'application/vnd.missionweave.v1.authority-key-rotation+protobuf';

// Node's crypto takes Ed25519 keys as DER, not as raw bytes. A raw 32-byte seed or public key
// becomes DER by putting the fixed ASN.1 header for the Ed25519 algorithm (OID 1.3.101.112) in front.
const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');
const SPKI_ED25519_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

// ============================================================================ options

const OPTIONS = {
  target: { env: 'MWP_TARGET', default: '127.0.0.1:50051', help: 'the gateway, host:port (also the HELLO audience)' },
  agent: { env: 'MWP_AGENT_ID', help: 'the agent identity id (required)' },
  'session-epoch': { env: 'MWP_SESSION_EPOCH', help: "the agent's current session epoch (required)" },
  'key-file': { env: 'MWP_SESSION_KEY_FILE', help: 'file with the session key: the 32-byte Ed25519 seed in hex, mode 0600 (required)' },
  group: { env: 'MWP_GROUP', help: 'the Group to subscribe to (required)' },
  'after-sequence': { env: 'MWP_AFTER_SEQUENCE', default: '0', help: 'deliver events after this sequence' },
  'until-sequence': { env: 'MWP_UNTIL_SEQUENCE', help: 'exit 0 once events through this sequence are ACKed (default: follow until Ctrl-C)' },
  credits: { env: 'MWP_CREDITS', default: '256', help: 'credit window: events in flight, 1..65536' },
  'authority-key': { env: 'MWP_AUTHORITY_KEY_HEX', help: "pin an Authority Ed25519 public key (hex), current or rotated away from; default: trust GetAuthorityKey" },
  timeout: { env: 'MWP_TIMEOUT', default: '60', help: 'seconds --until-sequence may take before the agent gives up' },
  protos: { env: 'MWP_PROTOS', default: path.join(__dirname, '..', '..', 'protos'), help: 'the protos/ directory' },
  // TLS (docs/tls.md): the same settings, flags and variables as `mwp` and the Python SDK.
  tls: { env: 'MWP_TLS', boolean: true, help: "use TLS, verifying the gateway with Node's trusted roots unless --tls-ca (on with any --tls-* option)" },
  'tls-ca': { env: 'MWP_TLS_CA', help: 'CA bundle (PEM file) that verifies the gateway' },
  'tls-client-cert': { env: 'MWP_TLS_CLIENT_CERT', help: 'client certificate (PEM file) for a gateway that requires one (mTLS)' },
  'tls-client-key': { env: 'MWP_TLS_CLIENT_KEY', help: 'its private key (PEM file)' },
  'tls-server-name': { env: 'MWP_TLS_SERVER_NAME', help: "the name to check in the gateway's certificate instead of the target's host" },
};

function usage() {
  const lines = Object.entries(OPTIONS).map(
    ([name, o]) => `  --${name.padEnd(17)} ${o.help}\n  ${''.padEnd(19)} env ${o.env}${o.default ? `, default ${o.default}` : ''}`,
  );
  return `usage: node agent.js [options]\n\n${lines.join('\n')}\n`;
}

// Flags win over environment variables, which win over defaults.
function readOptions(argv) {
  const spec = Object.fromEntries(Object.entries(OPTIONS).map(([name, o]) => [name, { type: o.boolean ? 'boolean' : 'string' }]));
  const { values } = parseArgs({ args: argv, options: { ...spec, help: { type: 'boolean' } } });
  if (values.help) {
    process.stdout.write(usage());
    process.exit(0);
  }
  const pick = (name) => values[name] ?? process.env[OPTIONS[name].env] ?? OPTIONS[name].default;
  const required = (name) => pick(name) ?? usageError(`--${name} (or ${OPTIONS[name].env}) is required`);
  const sequence = (name) => {
    const text = pick(name);
    if (text === undefined) return undefined;
    if (!/^\d+$/.test(text)) usageError(`--${name} must be a non-negative integer, not ${JSON.stringify(text)}`);
    return BigInt(text); // sequences are uint64: BigInt never rounds
  };
  const credits = Number(pick('credits'));
  if (!Number.isInteger(credits) || credits < 1 || credits > 65536) usageError('--credits must be 1..65536');
  const timeout = Number(pick('timeout'));
  if (!(timeout > 0)) usageError('--timeout must be a positive number of seconds');
  const flag = (name) => {
    const value = values[name] ?? process.env[OPTIONS[name].env] ?? '';
    if (typeof value === 'boolean') return value;
    const text = value.trim().toLowerCase();
    if (['1', 'true', 'yes', 'on'].includes(text)) return true;
    if (['', '0', 'false', 'no', 'off'].includes(text)) return false;
    return usageError(`${OPTIONS[name].env} must be 1/true/yes/on or 0/false/no/off, not ${JSON.stringify(value)}`);
  };
  const given = (name) => (pick(name) === '' ? undefined : pick(name)); // an empty variable is unset
  const tlsFiles = { ca: given('tls-ca'), cert: given('tls-client-cert'), key: given('tls-client-key') };
  const serverName = given('tls-server-name');
  if ((tlsFiles.cert === undefined) !== (tlsFiles.key === undefined)) usageError('--tls-client-cert and --tls-client-key go together');
  const tls = flag('tls') || Object.values(tlsFiles).some((v) => v !== undefined) || serverName !== undefined;
  const epoch = required('session-epoch');
  if (!/^[1-9]\d*$/.test(epoch)) usageError('--session-epoch must be a positive integer');
  return {
    target: pick('target'),
    agentId: required('agent'),
    sessionEpoch: epoch,
    keyFile: required('key-file'),
    groupId: required('group'),
    afterSequence: sequence('after-sequence'),
    untilSequence: sequence('until-sequence'),
    credits,
    authorityKeyHex: pick('authority-key'),
    timeoutMs: timeout * 1000,
    protos: pick('protos'),
    tls: tls ? { ...tlsFiles, serverName } : null,
  };
}

function usageError(message) {
  process.stderr.write(`agent.js: ${message}\n\n${usage()}`);
  process.exit(2);
}

// ============================================================================ keys and signatures

// The key file format of `mwp keygen` and missionweave/kernel/signing.py write_key: the seed as hex, and the
// file must not be readable by others (read_key refuses it otherwise; so do we).
function readSessionKey(file) {
  const mode = fs.statSync(file).mode & 0o777;
  if (process.platform !== 'win32' && mode & 0o077) {
    throw new Error(`key file ${file} has mode ${mode.toString(8)}; it must not be readable by others (0600)`);
  }
  const hex = fs.readFileSync(file, 'utf8').trim();
  if (!/^[0-9a-fA-F]{64}$/.test(hex)) throw new Error(`key file ${file} does not hold a 32-byte Ed25519 seed in hex`);
  const der = Buffer.concat([PKCS8_ED25519_PREFIX, Buffer.from(hex, 'hex')]);
  return crypto.createPrivateKey({ key: der, format: 'der', type: 'pkcs8' });
}

function publicKeyFromRaw(raw) {
  return crypto.createPublicKey({ key: Buffer.concat([SPKI_ED25519_PREFIX, raw]), format: 'der', type: 'spki' });
}

// DSSE v1 pre-authentication encoding, as pae() in missionweave/kernel/signing.py:
//   "DSSEv1" SP len(type) SP type SP len(payload) SP payload      (lengths in bytes, in decimal)
// The signature covers these bytes, built around the *exact* payload bytes that travel in the
// envelope, so no side ever re-serialises a protobuf to check a signature.
function pae(payloadType, payload) {
  const type = Buffer.from(payloadType, 'utf8');
  return Buffer.concat([
    Buffer.from(`DSSEv1 ${type.length} `, 'ascii'),
    type,
    Buffer.from(` ${payload.length} `, 'ascii'),
    payload,
  ]);
}

// sign_envelope() of missionweave/kernel/signing.py. For Ed25519 the algorithm argument must be null: the
// scheme hashes internally (PureEdDSA), exactly like PyNaCl's SigningKey.sign.
function signEnvelope(payload, payloadType, privateKey, keyId) {
  const sig = crypto.sign(null, pae(payloadType, payload), privateKey);
  return { payload, payload_type: payloadType, signatures: [{ key_id: keyId, sig }] };
}

// ============================================================================ protos

// proto-loader reads the very files the Python stubs are generated from. keepCase keeps the
// snake_case field names of the .proto (no camelCase translation to keep in mind); uint64 arrives
// as a decimal string (exact; turned into BigInt where we compute); enums as their names; oneofs
// also get a virtual field naming the member that is set (frame.frame === 'event'). The google/protobuf
// well-known types (Timestamp, Duration) are bundled with protobufjs, so only protos/ is on the path.
function loadProtos(protosDir) {
  const files = [
    'missionweave/v1/gateway_service.proto',
    'missionweave/v1/authority_service.proto',
    'missionweave/v1/event.proto',
  ];
  const definition = protoLoader.loadSync(files, {
    includeDirs: [protosDir],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const loaded = grpc.loadPackageDefinition(definition).missionweave.v1;
  return {
    GatewayService: loaded.GatewayService,
    AuthorityService: loaded.AuthorityService,
    // Messages that are never an RPC's request or response (they travel as bytes inside a
    // SignedEnvelope) are encoded and decoded through the same definitions.
    HelloProof: definition['missionweave.v1.HelloProof'],
    Event: definition['missionweave.v1.Event'],
    AuthorityKeyRotation: definition['missionweave.v1.AuthorityKeyRotation'],
  };
}

// ============================================================================ the channel

// Plain text (the embedded default on loopback), or TLS: the CA that verifies the gateway (default:
// Node's trusted roots), a client certificate for a gateway that requires one, and a server name
// override (checked against the certificate; the HELLO audience stays the target).
function channel(tls) {
  if (tls === null) return { credentials: grpc.credentials.createInsecure(), options: {} };
  const read = (file, what) => {
    try {
      return fs.readFileSync(file);
    } catch (err) {
      throw new Error(`cannot read the TLS ${what} ${file}: ${err.message}`);
    }
  };
  const credentials = grpc.credentials.createSsl(
    tls.ca === undefined ? null : read(tls.ca, 'CA bundle'),
    tls.key === undefined ? null : read(tls.key, 'client key'),
    tls.cert === undefined ? null : read(tls.cert, 'client certificate'),
  );
  const options = tls.serverName === undefined ? {} : { 'grpc.ssl_target_name_override': tls.serverName };
  return { credentials, options };
}

function timestampNow() {
  const ms = Date.now();
  return { seconds: String(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 };
}

// ============================================================================ credits

// The credit accounting of the Python SDK's CreditWindow (missionweave/agent.py), MW-8-17: the gateway
// spends one credit per sequence an EVENT frame covers; a frame's credits are granted back once the
// cursor has passed its last sequence, batched into ACKs when half of the window is free again or
// when the agent is idle. The ACKed cursor never exceeds what the gateway delivered (it answers
// ACK_BEYOND_DELIVERED otherwise) and never goes backwards (ACK_REGRESSED).
const min = (a, b) => (a < b ? a : b); // Math.min does not take BigInt

class CreditWindow {
  constructor(credits, after) {
    this.credits = credits;
    this.delivered = after;
    this.acked = after;
    this.frames = []; // [lastSequence, sequencesCovered] of frames not yet fully processed
    this.released = 0;
  }

  received(first, last) {
    if (last > this.delivered) this.delivered = last;
    this.frames.push([last, Number(last - first + 1n)]);
  }

  startAt(sequence) {
    if (sequence > this.delivered) this.delivered = sequence;
  }

  processed(cursor) {
    const pending = [];
    for (const [last, size] of this.frames) {
      if (last <= cursor) this.released += size;
      else pending.push([last, size]);
    }
    this.frames = pending;
  }

  due(cursor, idle) {
    if (this.released >= Math.max(1, Math.floor(this.credits / 2))) return true;
    return idle && (this.released > 0 || min(cursor, this.delivered) > this.acked);
  }

  take(cursor) {
    const reported = min(cursor, this.delivered);
    if (reported > this.acked) this.acked = reported;
    const credits = this.released;
    this.released = 0;
    return { cursor: this.acked, credits };
  }
}

// ============================================================================ the agent

class Agent {
  constructor(options, protos, sessionKey) {
    this.options = options;
    this.protos = protos;
    this.sessionKey = sessionKey;
    this.subscriptionId = 's1';
    // Events are released in sequence order and exactly once (MW-16-02, MW-16-03): `cursor` is the
    // highest contiguous sequence processed (MW-16-06); anything that arrives early waits in
    // `pending` (keyed by its first sequence) so the cursor never crosses a gap (MW-16-05).
    this.cursor = options.afterSequence;
    this.pending = new Map();
    this.seenEventIds = new Set();
    this.window = new CreditWindow(options.credits, options.afterSequence);
    this.idleAck = null;
    this.finishing = false;
    this.finished = false;
  }

  // Resolves with the exit code once the run is over.
  async run() {
    const finished = new Promise((resolve) => {
      this.resolve = resolve;
    });
    const { target } = this.options;
    try {
      const { credentials, options } = channel(this.options.tls);
      this.authorityClient = new this.protos.AuthorityService(target, credentials, options);
      this.gatewayClient = new this.protos.GatewayService(target, credentials, options);
      this.authority = await this.authorityKeys();
    } catch (err) {
      this.fail(err.message);
      return finished;
    }
    if (this.options.untilSequence !== undefined) {
      this.timer = setTimeout(
        () => this.fail(`timed out after ${this.options.timeoutMs / 1000} s at sequence ${this.cursor}, waiting for ${this.options.untilSequence}`),
        this.options.timeoutMs,
      );
    }
    this.call = this.gatewayClient.Connect();
    this.call.on('data', (response) => this.onFrame(response.frame));
    this.call.on('error', (err) => this.fail(`the stream failed: ${grpc.status[err.code] ?? err.code}: ${err.details}`));
    this.call.on('status', (status) => this.onStatus(status));
    this.send({ hello: this.hello() });
    return finished;
  }

  // Events are only as trustworthy as the keys they are checked against. GetAuthorityKey answers with
  // the current key and the store's key history, oldest first (docs/integrity.md "Key continuity"):
  // history signed before a rotation verifies with the key its signature names. Each key after the
  // first comes with its rotation, signed by the key before it and by itself, so the whole chain is
  // vouched for by any one of its keys: --authority-key pins one (obtained out of band), current or not.
  authorityKeys() {
    return new Promise((resolve, reject) => {
      const deadline = new Date(Date.now() + 10_000);
      this.authorityClient.GetAuthorityKey({}, { deadline }, (err, response) => {
        if (err) return reject(new Error(`GetAuthorityKey on ${this.options.target} failed: ${err.details || err.message}`));
        const history = response.keys.length ? response.keys : [{ key_id: response.key_id, public_key: response.public_key }];
        const keys = new Map();
        for (const [i, record] of history.entries()) {
          const broken = i > 0 && this.brokenRotation(history[i - 1], record);
          if (broken) return reject(new Error(`the Authority's key history does not hold: ${broken}`));
          keys.set(record.key_id, publicKeyFromRaw(record.public_key));
        }
        const last = history[history.length - 1];
        if (last.key_id !== response.key_id || !last.public_key.equals(response.public_key)) {
          return reject(new Error(`the Authority's key history ends with ${last.key_id}, not its current key ${response.key_id}`));
        }
        const pinned = this.options.authorityKeyHex?.toLowerCase();
        if (pinned !== undefined && !history.some((k) => k.public_key.toString('hex') === pinned)) {
          return reject(new Error(`the Authority key ${response.public_key.toString('hex')} is not the pinned key ${pinned}, nor rotated from it`));
        }
        log(`Authority key ${response.key_id}, ${keys.size} in its history${pinned ? ' (the pinned key among them)' : ''}`);
        resolve({ keyId: response.key_id, keys });
      });
    });
  }

  // Why the rotation recorded with `record` does not vouch for it as the successor of `previous`
  // (check_history() in missionweave_server/services/authority/keys.py), or '' when it does.
  brokenRotation(previous, record) {
    const envelope = record.rotation;
    if (!envelope || envelope.payload_type !== KEY_ROTATION_TYPE) return `no rotation record introduces ${record.key_id}`;
    const signedBy = (key) =>
      envelope.signatures.some(
        (s) => s.key_id === key.key_id && crypto.verify(null, pae(KEY_ROTATION_TYPE, envelope.payload), publicKeyFromRaw(key.public_key), s.sig),
      );
    let rotation;
    try {
      rotation = this.protos.AuthorityKeyRotation.deserialize(envelope.payload);
    } catch {
      return `the rotation to ${record.key_id} does not parse`;
    }
    const names =
      rotation.previous_key_id === previous.key_id &&
      rotation.previous_public_key.equals(previous.public_key) &&
      rotation.key_id === record.key_id &&
      rotation.public_key.equals(record.public_key);
    return names && signedBy(previous) && signedBy(record) ? '' : `the rotation from ${previous.key_id} to ${record.key_id} is not signed by both keys`;
  }

  // HELLO proves possession of the session key (the gateway looks up the public key registered for
  // "<agent>#session-<epoch>"): a fresh nonce and the current time against replays, the audience
  // (our target) against relaying the proof to another gateway.
  hello() {
    const { agentId, sessionEpoch, target } = this.options;
    const proof = this.protos.HelloProof.serialize({
      agent_id: agentId,
      session_epoch: sessionEpoch,
      issued_at: timestampNow(),
      nonce: crypto.randomBytes(16),
      audience: target,
    });
    const keyId = `${agentId}#session-${sessionEpoch}`; // session_key_id() in missionweave/kernel/signing.py
    return {
      agent_id: agentId,
      session_epoch: sessionEpoch,
      proof: signEnvelope(proof, HELLO_PROOF_TYPE, this.sessionKey, keyId),
      client_version: CLIENT_VERSION,
    };
  }

  send(frame) {
    this.call.write({ frame });
  }

  onFrame(frame) {
    if (this.finished) return;
    // After the hang-up the gateway may still send events (the final ACK granted credits): they lie
    // beyond what we acknowledged and come again on the next subscription, so they are not ours to
    // print. An ERROR still counts: it may be the answer to the final ACK.
    if (this.finishing && frame.frame !== 'error') return;
    try {
      this.dispatch(frame);
    } catch (err) {
      // A frame we cannot make sense of (e.g. a payload that is not an Event) ends the run with a
      // message instead of a stack trace from inside grpc-js.
      this.fail(`cannot process a ${frame.frame} frame: ${err.message}`);
    }
  }

  dispatch(frame) {
    switch (frame.frame) {
      case 'welcome':
        log(`connected as ${this.options.agentId} (session ${this.options.sessionEpoch}, connection ${frame.welcome.connection_id})`);
        this.subscribe();
        break;
      case 'flow':
        this.onFlow(frame.flow);
        break;
      case 'event':
        this.onEvents(frame.event);
        break;
      case 'error': {
        const { code, rejection, fatal } = frame.error;
        this.fail(`the gateway refused: ${String(code).replace('GATEWAY_ERROR_CODE_', '')}: ${rejection?.message ?? ''}${fatal ? ' (fatal)' : ''}`);
        break;
      }
      case 'cursor_too_old':
        this.fail(
          `sequence ${this.cursor} is older than the online log (CURSOR_TOO_OLD); this example does not restore ` +
            `snapshots: start again with --after-sequence ${frame.cursor_too_old.snapshot_sequence} or use the Python SDK`,
        );
        break;
      default:
        break; // RESULT: this agent sends no commands
    }
  }

  subscribe() {
    const { groupId, credits } = this.options;
    log(`subscribing to ${groupId} after sequence ${this.cursor} with ${credits} credits`);
    this.send({
      subscribe: {
        subscription_id: this.subscriptionId,
        group_id: groupId,
        after_sequence: this.cursor.toString(),
        initial_credits: credits,
      },
    });
  }

  onFlow(flow) {
    if (flow.reason === 'FLOW_REASON_SUBSCRIBED') {
      // MW-8-07: the gateway raises the start to the member's visibility start; nothing before it is
      // ours to see, so the cursor starts there.
      const start = BigInt(flow.effective_after_sequence);
      if (start > this.cursor) {
        log(`visibility starts after sequence ${start}`);
        this.window.startAt(start);
        this.cursor = start;
      }
      this.progressed();
    }
  }

  onEvents(frame) {
    if (frame.subscription_id !== this.subscriptionId) return;
    this.window.received(BigInt(frame.first_sequence), BigInt(frame.last_sequence));
    for (const envelope of frame.events) {
      const event = this.verifiedEvent(envelope);
      if (event === null) return; // fail() has ended the run
      const sequence = BigInt(event.sequence);
      // At-least-once delivery (MW-16-01): a repeat by id or by position is dropped (MW-16-02).
      if (sequence <= this.cursor || this.pending.has(sequence) || this.seenEventIds.has(event.event_id)) continue;
      this.pending.set(sequence, { last: sequence, event });
    }
    // Sequences the gateway did not deliver (attention filter, restricted Conversations) still move
    // the cursor: delivered plus skipped is the whole range of the frame.
    for (const range of frame.skipped) {
      const first = BigInt(range.first);
      const last = BigInt(range.last);
      if (last > this.cursor) this.pending.set(first > this.cursor ? first : this.cursor + 1n, { last, event: null });
    }
    this.release();
    this.progressed();
  }

  // Checks the Authority's signature over PAE(payload type, payload) before the payload is parsed:
  // the gateway only relays events, it cannot forge or alter them.
  verifiedEvent(envelope) {
    const payload = envelope.payload;
    if (envelope.payload_type !== EVENT_TYPE) {
      this.fail(`an event envelope has payload type ${envelope.payload_type}, not ${EVENT_TYPE}`);
      return null;
    }
    const { keys } = this.authority;
    const signature = envelope.signatures.find((s) => keys.has(s.key_id));
    if (signature === undefined || !crypto.verify(null, pae(EVENT_TYPE, payload), keys.get(signature.key_id), signature.sig)) {
      this.fail(`an event is not signed by a key of the Authority (${[...keys.keys()].join(', ')})`);
      return null;
    }
    const event = this.protos.Event.deserialize(payload);
    if (event.group_id !== this.options.groupId) {
      this.fail(`the gateway delivered an event of ${event.group_id} on the subscription to ${this.options.groupId}`);
      return null;
    }
    return event;
  }

  // Hands out every event that continues the cursor, in order; stops at the first gap.
  release() {
    let slot;
    while ((slot = this.pending.get(this.cursor + 1n)) !== undefined) {
      this.pending.delete(this.cursor + 1n);
      if (slot.event !== null) this.handle(slot.event);
      this.cursor = slot.last;
    }
    for (const first of this.pending.keys()) if (this.pending.get(first).last <= this.cursor) this.pending.delete(first);
  }

  // The "handler": one JSON line per event, written before the ACK that covers it is sent (stdout
  // writes are synchronous for files, and for pipes on Linux; Node flushes the rest before exiting).
  handle(event) {
    this.seenEventIds.add(event.event_id);
    if (this.seenEventIds.size > 65536) this.seenEventIds.delete(this.seenEventIds.values().next().value); // bounded memory
    const line = { sequence: Number(event.sequence), event_id: event.event_id, type: event.type, actor_id: event.actor_id };
    process.stdout.write(`${JSON.stringify(line)}\n`);
  }

  progressed() {
    this.window.processed(this.cursor);
    this.ack(false);
    const until = this.options.untilSequence;
    if (until !== undefined && this.cursor >= until) {
      this.finish();
      return;
    }
    // "Idle" = no further frame arrived before the event loop came round again: ACK whatever is left,
    // so a quiet Group is acknowledged promptly and a busy one in batches.
    if (this.idleAck === null) {
      this.idleAck = setImmediate(() => {
        this.idleAck = null;
        this.ack(true);
      });
    }
  }

  ack(idle) {
    if (this.finished || !this.window.due(this.cursor, idle)) return;
    const { cursor, credits } = this.window.take(this.cursor);
    this.send({
      ack: { cursors: [{ subscription_id: this.subscriptionId, group_id: this.options.groupId, cursor: cursor.toString(), credits }] },
    });
  }

  // The final ACK, then a half-close: the gateway reads every frame up to the end of our stream, so
  // when it ends the call with OK the ACK has been stored (MW-16-07).
  finish() {
    if (this.finishing || this.finished) return;
    this.finishing = true;
    if (this.idleAck !== null) clearImmediate(this.idleAck);
    this.idleAck = null;
    this.ack(true);
    log(`acknowledged through sequence ${this.window.acked}; closing`);
    this.call.end();
  }

  onStatus(status) {
    if (status.code !== grpc.status.OK) return; // 'error' reports it
    if (this.finishing) this.done(0);
    else this.fail(`the gateway ended the stream at sequence ${this.cursor}`);
  }

  fail(message) {
    if (this.finished) return;
    process.stderr.write(`agent.js: ${message}\n`);
    this.call?.cancel();
    this.done(1);
  }

  done(code) {
    if (this.finished) return;
    this.finished = true;
    clearTimeout(this.timer);
    if (this.idleAck !== null) clearImmediate(this.idleAck);
    this.authorityClient?.close();
    this.gatewayClient?.close();
    this.resolve?.(code);
  }
}

function log(message) {
  process.stderr.write(`agent.js: ${message}\n`);
}

async function main() {
  const options = readOptions(process.argv.slice(2));
  const sessionKey = readSessionKey(options.keyFile);
  const protos = loadProtos(options.protos);
  const agent = new Agent(options, protos, sessionKey);
  // Ctrl-C / SIGTERM: send the last ACK and hang up cleanly; a second signal leaves at once.
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.once(signal, () => {
      process.once(signal, () => process.exit(130));
      if (agent.call === undefined) process.exit(130);
      agent.finish();
    });
  }
  process.exitCode = await agent.run();
}

main().catch((err) => {
  process.stderr.write(`agent.js: ${err.message}\n`);
  process.exitCode = 1;
});
