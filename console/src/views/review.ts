// The submission under review: every Artifact (downloaded by content hash and checked here with
// BLAKE3 against it, with its provenance), and the Evidence against each acceptance criterion.
import { blake3 } from "@noble/hashes/blake3.js";
import { ArtifactService, ProvenanceDirection } from "../gen/missionweave/v1/artifact_service_pb";
import { create } from "@bufbuild/protobuf";
import { AuthorityService, MissionReviewArtifactSchema, type MissionReviewArtifact, type MissionReviewWorkItem } from "../gen/missionweave/v1/authority_service_pb";
import { EvidenceResult, EvidenceMethod, type Evidence } from "../gen/missionweave/v1/work_pb";
import type { Mesh } from "../mesh";
import { Refused } from "../rpc";
import { EAGER_SECTIONS, clear, h, hex, lazyDetails, short, when, workStateName } from "../ui";

const CHECK_LIMIT_BYTES = 64 * 1024 * 1024;

/** Downloads the blob `digestHex` and checks its BLAKE3 in the page. */
export async function fetchAndCheck(mesh: Mesh, digest: { algorithm: string; hex: string; sizeBytes: bigint }): Promise<{ ok: boolean; data: Uint8Array; why: string }> {
  if (digest.sizeBytes > BigInt(CHECK_LIMIT_BYTES)) return { ok: false, data: new Uint8Array(), why: "too large to check in the page" };
  const hasher = blake3.create();
  const parts: Uint8Array[] = [];
  for await (const chunk of mesh.stream(ArtifactService.method.download, { digest })) {
    hasher.update(chunk.data);
    parts.push(chunk.data);
  }
  const got = hex(hasher.digest());
  const data = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    data.set(p, at);
    at += p.length;
  }
  return got === digest.hex
    ? { ok: true, data, why: `BLAKE3 ${short(got, 16)} matches its content hash` }
    : { ok: false, data, why: `BLAKE3 of the bytes served is ${short(got, 16)}, not ${short(digest.hex, 16)}: the stored blob was altered` };
}

function artifactRow(mesh: Mesh, a: MissionReviewArtifact, groupId: string): HTMLElement {
  const d = a.artifact?.digest;
  const status = h("span", { class: "verify", "data-testid": "artifact-verify", role: "status" }, "checking…");
  const link = h("a", { class: "download", "aria-disabled": "true" }, "download");
  const provenance = h("ul", { class: "provenance", "aria-label": "Provenance" });
  const row = h(
    "li",
    { class: "artifact", "data-digest": d?.hex ?? "" },
    h("code", { title: d?.hex ?? "" }, `${d?.algorithm ?? ""}:${short(d?.hex ?? "", 18)}`),
    ` ${a.artifact?.mediaType ?? ""} · ${d?.sizeBytes ?? 0n} bytes · by ${a.producerId || "?"}${a.workItemId ? ` for ${a.workItemId}` : ""} `,
    status,
    " ",
    link,
    provenance,
  );
  if (d) {
    void fetchAndCheck(mesh, d)
      .then((r) => {
        status.textContent = r.ok ? `✓ verified: ${r.why}` : `✗ FAILED verification: ${r.why}`;
        status.className = `verify ${r.ok ? "ok" : "error"}`;
        if (r.ok) {
          link.setAttribute("href", URL.createObjectURL(new Blob([Uint8Array.from(r.data)], { type: a.artifact?.mediaType || "application/octet-stream" })));
          link.setAttribute("download", `${d.hex.slice(0, 16)}`);
          link.removeAttribute("aria-disabled");
        }
      })
      .catch((err: unknown) => {
        // DATA_CORRUPTED: the mesh hashed the stored bytes itself, found them altered and serves none.
        const corrupted = err instanceof Refused && err.reason === "DATA_CORRUPTED";
        status.textContent = `✗ ${corrupted ? "FAILED verification" : "could not be checked"}: ${err instanceof Refused ? err.message : String(err)}`;
        status.className = "verify error";
      });
    void mesh
      .unary(ArtifactService.method.queryProvenance, { digest: d, direction: ProvenanceDirection.ANCESTORS, maxDepth: 4, groupId })
      .then((p) => {
        for (const n of p.nodes) if (n.digest?.hex !== d.hex) provenance.append(h("li", {}, `derived from ${short(n.digest?.hex ?? "", 16)} (${n.mediaType || "?"}) by ${n.producerAgentId || "?"}`));
      })
      .catch(() => undefined);
  }
  return row;
}

