// The Mission's events, newest first, filterable, each with who caused it, the key that signed it
// and the page's own check of it. A long log is drawn a page at a time; at most one render a frame,
// which adds the rows of new events and drops the oldest, keeping the rows already drawn, and keeps
// its counts as events come and are checked instead of counting the whole log again.
import type { Event } from "./gen/missionweave/v1/event_pb";
import { h, short, when } from "./ui";
import type { CheckedEvent } from "./verify";

const PAGE = 200;
const MARKS_MS = 200;

export function eventSummary(event: Event): string {
  const p = event.payload;
  switch (p.case) {
    case "messagePosted":
      return p.value.content?.text ?? "";
    case "missionCreated":
      return p.value.definition?.title ?? "";
    case "missionApproved":
      return p.value.comment ? `approved: ${p.value.comment}` : "approved";
    case "missionChangesRequested":
      return p.value.requestedChanges;
    case "missionCancelled":
      return p.value.reason;
    case undefined:
      return event.redaction ? "content erased" : "";
    default: {
      const v = p.value as unknown as Record<string, unknown>;
      const id = v["workItemId"] ?? v["conversationId"] ?? v["memberId"] ?? "";
      const reason = v["reason"] ?? v["summary"] ?? "";
      return [id, reason].filter((x) => typeof x === "string" && x).join(": ");
    }
  }
}

export class Timeline {
  readonly element: HTMLElement;
  private events: CheckedEvent[] = [];
  private shown = PAGE;
  private filter = "";
  private readonly list: HTMLOListElement;
  private readonly count: HTMLElement;
  private readonly more: HTMLLIElement;
  private readonly moreButton: HTMLButtonElement;
  // The rows drawn, by sequence: kept across renders, so a new event adds one row, not PAGE.
  private rows = new Map<bigint, HTMLLIElement>();
  private verified = 0;
  private readonly counted = new WeakSet<CheckedEvent>();
  private failed = 0;
  private matching = 0;
  // What the next render must redo: the rows (events came or the filter changed), the marks of
  // rows drawn whose events were checked since, and always the count line.
  private rowsStale = true;
  private readonly marks = new Set<CheckedEvent>();
  private pending = false;
  private markTimer: number | undefined;
  private renderedAt = -Infinity;

  constructor() {
    const input = h("input", { type: "search", id: "timeline-filter", placeholder: "type, actor or text, e.g. work.submitted" });
    input.addEventListener("input", () => {
      this.filter = input.value.trim().toLowerCase();
      this.shown = PAGE;
      this.rowsStale = true;
      this.render();
    });
    this.list = h("ol", { class: "timeline", reversed: true });
    this.count = h("p", { class: "sub", role: "status" });
    this.moreButton = h("button", { type: "button", class: "more" });
    this.moreButton.addEventListener("click", () => {
      this.shown += PAGE;
      this.rowsStale = true;
      this.render();
    });
    this.more = h("li", { class: "more-row" }, this.moreButton);
    this.element = h("section", { "aria-labelledby": "timeline-title", class: "panel" }, h("h2", { id: "timeline-title" }, "Timeline"), h("label", { for: "timeline-filter" }, "Filter events"), input, this.count, this.list);
  }

  add(events: CheckedEvent[]): void {
    if (!events.length) return;
    this.events.push(...events);
    this.rowsStale = true;
    this.schedule();
  }

  /**
   * An event's check finished: its row (if drawn) shows the mark, the count line the total, at the
   * next render; one for marks alone comes at most every MARKS_MS (each frame redraws a page this
   * large for tens of ms: a log's checks, a frame each, would take several times as long).
   */
  marked(checked: CheckedEvent): void {
    if (!this.counted.has(checked)) {
      this.counted.add(checked);
      if (checked.mark === "verified") this.verified++;
      else if (checked.mark === "failed") this.failed++;
    }
    this.marks.add(checked);
    if (this.pending || this.markTimer !== undefined) return;
    this.markTimer = window.setTimeout(
      () => {
        this.markTimer = undefined;
        this.schedule();
      },
      Math.max(0, this.renderedAt + MARKS_MS - performance.now()),
    );
  }

  private schedule(): void {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  private matches(c: CheckedEvent): boolean {
    if (!this.filter) return true;
    const e = c.event;
    return e.type.toLowerCase().includes(this.filter) || e.actorId.toLowerCase().includes(this.filter) || eventSummary(e).toLowerCase().includes(this.filter);
  }

  private fillMark(row: HTMLLIElement, c: CheckedEvent): void {
    const mark = row.querySelector(".mark");
    if (!mark || mark.className === `mark mark-${c.mark}`) return;
    mark.className = `mark mark-${c.mark}`;
    mark.textContent = c.mark === "verified" ? "✓ verified" : c.mark === "failed" ? "✗ failed" : "… checking";
    mark.setAttribute("title", c.why);
  }

  private row(c: CheckedEvent): HTMLLIElement {
    const e = c.event;
    const at = when(e.recordedAt);
    const li = h(
      "li",
      { class: "event", "data-sequence": String(e.sequence), "data-type": e.type },
      h("span", { class: "seq" }, `#${e.sequence}`),
      h("time", { datetime: at }, at),
      h("span", { class: "etype" }, e.type),
      h("span", { class: "actor" }, e.actorId),
      h("span", { class: "summary" }, eventSummary(e)),
      h("span", { class: "signed", title: c.signedBy }, `signed ${short(c.signedBy, 22)}`),
      h("span", { class: "mark" }),
    );
    this.fillMark(li, c);
    return li;
  }

  private render(): void {
    this.renderedAt = performance.now();
    if (this.markTimer !== undefined) {
      clearTimeout(this.markTimer);
      this.markTimer = undefined;
    }
    if (this.rowsStale) this.renderRows();
    for (const c of this.marks) {
      const row = this.rows.get(c.event.sequence);
      if (row) this.fillMark(row, c);
    }
    this.marks.clear();
    const failed = this.failed;
    this.count.textContent = `${this.matching} of ${this.events.length} events · ${this.verified} verified${failed ? ` · ${failed} FAILED verification` : ""}`;
    this.count.classList.toggle("error", failed > 0);
  }

  /** The newest `shown` matching events, newest first: rows already drawn stay where they are. */
  private renderRows(): void {
    this.rowsStale = false;
    let newest: CheckedEvent[];
    if (this.filter) {
      const matching = this.events.filter((c) => this.matches(c));
      this.matching = matching.length;
      newest = matching.slice(-this.shown).reverse();
    } else {
      this.matching = this.events.length;
      newest = this.events.slice(-this.shown).reverse();
    }
    const rows = new Map<bigint, HTMLLIElement>();
    for (const c of newest) rows.set(c.event.sequence, this.rows.get(c.event.sequence) ?? this.row(c));
    for (const [sequence, row] of this.rows) if (!rows.has(sequence)) row.remove();
    this.rows = rows;
    let next: ChildNode | null = this.list.firstChild;
    for (const row of rows.values()) {
      if (row === next) next = row.nextSibling;
      else this.list.insertBefore(row, next);
    }
    if (this.matching > this.shown) {
      this.moreButton.textContent = `Show ${Math.min(PAGE, this.matching - this.shown)} older events`;
      if (this.more.parentNode !== this.list || this.list.lastChild !== this.more) this.list.append(this.more);
    } else {
      this.more.remove();
    }
  }
}
