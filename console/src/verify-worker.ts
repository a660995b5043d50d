// The verification worker (static/verify-worker.js, same origin as the page, which its CSP
// allows): checks the event envelopes the page sends it (checks.ts) off the page's thread, so a
// long log is checked while the page draws. Messages: {keys} once, then {id, envelopes} batches in
// order; answers {id, first, outcomes, busyMs} a window at a time, then {id, end: true}.
import { EnvelopeChecker, type Envelope } from "./checks";

interface Keys {
  keys: [string, Uint8Array][];
}
interface Batch {
  id: number;
  envelopes: Envelope[];
}

let checker: EnvelopeChecker | null = null;

self.onmessage = (message: MessageEvent<Keys | Batch>) => {
  const data = message.data;
  if ("keys" in data) {
    checker = new EnvelopeChecker(new Map(data.keys));
    return;
  }
  const { id, envelopes } = data;
  const using = checker;
  if (!using) {
    postMessage({ id, error: "no keys" });
    return;
  }
  void using
    .checkAll(envelopes, (first, outcomes) => postMessage({ id, first, outcomes, busyMs: using.busyMs }))
    .then(
      () => postMessage({ id, end: true }),
      (err: unknown) => postMessage({ id, error: String(err) }),
    );
};
