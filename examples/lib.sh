# shellcheck shell=bash
# Shared by the example scripts (sourced, not run). Bash.
#
#   rhc_collector_path   prints the collector binary: $COLLECTOR if set, else
#                        builds target/debug/ray-history-collector (in
#                        $CARGO_TARGET_DIR when set; cargo
#                        build, a no-op when up to date) and prints its path
#   rhc_free_port        prints a free TCP port on 127.0.0.1
#   rhc_wait_http URL S  waits up to S seconds for URL to answer 2xx
#   rhc_stop PID S       SIGTERM, then waits up to S seconds; returns the exit
#                        code (SIGKILL and 124 when the time is up)

RHC_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Everything the examples talk to is on loopback.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
export no_proxy="$NO_PROXY"

rhc_collector_path() {
    if [[ -n "${COLLECTOR:-}" ]]; then
        [[ -x "$COLLECTOR" ]] || { echo "COLLECTOR=$COLLECTOR is not executable" >&2; return 1; }
        printf '%s\n' "$COLLECTOR"
        return
    fi
    # Not --quiet: the first build takes minutes, and cargo's lines show it is moving.
    echo "building target/debug/ray-history-collector (cargo build; the first time takes" \
        "a few minutes)" >&2
    (cd "$RHC_REPO" && cargo build --locked --bin ray-history-collector) >&2 || return 1
    printf '%s\n' "${CARGO_TARGET_DIR:-$RHC_REPO/target}/debug/ray-history-collector"
}

rhc_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

rhc_wait_http() {
    local url="$1" limit="$2" start=$SECONDS
    until curl -fsS --noproxy '*' --max-time 2 -o /dev/null "$url" 2>/dev/null; do
        if ((SECONDS - start >= limit)); then
            echo "no answer from $url after ${limit}s" >&2
            return 1
        fi
        sleep 0.2
    done
}

rhc_stop() {
    local pid="$1" limit="$2" start=$SECONDS status=0
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS - start >= limit)); then
            echo "pid $pid still running ${limit}s after SIGTERM; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            return 124
        fi
        sleep 0.1
    done
    wait "$pid" 2>/dev/null || status=$?
    return "$status"
}
