/**
 * The SDK's small durable files, in the Python SDK's format (missionweave/sdk/files.py): JSON with
 * sorted keys, written to a temporary file (0600), fsynced, renamed, and the directory fsynced.
 * @module
 */
import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, statSync, chmodSync, unlinkSync, writeSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, basename, join } from "node:path";
import { AgentError } from "./errors.js";

/** JSON of `value` with object keys sorted at every level and Python's `json.dumps` separators (`", "`, `": "`). */
export function pythonJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(", ")}]`;
  const entries = Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}: ${pythonJson(v)}`).join(", ")}}`;
}

/** Writes `data` to `path` atomically and durably (temporary file 0600, fsync, rename, directory fsync). */
export function writeJsonAtomic(path: string, data: Record<string, unknown>): void {
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.tmp`);
  let fd: number;
  try {
    fd = openSync(tmp, "w", 0o600);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    fd = openSync(tmp, "w", 0o600);
  }
  try {
    try {
      writeSync(fd, pythonJson(data));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (err) {
    try {
      unlinkSync(tmp);
    } catch {
      // already gone
    }
    throw err;
  }
  const dir = openSync(dirname(path), "r"); // make the rename itself durable
  try {
    fsyncSync(dir);
  } finally {
    closeSync(dir);
  }
}

/** The JSON object in `path`, undefined when the file does not exist. */
export function readJson(path: string): Record<string, unknown> | undefined {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new AgentError(`${path} is unreadable (${(err as Error).message}); move it away to start over`);
  }
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (err) {
    throw new AgentError(`${path} is unreadable (${(err as Error).message}); move it away to start over`);
  }
  if (data === null || typeof data !== "object" || Array.isArray(data)) throw new AgentError(`${path} does not hold a JSON object`);
  return data as Record<string, unknown>;
}

/** Where an agent keeps its state by default: `$MWP_STATE_DIR`, else `$XDG_STATE_HOME/missionweave` or `~/.local/state/missionweave`. */
export function userStateDir(): string {
  const explicit = process.env["MWP_STATE_DIR"];
  if (explicit) return explicit;
  return join(process.env["XDG_STATE_HOME"] || join(homedir(), ".local", "state"), "missionweave");
}

/** `path` created if missing, readable by its owner only (0700): it holds a session's key. */
export function privateDir(path: string): string {
  mkdirSync(path, { recursive: true, mode: 0o700 });
  if (statSync(path).mode & 0o077) chmodSync(path, 0o700);
  return path;
}
