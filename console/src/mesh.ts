// A person's connection to the mesh: their session (opened with their identity key), the call
// proofs every read carries, and the commands they sign. Nothing here is trusted by the mesh for
// being sent by the console: each proof and command is checked as any client's.
import { create, toBinary, type DescMethodServerStreaming, type DescMethodUnary, type MessageInitShape, type MessageShape, type DescMessage } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { CallProofSchema } from "./gen/missionweave/v1/auth_pb";
import { SignedEnvelopeSchema, type SignedEnvelope } from "./gen/missionweave/v1/common_pb";
import { CommandSchema, type Command, type CommandResult } from "./gen/missionweave/v1/command_pb";
import { AuthorityService, type GroupState } from "./gen/missionweave/v1/authority_service_pb";
import { MembershipService, OpenSessionCommandSchema } from "./gen/missionweave/v1/membership_service_pb";
import { generateSessionKey, importKeyFile, randomBytes, saveSession, sign, type StoredSession } from "./keys";
import { Relay } from "./rpc";

export const COMMAND_TYPE = "application/vnd.missionweave.v1.command+protobuf";
export const OPEN_SESSION_TYPE = "application/vnd.missionweave.v1.open-session+protobuf";
export const CALL_PROOF_TYPE = "application/vnd.missionweave.v1.call-proof+protobuf";
export const EVENT_TYPE = "application/vnd.missionweave.v1.event+protobuf";

export function methodPath(method: { parent: { typeName: string }; name: string }): string {
  return `/${method.parent.typeName}/${method.name}`;
}

export function newId(prefix: string): string {
  const hex = Array.from(randomBytes(13), (b) => b.toString(16).padStart(2, "0")).join("");
  return `${prefix}_${hex.slice(0, 26)}`;
}

export interface ConsoleSettings {
  audience: string;
}

export class Mesh {
  readonly relay = new Relay();
  session: StoredSession | null = null;

  constructor(readonly settings: ConsoleSettings) {
    this.relay.proofs = (method) => this.callProof(method);
  }

  static async connect(): Promise<Mesh> {
    const response = await fetch("/api/config", { headers: { "X-MWP-Console": "1" } });
    if (!response.ok) throw new Error(`the console's configuration could not be read (HTTP ${response.status})`);
    return new Mesh((await response.json()) as ConsoleSettings);
  }

  get keyId(): string {
    if (!this.session) throw new Error("no session");
    return `${this.session.identityId}#session-${this.session.sessionEpoch}`;
  }

  /** Opens a session for `identityId` with the key in `keyFile`, which is dropped afterwards. */
  async login(identityId: string, keyFile: string): Promise<StoredSession> {
    const identityKey = await importKeyFile(keyFile);
    const { key, publicKey } = await generateSessionKey();
    const command = create(OpenSessionCommandSchema, {
      identityId,
      sessionPublicKey: publicKey,
      issuedAt: timestampNow(),
      nonce: randomBytes(16),
    });
    const payload = toBinary(OpenSessionCommandSchema, command);
    const envelope = create(SignedEnvelopeSchema, {
      payload,
      payloadType: OPEN_SESSION_TYPE,
      signatures: [{ keyId: `${identityId}#identity`, sig: await sign(identityKey, OPEN_SESSION_TYPE, payload) }],
    });
    const opened = await this.unary(MembershipService.method.openSession, { command: envelope });
    const session: StoredSession = { identityId, sessionEpoch: opened.session?.sessionEpoch ?? 0n, key };
    await saveSession(session);
    this.session = session;
    return session;
  }

  private async callProof(method: string): Promise<Uint8Array | null> {
    if (!this.session) return null;
    const proof = create(CallProofSchema, {
      identityId: this.session.identityId,
      sessionEpoch: this.session.sessionEpoch,
      method,
      audience: this.settings.audience,
      issuedAt: timestampNow(),
      nonce: randomBytes(16),
    });
    const payload = toBinary(CallProofSchema, proof);
    const envelope = create(SignedEnvelopeSchema, {
      payload,
      payloadType: CALL_PROOF_TYPE,
      signatures: [{ keyId: this.keyId, sig: await sign(this.session.key, CALL_PROOF_TYPE, payload) }],
    });
    return toBinary(SignedEnvelopeSchema, envelope);
  }

  unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    request: MessageInitShape<I>,
  ): Promise<MessageShape<O>> {
    return this.relay.unary(methodPath(method), method.input, method.output, create(method.input, request));
  }

  stream<I extends DescMessage, O extends DescMessage>(
    method: DescMethodServerStreaming<I, O>,
    request: MessageInitShape<I>,
    signal?: AbortSignal,
  ): AsyncGenerator<MessageShape<O>> {
    return this.relay.stream(methodPath(method), method.input, method.output, create(method.input, request), signal);
  }

  async groupState(groupId: string): Promise<GroupState | undefined> {
    return (await this.unary(AuthorityService.method.getGroupState, { groupId })).state;
  }

  /** The command a person is asked to sign: complete, with their current membership epoch. */
  async draft(groupId: string, body: Command["body"]): Promise<Command> {
    if (!this.session) throw new Error("no session");
    // A command creating its Group names membership epoch 0 (there is no Group to read yet).
    const state = body.case?.startsWith("missionCreate") ? undefined : await this.groupState(groupId);
    const member = state?.memberships.find((m) => m.memberId === this.session?.identityId && m.active);
    return create(CommandSchema, {
      commandId: newId("cmd"),
      groupId,
      actorId: this.session.identityId,
      sessionEpoch: this.session.sessionEpoch,
      membershipEpoch: member?.membershipEpoch ?? 0n,
      issuedAt: timestampNow(),
      body,
    });
  }

  async signCommand(command: Command): Promise<SignedEnvelope> {
    if (!this.session) throw new Error("no session");
    const payload = toBinary(CommandSchema, command);
    return create(SignedEnvelopeSchema, {
      payload,
      payloadType: COMMAND_TYPE,
      signatures: [{ keyId: this.keyId, sig: await sign(this.session.key, COMMAND_TYPE, payload) }],
    });
  }

  async execute(command: Command): Promise<CommandResult | undefined> {
    const envelope = await this.signCommand(command);
    return (await this.unary(AuthorityService.method.executeCommand, { command: envelope })).result;
  }
}
