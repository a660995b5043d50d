// The Worker runtime's rules that need no mesh: a slot's Evidence (as the Python SDK's Slot.evidence),
// its inputs (contract inputs, then the dependencies' Artifacts; unreadable upstream work adds
// nothing), reads refused when the bytes do not hash to the digest, and when a new schedule
// estimate is material enough to publish.
import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { CommandRejected, Disclosures, InputNotVerified, MATERIAL_SHIFT_MS, Slot, hashContent, material, slotInputs } from "../dist/index.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { ArtifactRefSchema, DigestSchema } from "../dist/gen/missionweave/v1/common_pb.js";
import {
  AcceptanceCriterionSchema,
  CapacityStatus,
  EvidenceMethod,
  EvidenceResult,
  ScheduleDisclosureSchema,
  WorkContractSchema,
  WorkInputSchema,
  WorkItemSchema,
} from "../dist/gen/missionweave/v1/work_pb.js";

const ref = (text) => {
  const h = hashContent(new TextEncoder().encode(text));
  return create(ArtifactRefSchema, { digest: create(DigestSchema, { algorithm: "blake3", hex: h.blake3Hex, sizeBytes: BigInt(h.size) }), mediaType: "text/plain" });
};

function slotOf(agent, init = {}) {
  return new Slot(agent, {
    slotId: "slot-1",
    groupId: "grp_1",
    workItemId: "wi-1",
    ownershipEpoch: 1n,
    leaseId: "lease-1",
    contract: create(WorkContractSchema, {}),
    resumeFromCheckpointId: "",
    origin: { groupId: "grp_1", missionId: "msn_1" },
    ...init,
  });
}

test("slot.evidence: ev-<work item>-<criterion>, about the WorkItem and the artifact, by the first required method", () => {
  const slot = slotOf({});
  const report = ref("report");
  const criterion = create(AcceptanceCriterionSchema, {
    criterionId: "balances",
    description: "all balances match",
    requiredEvidenceMethods: [EvidenceMethod.REVIEW, EvidenceMethod.TEST],
  });
  const before = Date.now();
  const passed = slot.evidence(criterion, { passed: true, summary: "checked", artifact: report });
  assert.equal(passed.evidenceId, "ev-wi-1-balances");
  assert.equal(passed.subject.workItemId, "wi-1");
  assert.equal(passed.subject.artifact.digest.hex, report.digest.hex);
  assert.equal(passed.criterionId, "balances");
  assert.equal(passed.criterion, "all balances match");
  assert.equal(passed.method, EvidenceMethod.REVIEW);
  assert.equal(passed.result, EvidenceResult.PASS);
  assert.equal(passed.summary, "checked");
  assert.ok(Number(passed.producedAt.seconds) * 1000 >= before - 1000);
  const failed = slot.evidence(create(AcceptanceCriterionSchema, { criterionId: "c2" }), { passed: false, summary: "no" });
  assert.equal(failed.method, EvidenceMethod.TEST);
  assert.equal(failed.result, EvidenceResult.FAIL);
  assert.equal(failed.subject.artifact, undefined);
});

test("slotInputs: the contract's inputs, then each upstream WorkItem's Artifacts once; unreadable ones add nothing", async () => {
  const given = ref("given");
  const upstream = { "wi-a": [ref("a1"), ref("a2")], "wi-b": [ref("b")] };
  const asked = [];
  const agent = {
    log: () => {},
    mesh: {
      authority: {
        getWorkItem: async ({ workItemId }) => {
          asked.push(workItemId);
          if (!(workItemId in upstream)) throw new Error("PERMISSION_DENIED");
          return { workItem: create(WorkItemSchema, { workItemId, artifacts: upstream[workItemId] }) };
        },
      },
    },
  };
  const contract = create(WorkContractSchema, {
    inputs: [
      create(WorkInputSchema, { name: "ledger", artifact: given }),
      create(WorkInputSchema, { name: "figures", fromWorkItemId: "wi-a" }),
    ],
    dependsOnWorkItemIds: ["wi-a", "wi-b", "wi-hidden"],
  });
  const inputs = await slotInputs(agent, "grp_1", contract);
  assert.deepEqual(
    inputs.map((i) => [i.name, i.ref.digest.hex, i.fromWorkItemId]),
    [
      ["ledger", given.digest.hex, ""],
      ["figures", upstream["wi-a"][0].digest.hex, "wi-a"],
      ["figures", upstream["wi-a"][1].digest.hex, "wi-a"],
      ["wi-b", upstream["wi-b"][0].digest.hex, "wi-b"],
    ],
  );
  assert.deepEqual(asked, ["wi-a", "wi-b", "wi-hidden"]); // wi-a once
});

