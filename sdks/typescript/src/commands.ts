/**
 * Commands: a `missionweave.v1.Command` built around one body of its oneof, signed by the session key
 * (payload type `...command+protobuf`), and the table of COMMAND frames waiting for their RESULT, which
 * the agent re-sends with the same command id after a reconnect (the Authority answers a repeat
 * idempotently).
 * @module
 */
import { create, fromJson, toBinary, type JsonValue } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { AgentError, CommandRejected, GatewayError } from "./errors.js";
import { CommandSchema, type Command, type CommandResult } from "./gen/missionweave/v1/command_pb.js";
import { CommandFrameSchema, type CommandFrame, type ErrorFrame, type ResultFrame } from "./gen/missionweave/v1/gateway_service_pb.js";
import type { SessionSigner } from "./sessions.js";
import { COMMAND_TYPE, newId } from "./signing.js";

/** One body of `Command.body`, e.g. `{ case: "messagePost", value: create(MessagePostSchema, {...}) }`. */
export type CommandBody = Exclude<Command["body"], { case: undefined }>;

/** The oneof case of `Command.body` a proto field name (`message_post`) stands for, with its body parsed from proto3 JSON. */
export function bodyFromJson(kind: string, json: JsonValue): CommandBody {
  const field = CommandSchema.fields.find((f) => f.name === kind && f.oneof?.name === "body");
  if (field === undefined || field.message === undefined) throw new AgentError(`${kind} is not a command kind (a field of Command.body)`);
  return { case: field.localName, value: fromJson(field.message, json) } as CommandBody;
}

/** The sequence of the last of a command's (verified) events: 0n when it appended none. */
export function lastSequence(events: readonly { readonly sequence: bigint }[]): bigint {
  return events.reduce((max, e) => (e.sequence > max ? e.sequence : max), 0n);
}

/** Options of a command. */
export interface CommandOptions {
  /** Makes retries idempotent: the Authority answers a repeat with the stored result (`replayed`). */
  readonly commandId?: string;
  /** The actor's Membership epoch in the Group (read from the Group state when not given). */
  readonly membershipEpoch?: bigint;
  /** Correlates the events the command appends. */
  readonly correlationId?: string;
}

/** The Command of `body` in `groupId` as `signer`'s session. */
export function buildCommand(signer: SessionSigner, groupId: string, body: CommandBody, membershipEpoch: bigint, options: CommandOptions = {}): Command {
  return create(CommandSchema, {
    commandId: options.commandId ?? newId("cmd"),
    groupId,
    actorId: signer.identityId,
    sessionEpoch: signer.sessionEpoch,
    membershipEpoch,
    issuedAt: timestampNow(),
    correlationId: options.correlationId ?? "",
    body,
  });
}

/** The COMMAND frame of `command` signed by `signer`. */
export function commandFrame(signer: SessionSigner, command: Command): CommandFrame {
  return create(CommandFrameSchema, { commandId: command.commandId, command: signer.sign(toBinary(CommandSchema, command), COMMAND_TYPE) });
}

interface Waiting {
  readonly frame: CommandFrame;
  resolve(result: CommandResult): void;
  reject(err: unknown): void;
}

/** COMMAND frames waiting for their RESULT, by command id. */
export class PendingCommands {
  private waiting = new Map<string, Waiting>();

  /** Registers `frame`; the promise settles with its RESULT (or a refusal). */
  add(frame: CommandFrame): Promise<CommandResult> {
    return new Promise((resolve, reject) => this.waiting.set(frame.commandId, { frame, resolve, reject }));
  }

  /** Every frame still waiting, to re-send after a reconnect. */
  frames(): CommandFrame[] {
    return [...this.waiting.values()].map((w) => w.frame);
  }

  /** A RESULT: the accepted result, or the Rejection as {@link CommandRejected}. */
  result(frame: ResultFrame): void {
    const waiting = this.take(frame.commandId);
    if (waiting === undefined) return;
    if (frame.outcome.case === "result") waiting.resolve(frame.outcome.value);
    else if (frame.outcome.case === "rejection") waiting.reject(new CommandRejected(frame.commandId, frame.outcome.value));
    else waiting.reject(new AgentError(`RESULT of ${frame.commandId} carries no outcome`));
  }

  /** An ERROR frame naming a command (COMMAND_ID_MISMATCH, AUTHORITY_UNAVAILABLE, ...). */
  error(frame: ErrorFrame): void {
    this.take(frame.commandId)?.reject(new GatewayError(frame));
  }

  /** Forgets `commandId` (answered, timed out). */
  forget(commandId: string): void {
    this.waiting.delete(commandId);
  }

  /** Fails every waiting command with `err` (the agent closed or was replaced). */
  failAll(err: unknown): void {
    for (const waiting of this.waiting.values()) waiting.reject(err);
    this.waiting.clear();
  }

  private take(commandId: string): Waiting | undefined {
    const waiting = this.waiting.get(commandId);
    this.waiting.delete(commandId);
    return waiting;
  }
}
