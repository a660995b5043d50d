// Small DOM and formatting helpers shared by the views.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { MissionState } from "./gen/missionweave/v1/mission_pb";
import { WorkItemState } from "./gen/missionweave/v1/work_pb";
import type { ResourceVector } from "./gen/missionweave/v1/common_pb";

type Child = Node | string | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | undefined>;

/** An element with attributes (`on*` ones are listeners) and children. */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) if (child) el.append(child);
  return el;
}

export function clear(el: Element, ...children: Child[]): void {
  el.replaceChildren(...children.filter((c): c is Node | string => Boolean(c)));
}

export function missionStateName(state: MissionState): string {
  return (MissionState[state] ?? "UNKNOWN").replace(/^MISSION_STATE_/, "").replace(/_/g, " ").toLowerCase();
}

export function workStateName(state: WorkItemState): string {
  return (WorkItemState[state] ?? "UNKNOWN").replace(/^WORK_ITEM_STATE_/, "").toLowerCase();
}

export function when(ts: Timestamp | undefined): string {
  if (!ts) return "none";
  return timestampDate(ts).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

export function relative(ts: Timestamp | undefined, now = Date.now()): string {
  if (!ts) return "";
  const ms = timestampDate(ts).getTime() - now;
  const abs = Math.abs(ms);
  const unit = abs < 60_000 ? `${Math.round(abs / 1000)} s` : abs < 3_600_000 ? `${Math.round(abs / 60_000)} min` : abs < 86_400_000 ? `${Math.round(abs / 3_600_000)} h` : `${Math.round(abs / 86_400_000)} d`;
  return ms >= 0 ? `in ${unit}` : `${unit} ago`;
}

export function money(micros: bigint, currency: string): string {
  const whole = Number(micros) / 1_000_000;
  return `${whole.toLocaleString("en", { maximumFractionDigits: 2 })}${currency ? ` ${currency}` : ""}`;
}

/** Each capped dimension of a budget, with its use: "12 of 100 USD". */
export function budgetLines(used: ResourceVector | undefined, cap: ResourceVector | undefined): { label: string; used: number; cap: number; text: string }[] {
  if (!cap) return [];
  const u = used;
  const rows: { label: string; used: number; cap: number; text: string }[] = [];
  const add = (label: string, a: bigint | undefined, b: bigint, show: (x: bigint) => string) => {
    if (b > 0n) rows.push({ label, used: Number(a ?? 0n), cap: Number(b), text: `${show(a ?? 0n)} of ${show(b)}` });
  };
  add("money", u?.financialMicros, cap.financialMicros, (x) => money(x, cap.currency));
  add("tokens", u?.tokens, cap.tokens, (x) => x.toLocaleString("en"));
  add("tool calls", u?.toolCalls, cap.toolCalls, (x) => x.toLocaleString("en"));
  add("compute", u?.computeMs, cap.computeMs, (x) => `${(Number(x) / 1000).toFixed(1)} s`);
  add("wall clock", u?.wallClockMs, cap.wallClockMs, (x) => `${(Number(x) / 60000).toFixed(1)} min`);
  add("side effects", u?.sideEffects, cap.sideEffects, (x) => x.toString());
  return rows;
}

export function meter(label: string, used: number, cap: number, text: string): HTMLElement {
  const ratio = cap > 0 ? Math.min(used / cap, 1) : 0;
  return h(
    "div",
    { class: "meter-row" },
    h("span", { class: "meter-label" }, label),
    h("meter", { min: 0, max: 1, low: 0.75, high: 0.9, optimum: 0, value: ratio, "aria-label": `${label}: ${text}` }),
    h("span", { class: "meter-text" }, text),
  );
}

export function short(id: string, keep = 14): string {
  return id.length > keep ? `${id.slice(0, keep)}…` : id;
}

export function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// Above this many sections a panel builds each one's content when it is first opened: a Mission of
// 1,000 WorkItems would otherwise lay out ~100,000 px (and start every Artifact's download) at once.
export const EAGER_SECTIONS = 50;

/** A <details> whose content is built now when `eager` or open, else when it is first opened. */
export function lazyDetails(attrs: Attrs & { open?: boolean }, summary: string, content: () => Child[], eager: boolean): HTMLDetailsElement {
  const el = h("details", attrs, h("summary", {}, summary));
  let built = false;
  const build = () => {
    if (built) return;
    built = true;
    for (const child of content()) if (child) el.append(child);
  };
  if (eager || attrs.open) build();
  else el.addEventListener("toggle", () => el.open && build());
  return el;
}
