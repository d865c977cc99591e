#!/usr/bin/env bash
# `serve` on a big session (BENCHMARKS.md, "serve on big sessions"): the bucket of
# bench/inspect_big.sh (the load generator's events through the real collector into a
# file:// bucket; written first if it is not there), then, RUNS times, a fresh
# `serve --storage file://<bucket>` process:
#   - cold: `/enter_cluster/<ns>/raycluster/<cluster>/<session>` (which starts the load),
#     then `/api/v0/tasks?limit=100` with its cookies, timed from before the first request
#     to the end of the second answer;
#   - warm: WARM requests of `/api/v0/tasks?limit=10000` on one keep-alive connection, each
#     timed to its last byte: p50 and p99;
#   - VmHWM of the serve process (/proc/<pid>/status) after all of it.
# The medians of the runs are printed as one JSON line.
#
#   bench/serve_big.sh 1000000
#   RUNS=5 WARM=200 bench/serve_big.sh 1000000
#
# Needs target/release/{ray-history-collector,rhc-loadgen} (cargo build --release
# --workspace --bins).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EVENTS="${1:?usage: bench/serve_big.sh EVENTS [DIR]}"
DIR="${2:-$REPO/.bench-deps/inspect-$EVENTS}"
RUNS="${RUNS:-3}"
WARM="${WARM:-100}"
BIN="${BIN:-$REPO/target/release/ray-history-collector}"
PORT="${PORT:-18585}"

log() { echo "serve_big: $*" >&2; }

if [[ ! -d "$DIR/store/cluster-metadata" ]]; then
    RUNS=1 "$REPO/bench/inspect_big.sh" "$EVENTS" "$DIR" >/dev/null
fi

results=()
for i in $(seq 1 "$RUNS"); do
    "$BIN" serve --storage "file://$DIR/store" --listen "127.0.0.1:$PORT" \
        >"$DIR/serve-$i.log" 2>&1 &
    SERVE=$!
    trap 'kill -TERM $SERVE 2>/dev/null || true' EXIT
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$PORT/readz" >/dev/null && break
        sleep 0.1
    done
    result=$(python3 - "$PORT" "$WARM" "$SERVE" <<'EOF'
import http.client, json, statistics, sys, time
port, warm, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def get(conn, path, cookie=""):
    conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
    r = conn.getresponse()
    body = r.read()
    return r, body

conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
r, body = get(conn, "/clusters")
c = json.loads(body)[0]
t0 = time.monotonic()
r, body = get(conn, f"/enter_cluster/{c['namespace']}/raycluster/{c['name']}/{c['sessionName']}")
assert r.status == 200, (r.status, body)
cookie = "; ".join(h.split(";")[0] for k, h in r.getheaders() if k.lower() == "set-cookie")
while True:
    r, body = get(conn, "/api/v0/tasks?limit=100", cookie)
    if r.status != 503:
        break
cold = time.monotonic() - t0
assert r.status == 200, (r.status, body[:200])
data = json.loads(body)["data"]["result"]
times = []
for _ in range(warm):
    t = time.monotonic()
    r, body = get(conn, "/api/v0/tasks?limit=10000", cookie)
    times.append(time.monotonic() - t)
    assert r.status == 200
    assert len(json.loads(body)["data"]["result"]["result"]) == min(10000, data["num_filtered"])
times.sort()
hwm = next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM"))
print(json.dumps({
    "task_attempts": data["total"],
    "unreadable": r.getheader("x-rhc-unreadable-objects"),
    "cold_s": round(cold, 3),
    "warm_p50_ms": round(1000 * times[len(times) // 2], 1),
    "warm_p99_ms": round(1000 * times[min(len(times) - 1, int(len(times) * 0.99))], 1),
    "answer_bytes": len(body),
    "vmhwm_mib": round(hwm / 1024, 1),
}))
EOF
    )
    kill -TERM "$SERVE"
    wait "$SERVE" || true
    trap - EXIT
    log "run $i: $result (load average $(cut -d' ' -f1 /proc/loadavg))"
    results+=("$result")
done
printf '%s\n' "${results[@]}" | python3 -c '
import json, statistics, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
out = {"runs": len(runs), "task_attempts": runs[0]["task_attempts"],
       "unreadable": runs[0]["unreadable"], "answer_bytes": runs[0]["answer_bytes"]}
for k in ("cold_s", "warm_p50_ms", "warm_p99_ms", "vmhwm_mib"):
    out[k] = [r[k] for r in runs]
    out["median_" + k] = statistics.median(out[k])
print(json.dumps(out))
'
