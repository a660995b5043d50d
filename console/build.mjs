// Bundles src/main.ts (app.js) and the worker that checks the events' signatures and chain
// (src/verify-worker.ts: verify-worker.js, which the page starts from its own origin), and copies
// the page's static files into the server package, where the mesh serves them
// (missionweave_server/console/static). Nothing is fetched from elsewhere at run time: everything
// the page needs is in these bundles. MINIFY=0 leaves them readable (for a profile's names).
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";

const out = "../missionweave_server/console/static";
mkdirSync(out, { recursive: true });
await build({
  entryPoints: { app: "src/main.ts", "verify-worker": "src/verify-worker.ts" },
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: process.env.MINIFY !== "0",
  sourcemap: true,
  outdir: out,
  logLevel: "warning",
});
for (const name of ["index.html", "app.css"]) copyFileSync(`static/${name}`, `${out}/${name}`);
console.log(`console built into ${out}`);
