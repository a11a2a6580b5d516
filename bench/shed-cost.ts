// The sheddable 429's cost in the router, in process: the director's decision
// for a bench:overload-shaped request (250-450 distinct words, cold) while
// every worker holds a cold prefill, with the refusal decided before
// tokenizing (Routing.shedsCold) and without it (the same App with the early
// check taken away: the pick tokenizes the whole prompt, then the objective
// shedder refuses). The two alternate request by request, so both see the
// same machine. Not a wall-clock run through Envoy (bench:overload is); this
// isolates the router's own work on the refusal.
//
// Usage: npm run bench:shed-cost -- [--requests 4000]
import { App } from "../runtime/app";
import { parseArgs } from "../runtime/config";
import { RouteInput } from "../runtime/director";
import { longText } from "../test/harness";

const argv = process.argv.slice(2);
const i = argv.indexOf("--requests");
const N = i >= 0 ? Number(argv[i + 1]) : 4000;
const noEvents = { subscribe: () => ({ close() {} }), close: async () => undefined };
const W = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"];

function app(): App {
  const a = new App(
    parseArgs(
      [
        "--workers",
        W.join(","),
        "--health-interval-ms",
        "0",
        "--objectives",
        "critical=100,standard=0,batch=-1",
        "--objective-headers",
        "trust",
      ],
      {},
    ),
    () => undefined,
    noEvents,
  );
  a.setWorkers(a.opts.workers);
  return a;
}

function input(seed: string, objective: string, words: number): RouteInput {
  const body = {
    model: "sim-model",
    max_tokens: 16,
    stream: true,
    messages: [{ role: "user", content: longText(seed, words) }],
  };
  return {
    endpoint: "chat",
    body: Buffer.from(JSON.stringify(body)),
    headers: {
      ":path": "/v1/chat/completions",
      "x-gateway-inference-objective": objective,
      "x-gateway-inference-fairness-id": "noisy",
      "x-slo-ttft-ms": "4000",
    },
    subset: null,
  };
}

const pct = (xs: number[], p: number) =>
  xs.slice().sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))];

async function main(): Promise<void> {
  const early = app();
  const late = app();
  // The old path: no early check, so the director picks (tokenizing the whole prompt) before the shedder refuses.
  (late as unknown as { routing: { shedsCold?: unknown } }).routing.shedsCold = undefined;
  for (const a of [early, late])
    for (let w = 0; w < W.length; w++) {
      const d = await a.director.decide(input(`hold${w}x`, "standard", 400));
      if (d.kind !== "route") throw new Error("a holder was not routed");
    }
  const times: { [k: string]: number[] } = { "before tokenizing": [], "after the pick": [] };
  for (let n = 0; n < N; n++) {
    const words = 250 + ((n * 7919) % 200);
    for (const [name, a] of n % 2
      ? ([
          ["before tokenizing", early],
          ["after the pick", late],
        ] as const)
      : ([
          ["after the pick", late],
          ["before tokenizing", early],
        ] as const)) {
      const inp = input(`r${n}x`, "batch", words);
      const t0 = performance.now();
      const d = await a.director.decide(inp);
      times[name].push(performance.now() - t0);
      if (d.kind !== "refuse" || d.status !== 429) throw new Error(`${name}: not shed`);
    }
  }
  process.stdout.write(`command: npm run bench:shed-cost -- --requests ${N}; node ${process.version}\n\n`);
  process.stdout.write(
    "| sheddable 429 decided | requests | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n",
  );
  for (const k of Object.keys(times)) {
    const t = times[k];
    process.stdout.write(
      `| ${k} | ${t.length} | ${pct(t, 0.5).toFixed(3)} | ${pct(t, 0.9).toFixed(3)} | ${pct(t, 0.99).toFixed(3)} | ${Math.max(...t).toFixed(3)} |\n`,
    );
  }
  await early.close();
  await late.close();
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${(e as Error).stack}\n`);
    process.exit(1);
  },
);
