// The WorkItem DAG as an SVG: laid out by dagre (layered, edges from a dependency to its
// dependant), coloured by state, the critical path drawn thick. Built for 1,000 WorkItems: one
// layout per change of the graph's shape; a change of state only recolours.
import dagre from "@dagrejs/dagre";
import type { WorkItemProgress } from "./gen/missionweave/v1/authority_service_pb";
import { WorkItemState } from "./gen/missionweave/v1/work_pb";
import { workStateName } from "./ui";

const SVG = "http://www.w3.org/2000/svg";
const NODE_W = 172;
const NODE_H = 46;

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

export interface DagSelection {
  (workItemId: string): void;
}

export class DagView {
  readonly element: SVGSVGElement;
  private shape = "";
  private nodes = new Map<string, SVGGElement>();

  constructor(private readonly onSelect: DagSelection) {
    this.element = svg("svg", { class: "dag", role: "group", "aria-label": "WorkItem dependency graph" });
  }

  /** Draws `items`; lays the graph out again only when its nodes or edges changed. */
  update(items: WorkItemProgress[], criticalPath: string[]): void {
    const shape = items.map((w) => `${w.workItemId}<${w.dependsOn.join(",")}`).join(";");
    if (shape !== this.shape) {
      this.layout(items);
      this.shape = shape;
    }
    const critical = new Set(criticalPath);
    for (const item of items) {
      const node = this.nodes.get(item.workItemId);
      if (!node) continue;
      node.setAttribute("class", `node state-${WorkItemState[item.state]}${critical.has(item.workItemId) ? " critical" : ""}${item.overdue ? " overdue" : ""}`);
      const state = node.querySelector<SVGTextElement>(".node-state");
      const label = `${workStateName(item.state)}${item.ownerId ? ` · ${item.ownerId}` : ""}${item.blockers.length ? " · blocked" : ""}`;
      if (state && state.textContent !== label) state.textContent = label;
      node.setAttribute("aria-label", `${item.title || item.workItemId}: ${label}${critical.has(item.workItemId) ? ", on the critical path" : ""}`);
    }
    for (const edge of this.element.querySelectorAll<SVGPathElement>("path.edge")) {
      const on = critical.has(edge.dataset.from ?? "") && critical.has(edge.dataset.to ?? "");
      edge.classList.toggle("critical", on);
    }
  }

  private layout(items: WorkItemProgress[]): void {
    const graph = new dagre.graphlib.Graph();
    graph.setGraph({ rankdir: "LR", nodesep: 14, ranksep: 48, marginx: 12, marginy: 12 });
    graph.setDefaultEdgeLabel(() => ({}));
    const ids = new Set(items.map((w) => w.workItemId));
    for (const item of items) graph.setNode(item.workItemId, { width: NODE_W, height: NODE_H });
    for (const item of items) for (const dep of item.dependsOn) if (ids.has(dep)) graph.setEdge(dep, item.workItemId);
    dagre.layout(graph);
    const width = graph.graph().width ?? 0;
    const height = graph.graph().height ?? 0;
    this.element.setAttribute("viewBox", `0 0 ${width} ${height}`);
    this.element.setAttribute("width", String(width));
    this.element.setAttribute("height", String(height));
    const edges = svg("g", { class: "edges" });
    for (const e of graph.edges()) {
      const points = graph.edge(e).points ?? [];
      const d = points.map((p: { x: number; y: number }, i: number) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      const path = svg("path", { class: "edge", d, "marker-end": "url(#arrow)" });
      path.dataset.from = e.v;
      path.dataset.to = e.w;
      edges.append(path);
    }
    const nodes = svg("g", { class: "nodes" });
    this.nodes.clear();
    for (const item of items) {
      const pos = graph.node(item.workItemId);
      const g = svg("g", { class: "node", transform: `translate(${(pos.x - NODE_W / 2).toFixed(1)},${(pos.y - NODE_H / 2).toFixed(1)})`, tabindex: 0, role: "button" });
      g.dataset.workItem = item.workItemId;
      g.append(svg("rect", { width: NODE_W, height: NODE_H, rx: 6 }));
      const title = svg("text", { x: 8, y: 18, class: "node-title" });
      title.textContent = (item.title || item.workItemId).slice(0, 24);
      const state = svg("text", { x: 8, y: 36, class: "node-state" });
      g.append(title, state);
      const pick = () => this.onSelect(item.workItemId);
      g.addEventListener("click", pick);
      g.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          pick();
        }
      });
      nodes.append(g);
      this.nodes.set(item.workItemId, g);
    }
    const defs = svg("defs", {});
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
    defs.append(marker);
    this.element.replaceChildren(defs, edges, nodes);
  }
}
