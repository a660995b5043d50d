// The WorkItem DAG as an SVG, edges from a dependency to its dependant, coloured by state, the
// critical path drawn thick. Laid out once per change of the graph's shape (a change of state only
// recolours): by dagre up to DAGRE_UP_TO WorkItems; above that by a cheaper layered layout of its
// own (layer = longest chain of dependencies, order within a layer by barycentre sweeps, edges as
// curves), because dagre's layout grows much faster than the graph: ~12 s for 1,000 WorkItems and
// ~2,000 dependencies on a 2-core machine (bench/console.py), against a few ms for this one.
import dagre from "@dagrejs/dagre";
import type { WorkItemProgress } from "./gen/missionweave/v1/authority_service_pb";
import { WorkItemState } from "./gen/missionweave/v1/work_pb";
import { workStateName } from "./ui";

const SVG = "http://www.w3.org/2000/svg";
const NODE_W = 172;
const NODE_H = 46;
const NODE_SEP = 14;
const RANK_SEP = 48;
const MARGIN = 12;
/** The largest graph dagre lays out (~20 ms at 100 WorkItems here); larger ones get layered(). */
export const DAGRE_UP_TO = 100;
/** Barycentre sweeps of layered(): down, up, down, up. */
const SWEEPS = 4;

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

export interface DagSelection {
  (workItemId: string): void;
}

interface Point {
  x: number;
  y: number;
}

/** Where each WorkItem's box goes (its centre) and each edge's path, in a width x height drawing. */
export interface Layout {
  width: number;
  height: number;
  centres: Map<string, Point>;
  edges: { from: string; to: string; d: string }[];
}

function dependencies(items: WorkItemProgress[]): Map<string, string[]> {
  const ids = new Set(items.map((w) => w.workItemId));
  return new Map(items.map((w) => [w.workItemId, w.dependsOn.filter((d) => ids.has(d) && d !== w.workItemId)]));
}

