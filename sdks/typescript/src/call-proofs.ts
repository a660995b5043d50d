/**
 * Call proofs (docs/security.md "The call proof, for any language"): every call that needs one gets a
 * fresh `CallProof` signed by the caller's current session key, in the `mwp-call-proof-bin` metadata.
 * @module
 */
import { randomBytes } from "node:crypto";
import { create, toBinary } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import { encodeBinaryHeader, type Interceptor } from "@connectrpc/connect";
import { CallProofSchema } from "./gen/missionweave/v1/auth_pb.js";
import { SignedEnvelopeSchema } from "./gen/missionweave/v1/common_pb.js";
import type { FixedProof, SessionSigner } from "./sessions.js";
import { CALL_PROOF_METADATA, CALL_PROOF_TYPE } from "./signing.js";

/** Methods whose requests are signed themselves (or public): a proof would cost a signature and prove nothing. */
export const NO_PROOF: ReadonlySet<string> = new Set([
  "/missionweave.v1.AuthorityService/ExecuteCommand",
  "/missionweave.v1.AuthorityService/ExecuteCommandStream",
  "/missionweave.v1.AuthorityService/ExecuteCommandBatch",
  "/missionweave.v1.AuthorityService/GetAuthorityKey",
  "/missionweave.v1.MembershipService/RegisterIdentity",
  "/missionweave.v1.MembershipService/OpenSession",
  "/missionweave.v1.GatewayService/Connect",
  "/missionweave.v1.GatewayService/GetSnapshot",
]);

/**
 * The serialised SignedEnvelope over a fresh CallProof for one call of `method` (e.g.
 * `/missionweave.v1.AuthorityService/ReadEvents`); `fixed` pins the time and nonce (tests only: a
 * proof is accepted once).
 */
export function callProof(signer: SessionSigner, method: string, audience: string, fixed?: FixedProof): Uint8Array {
  const proof = create(CallProofSchema, {
    identityId: signer.identityId,
    sessionEpoch: signer.sessionEpoch,
    method,
    audience,
    issuedAt: fixed?.issuedAt ?? timestampNow(),
    nonce: fixed?.nonce ?? randomBytes(16),
  });
  return toBinary(SignedEnvelopeSchema, signer.sign(toBinary(CallProofSchema, proof), CALL_PROOF_TYPE));
}

/**
 * An interceptor adding a call proof by the session `signer()` returns (none while it returns
 * undefined) to every call that needs one. `audience`: the mesh address as dialled (or `MWP_AUDIENCE`).
 */
export function callProofInterceptor(audience: string, signer: () => SessionSigner | undefined): Interceptor {
  return (next) => async (req) => {
    const method = `/${req.service.typeName}/${req.method.name}`;
    const session = signer();
    if (session !== undefined && !NO_PROOF.has(method)) {
      req.header.set(CALL_PROOF_METADATA, encodeBinaryHeader(callProof(session, method, audience)));
    }
    return next(req);
  };
}
