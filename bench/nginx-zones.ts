// How many mirrored engine blocks nginx's shared-dict zones hold, and what
// happens past that: nginx with the project's config (zones resized per row),
// a fleet of one worker pushed by hand (no bridge), and KV-event pushes of
// fresh chains of 256 blocks (16 tokens each, vLLM-sized engine hashes) until
// nginx answers 507. Each row makes one zone small and the other large, so
// the small one is what fills: its bytes over the blocks held are what a block
// costs there. After the 507, --after more batches are pushed: with the zone
// bound (njs/push.ts) every one should fit, the mirror held at the bound.
//
// Usage: node --import tsx bench/nginx-zones.ts [--rows str:4m/num:256m,str:256m/num:4m] [--after 40]
import { nginx08, startNginx, stopAll } from "../test/harness";
import { runBench } from "./run-bench";
import { optionReader } from "./args";

const opt = optionReader(process.argv.slice(2));
const rows = opt("--rows", "str:4m/num:256m,str:256m/num:4m").split(",");
const after = Math.min(400, Math.max(0, Number(opt("--after", "40"))));
const MAX_BATCHES = 4000;
const PER = 256;

const mb = (v: string) => Number(v.replace(/m$/, "")) * 1048576;

runBench(async () => {
  const fl = nginx08();
  if (!fl) throw new Error("njs >= 0.8 not set up (bash scripts/njs08.sh)");
  const out: string[] = [
    "| zone_str | zone_num | blocks held at the first 507 | bytes per block (the small zone) | bound learned | further batches of 256 refused |",
    "|---|---|---:|---:|---:|---:|",
  ];
  try {
    for (const row of rows) {
      const [s, n] = row.split("/").map((x) => x.split(":")[1]);
      const ng = await startNginx(fl, { zone_str: s, zone_num: n });
      const worker = "127.0.0.1:18001";
      let pseq = Date.now() * 1000;
      const push = (body: Record<string, unknown>) =>
        fetch(`${ng.url}/_infera/push`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-infera-push-token": "test-token" },
          body: JSON.stringify({ ...body, pseq: ++pseq }),
        });
      await push({ type: "workers", workers: [{ id: worker, address: worker, role: "mixed" }] });
      const toks = Array.from({ length: 16 * PER }, (_, i) => i + 1);
      const batch = (b: number) => ({
        type: "events",
        worker,
        seq: b,
        events: [
          {
            type: "BlockStored",
            // vLLM's engine hashes are 64-bit integers: up to 20 decimal digits
            hashes: Array.from({ length: PER }, (_, i) => String(1e19 - (b * PER + i) * 7919)),
            parent: null,
            tokens: toks.map((t) => t + b * 100000),
            blockSize: 16,
          },
        ],
      });
      let b = 0;
      let fit = NaN;
      for (; b < MAX_BATCHES; b++) {
        const r = await push(batch(b));
        if (r.status === 507) {
          fit = Number(/keeps at most (\d+) blocks/.exec(await r.text())?.[1]);
          break;
        }
        if (r.status !== 200) throw new Error(`push ${b}: ${r.status} ${await r.text()}`);
      }
      const held = b * PER;
      let refused = 0;
      for (let k = 1; k <= after && b < MAX_BATCHES; k++) if ((await push(batch(b + k))).status !== 200) refused++;
      const small = mb(s) < mb(n) ? mb(s) : mb(n);
      out.push(
        `| ${s} | ${n} | ${b < MAX_BATCHES ? held : `> ${held}`} | ${b < MAX_BATCHES ? Math.round(small / held) : "-"} | ${fit} | ${refused} of ${after} |`,
      );
      await ng.proc.kill("SIGTERM");
    }
  } finally {
    await stopAll();
  }
  console.log(out.join("\n"));
});