function resultName(r: EvidenceResult): string {
  return (EvidenceResult[r] ?? "none").replace(/^EVIDENCE_RESULT_/, "").toLowerCase();
}

// One Evidence record: its result, method, producer and summary, and every Artifact it cites
// (each checked like the submission's own).
function evidenceLine(mesh: Mesh, e: Evidence, groupId: string): HTMLElement {
  const line = h("div", { class: "evidence" });
  line.append(h("span", { class: "evidence-summary" }, `${resultName(e.result)} · ${(EvidenceMethod[e.method] ?? "").replace(/^EVIDENCE_METHOD_/, "").toLowerCase()} by ${e.producerId}: ${e.summary}`));
  if (e.artifacts.length) {
    line.append(
      h(
        "ul",
        { class: "artifacts", "aria-label": "Artifacts this Evidence cites" },
        ...e.artifacts.map((artifact) => artifactRow(mesh, create(MissionReviewArtifactSchema, { artifact, producerId: e.producerId }), groupId)),
      ),
    );
  }
  return line;
}

function workItemReview(mesh: Mesh, w: MissionReviewWorkItem, groupId: string, eager: boolean): HTMLElement {
  return lazyDetails(
    { class: "wi-review", open: w.criteria.some((c) => !c.satisfied) && eager },
    `${w.title || w.workItemId} — ${workStateName(w.state)}${w.submittedBy ? `, submitted by ${w.submittedBy} ${when(w.submittedAt)}` : ""}`,
    () => [
      w.submissionSummary ? h("p", {}, w.submissionSummary) : null,
      h(
        "table",
        { class: "criteria" },
        h("caption", {}, "Evidence against each acceptance criterion"),
        h("thead", {}, h("tr", {}, ...["Criterion", "Met", "Evidence"].map((c) => h("th", { scope: "col" }, c)))),
        h(
          "tbody",
          {},
          ...w.criteria.map((c) =>
            h(
              "tr",
              {},
              h("td", {}, c.description, c.independentReviewRequired ? h("div", { class: "sub" }, "needs an independent reviewer") : null),
              h("td", { class: c.satisfied ? "ok" : "error" }, c.satisfied ? "✓ met" : c.evidence.length ? `✗ ${resultName(c.latestResult)}` : "✗ no evidence yet"),
              h("td", {}, ...c.evidence.map((e) => evidenceLine(mesh, e, groupId))),
            ),
          ),
        ),
      ),
      w.artifacts.length ? h("ul", { class: "artifacts", "aria-label": `Artifacts of ${w.title || w.workItemId}` }, ...w.artifacts.map((a) => artifactRow(mesh, a, groupId))) : null,
    ],
    eager,
  );
}

export async function reviewPanel(mesh: Mesh, root: HTMLElement, groupId: string): Promise<void> {
  const review = await mesh.unary(AuthorityService.method.getMissionReview, { groupId });
  const s = review.submission;
  clear(
    root,
    h(
      "section",
      { class: "panel review", "aria-labelledby": "review-title" },
      h("h2", { id: "review-title" }, "Submission and evidence"),
      s ? h("p", {}, `Submitted by ${s.submittedBy} ${when(s.submittedAt)}: “${s.summary}”${s.latest ? "" : " (not the latest)"}`) : h("p", { class: "sub" }, "Nothing submitted yet."),
      review.artifacts.length ? h("div", {}, h("h3", {}, "Artifacts of the submission"), h("ul", { class: "artifacts" }, ...review.artifacts.map((a) => artifactRow(mesh, a, groupId)))) : null,
      review.blockers.length ? h("div", {}, h("h3", {}, "What stands between this Mission and approval"), h("ul", {}, ...review.blockers.map((b) => h("li", {}, `${b.workItemId} (${workStateName(b.state)}): ${b.details.join("; ") || "not verified yet"}`)))) : null,
      h("h3", {}, "WorkItems"),
      ...review.workItems.map((w) => workItemReview(mesh, w, groupId, review.workItems.length <= EAGER_SECTIONS)),
    ),
  );
}
