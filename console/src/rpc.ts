// Calls to the mesh through the console's relay (missionweave_server/console/relay.py): the
// request's protobuf bytes in, the response's out. The relay adds nothing: the call proof is made
// here, by the person's session key.
import { fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { base64Decode, base64Encode } from "@bufbuild/protobuf/wire";
import { RejectionSchema, RejectionReason, type Rejection } from "./gen/missionweave/v1/common_pb";

export type ProofMaker = (method: string) => Promise<Uint8Array | null>;

/** A refused call: its gRPC code, message and the Rejection the mesh gave (docs/errors.md). */
export class Refused extends Error {
  constructor(
    readonly code: string,
    readonly detail: string,
    readonly rejection: Rejection | null,
  ) {
    super(refusalInWords(code, detail, rejection));
  }

  get reason(): string {
    return this.rejection ? reasonName(this.rejection.reason) : this.code;
  }
}

export function reasonName(reason: RejectionReason): string {
  return (RejectionReason[reason] ?? String(reason)).replace(/^REJECTION_REASON_/, "");
}

function refusalInWords(code: string, detail: string, rejection: Rejection | null): string {
  if (rejection) {
    const meta = Object.entries(rejection.metadata)
      .map(([k, v]) => `${k}=${v}`)
      .join(", ");
    return `${reasonName(rejection.reason)}: ${rejection.message || detail}${meta ? ` (${meta})` : ""}`;
  }
  return `${code}: ${detail}`;
}

interface RefusalDocument {
  code?: string;
  message?: string;
  rejection?: string;
  ok?: boolean;
}

function refusalFrom(doc: RefusalDocument): Refused {
  const rejection = doc.rejection ? fromBinary(RejectionSchema, base64Decode(doc.rejection)) : null;
  return new Refused(doc.code ?? "UNKNOWN", doc.message ?? "", rejection);
}

export class Relay {
  proofs: ProofMaker = async () => null;

  constructor(readonly base = "") {}

  private async post(method: string, body: Uint8Array, signal?: AbortSignal): Promise<Response> {
    const headers: Record<string, string> = {
      "Content-Type": "application/x-protobuf",
      "X-MWP-Console": "1",
    };
    const proof = await this.proofs(method);
    if (proof) headers["X-MWP-Call-Proof"] = base64Encode(proof);
    let response: Response;
    try {
      response = await fetch(`${this.base}/rpc${method}`, { method: "POST", headers, body: Uint8Array.from(body), signal });
    } catch (err) {
      if (signal?.aborted) throw err;
      throw new Refused("UNAVAILABLE", `the console cannot be reached (${String(err)})`, null);
    }
    if (!response.ok) {
      let doc: RefusalDocument = {};
      try {
        doc = (await response.json()) as RefusalDocument;
      } catch {
        doc = { code: `HTTP ${response.status}`, message: response.statusText };
      }
      throw refusalFrom(doc);
    }
    return response;
  }

  async unary<I extends DescMessage, O extends DescMessage>(
    method: string,
    input: I,
    output: O,
    request: MessageShape<I>,
  ): Promise<MessageShape<O>> {
    const response = await this.post(method, toBinary(input, request));
    return fromBinary(output, new Uint8Array(await response.arrayBuffer()));
  }

  /** A server-streaming call: each message as it arrives; a refusal at the end is thrown. */
  async *stream<I extends DescMessage, O extends DescMessage>(
    method: string,
    input: I,
    output: O,
    request: MessageShape<I>,
    signal?: AbortSignal,
  ): AsyncGenerator<MessageShape<O>> {
    const response = await this.post(method, toBinary(input, request), signal);
    if (!response.body) throw new Refused("UNKNOWN", "the relay sent no body", null);
    const reader = response.body.getReader();
    let buffer = new Uint8Array(0);
    try {
      for (;;) {
        while (buffer.length >= 5) {
          const view = new DataView(buffer.buffer, buffer.byteOffset, buffer.byteLength);
          const flag = view.getUint8(0);
          const length = view.getUint32(1);
          if (buffer.length < 5 + length) break;
          const payload = buffer.slice(5, 5 + length);
          buffer = buffer.slice(5 + length);
          if (flag === 0) {
            yield fromBinary(output, payload);
          } else {
            const doc = JSON.parse(new TextDecoder().decode(payload)) as RefusalDocument;
            if (!doc.ok) throw refusalFrom(doc);
            return;
          }
        }
        const { done, value } = await reader.read();
        if (done) throw new Refused("UNAVAILABLE", "the stream ended before its trailer", null);
        const joined = new Uint8Array(buffer.length + value.length);
        joined.set(buffer);
        joined.set(value, buffer.length);
        buffer = joined;
      }
    } finally {
      reader.cancel().catch(() => undefined);
    }
  }
}
