// One Mission: its state, progress and budget, the WorkItem DAG, the selected WorkItem, the
// timeline, its Conversations, the submission under review, the Mission tree and the owner's
// actions. Live: the Group's events are followed from the last sequence seen, and a dropped
// stream resumes from there.
//
// Built for 1,000 WorkItems and 10,000 events (bench/console.py measures it):
// - Order of drawing: the progress, the Group's state and the Authority's keys are asked at once;
//   the header is drawn as soon as they are in and shown before the graph is laid out (dag.ts);
//   the events are followed from then on, decoded here and checked in a worker (verify.ts); the
//   actions and the tree come next; the Conversations and the review once the log so far is read
//   (the review downloads and checks every Artifact of the submission and of each WorkItem: a
//   hundred verified WorkItems are two hundred calls, which would queue the log behind them).
// - Live, the folded views are refreshed at most every REFRESH_MS, one refresh of each at a time
//   and each taking at most 1 / BUSY_SHARE of the page's time: message posts only redraw the
//   Conversations (from the messages kept here); any other event refreshes the progress, the
//   header, the graph and the WorkItem, and the review and the actions (the costliest:
//   GetMissionReview and its downloads, ListWorkItems with every contract) at most every SLOW_MS.
// - The Conversations and the review, which hold a section for every WorkItem (over 100,000 px
//   for 1,000), are redrawn only while on screen: off screen a change marks them stale, and they
//   are redrawn when they come into view. Their layout and paint are contained, as the graph's
//   and the timeline's: a new timeline row does not make the browser walk the whole page again.
import { AuthorityService, type GetMissionProgressResponse, type GroupState } from "../gen/missionweave/v1/authority_service_pb";
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
const SLOW_MS = 2000;
const BUSY_SHARE = 5;
// The Conversations panel shows each Conversation's last 100 messages (and opens one of fewer than
// 20): it is given no more than that of each, which it shows the same.
const MESSAGES_KEPT = 100;

/** After the next frame (the DOM changed so far is on screen), or 100 ms in a tab that draws none. */
function painted(): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, 100);
    requestAnimationFrame(() =>
      setTimeout(() => {
        clearTimeout(timer);
        resolve();
      }, 0),
    );
  });
}

/**
 * `task` run when asked, never twice at once (asks meanwhile are one), and at most once every
 * `gap` ms or every BUSY_SHARE x its last duration, whichever is longer: a view that takes 500 ms
 * to redraw (the Conversations of a thousand WorkItems) is redrawn every 2.5 s, not every 250 ms,
 * and never takes more than a fifth of the page's time.
 */
function throttled(gap: number, stop: AbortSignal, task: () => Promise<void>): () => void {
  let last = -Infinity;
  let wait = gap;
  let timer: number | undefined;
  let running = false;
  let again = false;
  const ask = () => {
    if (running) {
      again = true;
      return;
    }
    if (timer !== undefined) return;
    timer = window.setTimeout(run, Math.max(0, last + wait - performance.now()));
  };
  const run = () => {
    timer = undefined;
    if (stop.aborted) return;
    running = true;
    again = false;
    last = performance.now();
    void task()
      .catch(() => undefined)
      .finally(() => {
        running = false;
        wait = Math.max(gap, BUSY_SHARE * (performance.now() - last));
        if (again) ask();
      });
  };
  return ask;
}

/**
 * Whether `el` is on screen, kept by an IntersectionObserver;
 * `shown` is called each time it comes into view.
 */
function watchScreen(el: Element, stop: AbortSignal, shown: () => void): { on: boolean } {
  const state = { on: true };
  const observer = new IntersectionObserver(
    (entries) => {
      const on = entries[entries.length - 1]?.isIntersecting ?? state.on; // the latest of the changes since the last call
      if (on && !state.on) shown();
      state.on = on;
    },
    { rootMargin: "0px" },
  );
  observer.observe(el);
  stop.addEventListener("abort", () => observer.disconnect());
  return state;
}

// Timings of the drawing (performance.measure, "mw:..."), which bench/console.py reads: the first
// MEASURES of each view (the browser keeps every entry for as long as the page stays open).
const MEASURES = 100;
let measures = 0;
function measured(name: string, start: number): void {
  if (measures++ < MEASURES) performance.measure(name, { start, end: performance.now() });
}

