/**
 * The agent: one gateway stream per session (GatewayService.Connect) carrying every subscription and
 * command, as missionweave/sdk/agent.py. HELLO with a session-key proof, WELCOME, SUBSCRIBE each Group
 * from its durable cursor, re-send the commands still waiting; on a break, a capped jittered
 * exponential delay and again. The session is reused from `session.json` until the gateway refuses it.
 * @module
 */
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Backoff, sleep, within } from "./backoff.js";
import { AsyncQueue } from "./async-queue.js";
import { buildCommand, commandFrame, PendingCommands, type CommandBody, type CommandOptions } from "./commands.js";
import { CursorStore } from "./cursors.js";
import { AgentClosed, AgentError, CommandRejected, GatewayError, SessionReplaced } from "./errors.js";
import { verifiedSnapshot, type AuthorityVerifier } from "./event-verification.js";
import type { GroupSnapshot } from "./gen/missionweave/v1/authority_service_pb.js";
import type { SignedEnvelope } from "./gen/missionweave/v1/common_pb.js";
import { RejectionReason } from "./gen/missionweave/v1/common_pb.js";
import type { CommandResult } from "./gen/missionweave/v1/command_pb.js";
import {
  ClientFrameSchema,
  ConnectRequestSchema,
  GatewayErrorCode,
  GetSnapshotRequestSchema,
  HelloFrameSchema,
  type ClientFrame,
  type ConnectRequest,
  type ServerFrame,
} from "./gen/missionweave/v1/gateway_service_pb.js";
import { MeshClient, membershipEpoch, type MeshOptions } from "./mesh-client.js";
import { openSession, renewable, SessionFile, sessionProof, type SessionSigner } from "./sessions.js";
import { privateDir, userStateDir } from "./files.js";
import type { SigningKey } from "./signing.js";
import { Subscription, type EventHandler, type SubscribeOptions, type SubscriptionHost } from "./subscription.js";

/** What an agent is. */
export interface AgentOptions extends MeshOptions {
  /** The agent's identity id. */
  readonly identityId: string;
  /** Its identity key (`readKeyFile` of what `mwp keygen` wrote): it only signs OpenSession. */
  readonly identityKey?: SigningKey;
  /** A session opened elsewhere, used as it is (no identity key: never renewed, never saved). */
  readonly session?: SessionSigner;
  /** Where `<identity>/session.json` and `<identity>/cursors.json` live (default `userStateDir()`). */
  readonly stateDir?: string;
  /** Open a new session at start instead of reusing the saved one (a Worker runtime does: D213). */
  readonly newSession?: boolean;
  /** Pin the Authority key (hex), current or rotated away from; default: trust GetAuthorityKey. */
  readonly authorityKeyHex?: string;
  /** How long a command waits for its RESULT, in ms (default 30,000). */
  readonly commandTimeoutMs?: number;
  /** How long running handlers may take to finish at close, in ms (default 5,000). */
  readonly graceMs?: number;
  /** Where log lines go (default: stderr). */
  readonly log?: (message: string) => void;
}

const CLIENT_VERSION = "missionweave-sdk-typescript/0.1.0";
const STALE_MEMBERSHIP = new Set([RejectionReason.MEMBERSHIP_EPOCH_STALE, RejectionReason.NOT_A_MEMBER]);

interface Link {
  readonly queue: AsyncQueue<ConnectRequest>;
  readonly abort: AbortController;
  welcomed: boolean;
}

