#!/usr/bin/env node
// A MissionWeave agent in Node.js on the TypeScript SDK (sdks/typescript, @missionweave/sdk): it
// follows one Group and prints one JSON line per event.
//
//   HELLO (session-key proof) -> WELCOME -> SUBSCRIBE -> EVENT ... -> ACK (cursor + credits) ...
//
// The SDK verifies every event against the Authority's key history (GetAuthorityKey; --authority-key
// pins one key of it) and the event chain before the handler sees it, hands events over in sequence
// order exactly once, writes the cursor and ACKs it with credit grants, reconnects after a break.
// With --until-sequence the agent exits 0 once an ACK at or beyond that sequence is stored (the
// final ACK, then a half-close the gateway answers once it stored it); without it the agent follows
// the Group until Ctrl-C. Diagnostics go to stderr.
//
// It runs under an existing session (--session-epoch and its session key), not its identity key, so
// it never opens a session of its own; its cursor file lives in a temporary directory, and
// --after-sequence says where to start.
//
// Usage: node agent.js --agent coord --session-epoch 1 --key-file coord.key --group grp_...
//        (node agent.js --help lists every flag and its environment variable)
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { Agent, SessionSigner, readKeyFile } from '@missionweave/sdk';

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
    tls: tls ? { ...tlsFiles, serverName } : null,
  };
}

function usageError(message) {
  process.stderr.write(`agent.js: ${message}\n\n${usage()}`);
  process.exit(2);
}

// ============================================================================ the agent

function log(message) {
  process.stderr.write(`agent.js: ${message}\n`);
}

function readTls(tls) {
  if (tls === null) return undefined;
  const read = (file, what) => {
    if (file === undefined) return undefined;
    try {
      return readFileSync(file);
    } catch (err) {
      throw new Error(`cannot read the TLS ${what} ${file}: ${err.message}`);
    }
  };
  return { ca: read(tls.ca, 'CA bundle'), cert: read(tls.cert, 'client certificate'), key: read(tls.key, 'client key'), serverName: tls.serverName };
}

// The handler: one JSON line per event, written before the ACK that covers it (stdout writes are
// synchronous for files, and for pipes on Linux).
function print(event) {
  const line = { sequence: Number(event.sequence), event_id: event.eventId, type: event.type, actor_id: event.actorId };
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

async function main() {
  const options = readOptions(process.argv.slice(2));
  const stateDir = mkdtempSync(join(tmpdir(), 'mwp-node-agent-'));
  let agent;
  try {
    agent = await Agent.connect({
      target: options.target,
      tls: readTls(options.tls),
      identityId: options.agentId,
      session: new SessionSigner(options.agentId, BigInt(options.sessionEpoch), readKeyFile(options.keyFile)),
      authorityKeyHex: options.authorityKeyHex,
      stateDir,
      log,
    });
    log(`connected as ${options.agentId} (session ${options.sessionEpoch})`);
    let failed;
    const subscription = agent.subscribe(options.groupId, print, {
      credits: options.credits,
      afterSequence: options.afterSequence,
      onFailed: (failure) => (failed = failure),
    });
    // Ctrl-C / SIGTERM: the last ACK and a clean hang-up; a second signal leaves at once.
    const stopped = new Promise((resolve) => {
      for (const signal of ['SIGINT', 'SIGTERM']) {
        process.once(signal, () => {
          process.once(signal, () => process.exit(130));
          resolve();
        });
      }
    });
    if (options.untilSequence === undefined) {
      await Promise.race([stopped, subscription.reached(2n ** 64n - 1n)]);
    } else {
      let timer;
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`timed out after ${options.timeoutMs / 1000} s at sequence ${subscription.cursor}, waiting for ${options.untilSequence}`)),
          options.timeoutMs,
        );
      });
      try {
        await Promise.race([subscription.reached(options.untilSequence), stopped, timeout]);
      } finally {
        clearTimeout(timer);
      }
    }
    if (failed !== undefined) throw failed;
    await agent.close();
    log(`acknowledged through sequence ${subscription.cursor}; closed`);
  } catch (err) {
    log(err.message);
    await agent?.close();
    process.exitCode = 1;
  } finally {
    rmSync(stateDir, { recursive: true, force: true });
  }
}

await main();
