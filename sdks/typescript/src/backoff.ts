/**
 * Capped exponential backoff with jitter, the SDK's one retry schedule (missionweave/sdk/backoff.py):
 * the n-th delay lies in `[d/2, d]`, `d = min(cap, initial * factor**n)`.
 * @module
 */

/** A retry schedule; `reset()` after a success. */
export class Backoff {
  private attempt = 0;

  constructor(
    /** The first delay's ceiling, in ms. */
    readonly initialMs = 200,
    /** The largest delay, in ms. */
    readonly capMs = 30_000,
    /** Growth per attempt. */
    readonly factor = 2,
    private readonly random: () => number = Math.random,
  ) {}

  /** The next delay in ms. */
  next(): number {
    const ceiling = Math.min(this.capMs, this.initialMs * this.factor ** this.attempt);
    this.attempt = Math.min(this.attempt + 1, 64);
    return ceiling / 2 + this.random() * (ceiling / 2);
  }

  /** Starts the schedule over. */
  reset(): void {
    this.attempt = 0;
  }
}

/** Resolves after `ms` milliseconds (early, without error, when `signal` aborts). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Waits for `work` at most `ms` milliseconds (its outcome ignored), leaving no timer behind. */
export async function within(work: Promise<unknown> | undefined, ms: number): Promise<void> {
  const timer = new AbortController();
  try {
    await Promise.race([work?.catch(() => undefined), sleep(ms, timer.signal)]);
  } finally {
    timer.abort();
  }
}
