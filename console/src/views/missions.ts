// The Missions a person can see (ListMissions answers only those their Memberships show), their
// approval inbox and the decisions they made.
import { AuthorityService, type MissionSummary } from "../gen/missionweave/v1/authority_service_pb";
import { MissionState } from "../gen/missionweave/v1/mission_pb";
import type { Mesh } from "../mesh";
import { fromBinary } from "@bufbuild/protobuf";
import { EventSchema } from "../gen/missionweave/v1/event_pb";
import { eventSummary } from "../timeline";
import { budgetLines, clear, h, meter, missionStateName, relative, short, when } from "../ui";

export async function allMissions(mesh: Mesh): Promise<MissionSummary[]> {
  const out: MissionSummary[] = [];
  let pageToken = "";
  do {
    const page = await mesh.unary(AuthorityService.method.listMissions, { pageSize: 1000, pageToken });
    out.push(...page.missions);
    pageToken = page.nextPageToken;
  } while (pageToken);
  return out;
}

function waitsOn(m: MissionSummary, me: string): string {
  if (m.state === MissionState.AWAITING_APPROVAL) return m.ownerId === me ? "your decision" : `${m.ownerId}'s decision`;
  if (m.state === MissionState.ACTIVE) return m.coordinatorId ? `coordinator ${m.coordinatorId}` : "a coordinator (none holds the lease)";
  return "nothing (ended)";
}

// Progress as the spec derives it (7.3): required WorkItems verified, from GetMissionProgress;
// filled in after the list is drawn, a few Missions at a time.
const PROGRESS_CONCURRENCY = 4;

function missionRow(m: MissionSummary, me: string, progress: Map<string, HTMLElement>): HTMLElement {
  const budgets = budgetLines(m.used, m.budget);
  const cell = h("span", { class: "sub" }, "…");
  progress.set(m.groupId, cell);
  return h(
    "tr",
    { "data-group": m.groupId },
    h("td", {}, h("a", { href: `#/mission/${m.groupId}` }, m.title || m.missionId), h("div", { class: "sub" }, short(m.missionId, 20), m.parentGroupId ? " · child Mission" : "")),
    h("td", {}, h("span", { class: `state state-${MissionState[m.state]}` }, missionStateName(m.state))),
    h("td", {}, cell),
    h("td", {}, m.ownerId, m.ownerId === me ? h("span", { class: "sub" }, " (you)") : ""),
    h("td", {}, m.coordinatorId || h("span", { class: "sub" }, "none")),
    h("td", {}, ...(budgets.length ? budgets.map((b) => meter(b.label, b.used, b.cap, b.text)) : [h("span", { class: "sub" }, "no caps")])),
    h("td", {}, m.deadline ? h("span", { title: when(m.deadline) }, relative(m.deadline)) : h("span", { class: "sub" }, "none")),
    h("td", {}, waitsOn(m, me)),
  );
}

function table(caption: string, missions: MissionSummary[], me: string, progress: Map<string, HTMLElement>): HTMLElement {
  return h(
    "table",
    { class: "missions" },
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ...["Mission", "State", "Progress", "Owner", "Coordinator", "Budget used", "Deadline", "Waits on"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, ...missions.map((m) => missionRow(m, me, progress))),
  );
}

async function fillProgress(mesh: Mesh, cells: Map<string, HTMLElement>): Promise<void> {
  const queue = [...cells];
  const worker = async () => {
    for (let next = queue.shift(); next; next = queue.shift()) {
      const [groupId, cell] = next;
      try {
        const p = await mesh.unary(AuthorityService.method.getMissionProgress, { groupId });
        cell.textContent = p.requiredTotal ? `${p.requiredVerified} of ${p.requiredTotal} required verified` : "no required WorkItems yet";
        cell.className = p.requiredTotal && p.requiredVerified === p.requiredTotal ? "ok" : "";
      } catch {
        cell.textContent = "not readable";
      }
    }
  };
  await Promise.all(Array.from({ length: PROGRESS_CONCURRENCY }, worker));
}

