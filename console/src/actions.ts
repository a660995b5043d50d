// The person's actions on a Mission. Each builds the complete Command first and shows it, field by
// field, exactly as it will be serialised and signed; only "Sign and send" signs it (with the
// session key, in this page) and sends it. A refusal is shown with its reason in words.
import { toBinary, toJsonString } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { AuthorityService, type GroupState } from "./gen/missionweave/v1/authority_service_pb";
import { CommandSchema, type Command } from "./gen/missionweave/v1/command_pb";
import { MissionState } from "./gen/missionweave/v1/mission_pb";
import { WorkItemState } from "./gen/missionweave/v1/work_pb";
import { COMMAND_TYPE, type Mesh } from "./mesh";
import { Refused } from "./rpc";
import { h } from "./ui";

interface Field {
  name: string;
  label: string;
  required?: boolean;
  multiline?: boolean;
  choices?: string[];
  value?: string;
}

type Body = Command["body"];

/** A dialog: the form, then the Command it makes, then the outcome. */
export function commandDialog(mesh: Mesh, title: string, groupId: string, fields: Field[], body: (values: Record<string, string>) => Promise<Body> | Body, done: () => void): HTMLDialogElement {
  const dialog = h("dialog", { class: "action", "aria-labelledby": "dlg-title" });
  const form = h("form", { method: "dialog" });
  const inputs = new Map<string, HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement>();
  for (const f of fields) {
    const id = `f-${f.name}`;
    const input = f.choices
      ? h("select", { id, name: f.name, required: f.required }, ...f.choices.map((c) => h("option", { value: c }, c)))
      : f.multiline
        ? h("textarea", { id, name: f.name, required: f.required, rows: 3 })
        : h("input", { id, name: f.name, required: f.required, value: f.value ?? "" });
    inputs.set(f.name, input);
    form.append(h("label", { for: id }, f.label, f.required ? " (required)" : ""), input);
  }
  const preview = h("pre", { class: "to-sign", tabindex: 0, "aria-label": "The command you will sign" });
  const outcome = h("p", { role: "status", "aria-live": "polite", class: "outcome" });
  const review = h("button", { type: "button" }, "Review what I will sign");
  const signSend = h("button", { type: "button", class: "primary", disabled: true }, "Sign and send");
  const cancel = h("button", { type: "button" }, "Close");
  let command: Command | null = null;
  review.addEventListener("click", () => {
    if (!form.reportValidity()) return;
    const values = Object.fromEntries([...inputs].map(([k, v]) => [k, v.value.trim()]));
    void (async () => {
      try {
        command = await mesh.draft(groupId, await body(values));
        const bytes = toBinary(CommandSchema, command);
        preview.textContent = `payload type ${COMMAND_TYPE}\nsigned by ${mesh.keyId} (this browser's session key)\n${bytes.length} bytes:\n${toJsonString(CommandSchema, command, { prettySpaces: 2 })}`;
        signSend.disabled = false;
        outcome.textContent = "Check the command above, then sign it.";
      } catch (err) {
        outcome.textContent = err instanceof Error ? err.message : String(err);
      }
    })();
  });
  signSend.addEventListener("click", () => {
    if (!command) return;
    signSend.disabled = true;
    const sent = command;
    void mesh
      .execute(sent)
      .then((result) => {
        outcome.textContent = `Done: ${result?.events.length ?? 0} event(s) appended, the Group is at revision ${result?.groupRevision ?? "?"}${result?.replayed ? " (already done: this was a retry)" : ""}.`;
        outcome.className = "outcome ok";
        done();
      })
      .catch((err: unknown) => {
        outcome.textContent = `Refused — ${err instanceof Refused ? err.message : String(err)}`;
        outcome.className = "outcome error";
        signSend.disabled = false; // the same command (same id) may be retried: it is idempotent
      });
  });
  cancel.addEventListener("click", () => {
    dialog.close();
    dialog.remove();
  });
  dialog.append(h("h2", { id: "dlg-title" }, title), form, h("div", { class: "buttons" }, review, signSend, cancel), preview, outcome);
  return dialog;
}

function open(dialog: HTMLDialogElement): void {
  document.body.append(dialog);
  dialog.showModal();
}

