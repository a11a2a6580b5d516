// A/B of the routing core's pick() between this checkout and another one (an
// earlier commit checked out elsewhere), in ONE process with interleaved rounds,
// so machine noise hits both alike. Tokenization is left out (same code on both
// sides); this measures scoring + load accounting + release.
// Usage: node --import tsx bench/ab-pick.ts /path/to/other/checkout
import * as path from "path";
import { createRequire } from "module";
import { pct } from "./stats";

type AnyRouter = {
  addWorker(w: unknown): { ek?: string; epochKey?: string };
  pick(f: unknown): { reservation: { finish(): void }; target: { id: string } };
};
interface Side {
  name: string;
  make(
    workers: number,
    cachedPerWorker: number,
  ): { router: AnyRouter; cache(i: number, blocks: string[]): void; ids: string[] };
}

function side(root: string, name: string): Side {
  const req = createRequire(path.join(root, "package.json"));
  const router = req(path.join(root, "core/router.ts"));
  const hasState = (() => {
    try {
      req.resolve(path.join(root, "core/state/memory.ts"));
      return true;
    } catch {
      return false;
    }
  })();
  return {
    name,
    make(workers, cachedPerWorker) {
      let cacheFn: (ek: string, eh: string, h: string) => void;
      let r: AnyRouter;
      if (hasState) {
        const state = req(path.join(root, "core/state/memory.ts")).memoryState();
        r = router.createRouter(state, router.defaultConfig());
        cacheFn = (ek, eh, h) => state.mirror.store(ek, eh, h);
      } else {
        const st = req(path.join(root, "core/store.ts")).memStore();
        const mirror = req(path.join(root, "core/mirror.ts"));
        r = router.createRouter(st, router.defaultConfig());
        cacheFn = (ek, eh, h) => mirror.mirrorStore(st, ek, eh, h);
      }
      const eks: string[] = [];
      const ids: string[] = [];
      for (let i = 0; i < workers; i++) {
        const w = r.addWorker({ id: `127.0.0.1:${20000 + i}`, address: `127.0.0.1:${20000 + i}`, role: "mixed" });
        eks.push((w.epochKey ?? w.ek) as string);
        ids.push(`127.0.0.1:${20000 + i}`);
      }
      const cache = (i: number, blocks: string[]) => blocks.forEach((b, k) => cacheFn(eks[i], `e${i}-${k}-${b}`, b));
      for (let i = 0; i < workers; i++)
        cache(
          i,
          Array.from({ length: cachedPerWorker }, (_, k) => `bg${i}-${k}`.padStart(16, "0")),
        );
      return { router: r, cache, ids };
    },
  };
}

function main(): void {
  const other = process.argv[2];
  if (!other) throw new Error("usage: bench/ab-pick.ts /path/to/other/checkout");
  const sides = [side(path.resolve(other), "other"), side(path.resolve(__dirname, ".."), "this")];
  const lines = [
    "| workers | request blocks | other p50 µs | this p50 µs | this/other p50 | other p99 µs | this p99 µs |",
    "|---:|---:|---:|---:|---:|---:|---:|",
  ];
  for (const workers of [8, 64]) {
    for (const nb of [64, 256, 2048]) {
      const built = sides.map((s) => s.make(workers, 2000));
      const prompt = Array.from({ length: nb }, (_, k) => `req${nb}-${k}`.padStart(16, "0"));
      built.forEach((b) => b.cache(workers - 1, prompt.slice(0, nb >> 1)));
      const feats = { blocks: prompt, inputTokens: nb * 16, exact: true, mediaHashes: [], n: 1 };
      const times: number[][] = [[], []];
      for (let round = 0; round < 40; round++)
        for (let s = 0; s < 2; s++) {
          for (let k = 0; k < 10; k++) {
            const t0 = process.hrtime.bigint();
            const p = built[s].router.pick(feats);
            p.reservation.finish();
            const dt = Number(process.hrtime.bigint() - t0) / 1000;
            if (round >= 4) times[s].push(dt);
            if (p.target.id !== built[s].ids[workers - 1]) throw new Error(`${sides[s].name} picked ${p.target.id}`);
          }
        }
      const [o, t] = times;
      lines.push(
        `| ${workers} | ${nb} | ${pct(o, 50).toFixed(1)} | ${pct(t, 50).toFixed(1)} | ${(pct(t, 50) / pct(o, 50)).toFixed(2)} | ${pct(o, 99).toFixed(1)} | ${pct(t, 99).toFixed(1)} |`,
      );
    }
  }
  process.stdout.write(lines.join("\n") + "\n");
}

main();
