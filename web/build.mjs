// Bundles src/ and the d3 modules it imports into one file the controller serves (no CDN at run time), and
// writes the licences of everything bundled next to it. Run by `npm run build` after `npm ci`.
import { build } from "esbuild";
import { readFileSync, writeFileSync, mkdirSync, existsSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "controller", "observe", "page", "dist");
mkdirSync(out, { recursive: true });

const result = await build({
  entryPoints: [join(here, "src", "main.js")],
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  outfile: join(out, "fabric-view.js"),
  legalComments: "none",
  metafile: true,
  logLevel: "warning",
});

// Every npm package that ended up in the bundle, with its licence text.
const packages = new Map();
for (const input of Object.keys(result.metafile.inputs)) {
  const match = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (match) packages.set(match[1], join(here, "node_modules", match[1]));
}
const notices = [
  "Third-party code bundled into fabric-view.js (built from web/ with esbuild; versions pinned by web/package-lock.json).",
  "",
];
for (const [name, dir] of [...packages].sort()) {
  const meta = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  const file = readdirSync(dir).find((f) => /^licen[cs]e/i.test(f));
  notices.push(`== ${name} ${meta.version} (${meta.license})`);
  notices.push(file && existsSync(join(dir, file)) ? readFileSync(join(dir, file), "utf8").trim() : "(no licence file shipped)");
  notices.push("");
}
writeFileSync(join(out, "THIRD-PARTY-LICENSES.txt"), notices.join("\n") + "\n");
writeFileSync(
  join(out, "bundle.json"),
  JSON.stringify({ packages: Object.fromEntries([...packages.keys()].sort().map((n) => [n, JSON.parse(readFileSync(join(packages.get(n), "package.json"), "utf8")).version])) }, null, 2) + "\n",
);
console.log(`fabric-view.js: ${packages.size} packages bundled -> ${out}`);
