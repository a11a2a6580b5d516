#!/usr/bin/env bash
# Renders every manifest under deploy/ (Kustomize bases and examples, the Helm
# chart with its default and non-default values) and schema-validates the
# output with scripts/validate-k8s.py. Needs helm and kustomize (.ci/run
# installs both with `go install`) and pip's kubernetes-validate.
set -euo pipefail
cd "$(dirname "$0")/.."
GO="$(command -v go || echo /usr/local/go/bin/go)"
GOBIN="$("$GO" env GOPATH 2>/dev/null)/bin"
HELM="${HELM:-$(command -v helm || echo "$GOBIN/helm")}"
KUSTOMIZE="${KUSTOMIZE:-$(command -v kustomize || echo "$GOBIN/kustomize")}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

"$KUSTOMIZE" build deploy/kustomize > "$out/kustomize.yaml"
"$KUSTOMIZE" build deploy/examples/istio > "$out/istio.yaml"
"$KUSTOMIZE" build deploy/monitoring > "$out/monitoring.yaml"
"$HELM" lint --strict deploy/helm/infera-gate
"$HELM" template llm deploy/helm/infera-gate --namespace llm > "$out/helm-default.yaml"
"$HELM" template llm deploy/helm/infera-gate --namespace llm \
  --set inferencePool.create=false --set router.shedActiveBlocks=64 \
  --set 'router.sheddableObjectives={batch,eval}' --set router.kvEventTransport=nats \
  --set router.natsUrl=nats://nats:4222 --set 'inferencePool.targetPorts={8000,8001}' \
  --set 'extProc.clientIdentities={infera-gateway,spiffe://cluster.local/ns/gw/sa/gw}' --set adminToken.existingSecret=my-token \
  --set extProc.tls.generate=false --set extProc.tls.secretName=my-tls \
  --set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true \
  --set monitoring.grafanaDashboard.enabled=true --set monitoring.serviceMonitor.adminTokenSecret.name=admin-token \
  > "$out/helm-options.yaml"
"$HELM" template llm deploy/helm/infera-gate --namespace llm --set networkPolicy.enabled=false > "$out/helm-no-netpol.yaml"
python3 scripts/validate-k8s.py "$out"/*.yaml deploy/examples/gateway/*.yaml deploy/examples/istio/gateway.yaml
