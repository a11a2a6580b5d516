// nginx (njs 0.8, one worker process) + the bridge with its tokenizer helper,
// for the tokenize-offload tests and bench: the helper's URL is known, so
// nginx can be pointed at it or at a dead port, and the single worker's pid
// is known, so its CPU time can be read from /proc.
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import {
  fatal,
  freePort,
  longText,
  NginxFlavor,
  Proc,
  renderNginx,
  ROOT,
  run,
  Sim,
  sleep,
  entryArgs,
  waitFor,
} from "./harness";
import { loadTokenizer } from "../runtime/tokenizer";

export interface NginxStack {
  url: string;
  port: number;
  dir: string;
  proc: Proc;
  /** The one nginx worker process. */
  workerPid: number;
}

/**
 * nginx with worker_processes 1; vars as renderNginx takes them (e.g. tokenizer_url).
 * dist: another njs bundle directory than this checkout's (a bench's baseline build).
 * locations: nginx config put in the server block (a bench's own locations).
 */
export async function startNginx1(
  fl: NginxFlavor,
  vars: Record<string, string> = {},
  dist?: string,
  locations = "",
): Promise<NginxStack> {
  let last: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-nginx1-"));
    const file = renderNginx(fl, port, dir, vars);
    let conf = fs.readFileSync(file, "utf8").replace(/worker_processes [^;]*;/, "worker_processes 1;");
    if (dist) conf = conf.split(path.join(ROOT, "njs", "dist")).join(dist);
    // Older baselines, newest change first: each rewrite leaves the config of the bundle's time.
    if (dist && !fs.existsSync(path.join(dist, "infera-push.js"))) conf = pushInInferaConf(conf);
    if (dist && !fs.existsSync(path.join(dist, "infera-phases.js"))) conf = singleBundleConf(conf, dist);
    if (locations) {
      // A bench's own locations (bench/nginx-floor.ts), in the server block before its catch-all.
      const at = conf.indexOf("    location / {");
      if (at < 0) throw new Error("nginx.conf: no catch-all location to put the bench's locations before");
      conf = conf.slice(0, at) + locations + "\n" + conf.slice(at);
    }
    fs.writeFileSync(file, conf);
    const proc = run(`nginx1-${fl.label}`, fl.bin, ["-p", dir, "-c", file, "-e", "stderr", "-g", "daemon off;"], {
      INFERA_PUSH_TOKEN: "test-token",
    });
    try {
      await waitFor("nginx (one worker)", async () => {
        if (proc.child.exitCode !== null) throw fatal(`nginx exited: ${proc.log()}`);
        return !!(await fetch(`http://127.0.0.1:${port}/v1/admin/reservations`).catch(() => null));
      });
      const kids = fs
        .readFileSync(`/proc/${proc.child.pid}/task/${proc.child.pid}/children`, "utf8")
        .trim()
        .split(/\s+/)
        .map(Number);
      if (kids.length !== 1) throw new Error(`nginx has ${kids.length} worker processes, want 1`);
      return { url: `http://127.0.0.1:${port}`, port, dir, proc, workerPid: kids[0] };
    } catch (e) {
      last = e;
      await proc.kill();
      if (!/exited/.test(String((e as Error).message))) throw e;
    }
  }
  throw new Error(`nginx failed to start 3 times: ${String(last)}`);
}

/**
 * A bundle built before njs/phases.ts had its own file (a bench's baseline)
 * runs with the config of its time: infera.js imported once at http level,
 * with the vocabulary, for every phase.
 */
export function singleBundleConf(conf: string, dist: string): string {
  const out = conf
    .replace(/\n\s*js_preload_object infera_vocab from [^;]*;/g, "")
    .replace(/\n\s*js_import infera from infera\.js;/g, "")
    .replace(
      "js_import inferap from infera-phases.js;",
      `js_preload_object infera_vocab from ${path.join(dist, "tokenizer.json")};\n  js_import infera from infera.js;`,
    )
    .split("inferap.")
    .join("infera.");
  if (out.indexOf("js_import infera from infera.js;") < 0)
    throw new Error("nginx.conf: no js_import of infera-phases.js");
  return out;
}

