// The peer routers the benches run beside infera-gate (pip install smg
// vllm-router; benches only, never CI): found on PATH, started as their own
// HTTP proxy in front of the simulators, on 127.0.0.1.
import { execFileSync } from "child_process";
import { fatal, freePort, httpOk, Proc, run, Sim, waitFor } from "../test/harness";

/** The executable's path, or null when it is not installed. */
export function which(bin: string): string | null {
  try {
    return execFileSync("sh", ["-c", `command -v ${bin}`], { encoding: "utf8" }).trim() || null;
  } catch {
    return null;
  }
}

/** Why a peer cannot run here, or null. */
export function peerMissing(bin: string): string | null {
  return which(bin) ? null : `${bin} not installed (pip install ${bin === "smg" ? "smg" : "vllm-router"})`;
}

/**
 * Starts `bin` (smg: `launch` first) over the simulators with `extra` flags
 * (its policy and options); resolves once it answers /v1/models or /health.
 */
export async function startPeer(
  name: string,
  bin: string,
  sims: Sim[],
  extra: string[],
): Promise<{ url: string; stop: () => Promise<void> }> {
  const exe = which(bin);
  if (!exe) throw new Error(peerMissing(bin)!);
  const port = await freePort();
  const prom = await freePort();
  const p: Proc = run(name, exe, [
    ...(bin === "smg" ? ["launch"] : []),
    "--host",
    "127.0.0.1",
    "--port",
    String(port),
    "--worker-urls",
    ...sims.map((s) => `http://${s.address}`),
    "--prometheus-host",
    "127.0.0.1",
    "--prometheus-port",
    String(prom),
    "--log-level",
    bin === "smg" ? "warn" : "warning",
    ...extra,
  ]);
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    `${name} up`,
    async () => {
      if (p.child.exitCode !== null) throw fatal(`${name} exited: ${p.log().slice(-1500)}`);
      return (await httpOk(`${url}/v1/models`)) || (await httpOk(`${url}/health`));
    },
    60000,
  );
  return { url, stop: () => p.kill() };
}
