/**
 * A client of the mesh's unary and one-way streaming RPCs over real gRPC (HTTP/2, plaintext or TLS),
 * every call that needs one carrying a fresh call proof of the current session
 * (missionweave/sdk/client.py `MeshClient`, credentials.py `CallProofs`).
 * @module
 */
import { create } from "@bufbuild/protobuf";
import { createClient, type Client, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { callProofInterceptor } from "./call-proofs.js";
import { AgentError } from "./errors.js";
import { AuthorityVerifier } from "./event-verification.js";
import { ArtifactService } from "./gen/missionweave/v1/artifact_service_pb.js";
import { AuthorityService, GetAuthorityKeyRequestSchema, GetGroupStateRequestSchema, type GroupState } from "./gen/missionweave/v1/authority_service_pb.js";
import { GatewayService } from "./gen/missionweave/v1/gateway_service_pb.js";
import { MembershipService } from "./gen/missionweave/v1/membership_service_pb.js";
import { SchedulingService } from "./gen/missionweave/v1/scheduling_service_pb.js";
import type { SessionSigner } from "./sessions.js";

/** TLS to the mesh (docs/tls.md): PEM contents, not file names. */
export interface MeshTls {
  /** The CA bundle that verifies the mesh (default: Node's trusted roots). */
  readonly ca?: string | Buffer;
  /** A client certificate for a mesh that requires one (mTLS), with its key. */
  readonly cert?: string | Buffer;
  /** The client certificate's private key. */
  readonly key?: string | Buffer;
  /** The name to check in the server's certificate instead of the target's host. */
  readonly serverName?: string;
}

/** How to reach the mesh. */
export interface MeshOptions {
  /** `host:port` of the front door. */
  readonly target: string;
  /** The address proofs name when it differs from `target` (a proxy in between; `MWP_AUDIENCE`). */
  readonly audience?: string;
  /** TLS (`https://<target>`); plaintext without it. */
  readonly tls?: MeshTls;
}

/** `identityId`'s active Membership epoch in a Group state, 0n when it holds none (MW-8-02). */
export function membershipEpoch(state: GroupState, identityId: string): bigint {
  return state.memberships.find((m) => m.memberId === identityId && m.active)?.membershipEpoch ?? 0n;
}

/** Typed clients of the five public services on one HTTP/2 connection, with call proofs by {@link MeshClient.signer}. */
export class MeshClient {
  /** The session whose key signs call proofs (none: calls go without a proof). */
  signer: SessionSigner | undefined;
  /** The address proofs and HELLO name. */
  readonly audience: string;
  /** The gRPC transport (HTTP/2, bidirectional streams included). */
  readonly transport: Transport;
  /** AuthorityService: reads, snapshots, the Authority's keys. */
  readonly authority: Client<typeof AuthorityService>;
  /** MembershipService: sessions, identities, Agent Cards. */
  readonly membership: Client<typeof MembershipService>;
  /** ArtifactService: blobs and manifests. */
  readonly artifacts: Client<typeof ArtifactService>;
  /** SchedulingService: the calling Worker's admission and slots. */
  readonly scheduling: Client<typeof SchedulingService>;
  /** GatewayService: the agent stream and snapshots. */
  readonly gateway: Client<typeof GatewayService>;

  private readonly sessions: Http2SessionManager;

  constructor(readonly options: MeshOptions) {
    this.audience = options.audience ?? options.target;
    const tls = options.tls;
    const baseUrl = `${tls === undefined ? "http" : "https"}://${options.target}`;
    const secure = tls === undefined ? {} : { ca: tls.ca, cert: tls.cert, key: tls.key, servername: tls.serverName };
    // Keep the connection through quiet periods (a long NextSlot wait, an idle Group); ours to close.
    this.sessions = new Http2SessionManager(baseUrl, { pingIntervalMs: 20_000 }, secure);
    this.transport = createGrpcTransport({
      baseUrl,
      sessionManager: this.sessions,
      interceptors: [callProofInterceptor(this.audience, () => this.signer)],
    });
    this.authority = createClient(AuthorityService, this.transport);
    this.membership = createClient(MembershipService, this.transport);
    this.artifacts = createClient(ArtifactService, this.transport);
    this.scheduling = createClient(SchedulingService, this.transport);
    this.gateway = createClient(GatewayService, this.transport);
  }

  /** Closes the HTTP/2 connection (and any call still open on it). */
  close(): void {
    this.sessions.abort();
  }

  /** The Authority's verifier from `GetAuthorityKey` (key history checked; `pinnedHex` pins one key of it). */
  async authorityVerifier(pinnedHex?: string): Promise<AuthorityVerifier> {
    let response;
    try {
      response = await this.authority.getAuthorityKey(create(GetAuthorityKeyRequestSchema, {}), { timeoutMs: 10_000 });
    } catch (err) {
      throw new AgentError(`GetAuthorityKey on ${this.options.target} failed: ${(err as Error).message}`);
    }
    return AuthorityVerifier.fromKeyResponse(response, pinnedHex);
  }

  /** The Group's state as the caller may see it. */
  async groupState(groupId: string): Promise<GroupState> {
    const response = await this.authority.getGroupState(create(GetGroupStateRequestSchema, { groupId }), { timeoutMs: 10_000 });
    if (response.state === undefined) throw new AgentError(`GetGroupState of ${groupId} answered no state`);
    return response.state;
  }
}
