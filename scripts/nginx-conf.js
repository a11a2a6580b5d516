// Renders nginx/nginx.conf for this machine: the one code path behind
// `npm run nginx` (scripts/nginx.sh) and the tests' startNginx. The shipped
// file keeps the container's paths (docker-compose.yml mounts the bundle at
// /opt/infera-gate/njs/dist); this swaps in the js module this nginx loads, this
// checkout's bundle, the listen port, and a prefix directory for the pid,
// the temp paths and the access log, and sets `$infera_*` variables.
// Plain JavaScript: starting it costs no TypeScript compile.
//
//   node scripts/nginx-conf.js --modules DIR --prefix DIR [--port 8080] [--dist DIR]
//        [--access-log PATH] [--set name=value]...   (prints the written file's path)
// --set takes a variable name without `infera_` (policy=round-robin sets
// $infera_policy), zone_str / zone_num for the shared dict sizes (e.g. 1m), or
// stream_idle_timeout (60s) / answer_timeout (540s) / connect_timeout (2s) for
// the proxy locations' proxy_read_timeout and proxy_connect_timeout, or
// fetch_timeout (2s) for the route's js_fetch_timeout (the tokenizer helper's bound).
"use strict";
const fs = require("fs");
const path = require("path");

const ROOT = path.resolve(__dirname, "..");

/** Directives --set can change besides $infera_* (the proxy locations' timeouts, as shipped). */
const TIMEOUTS = {
  stream_idle_timeout: "proxy_read_timeout 60s;",
  answer_timeout: "proxy_read_timeout 540s;",
  connect_timeout: "proxy_connect_timeout 2s;",
  fetch_timeout: "js_fetch_timeout 2s;",
};

/** Quotes a value for nginx's `set` unless it is one plain token. */
function nginxValue(v) {
  if (/^[A-Za-z0-9_.,:=/+*@-]+$/.test(v)) return v;
  if (/^".*"$/.test(v)) return v; // already quoted by the caller
  return '"' + v.replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"';
}

/**
 * opts: { modules, prefix, port?, dist?, accessLog?, vars?: {name: value} }.
 * Returns the rendered config's text; throws when the template no longer
 * has a line this relies on (so a change to nginx.conf cannot silently
 * leave a container path in a local run).
 */
function renderNginxConf(opts) {
  const dist = opts.dist || path.join(ROOT, "njs", "dist");
  const prefix = path.resolve(opts.prefix);
  let c = fs.readFileSync(path.join(ROOT, "nginx", "nginx.conf"), "utf8");
  const swaps = [
    [/load_module \S+ngx_http_js_module\.so;/, "load_module " + path.join(opts.modules, "ngx_http_js_module.so") + ";"],
    [/\/opt\/infera-gate\/njs\/dist/g, dist],
    [/listen 127\.0\.0\.1:8080/, "listen 127.0.0.1:" + (opts.port || 8080)],
    [/pid \/tmp\/infera-nginx\.pid/, "pid " + path.join(prefix, "nginx.pid")],
    [/access_log \/dev\/stdout infera/, "access_log " + (opts.accessLog || "/dev/stdout") + " infera"],
    [/\/tmp\/infera-nginx-(body|proxy)/g, prefix + "/$1"],
  ];
  for (const [re, to] of swaps) {
    if (!re.test(c)) throw new Error("nginx/nginx.conf has no line matching " + re + ": update scripts/nginx-conf.js");
    re.lastIndex = 0;
    c = c.replace(re, to);
  }
  const vars = opts.vars || {};
  for (const k of Object.keys(vars)) {
    const v = String(vars[k]);
    if (TIMEOUTS[k]) {
      if (!/^[0-9]+(ms|s|m)?$/.test(v)) throw new Error(k + ": an nginx time (e.g. 60s), got " + v);
      const re = new RegExp(TIMEOUTS[k].replace("$", "\\$"), "g");
      if (!re.test(c)) throw new Error("nginx/nginx.conf has no " + TIMEOUTS[k]);
      c = c.replace(re, TIMEOUTS[k].split(" ")[0] + " " + v + ";");
      continue;
    }
    if (k === "zone_str" || k === "zone_num") {
      const re = new RegExp("zone=infera_" + k.slice(5) + ":[0-9]+[km]");
      if (!re.test(c)) throw new Error("no js_shared_dict_zone infera_" + k.slice(5));
      c = c.replace(re, "zone=infera_" + k.slice(5) + ":" + v);
      continue;
    }
    const re = new RegExp("set \\$infera_" + k + " [^;]*;");
    if (!re.test(c)) throw new Error("nginx/nginx.conf sets no $infera_" + k);
    c = c.replace(re, () => "set $infera_" + k + " " + nginxValue(v) + ";");
  }
  return c;
}

/** Renders into prefix/nginx.conf (prefix created) and returns that path. */
function writeNginxConf(opts) {
  fs.mkdirSync(opts.prefix, { recursive: true });
  const file = path.join(path.resolve(opts.prefix), "nginx.conf");
  fs.writeFileSync(file, renderNginxConf(opts));
  return file;
}

function main(argv) {
  const opts = { vars: {} };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(a + " needs a value");
      return argv[++i];
    };
    if (a === "--modules") opts.modules = val();
    else if (a === "--prefix") opts.prefix = val();
    else if (a === "--port") opts.port = Number(val());
    else if (a === "--dist") opts.dist = val();
    else if (a === "--access-log") opts.accessLog = val();
    else if (a === "--set") {
      const kv = val();
      const eq = kv.indexOf("=");
      if (eq <= 0) throw new Error("--set name=value, got " + kv);
      opts.vars[kv.slice(0, eq).replace(/^\$?(infera_)?/, "")] = kv.slice(eq + 1);
    } else throw new Error("unknown argument " + a);
  }
  if (!opts.modules || !opts.prefix) throw new Error("--modules and --prefix are required");
  if (opts.port !== undefined && !(opts.port > 0 && opts.port < 65536)) throw new Error("--port: 1..65535");
  process.stdout.write(writeNginxConf(opts) + "\n");
}

if (require.main === module) {
  try {
    main(process.argv.slice(2));
  } catch (e) {
    process.stderr.write("nginx-conf: " + e.message + "\n");
    process.exit(2);
  }
}

module.exports = { renderNginxConf, writeNginxConf };