test("slot.read hands over verified bytes and refuses bytes that do not hash to the input's digest", async () => {
  let served = "the input";
  const agent = { mesh: { artifacts: { download: async function* () { yield { data: new TextEncoder().encode(served) }; } } } };
  const input = { name: "x", ref: ref("the input"), fromWorkItemId: "wi-a" };
  const slot = slotOf(agent, { inputs: [input] });
  assert.equal(new TextDecoder().decode(await slot.read(input)), "the input");
  assert.equal(new TextDecoder().decode(await slot.read(input.ref)), "the input");
  served = "the inpuT";
  await assert.rejects(slot.read(input), InputNotVerified);
});

test("material: none published yet, another capacity status, or a start window moved by a minute or more", () => {
  const at = (ms, status = CapacityStatus.AVAILABLE) =>
    create(ScheduleDisclosureSchema, { startWindowBegin: timestampFromMs(ms), capacityStatus: status });
  const t = 1_800_000_000_000;
  assert.equal(material(create(ScheduleDisclosureSchema, {}), at(t)), true);
  assert.equal(material(at(t), at(t)), false);
  assert.equal(material(at(t), at(t + MATERIAL_SHIFT_MS - 1)), false);
  assert.equal(material(at(t), at(t - MATERIAL_SHIFT_MS + 1)), false);
  assert.equal(material(at(t), at(t + MATERIAL_SHIFT_MS)), true);
  assert.equal(material(at(t), at(t - MATERIAL_SHIFT_MS)), true);
  assert.equal(material(at(t), at(t, CapacityStatus.SATURATED)), true);
  assert.equal(MATERIAL_SHIFT_MS, 60_000);
});

test("Disclosures: every period, a material new estimate of accepted, not started work is published without a lease", async () => {
  const t = 1_800_000_000_000;
  const at = (ms) => create(ScheduleDisclosureSchema, { startWindowBegin: timestampFromMs(ms), capacityStatus: CapacityStatus.AVAILABLE });
  const estimates = { "wi-moved": at(t + MATERIAL_SHIFT_MS), "wi-same": at(t + 1_000), "wi-started": at(t + 5 * MATERIAL_SHIFT_MS) };
  const published = [];
  const asked = [];
  const agent = {
    log: () => {},
    mesh: {
      scheduling: {
        discloseSchedule: async ({ workItemId }) => {
          asked.push(workItemId);
          if (workItemId === "wi-gone") throw new ConnectError("not queued here", Code.NotFound);
          return { schedule: estimates[workItemId] };
        },
      },
    },
    execute: async (groupId, body) => {
      if (body.value.workItemId === "wi-started") throw new CommandRejected("cmd_1", { reason: 0, message: "started" });
      published.push([groupId, body.case, body.value.workItemId, body.value.leaseId, body.value.ownershipEpoch, body.value.schedule]);
      return { events: [] };
    },
  };
  const disclosures = new Disclosures(agent, 20);
  for (const id of ["wi-moved", "wi-same", "wi-gone", "wi-started"]) disclosures.waitingFor("grp_1", id, 2n, at(t));
  disclosures.waitingFor("grp_1", "wi-new", 3n); // paused: nothing published yet
  estimates["wi-new"] = at(t);
  disclosures.waitingFor("grp_1", "wi-running", 1n, at(t));
  disclosures.started("grp_1", "wi-running");
  const stop = new AbortController();
  const running = disclosures.run(stop.signal);
  const periods = () => asked.filter((id) => id === "wi-same").length;
  for (const deadline = Date.now() + 5_000; periods() < 3 && Date.now() < deadline; ) await new Promise((resolve) => setTimeout(resolve, 10));
  stop.abort();
  await running;
  assert.deepEqual(
    published.map(([g, kind, id, lease, epoch]) => [g, kind, id, lease, epoch]),
    [
      ["grp_1", "workReportProgress", "wi-moved", "", 2n],
      ["grp_1", "workReportProgress", "wi-new", "", 3n],
    ],
  ); // once each: the next periods compare with what was published
  assert.equal(published[0][5], estimates["wi-moved"]);
  assert.ok(!asked.includes("wi-running"));
  for (const gone of ["wi-gone", "wi-started"]) assert.equal(asked.filter((id) => id === gone).length, 1); // dropped
  assert.ok(periods() >= 3); // still looked at every period
});
