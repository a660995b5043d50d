/**
 * The SDK's errors, as the Python SDK names them (missionweave/sdk/errors.py): every one is an
 * {@link AgentError}; command refusals carry the Rejection reason name of docs/errors.md.
 * @module
 */
import type { Rejection } from "./gen/missionweave/v1/common_pb.js";
import { RejectionReason } from "./gen/missionweave/v1/common_pb.js";
import type { ErrorFrame } from "./gen/missionweave/v1/gateway_service_pb.js";
import { GatewayErrorCode } from "./gen/missionweave/v1/gateway_service_pb.js";

/** Base class of every error the SDK raises. */
export class AgentError extends Error {
  override name = "AgentError";
}

/** The name of an enum value (protobuf-es strips the shared prefix), or its number when this build does not know it. */
function enumName(table: Record<number, string>, value: number): string {
  return table[value] ?? String(value);
}

/** The name of a Rejection reason as docs/errors.md spells it, e.g. `OWNERSHIP_EPOCH_STALE`. */
export function reasonName(reason: RejectionReason): string {
  return enumName(RejectionReason as unknown as Record<number, string>, reason);
}

/** The name of a gateway error code without its prefix, e.g. `HELLO_INVALID`. */
export function gatewayCodeName(code: GatewayErrorCode): string {
  return enumName(GatewayErrorCode as unknown as Record<number, string>, code);
}

/** The Authority refused a command (RESULT with a Rejection); nothing was written. */
export class CommandRejected extends AgentError {
  override name = "CommandRejected";
  /** The reason without its prefix, e.g. `MEMBERSHIP_EPOCH_STALE`. */
  readonly reasonName: string;
  constructor(
    /** The refused command's id (re-sending it is answered the same way). */
    readonly commandId: string,
    /** The `missionweave.v1.Rejection` as received. */
    readonly rejection: Rejection,
  ) {
    super(`${reasonName(rejection.reason)}: ${rejection.message}`);
    this.reasonName = reasonName(rejection.reason);
  }
}

/** An ERROR frame from the gateway; `code` is its `GatewayErrorCode`. */
export class GatewayError extends AgentError {
  override name = "GatewayError";
  /** The gateway's code, e.g. `GatewayErrorCode.HELLO_INVALID`. */
  readonly code: GatewayErrorCode;
  /** Whether the gateway ends the stream after it. */
  readonly fatal: boolean;
  constructor(
    /** The frame as received. */
    readonly frame: ErrorFrame,
  ) {
    super(`${gatewayCodeName(frame.code)}: ${frame.rejection?.message ?? ""}`);
    this.code = frame.code;
    this.fatal = frame.fatal;
  }
}

/** An event, snapshot reference or snapshot whose Authority signature, chain link or digest does not check out. */
export class NotVerified extends AgentError {
  override name = "NotVerified";
}

/** The bytes received for a slot's input do not hash to its digest (MW-13.1-05): refused, not handed to the handler. */
export class InputNotVerified extends NotVerified {
  override name = "InputNotVerified";
}

/** A Group's subscription stopped for good (not a member, history unavailable, not verified, ...). */
export class SubscriptionFailed extends AgentError {
  override name = "SubscriptionFailed";
  constructor(
    /** The Group whose subscription stopped. */
    readonly groupId: string,
    /** Why: the gateway's code name, `NOT_VERIFIED`, or `HANDLER` (the handler threw). */
    readonly reason: string,
    message: string,
    /** The error that stopped it. */
    override readonly cause?: unknown,
  ) {
    super(`${groupId}: ${reason}: ${message}`);
  }
}

/** Another process of this identity opened a newer session: this agent stops rather than fence it back. */
export class SessionReplaced extends AgentError {
  override name = "SessionReplaced";
}

/** The agent was closed: no command, subscription or call can start any more. */
export class AgentClosed extends AgentError {
  override name = "AgentClosed";
}