/** An agent of the mesh: `Agent.connect(options)`, then `subscribe`, `execute`, `close`. */
export class Agent implements SubscriptionHost {
  /** The mesh's unary services, with call proofs of this agent's session. */
  readonly mesh: MeshClient;
  /** The agent's cursor file. */
  readonly cursors: CursorStore;
  /** `<stateDir>/<identity>`. */
  readonly directory: string;
  private readonly sessionFile: SessionFile;
  private session: SessionSigner | undefined;
  private sessionProven = false;
  private authority: AuthorityVerifier | undefined;
  private readonly subscriptions = new Map<string, Subscription>();
  private readonly commands = new PendingCommands();
  private readonly epochs = new Map<string, bigint>();
  private link: Link | undefined;
  private closing = false;
  private failure: AgentError | undefined;
  private numbers = 0;
  private running: Promise<void> | undefined;
  private readonly connectedWaiters: Array<{ resolve: () => void; reject: (err: unknown) => void }> = [];
  private readonly backoff = new Backoff(200, 30_000);

  private constructor(readonly options: AgentOptions) {
    this.mesh = new MeshClient(options);
    this.directory = privateDir(join(options.stateDir ?? userStateDir(), options.identityId));
    this.sessionFile = new SessionFile(join(this.directory, "session.json"), options.identityId);
    this.cursors = new CursorStore(this.directory, options.identityId);
  }

  /** Starts an agent and resolves once its first WELCOME arrived (raises what retrying cannot fix). */
  static async connect(options: AgentOptions): Promise<Agent> {
    const agent = new Agent(options);
    if ((options.identityKey === undefined) === (options.session === undefined)) throw new AgentError("give identityKey or session");
    agent.session = options.session ?? (options.newSession ? undefined : agent.sessionFile.load());
    if (agent.session === undefined) agent.session = await agent.openNewSession();
    agent.mesh.signer = agent.session;
    agent.authority = await agent.mesh.authorityVerifier(options.authorityKeyHex);
    const connected = agent.waitConnected();
    agent.running = agent.run();
    await connected;
    return agent;
  }

  /** The identity the agent acts as. */
  get identityId(): string {
    return this.options.identityId;
  }

  /** The current session. */
  get signer(): SessionSigner {
    if (this.session === undefined) throw new AgentError("no session is open");
    return this.session;
  }

