// Bundles src/main.ts and copies the page's static files into the server package, where the mesh
// serves them (missionweave_server/console/static). No file is fetched at run time: everything the
// page needs is in this bundle.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";

const out = "../missionweave_server/console/static";
mkdirSync(out, { recursive: true });
await build({
  entryPoints: ["src/main.ts"],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: true,
  outfile: `${out}/app.js`,
  logLevel: "warning",
});
for (const name of ["index.html", "app.css"]) copyFileSync(`static/${name}`, `${out}/${name}`);
console.log(`console built into ${out}`);
