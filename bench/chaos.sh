#!/usr/bin/env bash
# The full chaos suite (about 18 minutes, node-loss 10 of them): every scenario of
# `rhc-chaos --list` that is in the full suite, against a release build, with moto as the S3 server (the test suite's,
# installed by ./scripts/install-test-deps.sh on first use).
#
#   bench/chaos.sh                          # full suite
#   bench/chaos.sh --smoke                  # the CI subset (what tests/chaos_smoke.rs runs)
#   bench/chaos.sh --only outage,kill9      # any rhc-chaos arguments pass through
#   RHC_CHAOS_STORAGE=file bench/chaos.sh   # no S3 server: the S3 scenarios are skipped
#
# (s3s-fs 0.14.1 does not work as the server here: it answers 500 to every PUT of a key
# longer than about 170 bytes, and every event key of the KubeRay layout is longer.)
#
# Prints one verdict line per scenario (PASS/FAIL/SKIP with its figures); exit code 1 if
# any failed. Verdicts are also appended to .bench-deps/results/chaos-<timestamp>.jsonl.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
DEPS="$REPO/.bench-deps"

cargo build --release --workspace --bins --locked >&2
if [[ -z "${RHC_CHAOS_STORAGE:-}" ]]; then
    eval "$("$REPO/scripts/install-test-deps.sh")"
    RHC_CHAOS_STORAGE="moto:${RHC_MOTO_SERVER:?install-test-deps.sh did not export RHC_MOTO_SERVER}"
fi
mkdir -p "$DEPS/results"
# A frozen copy, so that another build in this checkout cannot swap the binary mid-run.
BIN="$(mktemp -d "$DEPS/results/chaos-bin.XXXXXX")"
trap 'rm -rf "$BIN"' EXIT
cp target/release/ray-history-collector target/release/rhc-chaos "$BIN/"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
"$BIN/rhc-chaos" --collector "$BIN/ray-history-collector" --storage "$RHC_CHAOS_STORAGE" \
    --json "$DEPS/results/chaos-$(date -u +%Y%m%dT%H%M%SZ).jsonl" "$@"
