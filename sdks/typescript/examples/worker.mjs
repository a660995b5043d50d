#!/usr/bin/env node
// A conforming MissionWeave Worker in TypeScript's SDK: it follows its Groups, admits and accepts
// the offers naming it, runs each placed WorkItem in a slot, stores its result as an Artifact with a
// signed provenance manifest and submits it with one Evidence per acceptance criterion. Everything
// else (sessions, verification, cursors, leases, preemption, retries) is the SDK's.
//
//   MWP_TARGET=127.0.0.1:50051 MWP_AGENT_ID=worker MWP_KEY_FILE=worker.key \
//     node examples/worker.mjs grp_...            (stops on SIGINT/SIGTERM)
import { Agent, WorkerRuntime, readKeyFile, submitted } from "../dist/index.js";

const groups = process.argv.slice(2);
if (groups.length === 0 || !process.env.MWP_AGENT_ID || !process.env.MWP_KEY_FILE) {
  process.stderr.write("usage: MWP_AGENT_ID=... MWP_KEY_FILE=... [MWP_TARGET=host:port] node worker.mjs GROUP...\n");
  process.exit(2);
}

// The work itself: read the goal, write a report, prove each acceptance criterion with it.
async function handle(slot) {
  const report = await slot.put(`Report for ${slot.workItemId}: ${slot.contract.goal}\n`, "text/plain");
  const evidence = slot.contract.acceptanceCriteria.map((criterion) =>
    slot.evidence(criterion, { passed: true, summary: `the report covers ${criterion.criterionId}`, artifact: report }),
  );
  return submitted(evidence, `reported on ${slot.workItemId}`);
}

const agent = await Agent.connect({
  target: process.env.MWP_TARGET ?? "127.0.0.1:50051",
  audience: process.env.MWP_AUDIENCE || undefined,
  identityId: process.env.MWP_AGENT_ID,
  identityKey: readKeyFile(process.env.MWP_KEY_FILE),
  stateDir: process.env.MWP_STATE_DIR || undefined,
  newSession: true, // a restarted Worker fences the lease of the process it replaces (D213)
});
const runtime = new WorkerRuntime(agent, handle, {
  onFinished: (slot, outcome) => console.log(JSON.stringify({ work_item_id: slot.workItemId, outcome, artifacts: slot.artifacts.map((r) => r.digest.hex) })),
});
runtime.serve(groups);
process.stderr.write(`worker ${agent.identityId} serving ${groups.join(", ")}\n`);

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, async () => {
    await runtime.close();
    await agent.close();
    process.exit(0);
  });
}
