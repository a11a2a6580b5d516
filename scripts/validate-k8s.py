#!/usr/bin/env python3
"""Schema-validates Kubernetes manifests read from files or stdin (multi-doc YAML).

Built-in kinds: kubernetes-validate's bundled OpenAPI schemas, strict (unknown
fields are errors). Custom resources the deploy/ folder uses (InferencePool,
Gateway API, Istio, Envoy Gateway, prometheus-operator): the JSON schemas in deploy/schemas. A kind
with no schema at all is an error, so nothing passes unchecked.
"""
import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = os.environ.get("K8S_VERSION", "1.33.0")
HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "..", "deploy", "schemas")
CUSTOM = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway-v1.json",
    ("gateway.networking.k8s.io/v1", "GatewayClass"): "gateway-v1.json",
    ("networking.istio.io/v1alpha3", "EnvoyFilter"): "envoyfilter.json",
    ("networking.istio.io/v1", "Gateway"): "istio-networking.json",
    ("networking.istio.io/v1", "VirtualService"): "istio-networking.json",
    ("networking.istio.io/v1", "DestinationRule"): "istio-destinationrule.json",
    ("gateway.envoyproxy.io/v1alpha1", "ClientTrafficPolicy"): "clienttrafficpolicy.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json",
}


def main() -> int:
    sources = sys.argv[1:] or ["-"]
    errors = 0
    count = 0
    for src in sources:
        text = sys.stdin.read() if src == "-" else open(src).read()
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            count += 1
            key = (doc.get("apiVersion"), doc.get("kind"))
            name = f"{src}: {key[1]}/{(doc.get('metadata') or {}).get('name')}"
            try:
                if key in CUSTOM:
                    with open(os.path.join(SCHEMAS, CUSTOM[key])) as f:
                        jsonschema.validate(doc, json.load(f))
                else:
                    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                print(f"ok   {name}")
            except kubernetes_validate.SchemaNotFoundError:
                print(f"FAIL {name}: no schema for {key}")
                errors += 1
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
                print(f"FAIL {name}: {getattr(e, 'message', e)}")
                errors += 1
    if count == 0:
        print("FAIL: no documents")
        return 1
    print(f"{count} documents, {errors} invalid")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
