// Coding agents' own session headers feed session affinity with nothing
// configured but --session-affinity: real Envoy + router + two simulators,
// all on 127.0.0.1. The session ids never reach the router's log in clear.
import { test, before, after } from "node:test";
import * as assert from "node:assert/strict";
import { chat, longText, stopAll, needsEnvoy, startEnvoyFleet, EnvoyFleet } from "../harness";
import { sessionTag } from "../../core/session-headers";

const skip = needsEnvoy();
let fleet: EnvoyFleet;

before(async () => {
  if (skip) return;
  fleet = await startEnvoyFleet({
    ids: ["w0", "w1"],
    simArgs: ["--decode-ms-per-token", "1"],
    // No --session-header: only the built-in agent header list names sessions.
    routerArgs: ["--session-affinity", "prefill", "--log-level", "debug"],
  });
});

after(stopAll);

const simOf = (id: string | null) => fleet.sims.find((s) => s.id === id)!;
/** Every block the engine holds is in the router's mirror: the next pick sees this request's cache. */
const settled = () => fleet.settled();

// Each agent's header, as the agent spells it.
const AGENTS: [string, string, string][] = [
  ["Claude Code", "X-Claude-Code-Session-Id", "3f1c2a9e-claude-secret-0001"],
  ["OpenCode", "x-session-affinity", "ses_opencode_secret_0002"],
  ["Dynamo clients", "X-Dynamo-Session-ID", "dynamo-secret-0003"],
];

for (const [agent, header, id] of AGENTS) {
  test(`${agent}: two turns with different prompts stay on one worker (${header})`, { skip }, async () => {
    const seed = agent.replace(/\W/g, "").toLowerCase();
    const a = await chat(fleet.envoy.url, longText(seed + "one", 300), { headers: { [header]: id } });
    assert.equal(a.status, 200);
    await settled();
    // Prompts sharing nothing with the first: without the session each is cold
    // everywhere and its tie goes by a hash of its content (the control below
    // shows some of them go elsewhere); with it, every turn stays.
    for (let k = 0; k < 3; k++) {
      const b = await chat(fleet.envoy.url, longText(seed + "turn" + k, 300), { headers: { [header]: id } });
      assert.equal(b.status, 200);
      assert.equal(b.worker, a.worker, `turn ${k + 2} of the ${agent} session moved`);
      await settled();
    }
    const control: string[] = [];
    for (let k = 0; k < 4; k++) {
      const c = await chat(fleet.envoy.url, longText(seed + "control" + k, 300));
      control.push(c.worker!);
      await settled();
    }
    assert.ok(
      control.some((w) => w !== a.worker),
      `control: without the header cold prompts spread, not all to ${a.worker}: ${control}`,
    );
    assert.ok(simOf(a.worker));
    await settled();
  });
}

test("session ids never appear in the router's log; their tag does", { skip }, async () => {
  const log = fleet.router.proc.log();
  assert.ok(log.includes('"msg":"pick"') || log.includes("pick"), "debug pick lines were written");
  for (const [, , id] of AGENTS) {
    assert.ok(!log.includes(id), `session id ${id} in the router log`);
    assert.ok(log.includes(sessionTag(id)), `no tag for ${id} in the router's debug pick lines`);
  }
});
