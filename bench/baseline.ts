// Another revision of the router as one more side of a bench run: the same
// machine, the same minute, the same fleet, so "before" and "after" are
// compared side by side instead of across runs that differ by the machine's noise.
import { execFileSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";

/** A detached checkout of rev beside this one, removed at exit; its cli/router.ts. */
export function baselineRouterEntry(rev: string): string {
  const root = path.resolve(__dirname, "..");
  const sha = execFileSync("git", ["rev-parse", "--short", rev], { cwd: root }).toString().trim();
  // A fresh path: git worktree add wants one that does not exist yet.
  const parent = fs.mkdtempSync(path.join(os.tmpdir(), "infera-baseline-"));
  const dir = path.join(parent, sha);
  execFileSync("git", ["worktree", "add", "--detach", dir, sha], { cwd: root, stdio: "ignore" });
  // Gone however the bench ends, so no worktree stays registered in the repository.
  process.on("exit", () => {
    execFileSync("git", ["worktree", "remove", "--force", dir], { cwd: root, stdio: "ignore" });
    fs.rmSync(parent, { recursive: true, force: true });
  });
  const lock = (d: string) => fs.readFileSync(path.join(d, "package-lock.json"), "utf8");
  // Same dependencies: share ours. Otherwise that revision's own (from the registry).
  if (lock(dir) === lock(root)) fs.symlinkSync(path.join(root, "node_modules"), path.join(dir, "node_modules"));
  else
    execFileSync("npm", ["ci", "--ignore-scripts", "--no-audit", "--no-fund"], {
      cwd: dir,
      stdio: "ignore",
      timeout: 600_000,
    });
  return path.join(dir, "cli/router.ts");
}
