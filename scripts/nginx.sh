#!/usr/bin/env bash
# Starts nginx with the project's config (nginx/nginx.conf), in the foreground:
#
#   npm run nginx -- [--port 8080] [--prefix DIR] [--nginx BIN --modules DIR]
#                    [--access-log PATH] [--set name=value]...
#   (--set also takes stream_idle_timeout=60s, answer_timeout=540s and
#    connect_timeout=2s: the proxy locations' timeouts, as shipped; and
#    fetch_timeout=2s: the route's js_fetch_timeout, the tokenizer helper's bound)
#
# nginx: --nginx/--modules if given, else .njs-0.8/ (bash scripts/njs08.sh:
# nginx 1.26 + njs 0.8 unpacked beside the checkout), else the system nginx if
# it is 1.25 or newer with the js module (njs >= 0.8 is what the config needs:
# js_shared_dict_zone). The config is rendered into --prefix (default: a new
# temporary directory) by scripts/nginx-conf.js with this checkout's njs bundle
# (built first if missing), the port and the prefix's pid and temp paths; the
# file in the repository is never edited. `--set policy=round-robin` sets
# $infera_policy (any $infera_* variable; zone_str=/zone_num= resize the
# shared dicts). The bridge's push token comes from INFERA_PUSH_TOKEN in this
# environment. The script ends by exec'ing nginx, so its PID is nginx's master:
# stop it with SIGTERM (fast) or SIGQUIT (graceful).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PORT=8080
PREFIX=""
BIN=""
MODULES=""
ACCESS=""
SETS=()
die() { echo "nginx.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT="${2:?--port needs a value}"; shift 2 ;;
    --prefix) PREFIX="${2:?--prefix needs a value}"; shift 2 ;;
    --nginx) BIN="${2:?--nginx needs a value}"; shift 2 ;;
    --modules) MODULES="${2:?--modules needs a value}"; shift 2 ;;
    --access-log) ACCESS="${2:?--access-log needs a value}"; shift 2 ;;
    --set) SETS+=(--set "${2:?--set needs name=value}"); shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

# Which nginx, and where its js module is.
if [ -z "$BIN" ]; then
  if [ -x "$ROOT/.njs-0.8/bin/nginx" ]; then
    BIN="$ROOT/.njs-0.8/bin/nginx"
    MODULES="${MODULES:-$(cat "$ROOT/.njs-0.8/modules-path")}"
  elif command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then
    BIN="$(command -v nginx || echo /usr/sbin/nginx)"
    v="$("$BIN" -v 2>&1 | sed -n 's|.*nginx/\([0-9]*\)\.\([0-9]*\).*|\1 \2|p')"
    read -r major minor <<<"${v:-0 0}"
    if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 25 ]; }; then
      die "$BIN is nginx ${major}.${minor}: the config needs njs >= 0.8 (js_shared_dict_zone), shipped with nginx >= 1.25; run 'bash scripts/njs08.sh' to unpack nginx 1.26 + njs 0.8 into .njs-0.8/"
    fi
  else
    die "no nginx: run 'bash scripts/njs08.sh' (nginx 1.26 + njs 0.8 into .njs-0.8/) or install nginx >= 1.25 with its js module"
  fi
fi
if [ -z "$MODULES" ]; then
  for d in /usr/lib/nginx/modules /usr/lib64/nginx/modules /etc/nginx/modules /usr/local/nginx/modules; do
    [ -e "$d/ngx_http_js_module.so" ] && MODULES="$d" && break
  done
fi
[ -n "$MODULES" ] && [ -e "$MODULES/ngx_http_js_module.so" ] || die "no ngx_http_js_module.so (pass --modules DIR)"

# The bundle nginx loads (js_path): this checkout's, built if missing.
if [ ! -e "$ROOT/njs/dist/infera.js" ] || [ ! -e "$ROOT/njs/dist/tokenizer.json" ]; then
  echo "nginx.sh: njs/dist is missing, building it (npm run build:njs)" >&2
  (cd "$ROOT" && node --import tsx njs/build.ts >&2)
fi
[ -n "${INFERA_PUSH_TOKEN:-}" ] || echo "nginx.sh: INFERA_PUSH_TOKEN is not set: nginx will refuse the bridge's pushes (503)" >&2

[ -n "$PREFIX" ] || PREFIX="$(mktemp -d "${TMPDIR:-/tmp}/infera-nginx.XXXXXX")"
# The access log goes to stdout (one JSON line per request) unless stdout
# cannot be opened by path (a socket, as under some supervisors): then a file.
if [ -z "$ACCESS" ] && ! { : >/dev/stdout; } 2>/dev/null; then
  ACCESS="$PREFIX/access.log"
  echo "nginx.sh: stdout cannot be opened as /dev/stdout: access log in $ACCESS" >&2
fi
ARGS=(--modules "$MODULES" --prefix "$PREFIX" --port "$PORT")
[ -z "$ACCESS" ] || ARGS+=(--access-log "$ACCESS")
CONF="$(node "$ROOT/scripts/nginx-conf.js" "${ARGS[@]}" ${SETS[@]+"${SETS[@]}"})"
echo "nginx.sh: $BIN -p $PREFIX -c $CONF (127.0.0.1:$PORT)" >&2
exec "$BIN" -p "$PREFIX" -c "$CONF" -e stderr -g "daemon off;"
