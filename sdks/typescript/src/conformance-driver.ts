/**
 * The conformance driver: the SDK behind a JSON-lines protocol on stdin/stdout, so that the same
 * scenarios drive every SDK of the mesh. Configured by MWP_TARGET, MWP_AUDIENCE, MWP_AGENT_ID,
 * MWP_KEY_FILE, MWP_STATE_DIR; logs go to stderr only. After WELCOME it writes
 * `{"type":"ready","sdk":"typescript"}`; each request line (with an `id`) gets one answer line with
 * that `id` and `ok`; events and Worker progress are notifications.
 * @module
 */
import { createInterface } from "node:readline";
import type { JsonValue } from "@bufbuild/protobuf";
import { Agent } from "./agent.js";
import { bodyFromJson } from "./commands.js";
import { CommandRejected } from "./errors.js";
import { readKeyFile } from "./signing.js";
import { finishedLine, scriptedHandler, type ScriptMode } from "./conformance-script.js";
import { WorkerRuntime } from "./worker.js";

type Request = { id?: unknown; op?: unknown; [key: string]: unknown };

function write(line: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(line, (_, v: unknown) => (typeof v === "bigint" ? Number(v) : v))}\n`);
}

function log(message: string): void {
  process.stderr.write(`conformance-driver: ${message}\n`);
}

function required(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is required`);
  return value;
}

async function main(): Promise<void> {
  const target = required("MWP_TARGET");
  const agent = await Agent.connect({
    target,
    audience: process.env["MWP_AUDIENCE"] || target,
    identityId: required("MWP_AGENT_ID"),
    identityKey: readKeyFile(required("MWP_KEY_FILE")),
    stateDir: process.env["MWP_STATE_DIR"] || undefined,
    newSession: true,
    log,
  });
  write({ type: "ready", sdk: "typescript" });
  let runtime: WorkerRuntime | undefined;
  // One subscription per Group serves both the `subscribe` op's notifications and the Worker.
  const notified = new Set<string>();
  const follow = (group: string, credits: number): void => {
    agent.subscribe(
      group,
      (event) => {
        if (notified.has(group)) write({ type: "event", group, sequence: event.sequence, event_id: event.eventId, event_type: event.type });
        runtime?.handleEvent(group, event);
      },
      { credits, onFailed: (failure) => write({ type: "subscription_failed", group, error: failure.reason }) },
    );
  };

  async function answer(request: Request): Promise<Record<string, unknown>> {
    switch (request.op) {
      case "subscribe": {
        const group = String(request["group"]);
        if (notified.has(group)) throw new Error(`${group} is subscribed already`);
        if (agent.subscription(group) === undefined) follow(group, typeof request["credits"] === "number" ? request["credits"] : 256);
        notified.add(group);
        return {};
      }
      case "cursor":
        return { cursor: agent.cursors.load(String(request["group"])) };
      case "execute": {
        const body = bodyFromJson(String(request["kind"]), (request["body"] ?? {}) as JsonValue);
        const commandId = typeof request["command_id"] === "string" ? request["command_id"] : undefined;
        const result = await agent.execute(String(request["group"]), body, { commandId });
        const sequences = result.events.map((e) => agent.verifier().event(e).sequence);
        return { sequence: sequences.reduce((a, b) => (a > b ? a : b), 0n), replayed: result.replayed };
      }
      case "work": {
        const groups = Array.isArray(request["groups"]) ? request["groups"].map(String) : [];
        const handler = scriptedHandler(String(request["mode"]) as ScriptMode, String(request["content"] ?? ""), write);
        if (runtime !== undefined) throw new Error("the Worker runs already");
        runtime = new WorkerRuntime(agent, handler, { onFinished: (slot, outcome, error) => write(finishedLine(slot, outcome, error)) });
        for (const group of groups) if (agent.subscription(group) === undefined) follow(group, 256);
        runtime.serve(groups, { subscribe: false });
        return {};
      }
      case "close":
        await runtime?.close();
        await agent.close();
        return {};
      default:
        throw new Error(`unknown op ${JSON.stringify(request.op)}`);
    }
  }

  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let request: Request;
    try {
      request = JSON.parse(line) as Request;
    } catch {
      log(`not JSON: ${line}`);
      continue;
    }
    try {
      write({ id: request.id, ok: true, ...(await answer(request)) });
    } catch (err) {
      const failure: Record<string, unknown> = { id: request.id, ok: false, error: (err as Error).message };
      if (err instanceof CommandRejected) failure["reason"] = err.reasonName;
      write(failure);
    }
    if (request.op === "close") process.exit(0);
  }
  await runtime?.close();
  await agent.close();
}

main().catch((err: unknown) => {
  log((err as Error).stack ?? String(err));
  process.exit(1);
});
