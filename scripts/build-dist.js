// Compiles the TypeScript sources to CommonJS in dist/ (esbuild, one file per
// source, no bundling), so production runs plain `node dist/...` without tsx.
// Plain JavaScript on purpose: it runs at `npm ci --omit=dev` (prepare), where
// no TypeScript tooling is installed.
const fs = require("fs");
const path = require("path");

const ROOT = path.resolve(__dirname, "..");
const DIRS = ["core", "cli", "runtime", "extproc", "njs", "sim"];

function walk(dir, out) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, out);
    else if (/\.ts$/.test(e.name) && !/\.d\.ts$/.test(e.name)) out.push(p);
  }
  return out;
}

async function main() {
  let esbuild;
  try {
    esbuild = require("esbuild");
  } catch {
    process.stderr.write("build-dist: esbuild is not installed; skipping (dist/ must come from the image build)\n");
    return;
  }
  const files = [];
  for (const d of DIRS) if (fs.existsSync(path.join(ROOT, d))) walk(path.join(ROOT, d), files);
  fs.rmSync(path.join(ROOT, "dist"), { recursive: true, force: true });
  await esbuild.build({
    entryPoints: files,
    outdir: path.join(ROOT, "dist"),
    outbase: ROOT,
    format: "cjs",
    platform: "node",
    target: "node20",
    sourcemap: true,
    logLevel: "warning",
    // Lazy import("./x") must become require("./x"): Node resolves an extension-less path only for require.
    supported: { "dynamic-import": false },
  });
  // The test harness runs dist/ only when this stamp is newer than every source (test/harness.ts entryArgs).
  fs.writeFileSync(path.join(ROOT, "dist", ".built"), new Date().toISOString() + "\n");
  process.stderr.write(`build-dist: ${files.length} files -> dist/\n`);
}

// The test harness reads DIRS to tell whether dist/ is older than a source.
module.exports = { DIRS };

if (require.main === module)
  main().catch((e) => {
    process.stderr.write(`build-dist: ${e.message}\n`);
    process.exit(1);
  });