  /** Resolves once a stream is up (immediately when it is). */
  waitConnected(): Promise<void> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.link?.welcomed) return Promise.resolve();
    return new Promise((resolve, reject) => this.connectedWaiters.push({ resolve, reject }));
  }

  /** Follows a Group: `handler` gets each verified event once, in order; one subscription per Group. */
  subscribe(groupId: string, handler: EventHandler, options: SubscribeOptions = {}): Subscription {
    if (this.closing || this.failure !== undefined) throw this.failure ?? new AgentClosed("the agent is closed");
    const existing = this.subscriptions.get(groupId);
    if (existing !== undefined && !existing.stopped) throw new AgentError(`${groupId} is subscribed already`);
    const subscription = new Subscription(this, groupId, handler, options);
    this.subscriptions.set(groupId, subscription);
    if (this.link?.welcomed) subscription.open();
    return subscription;
  }

  /** The Group's subscription, if any. */
  subscription(groupId: string): Subscription | undefined {
    return this.subscriptions.get(groupId);
  }

  /**
   * Signs a command as the session, sends it as a COMMAND frame (re-sent with the same id after a
   * reconnect) and resolves with its RESULT. Rejects with {@link CommandRejected} (the Rejection),
   * {@link GatewayError}, {@link AgentClosed} or {@link SessionReplaced}.
   */
  async execute(groupId: string, body: CommandBody, options: CommandOptions = {}): Promise<CommandResult> {
    if (this.closing) throw new AgentClosed("the agent is closed");
    const epoch = options.membershipEpoch ?? (await this.membershipEpoch(groupId));
    const signer = this.signer;
    const frame = commandFrame(signer, buildCommand(signer, groupId, body, epoch, options));
    const answered = this.commands.add(frame);
    this.send({ case: "command", value: frame }); // while disconnected: sent after the next WELCOME
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new AgentError(`no RESULT for ${frame.commandId}; it may still be applied: retry with commandId ${frame.commandId}`)),
        this.options.commandTimeoutMs ?? 30_000,
      );
    });
    try {
      return await Promise.race([answered, timeout]);
    } catch (err) {
      if (err instanceof CommandRejected && STALE_MEMBERSHIP.has(err.rejection.reason)) this.epochs.delete(groupId);
      throw err;
    } finally {
      clearTimeout(timer);
      this.commands.forget(frame.commandId);
    }
  }

  /** The agent's active Membership epoch in the Group (cached; dropped after a stale refusal). */
  async membershipEpoch(groupId: string): Promise<bigint> {
    let epoch = this.epochs.get(groupId);
    if (epoch === undefined) {
      epoch = membershipEpoch(await this.mesh.groupState(groupId), this.identityId);
      if (epoch === 0n) throw new AgentError(`${this.identityId} holds no active Membership in ${groupId}`);
      this.epochs.set(groupId, epoch);
    }
    return epoch;
  }

  /** Lets running handlers finish (`graceMs`), sends the final ACKs, half-closes the stream, and stops. */
  async close(): Promise<void> {
    if (this.closing) return this.running;
    this.closing = true;
    const grace = this.options.graceMs ?? 5_000;
    await Promise.all([...this.subscriptions.values()].map((s) => s.drain(grace)));
    this.commands.failAll(new AgentClosed("the agent was closed"));
    const link = this.link;
    if (link !== undefined) {
      link.queue.end(); // the gateway reads every frame up to the half-close: the ACKs are stored
      await within(this.running, 5_000);
      link.abort.abort();
    }
    await this.running;
    this.mesh.close();
  }

  // ------------------------------------------------------------------ SubscriptionHost

  /** @internal Sends a frame on the current stream; false while disconnected. */
  send(frame: ClientFrame["frame"]): boolean {
    const link = this.link;
    if (link === undefined || !link.welcomed) return false;
    return link.queue.push(create(ConnectRequestSchema, { frame: create(ClientFrameSchema, { frame }) }));
  }

  /** @internal Whether a stream is up. */
  connected(): boolean {
    return this.link?.welcomed === true;
  }

  /** @internal The Authority's verifier. */
  verifier(): AuthorityVerifier {
    if (this.authority === undefined) throw new AgentError("the Authority's key is not known yet");
    return this.authority;
  }

  /** @internal A fresh subscription id. */
  nextSubscriptionId(): string {
    return `s${++this.numbers}`;
  }

  /** @internal The snapshot a CURSOR_TOO_OLD's signed reference names, fetched and verified (MW-16-12). */
  snapshot(reference: SignedEnvelope): Promise<GroupSnapshot> {
    return verifiedSnapshot(this.verifier(), reference, this.identityId, (asked) =>
      this.mesh.gateway.getSnapshot(
        create(GetSnapshotRequestSchema, { groupId: asked.groupId, digest: asked.digest, proof: sessionProof(this.signer, this.mesh.audience) }),
        { timeoutMs: 30_000 },
      ),
    );
  }

  /** @internal Logs a line. */
  log(message: string): void {
    (this.options.log ?? ((m: string) => process.stderr.write(`missionweave: ${m}\n`)))(`${this.identityId}: ${message}`);
  }

  // ------------------------------------------------------------------ the connection loop

  private async openNewSession(): Promise<SessionSigner> {
    if (this.options.identityKey === undefined) throw new AgentError("no identity key to open a session with");
    const signer = await openSession(this.mesh.membership, this.identityId, this.options.identityKey, this.sessionFile);
    this.sessionProven = false;
    this.mesh.signer = signer;
    this.epochs.clear();
    return signer;
  }

  private async run(): Promise<void> {
    let first = true;
    let renewedFor = -1n;
    while (!this.closing) {
      try {
        await this.stream();
        if (this.closing) break;
        this.log("the gateway ended the stream; reconnecting");
      } catch (err) {
        if (this.closing) break;
        if (err instanceof GatewayError && !this.link?.welcomed) {
          // A saved session the gateway refuses is replaced once; a session that was working and is
          // now stale was replaced by another process of this identity: stop rather than fence it.
          const epoch = this.signer.sessionEpoch;
          if (renewable(err) && this.sessionProven && err.code === GatewayErrorCode.SESSION_STALE) {
            this.stop(new SessionReplaced(`session ${epoch} of ${this.identityId} was replaced by a newer one`));
            return;
          }
          if (renewable(err) && renewedFor !== epoch && !this.sessionProven && this.options.identityKey !== undefined) {
            renewedFor = epoch;
            try {
              this.session = await this.openNewSession();
              renewedFor = this.session.sessionEpoch;
              continue;
            } catch (opening) {
              err = opening;
            }
          } else if (first || err.code === GatewayErrorCode.HELLO_INVALID) {
            this.stop(err);
            return;
          }
        }
        this.log(`the stream broke: ${(err as Error).message}`);
      }
      first = false;
      await sleep(this.backoff.next());
    }
  }

  /** One stream: HELLO, then frames until it ends. */
  private async stream(): Promise<void> {
    const link: Link = { queue: new AsyncQueue(), abort: new AbortController(), welcomed: false };
    this.link = link;
    const signer = this.signer;
    const hello = create(HelloFrameSchema, {
      agentId: signer.identityId,
      sessionEpoch: signer.sessionEpoch,
      proof: sessionProof(signer, this.mesh.audience),
      clientVersion: CLIENT_VERSION,
      acceptsFrameBatches: true,
    });
    link.queue.push(create(ConnectRequestSchema, { frame: create(ClientFrameSchema, { frame: { case: "hello", value: hello } }) }));
    try {
      for await (const response of this.mesh.gateway.connect(link.queue, { signal: link.abort.signal })) {
        for (const frame of [response.frame, ...response.moreFrames]) if (frame !== undefined) this.dispatch(link, frame);
      }
    } finally {
      link.welcomed = false;
      link.queue.end();
    }
  }

  private dispatch(link: Link, frame: ServerFrame): void {
    const body = frame.frame;
    switch (body.case) {
      case "welcome":
        link.welcomed = true;
        this.sessionProven = true;
        this.backoff.reset();
        for (const waiter of this.connectedWaiters.splice(0)) waiter.resolve();
        for (const subscription of this.subscriptions.values()) subscription.open();
        for (const command of this.commands.frames()) this.send({ case: "command", value: command });
        return;
      case "result":
        this.commands.result(body.value);
        return;
      case "event":
        this.bySubscription(body.value.subscriptionId)?.onEvents(body.value);
        return;
      case "flow":
        this.bySubscription(body.value.subscriptionId)?.onFlow(body.value);
        return;
      case "cursorTooOld":
        void this.bySubscription(body.value.subscriptionId)?.onCursorTooOld(body.value);
        return;
      case "error": {
        const error = body.value;
        if (!link.welcomed) throw new GatewayError(error);
        if (error.commandId) this.commands.error(error);
        else if (error.subscriptionId) this.bySubscription(error.subscriptionId)?.onError(error);
        else this.log(`the gateway refused a frame: ${new GatewayError(error).message}`);
        return;
      }
      default:
        return; // FETCHED: this SDK sends no FETCH yet
    }
  }

  private bySubscription(subscriptionId: string): Subscription | undefined {
    for (const subscription of this.subscriptions.values()) if (subscription.subscriptionId === subscriptionId) return subscription;
    return undefined;
  }

  private stop(err: AgentError): void {
    this.failure = err;
    this.closing = true;
    this.log(`stopped: ${err.message}`);
    for (const waiter of this.connectedWaiters.splice(0)) waiter.reject(err);
    this.commands.failAll(err);
    for (const subscription of this.subscriptions.values()) subscription.fail(err.name === "SessionReplaced" ? "SESSION_REPLACED" : "AGENT_STOPPED", err);
  }
}