/** The actions open to this person on this Mission now. */
export async function actionBar(mesh: Mesh, groupId: string, state: GroupState | undefined, changed: () => void): Promise<HTMLElement> {
  const me = mesh.session?.identityId ?? "";
  const mission = state?.mission;
  const bar = h("nav", { class: "actions", "aria-label": "Actions on this Mission" });
  if (!mission) return bar;
  const isOwner = mission.definition?.ownerId === me;
  const submission = mission.latestSubmissionEventId;
  const add = (label: string, make: () => HTMLDialogElement) => {
    const b = h("button", { type: "button" }, label);
    b.addEventListener("click", () => open(make()));
    bar.append(b);
  };
  if (isOwner && mission.state === MissionState.AWAITING_APPROVAL && submission) {
    add("Approve", () => commandDialog(mesh, "Approve the submission", groupId, [{ name: "comment", label: "Comment" }], (v) => ({ case: "missionApprove", value: { $typeName: "missionweave.v1.MissionApprove", submissionEventId: submission, comment: v["comment"] ?? "" } }), changed));
    add("Request changes", () => commandDialog(mesh, "Request changes", groupId, [{ name: "changes", label: "What must change", required: true, multiline: true }], (v) => ({ case: "missionRequestChanges", value: { $typeName: "missionweave.v1.MissionRequestChanges", submissionEventId: submission, requestedChanges: v["changes"] ?? "" } }), changed));
  }
  const running = mission.state === MissionState.ACTIVE || mission.state === MissionState.AWAITING_APPROVAL;
  if (isOwner && running) {
    add("Replace coordinator", () =>
      commandDialog(mesh, "Appoint a replacement Coordinator", groupId, [{ name: "coordinator", label: "New Coordinator's identity", required: true }], (v) => ({
        case: "missionReplaceCoordinator",
        value: { $typeName: "missionweave.v1.MissionReplaceCoordinator", coordinatorId: v["coordinator"] ?? "", replacedCoordinatorEpoch: mission.coordinator?.coordinatorEpoch ?? 0n },
      }), changed),
    );
    const waiting = await approvalsWanted(mesh, groupId);
    if (waiting.length) {
      // "Allow once" binds the approval to the WorkItem's current ownership epoch: a later owner
      // (after a failure, a preemption, a replacement) needs a new one. "Standing" covers any owner
      // of this contract revision; either ends with a material contract revision or at its expiry.
      add("Grant execution approval", () =>
        commandDialog(
          mesh,
          "Grant execution approval",
          groupId,
          [
            { name: "workItem", label: "WorkItem", choices: waiting.map((w) => w.id), required: true },
            { name: "scope", label: "For", choices: ["this owner only (allow once)", "any owner of this contract revision"], required: true },
            { name: "hours", label: "Expires after (hours; empty: no expiry)" },
            { name: "comment", label: "Comment" },
          ],
          (v) => {
            const item = waiting.find((w) => w.id === v["workItem"]);
            if (!item) throw new Error("pick a WorkItem");
            const once = (v["scope"] ?? "").startsWith("this owner");
            if (once && !item.ownershipEpoch) throw new Error(`${item.id} has no owner yet: grant it for any owner, or wait until it is accepted`);
            const hours = Number(v["hours"] || "0");
            if (!Number.isFinite(hours) || hours < 0) throw new Error("the expiry is a number of hours");
            return {
              case: "approvalGrantExecution",
              value: {
                $typeName: "missionweave.v1.ApprovalGrantExecution",
                workItemId: item.id,
                contractRevision: item.revision,
                ownershipEpoch: once ? item.ownershipEpoch : 0n,
                expiresAt: hours ? timestampFromDate(new Date(Date.now() + hours * 3_600_000)) : undefined,
                comment: v["comment"] ?? "",
              },
            };
          },
          changed,
        ),
      );
    }
    add("Cancel Mission", () => commandDialog(mesh, "Cancel the Mission", groupId, [{ name: "reason", label: "Why", required: true }], (v) => ({ case: "missionCancel", value: { $typeName: "missionweave.v1.MissionCancel", reason: v["reason"] ?? "" } }), changed));
  }
  if (isOwner && mission.state === MissionState.APPROVED && mission.definition) {
    const definition = mission.definition;
    add("Create follow-up", () =>
      commandDialog(
        mesh,
        "Create a follow-up Mission",
        `grp_${crypto.randomUUID().replace(/-/g, "").slice(0, 26)}`,
        [
          { name: "title", label: "Title", required: true, value: `Follow-up: ${definition.title}` },
          { name: "objective", label: "Objective", required: true, multiline: true },
          { name: "coordinator", label: "Coordinator", required: true, value: mission.coordinator?.agentId ?? "" },
          { name: "reason", label: "Why", choices: ["correction", "remediation", "revocation"], required: true },
        ],
        (v) => ({
          case: "missionCreateFollowUp",
          value: {
            $typeName: "missionweave.v1.MissionCreateFollowUp",
            approvedMissionId: mission.missionId,
            approvedGroupId: groupId,
            definition: { ...definition, title: v["title"] ?? "", objective: v["objective"] ?? "", deadline: definition.deadline ?? timestampFromDate(new Date(Date.now() + 7 * 86_400_000)) },
            coordinatorId: v["coordinator"] ?? "",
            reason: v["reason"] ?? "",
          },
        }),
        changed,
      ),
    );
  }
  if (!bar.childElementCount) bar.append(h("span", { class: "sub" }, isOwner ? "No action is open in this state." : "You are not this Mission's owner: you can read what your Membership shows."));
  return bar;
}

interface ApprovalWanted {
  id: string;
  revision: bigint;
  // The current owner's ownership epoch; 0 when nobody owns it yet.
  ownershipEpoch: bigint;
}

async function approvalsWanted(mesh: Mesh, groupId: string): Promise<ApprovalWanted[]> {
  const out: ApprovalWanted[] = [];
  let pageToken = "";
  do {
    const page = await mesh.unary(AuthorityService.method.listWorkItems, { groupId, pageSize: 1000, pageToken });
    for (const w of page.workItems) {
      const ended = w.state === WorkItemState.VERIFIED || w.state === WorkItemState.CANCELLED;
      if (!ended && w.contract?.requiresExecutionApproval && !w.executionApproved) out.push({ id: w.workItemId, revision: w.contract.revision, ownershipEpoch: w.ownership?.ownershipEpoch ?? 0n });
    }
    pageToken = page.nextPageToken;
  } while (pageToken);
  return out;
}
