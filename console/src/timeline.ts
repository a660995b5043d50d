// The Mission's events, newest first, filterable, each with who caused it, the key that signed it
// and the page's own check of it. A long log is drawn a page at a time.
import type { Event } from "./gen/missionweave/v1/event_pb";
import { h, clear, short, when } from "./ui";
import type { CheckedEvent } from "./verify";

const PAGE = 200;

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
  private readonly rows = new Map<bigint, HTMLLIElement>();
  private pending = false;

  constructor() {
    const input = h("input", { type: "search", id: "timeline-filter", placeholder: "type, actor or text, e.g. work.submitted" });
    input.addEventListener("input", () => {
      this.filter = input.value.trim().toLowerCase();
      this.shown = PAGE;
      this.render();
    });
    this.list = h("ol", { class: "timeline", reversed: true });
    this.count = h("p", { class: "sub", role: "status" });
    this.element = h("section", { "aria-labelledby": "timeline-title", class: "panel" }, h("h2", { id: "timeline-title" }, "Timeline"), h("label", { for: "timeline-filter" }, "Filter events"), input, this.count, this.list);
  }

  add(events: CheckedEvent[]): void {
    this.events.push(...events);
    this.schedule();
  }

  /** An event's check finished: its row (if drawn) shows the mark. */
  marked(checked: CheckedEvent): void {
    const row = this.rows.get(checked.event.sequence);
    if (row) this.fillMark(row, checked);
    this.schedule();
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
    if (!mark) return;
    mark.className = `mark mark-${c.mark}`;
    mark.textContent = c.mark === "verified" ? "✓ verified" : c.mark === "failed" ? "✗ failed" : "… checking";
    mark.setAttribute("title", c.why);
  }

  private row(c: CheckedEvent): HTMLLIElement {
    const e = c.event;
    const li = h(
      "li",
      { class: "event", "data-sequence": String(e.sequence), "data-type": e.type },
      h("span", { class: "seq" }, `#${e.sequence}`),
      h("time", { datetime: when(e.recordedAt) }, when(e.recordedAt)),
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
    const matching = this.events.filter((c) => this.matches(c));
    const failed = this.events.filter((c) => c.mark === "failed").length;
    const verified = this.events.filter((c) => c.mark === "verified").length;
    this.count.textContent = `${matching.length} of ${this.events.length} events · ${verified} verified${failed ? ` · ${failed} FAILED verification` : ""}`;
    this.count.classList.toggle("error", failed > 0);
    const newest = matching.slice(-this.shown).reverse();
    this.rows.clear();
    const items: Node[] = newest.map((c) => {
      const li = this.row(c);
      this.rows.set(c.event.sequence, li);
      return li;
    });
    clear(this.list, ...items);
    if (matching.length > this.shown) {
      const more = h("button", { type: "button", class: "more" }, `Show ${Math.min(PAGE, matching.length - this.shown)} older events`);
      more.addEventListener("click", () => {
        this.shown += PAGE;
        this.render();
      });
      this.list.append(h("li", { class: "more-row" }, more));
    }
  }
}
