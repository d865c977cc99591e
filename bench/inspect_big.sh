#!/usr/bin/env bash
# `inspect` on a big session (BENCHMARKS.md, "inspect on big sessions"): the load generator
# sends Ray-shaped events through the real collector into a file:// bucket, then
# `inspect --session latest --json` is timed and its peak RSS measured with /usr/bin/time -v,
# several runs; the medians are printed. Every task event of the load generator has its own
# task id, so a session of N events holds about 0.9 N task attempts: the worst case for the
# fold's memory.
#
#   bench/inspect_big.sh 1000000            # 1M events, 5 runs
#   RUNS=3 bench/inspect_big.sh 10000000    # 10M events
#   BASELINE=/path/to/older/ray-history-collector bench/inspect_big.sh 1000000
#       # each round also runs the older binary, right after this one: a same-run ratio
#
# Needs target/release/{ray-history-collector,rhc-loadgen} (cargo build --release
# --workspace --bins). The bucket is kept in DIR (default .bench-deps/inspect-<N>) and
# reused when it is there already.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EVENTS="${1:?usage: bench/inspect_big.sh EVENTS [DIR]}"
DIR="${2:-$REPO/.bench-deps/inspect-$EVENTS}"
RUNS="${RUNS:-5}"
RATE="${RATE:-100000}"
BIN="${BIN:-$REPO/target/release/ray-history-collector}"
LOADGEN="$REPO/target/release/rhc-loadgen"
PORT="${PORT:-18484}"

log() { echo "inspect_big: $*" >&2; }

if [[ ! -d "$DIR/store/cluster-metadata" ]]; then
    rm -rf "$DIR"
    mkdir -p "$DIR"
    log "writing $EVENTS events through the collector into $DIR/store"
    "$REPO/target/release/ray-history-collector" \
        --listen "127.0.0.1:$PORT" --storage "$DIR/store" --spool-dir "$DIR/spool" \
        --cluster-name big --enable-log-collector false --enable-export-events false \
        --dashboard-address http://127.0.0.1:1 --max-spool-bytes 32GiB \
        --rotation-interval 30s >"$DIR/collector.log" 2>&1 &
    COLLECTOR=$!
    trap 'kill -TERM $COLLECTOR 2>/dev/null || true' EXIT
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null && break
        sleep 0.1
    done
    DURATION=$(python3 -c "print($EVENTS / $RATE)")
    "$LOADGEN" --url "http://127.0.0.1:$PORT/v1/events" --rate "$RATE" --duration "$DURATION" \
        --batch 1000 --concurrency 2 --jobs 4 --run-id big --json >"$DIR/loadgen.json"
    accepted=$(curl -sf "http://127.0.0.1:$PORT/metrics" \
        | awk '/^rhc_events_accepted_total/ {s += $NF} END {printf "%d", s}')
    log "collector accepted $accepted events; SIGTERM (upload everything)"
    kill -TERM "$COLLECTOR"
    wait "$COLLECTOR" || true
    trap - EXIT
    rm -rf "$DIR/spool"
    echo "$accepted" >"$DIR/accepted"
fi
log "bucket: $(du -sh "$DIR/store" | cut -f1), $(find "$DIR/store" -type f | wc -l) objects, $(cat "$DIR/accepted") events"

source "$REPO/bench/lib/inspect_runs.sh"
inspect_runs
python3 - "$DIR/report-new.json" "${walls[*]}" "${rss[*]}" "${cpus[*]}" \
    "${base_walls[*]:-}" "${base_rss[*]:-}" "${base_cpus[*]:-}" <<'EOF'
import json, statistics, sys
report = json.load(open(sys.argv[1]))
def series(walls, rss, cpus):
    walls = [float(x) for x in walls.split()]
    rss = [int(x) / 1024 for x in rss.split()]
    cpus = [float(x) for x in cpus.split()]
    return {
        "wall_s": walls,
        "median_wall_s": statistics.median(walls),
        "cpu_s": cpus,
        "median_cpu_s": statistics.median(cpus),
        "max_rss_mib": [round(r, 1) for r in rss],
        "median_max_rss_mib": round(statistics.median(rss), 1),
    }
out = {
    "events": report["events"]["total"],
    "task_attempts": report["tasks"]["total"],
    "objects_read": report["objects"]["read"],
    "bytes_read": report["objects"]["bytes_read"],
    "problems": report["problems"]["unreadable_objects"] + report["problems"]["bad_lines"],
    "runs": len(sys.argv[2].split()),
    **series(sys.argv[2], sys.argv[3], sys.argv[4]),
}
if sys.argv[5].strip():
    base = series(sys.argv[5], sys.argv[6], sys.argv[7])
    out["baseline"] = base
    out["wall_ratio"] = round(base["median_wall_s"] / out["median_wall_s"], 2)
    out["cpu_ratio"] = round(base["median_cpu_s"] / out["median_cpu_s"], 2)
    out["rss_ratio"] = round(base["median_max_rss_mib"] / out["median_max_rss_mib"], 2)
print(json.dumps(out))
EOF
