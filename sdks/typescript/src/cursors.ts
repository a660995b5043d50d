/**
 * An agent's durable cursors (MW-16-06), every Group's in one file `<dir>/cursors.json` in the Python
 * SDK's format (`{"agent_id": ..., "cursors": {group: sequence}}`), written in rounds (D143): every
 * cursor asked for since the last round in one atomic write, at most one round per interval.
 * The file only moves forward.
 * @module
 */
import { join } from "node:path";
import { AgentError } from "./errors.js";
import { readJson, writeJsonAtomic } from "./files.js";

/** The name of the cursor file in an agent's state directory. */
export const CURSORS_FILE = "cursors.json";
/** The least time between two rounds, in ms: what an ACK may wait for the disk. */
export const CURSOR_INTERVAL_MS = 20;

// ids.py ID_PATTERN, and never a hidden file (files.py `file_name`).
const GROUP_ID = /^(?!\.)[A-Za-z0-9._:-]{1,128}$/;

/** The cursors of one agent, saved in rounds; one per agent. */
export class CursorStore {
  /** The file. */
  readonly path: string;
  private saved: Map<string, bigint>;
  private asked = new Map<string, bigint>();
  private round: { promise: Promise<void>; resolve: () => void; reject: (err: unknown) => void } | undefined;
  private writing = false;
  private lastWrite = 0;

  constructor(
    /** `<stateDir>/<identity>`. */
    readonly directory: string,
    /** The agent whose file it is. */
    readonly agentId: string,
    /** The least time between two rounds, in ms. */
    readonly intervalMs = CURSOR_INTERVAL_MS,
  ) {
    this.path = join(directory, CURSORS_FILE);
    this.saved = this.read();
  }

  /** The saved cursor of `groupId`, 0n when there is none. */
  load(groupId: string): bigint {
    return this.saved.get(groupId) ?? 0n;
  }

  /** Resolves once `cursor` (or a later one) of `groupId` is durable; rejects with the round's write error. */
  save(groupId: string, cursor: bigint): Promise<void> {
    const held = this.asked.get(groupId) ?? this.saved.get(groupId) ?? 0n;
    if (cursor < held) return Promise.reject(new AgentError(`cursor ${cursor} of ${groupId} would move ${this.path} backwards from ${held}`));
    if (cursor === (this.saved.get(groupId) ?? 0n) && !this.asked.has(groupId)) return Promise.resolve();
    this.asked.set(groupId, cursor);
    if (this.round === undefined) {
      let resolve!: () => void;
      let reject!: (err: unknown) => void;
      const promise = new Promise<void>((ok, fail) => {
        resolve = ok;
        reject = fail;
      });
      promise.catch(() => undefined); // a round whose waiters went away must not be unhandled
      this.round = { promise, resolve, reject };
    }
    const round = this.round.promise;
    if (!this.writing) void this.writeRounds();
    return round;
  }

  private async writeRounds(): Promise<void> {
    this.writing = true;
    try {
      while (this.asked.size > 0) {
        const wait = this.lastWrite + this.intervalMs - Date.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        const asked = this.asked;
        const round = this.round;
        this.asked = new Map();
        this.round = undefined;
        const cursors = new Map([...this.saved, ...asked]);
        try {
          writeJsonAtomic(this.path, { agent_id: this.agentId, cursors: Object.fromEntries([...cursors].map(([g, c]) => [g, Number(c)])) });
          this.saved = cursors;
          round?.resolve();
        } catch (err) {
          round?.reject(err);
        } finally {
          this.lastWrite = Date.now();
        }
      }
    } finally {
      this.writing = false;
    }
  }

  private read(): Map<string, bigint> {
    const data = readJson(this.path);
    if (data === undefined) return new Map();
    const cursors = data["cursors"];
    if (data["agent_id"] !== this.agentId || cursors === null || typeof cursors !== "object" || Array.isArray(cursors)) {
      throw new AgentError(`${this.path} is not the cursor file of ${this.agentId}`);
    }
    const out = new Map<string, bigint>();
    for (const [groupId, cursor] of Object.entries(cursors as Record<string, unknown>)) {
      if (typeof cursor !== "number" || !Number.isInteger(cursor) || cursor < 0 || !GROUP_ID.test(groupId)) {
        throw new AgentError(`${this.path} holds ${JSON.stringify(cursor)} as the cursor of ${JSON.stringify(groupId)}`);
      }
      out.set(groupId, BigInt(cursor));
    }
    return out;
  }
}
