/**
 * The credit accounting of a subscription (MW-8-17), as the Python SDK's CreditWindow: the gateway
 * spends one credit per sequence an EVENT frame covers; a frame's credits are granted back once the
 * cursor has passed its last sequence, batched into ACKs when half the window is free again or when
 * the subscription is idle. The ACKed cursor never exceeds what the stream delivered (the gateway
 * answers ACK_BEYOND_DELIVERED otherwise) and never goes backwards (ACK_REGRESSED).
 * @module
 */

const min = (a: bigint, b: bigint): bigint => (a < b ? a : b);

/** One subscription's window on one stream. */
export class CreditWindow {
  /** The highest sequence the stream delivered (or the start). */
  delivered: bigint;
  /** The cursor last ACKed. */
  acked: bigint;
  private frames: Array<[last: bigint, size: number]> = [];
  private released = 0;

  constructor(
    /** The window, 1..65,536 events. */
    readonly credits: number,
    after: bigint,
  ) {
    this.delivered = after;
    this.acked = after;
  }

  /** An EVENT frame covering `first..last` arrived. */
  received(first: bigint, last: bigint): void {
    if (last > this.delivered) this.delivered = last;
    this.frames.push([last, Number(last - first + 1n)]);
  }

  /** The stream starts at `sequence` (FLOW's effective start): ACKs up to it are allowed. */
  startAt(sequence: bigint): void {
    if (sequence > this.delivered) this.delivered = sequence;
  }

  /** The (durable) cursor reached `cursor`: the frames it passed give their credits back. */
  processed(cursor: bigint): void {
    const pending: Array<[bigint, number]> = [];
    for (const [last, size] of this.frames) {
      if (last <= cursor) this.released += size;
      else pending.push([last, size]);
    }
    this.frames = pending;
  }

  /** Whether an ACK is due: half the window free again, or idle with anything to report. */
  due(cursor: bigint, idle: boolean): boolean {
    if (this.released >= Math.max(1, Math.floor(this.credits / 2))) return true;
    return idle && (this.released > 0 || min(cursor, this.delivered) > this.acked);
  }

  /** The ACK to send for `cursor` now: the cursor it may report and the credits it grants back. */
  take(cursor: bigint): { cursor: bigint; credits: number } {
    const reported = min(cursor, this.delivered);
    if (reported > this.acked) this.acked = reported;
    const credits = this.released;
    this.released = 0;
    return { cursor: this.acked, credits };
  }
}
