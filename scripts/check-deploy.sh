#!/usr/bin/env bash
# Checks the Kubernetes packaging and the examples without a cluster or a
# Docker engine, offline. scripts/test.sh runs it before `cargo test`.
#
#   ./scripts/check-deploy.sh
#
#   1. yamllint (.yamllint.yaml) of deploy/, charts/, examples/
#   2. hadolint of the Dockerfile
#   3. the Docker build context (.dockerignore) holds a buildable cargo package
#   4. examples/docker-compose/compose.yaml against the Compose specification
#   5. promtool check rules of the chart's alerts (charts/*/files/alerts.yaml)
#   6. scripts/check_deploy.py: kustomize builds, helm lint + render of the chart
#      (and refusal of bad values), every object against Kubernetes' schemas
#      (kubernetes-validate --strict), KubeRay's CRDs and the Prometheus
#      Operator's (fetched by install-test-deps.sh), the sidecar wiring of every Ray pod (events
#      on loopback, probes on the read-only port), the chart's PodMonitor and
#      PrometheusRule, the KubeRay ray-cluster chart snippet
#   7. examples/quickstart/run.sh: the collector with a file:// bucket
#   8. examples/s3-local/run.sh: the collector against moto's S3 server
#
# The tools come from .test-deps/venv (scripts/install-test-deps.sh, run here
# when RHC_PYTHON / RHC_MOTO_SERVER are not set). The image build itself is not
# exercised: no Docker engine runs here. Runs every step, then exits 1 if any
# failed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

if [[ -z "${RHC_PYTHON:-}" || -z "${RHC_MOTO_SERVER:-}" ]]; then
    eval "$("$REPO/scripts/install-test-deps.sh")"
    export RHC_PYTHON RHC_MOTO_SERVER
fi
VENV_BIN="$(dirname "$RHC_PYTHON")"
export PATH="$VENV_BIN:$PATH"
for tool in yamllint hadolint kubectl check-jsonschema; do
    if [[ ! -x "$VENV_BIN/$tool" ]]; then
        echo "check-deploy: $VENV_BIN/$tool is missing; run ./scripts/install-test-deps.sh" >&2
        exit 1
    fi
done
# Nothing here may reach out: loopback only, and kubectl must not look for a cluster.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
export no_proxy="$NO_PROXY"
export KUBECONFIG=/dev/null

started=$SECONDS
failed=()
step() { # step NAME COMMAND...: runs one check, records a failure, goes on
    local name="$1" t=$SECONDS
    shift
    echo
    echo "==== $name"
    if "$@"; then
        echo "==== ok: $name ($((SECONDS - t)) s)"
    else
        echo "==== FAILED: $name" >&2
        failed+=("$name")
    fi
}

docker_context() {
    # The context is what .dockerignore lets through: it starts with `*` and
    # lists what to keep with `!`. cargo must find a complete package in it.
    local ctx line path
    ctx="$(mktemp -d /tmp/rhc-docker-context.XXXXXX)"
    # shellcheck disable=SC2064  # expand now
    trap "rm -rf '$ctx'" RETURN
    if [[ "$(grep -v '^\s*#' .dockerignore | grep -v '^\s*$' | head -1)" != "*" ]]; then
        echo ".dockerignore must start with '*' (an allow-list)" >&2
        return 1
    fi
    while IFS= read -r line; do
        path="${line#!}"
        path="${path%/\*\*}"
        path="${path%/}"
        [[ -e "$path" ]] || { echo ".dockerignore keeps $path, which does not exist" >&2; return 1; }
        mkdir -p "$ctx/$(dirname "$path")"
        cp -r "$path" "$ctx/$path"
    done < <(grep '^!' .dockerignore)
    echo "context: $(cd "$ctx" && find . -type f | wc -l) files ($(grep '^!' .dockerignore | tr '\n' ' '))"
    cargo metadata --offline --no-deps --format-version 1 --manifest-path "$ctx/Cargo.toml" >/dev/null
    # The Dockerfile builds this binary target; cargo metadata has found it.
    grep -q "\"name\":\"ray-history-collector\"" \
        <(cargo metadata --offline --no-deps --format-version 1 --manifest-path "$ctx/Cargo.toml")
    # Files compiled into it from outside src/ would be missing from the context.
    if grep -rnE 'include_(str|bytes)!\(.*(\.\./\.\.|CARGO_MANIFEST_DIR)' src --include='*.rs'; then
        echo "the collector includes files from outside src/: add them to .dockerignore's allow-list" >&2
        return 1
    fi
}

step "yamllint -s (.yamllint.yaml): deploy/ charts/ examples/ .yamllint.yaml" \
    yamllint -s -c .yamllint.yaml deploy charts examples .yamllint.yaml
step "hadolint Dockerfile ($(hadolint --version))" hadolint Dockerfile
step "Docker build context from .dockerignore is a cargo package" docker_context
step "compose.yaml against the Compose specification (check-jsonschema $(check-jsonschema --version | awk '{print $NF}'))" \
    check-jsonschema --builtin-schema vendor.compose-spec examples/docker-compose/compose.yaml
promtool_rules() {
    local promtool="${RHC_PROMTOOL:-$(command -v promtool || true)}"
    if [[ -z "$promtool" ]]; then
        echo "promtool is missing: ./scripts/install-test-deps.sh installs Debian's prometheus package (needs root and apt-get)" >&2
        return 1
    fi
    "$promtool" check rules charts/ray-history-collector/files/alerts.yaml
}
step "promtool check rules charts/ray-history-collector/files/alerts.yaml" promtool_rules
step "manifests, kustomize, Helm chart, CRDs, sidecar wiring, monitoring (scripts/check_deploy.py)" \
    "$RHC_PYTHON" scripts/check_deploy.py
quickstart() {
    local work rc=0
    work="$(mktemp -d /tmp/rhc-quickstart-ci.XXXXXX)"
    examples/quickstart/run.sh "$work" || rc=$?
    rm -rf "$work"
    return "$rc"
}

step "examples/quickstart/run.sh (file:// bucket)" quickstart
step "examples/s3-local/run.sh (moto S3 server)" examples/s3-local/run.sh

echo
if ((${#failed[@]} > 0)); then
    echo "check-deploy: FAILED (${#failed[@]}): ${failed[*]}" >&2
    exit 1
fi
echo "check-deploy: all checks passed in $((SECONDS - started)) s"
