#!/usr/bin/env bash
# Profiles of the ingest path, as quoted in BENCHMARKS.md ("What the profiles show").
# Needs perf, valgrind and strace (Debian: linux-perf, valgrind, strace). About 5 minutes.
#
#   bench/profile.sh [--skip-build]
#
# 1. perf (cpu-clock, DWARF call graphs) of the collector under the maximum load: where
#    the CPU time goes (this VM has no hardware counters: `perf stat -e instructions`
#    is "not supported", so perf samples the cpu-clock software event).
# 2. strace -c -f of the same: the system calls, their count and time. The collector is
#    mostly waiting, not computing: this shows on what.
# 3. valgrind --tool=callgrind on a fixed load (200 requests of 1,000 events): instructions
#    per event, by function. Deterministic, so it is the figure to compare before and
#    after a change on a noisy machine.
# 4. valgrind --tool=massif at the same load, and /proc/<pid>/smaps_rollup at the peak of
#    a release run: where the resident memory goes.
#
# Output: .bench-deps/profile/<timestamp>/ (perf-report.txt, strace.txt,
# callgrind-top.txt, massif.txt, smaps.txt).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
[[ "${1:-}" == "--skip-build" ]] || cargo build --release --workspace --bins --locked >&2
OUT="$REPO/.bench-deps/profile/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT/bin"
cp target/release/ray-history-collector target/release/rhc-loadgen "$OUT/bin/"
BIN="$OUT/bin"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

# start [wrapper...]: the collector in the ingest-only configuration of bench/run.sh.
start() {
    PORT="$(free_port)"
    rm -rf "$OUT/spool" "$OUT/bucket"
    "$@" "$BIN/ray-history-collector" --listen "127.0.0.1:$PORT" --spool-dir "$OUT/spool" \
        --storage "$OUT/bucket" --enable-log-collector false --enable-export-events false \
        --ray-tmp-dir "$OUT/ray" --max-segment-bytes 4GiB --rotation-interval 1h \
        --max-spool-bytes 64GiB >"$OUT/collector.log" 2>&1 &
    CPID=$!
    PIDS+=("$CPID")
    for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/healthz" && return 0; sleep 0.1; done
    echo "profile.sh: collector did not start" >&2; exit 1
}
stop() { kill -TERM "$CPID" 2>/dev/null || true; wait "$CPID" 2>/dev/null || true; }
load() { "$BIN/rhc-loadgen" --url "http://127.0.0.1:$PORT/v1/events" --batch 1000 --concurrency 4 "$@"; }

echo "== 1. perf record, maximum load" >&2
start
load --duration 14 --warmup 1 --pid "$CPID" >"$OUT/perf-load.txt" &
LPID=$!
sleep 3
perf record -F 499 --call-graph dwarf,32768 -o "$OUT/perf.data" -p "$CPID" -- sleep 8 2>/dev/null
wait "$LPID" || true
stop
perf report -i "$OUT/perf.data" --no-children --sort symbol --stdio 2>/dev/null \
    | grep -E '^ +[0-9]' | head -40 >"$OUT/perf-report.txt"
perf report -i "$OUT/perf.data" --children --sort symbol --stdio 2>/dev/null \
    | grep -E '^ +[0-9]' | head -60 >"$OUT/perf-report-children.txt"
rm -f "$OUT/perf.data"

echo "== 2. strace -c, maximum load" >&2
start
load --duration 10 --warmup 1 --pid "$CPID" >"$OUT/strace-load.txt" &
LPID=$!
sleep 2
timeout 6 strace -c -f -p "$CPID" -o "$OUT/strace.txt" || true
wait "$LPID" || true
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^rhc_spool_commit_seconds_(sum|count)|^rhc_spool_written' >>"$OUT/strace.txt"
stop

echo "== 3. callgrind, 200 requests of 1,000 events" >&2
start valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" --dump-instr=no
load --duration 900 >/dev/null 2>&1 &
LG=$!
# 200 requests: the load generator is stopped by the request count below.
python3 - "$PORT" <<'EOF'
import sys, time, urllib.request
port = sys.argv[1]
deadline = time.time() + 900
while time.time() < deadline:
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    n = sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("rhc_events_accepted_total"))
    if n >= 200_000:
        break
    time.sleep(1)
EOF
kill "$LG" 2>/dev/null || true; wait "$LG" 2>/dev/null || true
stop
callgrind_annotate --inclusive=no "$OUT/callgrind.out" 2>/dev/null | head -60 >"$OUT/callgrind-top.txt"
callgrind_annotate --inclusive=yes "$OUT/callgrind.out" 2>/dev/null | head -80 >"$OUT/callgrind-inclusive.txt"

echo "== 4. massif, and smaps at the peak of a release run" >&2
start valgrind --tool=massif --massif-out-file="$OUT/massif.out" --pages-as-heap=no
load --duration 20 --warmup 0 >/dev/null 2>&1 || true
stop
ms_print "$OUT/massif.out" | head -120 >"$OUT/massif.txt"
start
load --duration 8 --warmup 1 --pid "$CPID" >"$OUT/smaps-load.txt" &
LPID=$!
sleep 6
{
    echo "# /proc/<pid>/smaps_rollup under the maximum load"
    cat "/proc/$CPID/smaps_rollup"
    echo "# the largest mappings by Rss (kB)"
    awk '/^[0-9a-f]+-[0-9a-f]+ / {name=$6} /^Rss:/ {print $2, name}' "/proc/$CPID/smaps" | sort -rn | head -12
} >"$OUT/smaps.txt"
wait "$LPID" || true
stop
echo "profile.sh: results in $OUT" >&2
ls "$OUT" >&2