function dagreLayout(items: WorkItemProgress[]): Layout {
  const graph = new dagre.graphlib.Graph();
  graph.setGraph({ rankdir: "LR", nodesep: NODE_SEP, ranksep: RANK_SEP, marginx: MARGIN, marginy: MARGIN });
  graph.setDefaultEdgeLabel(() => ({}));
  for (const item of items) graph.setNode(item.workItemId, { width: NODE_W, height: NODE_H });
  for (const [id, deps] of dependencies(items)) for (const dep of deps) graph.setEdge(dep, id);
  dagre.layout(graph);
  const centres = new Map<string, Point>();
  for (const item of items) {
    const pos = graph.node(item.workItemId);
    centres.set(item.workItemId, { x: pos.x, y: pos.y });
  }
  const edges = graph.edges().map((e) => {
    const points = graph.edge(e).points ?? [];
    const d = points.map((p: Point, i: number) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
    return { from: e.v, to: e.w, d };
  });
  return { width: graph.graph().width ?? 0, height: graph.graph().height ?? 0, centres, edges };
}

/**
 * A layered layout in O((WorkItems + dependencies) x SWEEPS): each WorkItem in the column after its
 * latest dependency, the columns ordered by the mean position of each WorkItem's neighbours in the
 * columns already placed (down the dependencies, then back up the dependants), each column centred
 * on the tallest. An edge that skips columns is drawn across them (dagre would route it around the
 * boxes between); a cycle, which the Authority never accepts, is broken where it is met.
 */
export function layered(items: WorkItemProgress[]): Layout {
  const deps = dependencies(items);
  const dependants = new Map<string, string[]>(items.map((w) => [w.workItemId, []]));
  for (const [id, ds] of deps) for (const d of ds) dependants.get(d)?.push(id);
  // Columns: the longest chain of dependencies before each WorkItem (Kahn's order, authorization order within).
  const rank = new Map<string, number>();
  const waiting = new Map<string, number>();
  const ready: string[] = [];
  for (const [id, ds] of deps) {
    waiting.set(id, ds.length);
    if (!ds.length) ready.push(id);
  }
  for (let i = 0; i < ready.length; i++) {
    const id = ready[i] as string;
    let r = 0;
    for (const d of deps.get(id) ?? []) r = Math.max(r, (rank.get(d) ?? 0) + 1);
    rank.set(id, r);
    for (const next of dependants.get(id) ?? []) {
      const left = (waiting.get(next) ?? 0) - 1;
      waiting.set(next, left);
      if (left === 0) ready.push(next);
    }
  }
  let last = 0;
  for (const r of rank.values()) last = Math.max(last, r);
  for (const item of items) if (!rank.has(item.workItemId)) rank.set(item.workItemId, last + 1); // in a cycle
  const columns: string[][] = [];
  for (const item of items) {
    const r = rank.get(item.workItemId) ?? 0;
    (columns[r] ??= []).push(item.workItemId);
  }
  for (let r = 0; r < columns.length; r++) columns[r] ??= [];
  // Order within each column: barycentre of the neighbours already placed, sweeping both ways; a
  // position is a slot of the drawing (the columns are centred on the tallest).
  const tallest = Math.max(0, ...columns.map((c) => c.length));
  const position = new Map<string, number>();
  const place = (column: string[]) => column.forEach((id, i) => position.set(id, (tallest - column.length) / 2 + i));
  columns.forEach(place);
  const sortBy = (column: string[], neighbours: Map<string, string[]>) => {
    const key = new Map<string, number>();
    for (const id of column) {
      const ns = neighbours.get(id) ?? [];
      let sum = 0;
      for (const n of ns) sum += position.get(n) ?? 0;
      key.set(id, ns.length ? sum / ns.length : (position.get(id) ?? 0));
    }
    column.sort((a, b) => (key.get(a) ?? 0) - (key.get(b) ?? 0));
    place(column);
  };
  for (let sweep = 0; sweep < SWEEPS; sweep++) {
    if (sweep % 2 === 0) for (let r = 1; r < columns.length; r++) sortBy(columns[r] as string[], deps);
    else for (let r = columns.length - 2; r >= 0; r--) sortBy(columns[r] as string[], dependants);
  }
  // Coordinates: one column per rank, each column centred on the tallest.
  const step = NODE_H + NODE_SEP;
  const centres = new Map<string, Point>();
  columns.forEach((column, r) => {
    const top = MARGIN + ((tallest - column.length) * step) / 2;
    const x = MARGIN + r * (NODE_W + RANK_SEP) + NODE_W / 2;
    column.forEach((id, i) => centres.set(id, { x, y: top + i * step + NODE_H / 2 }));
  });
  const edges: Layout["edges"] = [];
  for (const [id, ds] of deps) {
    const to = centres.get(id);
    if (!to) continue;
    for (const d of ds) {
      const from = centres.get(d);
      if (!from) continue;
      const x1 = from.x + NODE_W / 2;
      const x2 = to.x - NODE_W / 2;
      const mid = (x1 + x2) / 2;
      edges.push({ from: d, to: id, d: `M${x1.toFixed(1)},${from.y.toFixed(1)} C${mid.toFixed(1)},${from.y.toFixed(1)} ${mid.toFixed(1)},${to.y.toFixed(1)} ${x2.toFixed(1)},${to.y.toFixed(1)}` });
    }
  }
  return {
    width: 2 * MARGIN + columns.length * NODE_W + Math.max(0, columns.length - 1) * RANK_SEP,
    height: 2 * MARGIN + Math.max(0, tallest * step - NODE_SEP),
    centres,
    edges,
  };
}

interface Drawn {
  g: SVGGElement;
  state: SVGTSpanElement;
  className: string;
  label: string;
}

function shownTitle(item: WorkItemProgress): string {
  return (item.title || item.workItemId).slice(0, 24);
}

export class DagView {
  readonly element: SVGSVGElement;
  private shape = "";
  private nodes = new Map<string, Drawn>();
  private edges: { path: SVGPathElement; from: string; to: string; critical: boolean }[] = [];

  constructor(private readonly onSelect: DagSelection) {
    this.element = svg("svg", { class: "dag", role: "group", "aria-label": "WorkItem dependency graph" });
    // One listener for every node (a thousand closures cost more to make than the layout).
    const picked = (ev: Event): string | undefined => (ev.target instanceof Element ? (ev.target.closest("g.node") as SVGGElement | null)?.dataset.workItem : undefined);
    this.element.addEventListener("click", (ev) => {
      const id = picked(ev);
      if (id) this.onSelect(id);
    });
    this.element.addEventListener("keydown", (ev) => {
      const id = picked(ev);
      if (id && (ev.key === "Enter" || ev.key === " ")) {
        ev.preventDefault();
        this.onSelect(id);
      }
    });
  }

  /** Draws `items`; lays the graph out again only when its nodes or edges changed. */
  update(items: WorkItemProgress[], criticalPath: string[]): void {
    const shape = items.map((w) => `${w.workItemId}<${w.dependsOn.join(",")}`).join(";");
    if (shape !== this.shape) {
      const start = performance.now();
      const layout = items.length > DAGRE_UP_TO ? layered(items) : dagreLayout(items);
      performance.measure("mw:dag-layout", { start, end: performance.now() });
      this.draw(items, layout);
      this.shape = shape;
    }
    const critical = new Set(criticalPath);
    for (const item of items) {
      const node = this.nodes.get(item.workItemId);
      if (!node) continue;
      const on = critical.has(item.workItemId);
      const className = `node state-${WorkItemState[item.state]}${on ? " critical" : ""}${item.overdue ? " overdue" : ""}`;
      if (node.className !== className) {
        node.g.setAttribute("class", className);
        node.className = className;
      }
      const label = `${workStateName(item.state)}${item.ownerId ? ` · ${item.ownerId}` : ""}${item.blockers.length ? " · blocked" : ""}`;
      const aria = `${shownTitle(item)} ${label}${on ? ", on the critical path" : ""}`;
      if (node.label !== aria) {
        node.state.textContent = ` ${label}`;
        node.g.setAttribute("aria-label", aria);
        node.label = aria;
      }
    }
    for (const edge of this.edges) {
      const on = critical.has(edge.from) && critical.has(edge.to);
      if (on !== edge.critical) {
        edge.path.classList.toggle("critical", on);
        edge.critical = on;
      }
    }
  }

  private draw(items: WorkItemProgress[], layout: Layout): void {
    const start = performance.now();
    this.element.setAttribute("viewBox", `0 0 ${layout.width} ${layout.height}`);
    this.element.setAttribute("width", String(layout.width));
    this.element.setAttribute("height", String(layout.height));
    const edges = svg("g", { class: "edges" });
    this.edges = layout.edges.map((e) => {
      const path = svg("path", { class: "edge", d: e.d, "marker-end": "url(#arrow)" });
      path.dataset.from = e.from;
      path.dataset.to = e.to;
      edges.append(path);
      return { path, from: e.from, to: e.to, critical: false };
    });
    const nodes = svg("g", { class: "nodes" });
    this.nodes.clear();
    for (const item of items) {
      const pos = layout.centres.get(item.workItemId);
      if (!pos) continue;
      const g = svg("g", { class: "node", transform: `translate(${(pos.x - NODE_W / 2).toFixed(1)},${(pos.y - NODE_H / 2).toFixed(1)})`, tabindex: 0, role: "button" });
      g.dataset.workItem = item.workItemId;
      g.append(svg("rect", { width: NODE_W, height: NODE_H, rx: 6 }));
      // One <text> of two lines, the second starting with a space: read as one, it is the node's
      // name (axe's label-content-name-mismatch: the name must contain the visible text).
      const text = svg("text", { class: "node-text" });
      const title = svg("tspan", { x: 8, y: 18, class: "node-title" });
      title.textContent = shownTitle(item);
      const state = svg("tspan", { x: 8, y: 36, class: "node-state" });
      text.append(title, state);
      g.append(text);
      nodes.append(g);
      this.nodes.set(item.workItemId, { g, state, className: "node", label: "" });
    }
    const defs = svg("defs", {});
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
    defs.append(marker);
    this.element.replaceChildren(defs, edges, nodes);
    performance.measure("mw:dag-draw", { start, end: performance.now() });
  }
}
