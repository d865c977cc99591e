#!/usr/bin/env bash
# The project's test command (formatting and lints are .ci/run's): installs the test
# tools (moto, Azurite, fake-gcs-server, Ray, the Kubernetes checkers) into .test-deps/ if needed,
# points the tests at them, runs ./scripts/check-deploy.sh (only without
# arguments) and then the tests of the collector, the test kit and the dev tools (the chaos
# smoke test among them): without arguments with `cargo nextest run --workspace` (settings in
# .config/nextest.toml) and the doc tests; with arguments `cargo test --workspace --locked
# "$@"`, so a narrowed run takes cargo test's filters and flags. Without arguments it then runs
# the tests marked ignored because they need a peer binary (KubeRay's history server,
# KubeRay's collector) when that binary is set, and ends with one line naming every test
# that did not run and why. Exit code is cargo's, or 1 if check-deploy.sh failed.
#
#   ./scripts/test.sh                                  # everything
#   ./scripts/test.sh --test services_smoke -- --nocapture
#
# The tests start and stop the servers themselves (testkit/src/services.rs);
# this script only makes sure none is left running afterwards.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

# The default build needs only Rust and a C compiler (igzip, the image's compressor, is the
# opt-in `igzip` feature: .ci/run checks that build).
# install-test-deps.sh prints `export RHC_...=...` lines on stdout.
exports="$("$REPO/scripts/install-test-deps.sh")"
eval "$exports"
export RHC_MOTO_SERVER RHC_AZURITE_BLOB RHC_FAKE_GCS RHC_GCSEMU RHC_PYTHON RHC_HISTORY_SERVER RHC_NEXTEST
export RHC_REQUIRE_SERVICES=1
# Everything the tests talk to is on loopback; keep any proxy settings away from it.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
export no_proxy="$NO_PROXY"
# Ray (end-to-end tests) must not try to report usage statistics.
export RAY_USAGE_STATS_ENABLED=0

# Kill any server the tests of THIS run left behind. Candidates are processes
# whose command line contains this repo's .test-deps path; of those, only ones
# that inherited this run's RHC_TEST_RUN_ID are killed, so servers of another
# test run in the same checkout (another shell, another engineer) survive.
RHC_TEST_RUN_ID="$$-$(date +%s%N)"
export RHC_TEST_RUN_ID
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local pid pids=()
    local deps
    deps="$(readlink -f "$REPO/.test-deps")"
    for pid in $(pgrep -f -- "$deps/" || true); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null \
                | grep -qxF "RHC_TEST_RUN_ID=$RHC_TEST_RUN_ID"; then
            pids+=("$pid")
        fi
    done
    if ((${#pids[@]} > 0)); then
        echo "test.sh: killing leftover test servers of this run:" >&2
        ps -o pid=,args= -p "${pids[@]}" >&2 || true
        kill -TERM "${pids[@]}" 2>/dev/null || true
        sleep 1
        kill -KILL "${pids[@]}" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

status=0
# The Kubernetes packaging and the examples, checked offline (no cluster, no
# Docker engine). A full run (no arguments, as CI runs it) fails if they fail;
# a run narrowed with arguments skips them.
if (($# == 0)); then
    echo "test.sh: ./scripts/check-deploy.sh" >&2
    if ! "$REPO/scripts/check-deploy.sh"; then
        echo "test.sh: scripts/check-deploy.sh failed" >&2
        exit 1
    fi
else
    echo "test.sh: arguments given, skipping ./scripts/check-deploy.sh" >&2
fi
if (($# == 0)); then
    # A full run: nextest runs the tests of different binaries side by side
    # (.config/nextest.toml: three at once, the real-Ray tests one at a time, a failure
    # retried once and reported FLAKY if it then passes); it does not run doc tests.
    "$RHC_NEXTEST" nextest run --workspace --locked || status=$?
    cargo test --workspace --locked --doc || status=$?
else
    cargo test --workspace --locked "$@" || status=$?
fi

# Tests that need a peer binary which may not be installable here (the Go module proxy
# refuses KubeRay's module) are marked #[ignore] so the runner counts them as not run. Run
# them when their binary is there; list the rest, with the reason, in one last line.
not_run=()
peer_test() { # peer_test VAR TESTS REASON CARGO_ARGS...: run them with --ignored if $VAR names a file
    local var="$1" tests="$2" reason="$3"; shift 3
    local bin="${!var:-}"
    if [[ -n "$bin" && -f "$bin" ]]; then
        echo "test.sh: $var=$bin, running: cargo test $* -- --ignored" >&2
        cargo test --locked "$@" -- --ignored || status=$?
    else
        not_run+=("$tests ($reason: $var does not name a file)")
    fi
}
if (($# == 0)); then
    peer_test RHC_HISTORY_SERVER \
        "history_e2e::history_server_replays_what_ray_served_live_in_both_key_styles" \
        "needs KubeRay's history server" --test history_e2e
    peer_test RHC_PEER_COLLECTOR \
        "peer_bench::measures_kuberays_collector_when_it_is_given, peer_bench::the_side_by_side_faults_count_both_collectors" \
        "needs KubeRay's collector" -p rhc-tools --test peer_bench
    if ((${#not_run[@]} > 0)); then
        joined="$(printf '%s; ' "${not_run[@]}")"
        echo "test.sh: did not run: ${joined%; }"
    else
        echo "test.sh: every test ran, the peer tests included"
    fi
fi
exit "$status"
