// Ed25519 in the browser (WebCrypto): the person's identity key is imported from their key file
// only to open a session and is then dropped; the session key is generated here, non-extractable,
// and kept in IndexedDB so a reload does not need the key file again (docs/console.md, D178).

const PKCS8_ED25519_PREFIX = new Uint8Array([
  0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
]);

export class KeyFileError extends Error {}

/** The key of an `mwp keygen` file (the 32-byte seed as 64 hex characters), as a non-extractable signing key. */
export async function importKeyFile(text: string): Promise<CryptoKey> {
  const hex = text.trim();
  if (!/^[0-9a-fA-F]{64}$/.test(hex)) {
    throw new KeyFileError("this is not an Ed25519 key file (64 hex characters, as `mwp keygen` writes)");
  }
  const seed = new Uint8Array(32);
  for (let i = 0; i < 32; i++) seed[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  const der = new Uint8Array(PKCS8_ED25519_PREFIX.length + 32);
  der.set(PKCS8_ED25519_PREFIX);
  der.set(seed, PKCS8_ED25519_PREFIX.length);
  seed.fill(0);
  try {
    return await crypto.subtle.importKey("pkcs8", der, { name: "Ed25519" }, false, ["sign"]);
  } finally {
    der.fill(0);
  }
}

export async function generateSessionKey(): Promise<{ key: CryptoKey; publicKey: Uint8Array }> {
  const pair = (await crypto.subtle.generateKey({ name: "Ed25519" }, false, ["sign", "verify"])) as CryptoKeyPair;
  const publicKey = new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey));
  return { key: pair.privateKey, publicKey };
}

/** DSSE v1 pre-authentication encoding: what every MissionWeave signature covers. */
export function pae(payloadType: string, payload: Uint8Array): Uint8Array {
  const enc = new TextEncoder();
  const type = enc.encode(payloadType);
  const head = enc.encode(`DSSEv1 ${type.length} `);
  const mid = enc.encode(` ${payload.length} `);
  const out = new Uint8Array(head.length + type.length + mid.length + payload.length);
  let at = 0;
  for (const part of [head, type, mid, payload]) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

// WebCrypto takes ArrayBuffer-backed views only.
function owned(bytes: Uint8Array): Uint8Array<ArrayBuffer> {
  return Uint8Array.from(bytes);
}

export async function sign(key: CryptoKey, payloadType: string, payload: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, key, owned(pae(payloadType, payload))));
}

export async function verify(
  publicKey: Uint8Array,
  payloadType: string,
  payload: Uint8Array,
  signature: Uint8Array,
): Promise<boolean> {
  const key = await crypto.subtle.importKey("raw", owned(publicKey), { name: "Ed25519" }, false, ["verify"]);
  return crypto.subtle.verify({ name: "Ed25519" }, key, owned(signature), owned(pae(payloadType, payload)));
}

export function randomBytes(n: number): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(n));
}

// The session kept across reloads: the identity, its session epoch and the session's CryptoKey.
export interface StoredSession {
  identityId: string;
  sessionEpoch: bigint;
  key: CryptoKey;
}

const DB = "missionweave-console";
const STORE = "session";

function database(): Promise<IDBDatabase> {
  return new Promise((resolve, reject) => {
    const open = indexedDB.open(DB, 1);
    open.onupgradeneeded = () => open.result.createObjectStore(STORE);
    open.onsuccess = () => resolve(open.result);
    open.onerror = () => reject(open.error);
  });
}

async function transact<T>(mode: IDBTransactionMode, run: (store: IDBObjectStore) => IDBRequest): Promise<T> {
  const db = await database();
  try {
    return await new Promise<T>((resolve, reject) => {
      const request = run(db.transaction(STORE, mode).objectStore(STORE));
      request.onsuccess = () => resolve(request.result as T);
      request.onerror = () => reject(request.error);
    });
  } finally {
    db.close();
  }
}

export async function saveSession(session: StoredSession): Promise<void> {
  await transact("readwrite", (s) => s.put(session, "current"));
}

export async function loadSession(): Promise<StoredSession | null> {
  return (await transact<StoredSession | undefined>("readonly", (s) => s.get("current"))) ?? null;
}

export async function forgetSession(): Promise<void> {
  await transact("readwrite", (s) => s.delete("current"));
}
