// The Missions a person can see (ListMissions answers only those their Memberships show), their
// approval inbox and the decisions they made.
import { AuthorityService, type MissionSummary } from "../gen/missionweave/v1/authority_service_pb";
import { MissionState } from "../gen/missionweave/v1/mission_pb";
import type { Mesh } from "../mesh";
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

function missionRow(m: MissionSummary, me: string): HTMLElement {
  const budgets = budgetLines(m.used, m.budget);
  return h(
    "tr",
    {},
    h("td", {}, h("a", { href: `#/mission/${m.groupId}` }, m.title || m.missionId), h("div", { class: "sub" }, short(m.missionId, 20), m.parentGroupId ? " · child Mission" : "")),
    h("td", {}, h("span", { class: `state state-${MissionState[m.state]}` }, missionStateName(m.state))),
    h("td", {}, m.ownerId, m.ownerId === me ? h("span", { class: "sub" }, " (you)") : ""),
    h("td", {}, m.coordinatorId || h("span", { class: "sub" }, "none")),
    h("td", {}, ...(budgets.length ? budgets.map((b) => meter(b.label, b.used, b.cap, b.text)) : [h("span", { class: "sub" }, "no caps")])),
    h("td", {}, m.deadline ? h("span", { title: when(m.deadline) }, relative(m.deadline)) : h("span", { class: "sub" }, "none")),
    h("td", {}, waitsOn(m, me)),
  );
}

function table(caption: string, missions: MissionSummary[], me: string): HTMLElement {
  return h(
    "table",
    { class: "missions" },
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ...["Mission", "State", "Owner", "Coordinator", "Budget used", "Deadline", "Waits on"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, ...missions.map((m) => missionRow(m, me))),
  );
}

export async function missionsView(mesh: Mesh, root: HTMLElement): Promise<void> {
  const me = mesh.session?.identityId ?? "";
  clear(root, h("p", { role: "status" }, "Loading Missions…"));
  const missions = await allMissions(mesh);
  const inbox = missions.filter((m) => m.state === MissionState.AWAITING_APPROVAL && m.ownerId === me);
  const active = missions.filter((m) => m.state === MissionState.ACTIVE || m.state === MissionState.AWAITING_APPROVAL);
  const ended = missions.filter((m) => !active.includes(m));
  clear(
    root,
    h("h1", {}, "Missions"),
    h(
      "section",
      { "aria-labelledby": "inbox-title", class: "inbox" },
      h("h2", { id: "inbox-title" }, `Waiting for your approval (${inbox.length})`),
      inbox.length ? table("Submissions you own that wait on your decision", inbox, me) : h("p", { class: "sub" }, "Nothing waits on you."),
    ),
    h("section", { "aria-labelledby": "active-title" }, h("h2", { id: "active-title" }, `In progress (${active.length})`), active.length ? table("Missions in progress you can see", active, me) : h("p", { class: "sub" }, "No Mission in progress is visible to you.")),
    h("section", { "aria-labelledby": "ended-title" }, h("h2", { id: "ended-title" }, `Ended (${ended.length})`), ended.length ? table("Ended Missions you can see", ended, me) : h("p", { class: "sub" }, "None.")),
  );
}