/** Who asked for the decision and why: the submission's author and summary. */
async function inboxReasons(mesh: Mesh, inbox: MissionSummary[], rows: HTMLElement): Promise<void> {
  for (const m of inbox) {
    const review = await mesh.unary(AuthorityService.method.getMissionReview, { groupId: m.groupId }).catch(() => null);
    const s = review?.submission;
    if (s) rows.append(h("li", {}, h("a", { href: `#/mission/${m.groupId}` }, m.title || m.missionId), `: submitted by ${s.submittedBy} ${when(s.submittedAt)} — “${s.summary}”`, review.blockers.length ? h("span", { class: "error" }, ` · ${review.blockers.length} WorkItem(s) not verified`) : ""));
  }
}

const DECISIONS = new Set(["mission.approved", "mission.changes_requested", "mission.cancelled", "mission.approval_revoked", "approval.execution_granted", "mission.coordinator_replaced"]);

/** Decisions this person made on the Missions they own, newest first: the history an inbox that empties does not keep. */
async function decisionHistory(mesh: Mesh, owned: MissionSummary[], list: HTMLElement): Promise<void> {
  const me = mesh.session?.identityId ?? "";
  const found: { at: Date; row: HTMLElement }[] = [];
  for (const m of owned) {
    for await (const batch of mesh.stream(AuthorityService.method.readEvents, { groupId: m.groupId, afterSequence: 0n, batchSize: 1024 })) {
      for (const envelope of batch.events) {
        const e = fromBinary(EventSchema, envelope.payload);
        if (e.actorId !== me || !(DECISIONS.has(e.type) || e.type.startsWith("approval."))) continue;
        found.push({
          at: e.recordedAt ? new Date(Number(e.recordedAt.seconds) * 1000) : new Date(0),
          row: h("li", {}, h("time", {}, when(e.recordedAt)), " ", h("strong", {}, e.type), " on ", h("a", { href: `#/mission/${m.groupId}` }, m.title || m.missionId), ` — ${eventSummary(e)}`),
        });
      }
    }
  }
  found.sort((a, b) => b.at.getTime() - a.at.getTime());
  clear(list, ...(found.length ? found.map((f) => f.row) : [h("li", { class: "sub" }, "You have made no decision yet.")]));
}

export async function missionsView(mesh: Mesh, root: HTMLElement): Promise<void> {
  const me = mesh.session?.identityId ?? "";
  clear(root, h("p", { role: "status" }, "Loading Missions…"));
  const missions = await allMissions(mesh);
  const inbox = missions.filter((m) => m.state === MissionState.AWAITING_APPROVAL && m.ownerId === me);
  // Each Mission once: what waits on this person is in the inbox only.
  const active = missions.filter((m) => (m.state === MissionState.ACTIVE || m.state === MissionState.AWAITING_APPROVAL) && !inbox.includes(m));
  const ended = missions.filter((m) => !active.includes(m) && !inbox.includes(m));
  const progress = new Map<string, HTMLElement>();
  const inboxProgress = new Map<string, HTMLElement>();
  const reasons = h("ul", { class: "reasons", "aria-label": "Who asked, and why" });
  const decisions = h("ol", { class: "decisions" }, h("li", { class: "sub" }, "Reading your decisions…"));
  clear(
    root,
    h("h1", {}, "Missions"),
    h(
      "section",
      { "aria-labelledby": "inbox-title", class: "inbox" },
      h("h2", { id: "inbox-title" }, `Waiting for your approval (${inbox.length})`),
      inbox.length ? table("Submissions you own that wait on your decision", inbox, me, inboxProgress) : h("p", { class: "sub" }, "Nothing waits on you."),
      reasons,
    ),
    h("section", { "aria-labelledby": "active-title" }, h("h2", { id: "active-title" }, `In progress (${active.length})`), active.length ? table("Missions in progress you can see", active, me, progress) : h("p", { class: "sub" }, "No Mission in progress is visible to you.")),
    h("section", { "aria-labelledby": "ended-title" }, h("h2", { id: "ended-title" }, `Ended (${ended.length})`), ended.length ? table("Ended Missions you can see", ended, me, progress) : h("p", { class: "sub" }, "None.")),
    h("section", { "aria-labelledby": "decisions-title" }, h("h2", { id: "decisions-title" }, "Your decisions"), decisions),
  );
  void fillProgress(mesh, progress).then(() => fillProgress(mesh, inboxProgress));
  void inboxReasons(mesh, inbox, reasons);
  void decisionHistory(mesh, missions.filter((m) => m.ownerId === me), decisions).catch((err: unknown) => clear(decisions, h("li", { class: "error" }, String(err))));
}