/** A bundle built before njs/push.ts had its own file: every push to infera.js's push, as in its time. */
export function pushInInferaConf(conf: string): string {
  const out = conf
    .replace(/\n\s*js_import inferapush from infera-push\.js;/g, "\n      js_import infera from infera.js;")
    .split("inferapush.push")
    .join("infera.push");
  if (out.indexOf("infera-push.js") >= 0) throw new Error("nginx.conf: infera-push.js left in a baseline's config");
  return out;
}

/** The bridge on a known admin port (its /v1/tokenize is the helper). Resolves once its tokenizer is loaded. */
export async function startBridgeAt(
  workers: string,
  pushUrl: string,
  adminPort?: number,
  extra: string[] = [],
): Promise<{ proc: Proc; adminPort: number; tokenizeUrl: string }> {
  const port = adminPort ?? (await freePort());
  const proc = run("bridge", process.execPath, [
    ...entryArgs("njs/bridge.ts"),
    "--nginx-push-url",
    pushUrl,
    "--push-token",
    "test-token",
    "--admin-port",
    String(port),
    "--workers",
    workers,
    ...extra,
  ]);
  await waitFor(
    "bridge admin",
    async () => {
      if (proc.child.exitCode !== null) throw fatal(`bridge exited: ${proc.log().slice(-800)}`);
      // Logged after the tokenizer helper is warm (njs/bridge.ts).
      return proc.log().includes('"bridge started"');
    },
    30000,
  );
  return { proc, adminPort: port, tokenizeUrl: `http://127.0.0.1:${port}/v1/tokenize` };
}

/** utime + stime of a process in ms (10 ms ticks). */
export function cpuMs(pid: number): number {
  const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return 10 * (Number(f[11]) + Number(f[12]));
}

/**
 * The CPU time of a single-threaded process (the nginx worker) in ms, from
 * /proc/<pid>/schedstat's nanoseconds where the kernel keeps it, else cpuMs's
 * 10 ms ticks: a few milliseconds per request are then measurable in tens of
 * requests rather than hundreds.
 */
export function workerCpuMs(pid: number): number {
  try {
    return Number(fs.readFileSync(`/proc/${pid}/schedstat`, "utf8").split(" ")[0]) / 1e6;
  } catch {
    return cpuMs(pid);
  }
}

let tok: ReturnType<typeof loadTokenizer> | undefined;
/**
 * longText(seed, words) of about `tokens` tokens (the default tokenizer, the
 * one npm run build:njs puts in the bundle): a word's token count depends on
 * the seed's length, so the word count is calibrated on a sample per seed.
 */
export function textOfTokens(seed: string, tokens: number): string {
  if (tok === undefined) tok = loadTokenizer(null);
  const sample = 400;
  const per = tok ? tok.encode(longText(seed, sample)).length / sample : 1024 / 150;
  return longText(seed, Math.max(1, Math.round(tokens / per)));
}

/** The KV events of what was sent are applied: nginx's mirror counts stop moving (3 equal reads 100 ms apart, at most 20 s). */
export async function mirrorSettled(ng: NginxStack, sims: Sim[]): Promise<void> {
  let last = "";
  let same = 0;
  for (let i = 0; i < 200 && same < 3; i++) {
    await sleep(100);
    const now = JSON.stringify(
      await Promise.all(
        sims.map(
          async (s) =>
            ((await (await fetch(`${ng.url}/v1/admin/cache-view/${s.address}`)).json()) as { block_count: number })
              .block_count,
        ),
      ),
    );
    same = now === last ? same + 1 : 0;
    last = now;
  }
}

/** Simulator flags for an engine that costs no time (prefill free, decode at decodeMsPerToken): what is measured is the gateway, not the engine. */
export function freeEngineArgs(capacityBlocks: number, decodeMsPerToken = 0): string[] {
  return [
    "--prefill-us-per-token",
    "0",
    "--decode-ms-per-token",
    String(decodeMsPerToken),
    "--prefill-attn-us-per-kctx",
    "0",
    "--capacity-blocks",
    String(capacityBlocks),
  ];
}
