// The njs module reads the coding agents' session headers too: real nginx
// (njs >= 0.8) fed by the bridge, two simulators, all on 127.0.0.1.
import { test, after } from "node:test";
import * as assert from "node:assert/strict";
import { chat, longText, stopAll, needsNjs08, startNginxFleet } from "../harness";

const { n8, skip } = needsNjs08();
after(stopAll);

test(
  "nginx: a Claude Code session's turns with different prompts stay on one worker, with no session header configured",
  { skip, timeout: 120000 },
  async () => {
    const { ng, settled } = await startNginxFleet(n8!, {
      ids: ["n0", "n1"],
      simArgs: ["--decode-ms-per-token", "1"],
      vars: { session_affinity: "prefill" },
    });
    const h = { "X-Claude-Code-Session-Id": "njs-claude-secret-1" };
    const a = await chat(ng.url, longText("njs-sess-one", 300), { headers: h });
    assert.equal(a.status, 200);
    await settled();
    // Cold prompts: without the session each tie goes by a hash of its content
    // (the control shows some go elsewhere); with it, every turn stays.
    for (let k = 0; k < 3; k++) {
      const b = await chat(ng.url, longText("njs-sess-turn" + k, 300), { headers: h });
      assert.equal(b.status, 200);
      assert.equal(b.worker, a.worker, `the session's turn ${k + 2} moved`);
      await settled();
    }
    const control: string[] = [];
    for (let k = 0; k < 4; k++) {
      const c = await chat(ng.url, longText("njs-sess-control" + k, 300));
      control.push(c.worker!);
      await settled();
    }
    assert.ok(
      control.some((w) => w !== a.worker),
      `control: without the header cold prompts spread, not all to ${a.worker}: ${control}`,
    );
  },
);
