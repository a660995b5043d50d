// One Mission: its state, progress and budget, the WorkItem DAG, the selected WorkItem, the
// timeline, its Conversations, the submission under review, the Mission tree and the owner's
// actions. Live: the Group's events are followed from the last sequence seen, and a dropped
// stream resumes from there.
import { AuthorityService, type GetMissionProgressResponse } from "../gen/missionweave/v1/authority_service_pb";
import { MissionState } from "../gen/missionweave/v1/mission_pb";
import { actionBar } from "../actions";
import { DagView } from "../dag";
import type { Mesh } from "../mesh";
import { Refused } from "../rpc";
import { Timeline } from "../timeline";
import { budgetLines, clear, h, meter, missionStateName, relative, short, when, workStateName } from "../ui";
import { EventVerifier, type CheckedEvent } from "../verify";
import { conversationsPanel } from "./conversations";
import { reviewPanel } from "./review";
import { treePanel } from "./tree";

const REFRESH_MS = 250;

export async function missionView(mesh: Mesh, root: HTMLElement, groupId: string): Promise<() => void> {
  clear(root, h("p", { role: "status" }, "Loading the Mission…"));
  const stop = new AbortController();
  const verifier = await EventVerifier.forMesh(mesh);
  let progress = await mesh.unary(AuthorityService.method.getMissionProgress, { groupId });
  const timeline = new Timeline();
  const events: CheckedEvent[] = [];
  let selected = "";
  const detail = h("section", { class: "panel workitem", "aria-labelledby": "wi-title", "aria-live": "polite" });
  const dag = new DagView((id) => {
    selected = id;
    showWorkItem();
  });
  const header = h("section", { class: "mission-head" });
  const live = h("span", { class: "live", role: "status" }, "connecting…");
  const conversations = h("div");
  const review = h("div");
  const tree = h("div");
  const actions = h("div");

  function showWorkItem(): void {
    const item = progress.workItems.find((w) => w.workItemId === selected);
    if (!item) {
      clear(detail, h("h2", { id: "wi-title" }, "WorkItem"), h("p", { class: "sub" }, "Pick a WorkItem in the graph (Tab to it, Enter)."));
      return;
    }
    clear(
      detail,
      h("h2", { id: "wi-title" }, item.title || item.workItemId),
      h(
        "dl",
        {},
        h("dt", {}, "State"),
        h("dd", { "data-testid": "wi-state" }, workStateName(item.state)),
        h("dt", {}, "Owner"),
        h("dd", {}, item.ownerId || "none"),
        h("dt", {}, "Depends on"),
        h("dd", {}, item.dependsOn.join(", ") || "nothing"),
        h("dt", {}, "Required"),
        h("dd", {}, item.required ? "yes" : "no"),
        h("dt", {}, "Deadline"),
        h("dd", {}, item.deadline ? `${when(item.deadline)} (${relative(item.deadline)})${item.overdue ? " OVERDUE" : ""}` : "none"),
        h("dt", {}, "Attempts"),
        h("dd", {}, String(item.attempts)),
        h("dt", {}, "Blocked by"),
        h("dd", {}, item.blockers.join("; ") || "nothing"),
        h("dt", {}, "Critical path"),
        h("dd", {}, item.onCriticalPath ? "on it" : "no"),
        ...(item.childGroupId ? [h("dt", {}, "Child Mission"), h("dd", {}, h("a", { href: `#/mission/${item.childGroupId}` }, short(item.childGroupId, 24)))] : []),
      ),
    );
  }

  function showHeader(p: GetMissionProgressResponse, title: string, owner: string, coordinator: string): void {
    const budgets = budgetLines(p.used, p.budget);
    clear(
      header,
      h("h1", {}, title || p.missionId),
      h(
        "p",
        { class: "facts" },
        h("span", { class: `state state-${MissionState[p.missionState]}`, "data-testid": "mission-state" }, missionStateName(p.missionState)),
        ` · owner ${owner} · coordinator ${coordinator || "none"} · `,
        h("strong", {}, `${p.requiredVerified} of ${p.requiredTotal}`),
        " required WorkItems verified · revision ",
        String(p.groupRevision),
        " · ",
        live,
      ),
      h("div", { class: "budgets", "aria-label": "Budget used against caps" }, ...budgets.map((b) => meter(b.label, b.used, b.cap, b.text))),
    );
  }

  let title = "";
  let owner = "";
  let coordinator = "";
  async function refresh(): Promise<void> {
    progress = await mesh.unary(AuthorityService.method.getMissionProgress, { groupId });
    const state = await mesh.groupState(groupId);
    title = state?.mission?.definition?.title ?? title;
    owner = state?.mission?.definition?.ownerId ?? owner;
    coordinator = state?.mission?.coordinator?.agentId ?? "";
    showHeader(progress, title, owner, coordinator);
    dag.update(progress.workItems, progress.criticalPath);
    showWorkItem();
    await Promise.all([
      reviewPanel(mesh, review, groupId).catch((err: unknown) => clear(review, h("p", { class: "error" }, String(err)))),
      conversationsPanel(mesh, conversations, groupId, events),
    ]);
    clear(actions, await actionBar(mesh, groupId, state, () => void refresh()));
  }

  clear(
    root,
    header,
    actions,
    h("section", { class: "panel graph", "aria-labelledby": "dag-title" }, h("h2", { id: "dag-title" }, `Plan (${progress.workItems.length} WorkItems; thick: the critical path)`), h("div", { class: "dag-scroll" }, dag.element)),
    detail,
    review,
    conversations,
    tree,
    timeline.element,
  );
  await refresh();
  void treePanel(mesh, tree, groupId);

  // Live updates: follow the Group from the last sequence seen; refresh the folded views at most
  // every REFRESH_MS; on a dropped stream, resume after the last sequence read.
  let cursor = 0n;
  let refreshTimer: number | undefined;
  const later = () => {
    if (refreshTimer !== undefined) return;
    refreshTimer = window.setTimeout(() => {
      refreshTimer = undefined;
      void refresh().catch(() => undefined);
    }, REFRESH_MS);
  };
  void (async () => {
    let backoff = 250;
    while (!stop.signal.aborted) {
      try {
        live.textContent = cursor ? `live (resumed after #${cursor})` : "live";
        live.className = "live on";
        for await (const batch of mesh.stream(AuthorityService.method.readEvents, { groupId, afterSequence: cursor, follow: true, batchSize: 1024 }, stop.signal)) {
          backoff = 250;
          const checked = batch.events.map((e) => verifier.decode(e));
          events.push(...checked);
          timeline.add(checked);
          if (batch.lastSequence > cursor) cursor = batch.lastSequence;
          for (const c of checked) void verifier.check(c).then((done) => timeline.marked(done));
          if (checked.length) later();
        }
      } catch (err) {
        if (stop.signal.aborted) return;
        if (err instanceof Refused && err.code === "UNAUTHENTICATED") {
          live.textContent = "session ended: sign in again";
          live.className = "live off error";
          return;
        }
        live.textContent = `disconnected; retrying from #${cursor}`;
        live.className = "live off";
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(backoff * 2, 5000);
      }
    }
  })();
  return () => stop.abort();
}