export async function missionView(mesh: Mesh, root: HTMLElement, groupId: string): Promise<() => void> {
  const opened = performance.now();
  measures = 0;
  clear(root, h("p", { role: "status" }, "Loading the Mission…"));
  const stop = new AbortController();
  const [verifier, first, firstState] = await Promise.all([EventVerifier.forMesh(mesh), mesh.unary(AuthorityService.method.getMissionProgress, { groupId }), mesh.groupState(groupId)]);
  let progress = first;
  let state = firstState;
  measured("mw:first-reads", opened);
  const timeline = new Timeline();
  // Each Conversation's latest messages, oldest first (at most 2 x MESSAGES_KEPT between trims).
  const messages = new Map<string, CheckedEvent[]>();
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
  // Containment through the CSSOM (the page's CSP allows no style attribute). Not style
  // containment, nor content-visibility: either made Chromium restyle the thousand <details> of
  // these panels for 1-2 s when they were drawn.
  for (const heavy of [conversations, review]) heavy.style.setProperty("contain", "layout paint");
  const tree = h("div");
  const actions = h("div");
  const graphTitle = h("h2", { id: "dag-title" });

  // The selected WorkItem's execution lease (GetWorkItem; GetMissionProgress has none): read again
  // only when the selection, its state, owner or attempt changes, not on every live refresh.
  const lease = h("dd", { "data-testid": "wi-lease" });
  let leaseOf = "";
  function showLease(workItemId: string, key: string): void {
    if (key === leaseOf) return;
    leaseOf = key;
    lease.textContent = "…";
    void mesh
      .unary(AuthorityService.method.getWorkItem, { groupId, workItemId })
      .then(({ workItem }) => {
        if (leaseOf !== key) return;
        const l = workItem?.lease;
        lease.textContent = l?.leaseId && !l.endedAt ? `${l.agentId}, attempt ${l.attempt}, expires ${when(l.expiresAt)} (${relative(l.expiresAt)})` : "none held";
      })
      .catch((err: unknown) => {
        if (leaseOf === key) lease.textContent = err instanceof Refused ? err.message : String(err);
      });
  }

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
        h("dt", {}, "Execution lease"),
        lease,
        h("dt", {}, "Blocked by"),
        h("dd", {}, item.blockers.join("; ") || "nothing"),
        h("dt", {}, "Critical path"),
        h("dd", {}, item.onCriticalPath ? "on it" : "no"),
        ...(item.childGroupId ? [h("dt", {}, "Child Mission"), h("dd", {}, h("a", { href: `#/mission/${item.childGroupId}` }, short(item.childGroupId, 24)))] : []),
      ),
    );
    showLease(item.workItemId, `${item.workItemId}:${item.state}:${item.ownerId}:${item.attempts}`);
  }

  function showHeader(p: GetMissionProgressResponse, s: GroupState | undefined): void {
    const title = s?.mission?.definition?.title ?? "";
    const owner = s?.mission?.definition?.ownerId ?? "";
    const coordinator = s?.mission?.coordinator?.agentId ?? "";
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
    graphTitle.textContent = `Plan (${p.workItems.length} WorkItems; thick: the critical path)`;
  }

  function showGraph(): void {
    const start = performance.now();
    dag.update(progress.workItems, progress.criticalPath);
    showWorkItem();
    measured("mw:graph", start);
  }

  function keep(batch: CheckedEvent[]): void {
    for (const c of batch) {
      if (c.event.payload.case !== "messagePosted") continue;
      const id = c.event.payload.value.conversationId;
      let list = messages.get(id);
      if (!list) messages.set(id, (list = []));
      list.push(c);
      if (list.length > 2 * MESSAGES_KEPT) list.splice(0, list.length - MESSAGES_KEPT);
    }
  }

  function latestMessages(): CheckedEvent[] {
    const out: CheckedEvent[] = [];
    for (const list of messages.values()) out.push(...list.slice(-MESSAGES_KEPT));
    return out;
  }

  // The Conversations and the review are drawn once, then redrawn only while on screen (or near
  // it): off screen, a change marks them stale and they are redrawn when they come into view.
  const offScreen = { conversations: false, review: false };
  let conversationsDrawn = false;
  let reviewDrawn = false;

  async function showConversations(): Promise<void> {
    if (conversationsDrawn && !conversationsOnScreen.on) {
      offScreen.conversations = true;
      return;
    }
    offScreen.conversations = false;
    conversationsDrawn = true;
    const start = performance.now();
    await conversationsPanel(mesh, conversations, groupId, latestMessages());
    measured("mw:conversations", start);
  }

  async function showActions(): Promise<void> {
    const start = performance.now();
    clear(
      actions,
      await actionBar(mesh, groupId, state, () => {
        refreshFolded();
        refreshActions();
        refreshReview();
      }),
    );
    measured("mw:actions", start);
  }

  async function showReview(): Promise<void> {
    if (reviewDrawn && !reviewOnScreen.on) {
      offScreen.review = true;
      return;
    }
    offScreen.review = false;
    reviewDrawn = true;
    const start = performance.now();
    await reviewPanel(mesh, review, groupId).catch((err: unknown) => clear(review, h("p", { class: "error" }, String(err))));
    measured("mw:review", start);
  }

  // The folded views on live events (see the top of this file).
  const refreshActions = throttled(SLOW_MS, stop.signal, showActions);
  const refreshReview = throttled(SLOW_MS, stop.signal, showReview);
  const refreshConversations = throttled(REFRESH_MS, stop.signal, showConversations);
  const refreshFolded = throttled(REFRESH_MS, stop.signal, async () => {
    [progress, state] = await Promise.all([mesh.unary(AuthorityService.method.getMissionProgress, { groupId }), mesh.groupState(groupId)]);
    showHeader(progress, state);
    showGraph();
    refreshActions();
    refreshReview();
    refreshConversations();
  });
  const conversationsOnScreen = watchScreen(conversations, stop.signal, () => {
    if (offScreen.conversations) refreshConversations();
  });
  const reviewOnScreen = watchScreen(review, stop.signal, () => {
    if (offScreen.review) refreshReview();
  });

  const dagScroll = h("div", { class: "dag-scroll" }, dag.element);
  dagScroll.style.setProperty("contain", "layout paint");
  timeline.element.style.setProperty("contain", "layout paint");
  showHeader(progress, state);
  showWorkItem();
  clear(
    root,
    header,
    actions,
    h("section", { class: "panel graph", "aria-labelledby": "dag-title" }, graphTitle, dagScroll),
    detail,
    review,
    conversations,
    tree,
    timeline.element,
  );
  measured("mw:header", opened);

  // Live updates: follow the Group from the last sequence seen; on a dropped stream, resume after
  // the last sequence read. The first batches are the whole log so far.
  let cursor = 0n;
  const follow = async () => {
    let backoff = 250;
    let caughtUp = false;
    let stale = false;
    while (!stop.signal.aborted) {
      try {
        live.textContent = cursor ? `live (resumed after #${cursor})` : "live";
        live.className = "live on";
        for await (const batch of mesh.stream(AuthorityService.method.readEvents, { groupId, afterSequence: cursor, follow: true, batchSize: 1024 }, stop.signal)) {
          backoff = 250;
          if (!caughtUp) await graphShown; // the log so far waits for the graph's frame
          const start = performance.now();
          const checked = batch.events.map((e) => verifier.decode(e));
          keep(checked);
          timeline.add(checked);
          if (batch.lastSequence > cursor) cursor = batch.lastSequence;
          const checking = verifier.checkAll(checked, (done) => timeline.marked(done));
          measured("mw:events-batch", start);
          if (!caughtUp) {
            // The log so far: the Conversations once it is read, and the folded views again if
            // something besides messages happened after the progress read first.
            stale ||= checked.some((c) => c.event.sequence > progress.groupRevision && c.event.payload.case !== "messagePosted");
            if (batch.lastSequence >= batch.headSequence) {
              caughtUp = true;
              measured("mw:events-read", opened);
              void checking.then(() => {
                measured("mw:events-verified", opened);
                performance.measure("mw:verify-busy", { start: opened, duration: verifier.busyMs }); // the checks themselves, in the worker
              });
              refreshReview();
              if (stale) refreshFolded();
              else refreshConversations();
            }
            continue;
          }
          if (checked.some((c) => c.event.payload.case !== "messagePosted")) refreshFolded();
          else if (checked.length) refreshConversations();
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
  };
  // The events are asked for now, but their first batches (a thousand events each to decode and
  // hand to the checks) are taken once the graph is on screen.
  let graphDrawn = () => {};
  const graphShown = new Promise<void>((resolve) => (graphDrawn = resolve));
  void follow();

  await painted(); // the header is on screen before the graph is laid out
  showGraph();
  measured("mw:header-and-graph", opened);
  void painted().then(graphDrawn);
  refreshActions();
  void treePanel(mesh, tree, groupId);
  return () => {
    stop.abort();
    verifier.close();
  };
}
