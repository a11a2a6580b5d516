// The njs tokenize + hash + pick path on njs's own engines (CLI 0.7.9 and 0.8.x)
// at agentic prompt sizes: it must stay linear in the prompt length (one
// String#match over the whole prompt made it quadratic: a 100k-token prompt
// blocked the nginx worker for seconds), and the chunked pre-tokenizer that
// fixed it must give @huggingface/tokenizers' ids on texts long enough to be cut.
import { needs } from "../tools";
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { ROOT, longText, njsClis } from "../harness";
import { loadTokenizer } from "../../runtime/tokenizer";
import { NJS_CORPUS } from "../tokenizer-corpus";

const DIST = path.join(ROOT, "njs", "dist");
const built = fs.existsSync(path.join(DIST, "infera-cli.js")) && fs.existsSync(path.join(DIST, "tokenizer.json"));

const clis = njsClis();

/** A long prompt mixing prose, code, whitespace runs, CJK, emoji, numbers and special tokens (NFC: njs has no normalizer). */
function mixedText(chars: number): string {
  const parts = NJS_CORPUS.concat([
    longText("mix", 40),
    "def f(x):\n    return [y ** 2 for y in range(x) if y % 3 == 0]  # squares\n\n\n",
    "    \t  \n \r\n\r\n   ",
    "https://example.com/a/b?c=1&d=%20e#frag user@example.org",
    "它的价格是１２３元，对吗？是的。Ｆｕｌｌｗｉｄｔｈ テスト、テスト。",
    "!!!??? ... --- *** ((())) [[[]]] {{{}}} <<<>>> '''\"\"\" ``` ~~~",
    "I'd've thought it's OK, DON'T you? We'LL see. 'quoted' x'y",
    "aGVsbG8gd29ybGQ/dGhpcyBpcyBiYXNlNjQ+Kw==",
    "🎉🎉 🎉 x🎉y 👩‍💻👩‍💻 1️⃣2️⃣",
  ]);
  const seps = [" ", "\n", "\n\n", "", "  ", "\t", ". ", ", "];
  let seed = 7;
  const rnd = (n: number) => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed % n;
  };
  let s = "";
  for (let i = 0; i < 100000 && s.length < chars; i++) s += parts[rnd(parts.length)] + seps[rnd(seps.length)];
  return s;
}

function runNjs(bin: string, script: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "infera-njs-scale-"));
  const f = path.join(dir, "t.mjs");
  fs.writeFileSync(f, script);
  try {
    const r = spawnSync(bin, ["-p", DIST, f], { encoding: "utf8", timeout: 60000, maxBuffer: 1 << 28 });
    if (r.status !== 0) throw new Error(`${bin} failed (${r.status}): ${r.stderr}${r.stdout}`);
    return r.stdout;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

test(
  "njs tokenize + hash + pick is linear in the prompt: 4x the tokens costs at most 6x the time, with HF's ids on long mixed text",
  {
    skip: !built ? "run npm run build:njs" : needs(clis.length === 0 && "no njs CLI (apt-get install njs)"),
    timeout: 120000,
  },
  () => {
    const long = mixedText(60000);
    const expected = loadTokenizer(null)!.encode(long);
    // ~12.5k and ~50k prompt tokens with the bench's generator (bench/njs-scale.ts).
    const small = longText("scale", 1840);
    const large = longText("scale", 7360);
    for (const [label, bin] of clis) {
      const t0 = Date.now();
      const out = runNjs(
        bin,
        `import cli from 'infera-cli.js';
import fs from 'fs';
const vocab = JSON.parse(fs.readFileSync(${JSON.stringify(path.join(DIST, "tokenizer.json"))}));
const ids = JSON.stringify(cli.encodeAll(vocab, [${JSON.stringify(long)}])[0]);
// njs's console.log cuts lines at 2048 bytes: the ids come in chunks.
for (let k = 0; k < ids.length; k += 1000) console.log('ids\\t' + ids.slice(k, k + 1000));
const small = ${JSON.stringify(small)};
const large = ${JSON.stringify(large)};
// CPU time of this process (utime + stime, 10 ms ticks), not wall time: on a
// shared machine the wait for a core would swamp the measure.
function cpuMs() { const f = fs.readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' '); return 10 * (Number(f[11]) + Number(f[12])); }
function block(text, picks) { const c0 = cpuMs(); let t = 0, w = 0; for (let i = 0; i < picks; i++) { const r = cli.timePick(vocab, text, 1); t = r.tokens; w += r.ms; } return { cpu: (cpuMs() - c0) / picks, wall: w / picks, tokens: t }; }
const a = [], b = [], wa = [], wb = [];
let ta = 0, tb = 0;
// Alternating blocks of about the same length, fewest-disturbed of each.
for (let k = 0; k < 3; k++) {
  const x = block(small, 8);
  const y = block(large, 2);
  a.push(x.cpu); b.push(y.cpu); wa.push(x.wall); wb.push(y.wall); ta = x.tokens; tb = y.tokens;
}
console.log('time\\t' + JSON.stringify({ small: Math.min.apply(null, a), large: Math.min.apply(null, b), wallSmall: Math.min.apply(null, wa), wallLarge: Math.min.apply(null, wb), ta: ta, tb: tb }));`,
      );
      let idsJson = "";
      let time: { small: number; large: number; wallSmall: number; wallLarge: number; ta: number; tb: number } | null =
        null;
      for (const l of out.split("\n")) {
        if (l.startsWith("ids\t")) idsJson += l.slice(4);
        else if (l.startsWith("time\t")) time = JSON.parse(l.slice(5));
      }
      const got = JSON.parse(idsJson) as number[];
      assert.equal(got.length, expected.length, `${label}: token count of a ${long.length}-char mixed text`);
      const at = got.findIndex((x, i) => x !== expected[i]);
      assert.equal(at, -1, `${label}: ids differ from token ${at}`);
      assert.ok(time, `${label}: no timing line`);
      const ratio = time!.large / Math.max(1, time!.small);
      process.stdout.write(
        `# ${label}: CPU ms per pick ${time!.small} at ${time!.ta} tokens, ${time!.large} at ${time!.tb}: ratio ${ratio.toFixed(2)} (wall ${time!.wallSmall} -> ${time!.wallLarge} ms; whole check ${Date.now() - t0} ms)\n`,
      );
      assert.ok(time!.ta > 11000 && time!.ta < 14000, `~12.5k tokens, got ${time!.ta}`);
      assert.ok(time!.tb > 45000 && time!.tb < 55000, `~50k tokens, got ${time!.tb}`);
      // Linear is 4x; quadratic 16x. 6 leaves room for a noisy shared machine.
      assert.ok(
        ratio <= 6,
        `${label}: ${(time!.tb / time!.ta).toFixed(1)}x the tokens took ${ratio.toFixed(1)}x the time (${time!.small} -> ${time!.large} ms)`,
      );
    }
  },
);
