#!/usr/bin/env bash
# The full benchmark of BENCHMARKS.md: baselines and the collector measured in the same
# rounds, so every figure can be quoted as a median and as a ratio that holds on a noisy
# machine. Loopback only; every load is bounded in time. Takes about 25 minutes
# (--quick: about 8).
#
#   bench/run.sh                 # release build; moto and the plot venv installed on first use
#   bench/run.sh --quick         # 3 rounds, shorter loads: a check of the harness
#   bench/run.sh --rounds 7 --skip-build
#
# Output: .bench-deps/results/<timestamp>/ (results.jsonl: one JSON line per measurement,
# summary.json, table.md, machine.txt, collector logs), and bench/throughput_p99.png plus
# bench/results/summary.json and bench/results/table.md, the copies BENCHMARKS.md quotes.
#
# Measured per round, interleaved so that noise from other work on the machine hits every
# figure alike: dd's sequential write with fdatasync (the bound of any durable ingest
# here; before and right after the collector's maximum run, and the mean of the two is the
# round's baseline), the null sink (rhc-null-sink: the bound of the HTTP side, same load generator),
# the collector's idle RSS, its maximum durable ingest, the same at half that rate, and
# 10,000 distinct jobs. Then: a sweep of offered load (the plot), 60 s sustained with gzip
# and uploads to S3, SIGTERM with 256 MB of spool, and one 2 GB log file.
#
# The S3 server is moto (the test suite's, from ./scripts/install-test-deps.sh). s3s-fs
# 0.14.1 cannot hold this layout: it names a metadata file after base64(bucket) +
# base64(key), which passes the 255-byte file name limit for keys over ~170 bytes, and
# every event key of the KubeRay layout is longer, so every PUT gets a 500.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
DEPS="$REPO/.bench-deps"

ROUNDS=5
QUICK=0
BUILD=1
PLOT=1
while (($#)); do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --quick) QUICK=1; ROUNDS=3; shift ;;
        --skip-build) BUILD=0; shift ;;
        --no-plot) PLOT=0; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "bench/run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

if ((QUICK)); then
    DUR=5; WARM=1; SWEEP_ROUNDS=1; SWEEP_DUR=4; SUSTAIN=30; SUSTAIN_RUNS=1; BACKLOG_RUNS=1; LOG_RUNS=1; LOG_MIB=512
else
    DUR=10; WARM=2; SWEEP_ROUNDS=3; SWEEP_DUR=5; SUSTAIN=60; SUSTAIN_RUNS=3; BACKLOG_RUNS=3; LOG_RUNS=3; LOG_MIB=2048
fi
SUSTAIN_RATE="${SUSTAIN_RATE:-60000}"
SWEEP_RATES="${SWEEP_RATES:-2000 25000 50000 100000 150000 200000 250000 300000 0}"

log() { echo "bench: $*" >&2; }

# ------------------------------------------------------------------ tools
if ((BUILD)); then
    log "cargo build --release --workspace --bins"
    cargo build --release --workspace --bins --locked >&2
fi
eval "$("$REPO/scripts/install-test-deps.sh")"
MOTO="${RHC_MOTO_SERVER:?install-test-deps.sh did not export RHC_MOTO_SERVER}"
if ((PLOT)) && [[ ! -x "$DEPS/venv/bin/python" || "$(cat "$DEPS/venv/.stamp" 2>/dev/null)" != "$(sha256sum bench/requirements.txt | cut -d' ' -f1)" ]]; then
    log "creating the plot venv in $DEPS/venv"
    rm -rf "$DEPS/venv"
    python3 -m venv "$DEPS/venv"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$DEPS/venv/bin/python" -m pip install -q -r bench/requirements.txt >&2
    sha256sum bench/requirements.txt | cut -d' ' -f1 >"$DEPS/venv/.stamp"
fi

OUT="$DEPS/results/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT/bin" "$OUT/run"
# Frozen copies: other builds in this checkout must not change the binaries mid-run.
for b in ray-history-collector rhc-loadgen rhc-null-sink rhc-chaos; do
    cp "target/release/$b" "$OUT/bin/"
done
BIN="$OUT/bin"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"
log "results in $OUT"

# ------------------------------------------------------------------ machine
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') ($(nproc) cores; $(grep -m1 'cpu MHz' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') MHz)"
    echo "memory: $(free -m | awk '/^Mem:/ {print $2 " MiB total, " $7 " MiB available"}')"
    echo "kernel: $(uname -sr)"
    echo "filesystem: $(df -T "$OUT" | awk 'NR==2 {print $2 " on " $1}')"
    echo "rustc: $(rustc --version)"
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo ' (with local changes in src/)')"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# ------------------------------------------------------------------ helpers
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

S3_PORT="$(free_port)"
"$MOTO" -H 127.0.0.1 -p "$S3_PORT" >"$OUT/moto.log" 2>&1 &
S3_PID=$!
PIDS=("$S3_PID")
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/" && break; sleep 0.1; done
# moto ignores signatures but wants one.
MOTO_AUTH='AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000'
new_bucket() { # empty moto (it keeps objects in memory) and create the bucket
    curl -s -o /dev/null -X POST "http://127.0.0.1:$S3_PORT/moto-api/reset"
    curl -sf -o /dev/null -X PUT -H "Authorization: $MOTO_AUTH" "http://127.0.0.1:$S3_PORT/bench"
}
new_bucket

emit() { echo "$1" >>"$RESULTS"; }
rss_mib() { awk '/^VmRSS:/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }

# start_collector NAME [extra args...]: sets CPID, CPORT, CDIR
start_collector() {
    CDIR="$OUT/run/$1"; shift
    rm -rf "$CDIR"; mkdir -p "$CDIR/ray"
    CPORT="$(free_port)"
    AWS_ENDPOINT="http://127.0.0.1:$S3_PORT" AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test \
    AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 RUST_LOG=info \
        "$BIN/ray-history-collector" --listen "127.0.0.1:$CPORT" --spool-dir "$CDIR/spool" \
        --storage s3://bench --cluster-name bench --ray-tmp-dir "$CDIR/ray" \
        --enable-log-collector false --enable-export-events false "$@" >"$CDIR/collector.log" 2>&1 &
    CPID=$!
    PIDS+=("$CPID")
    for _ in $(seq 200); do
        curl -sf -o /dev/null "http://127.0.0.1:$CPORT/healthz" && return 0
        sleep 0.05
    done
    log "collector $CDIR did not start:"; tail -5 "$CDIR/collector.log" >&2; exit 1
}
stop_collector() { # kill -9 and drop the spool (a backlog we do not want to upload)
    kill -9 "$CPID" 2>/dev/null || true
    wait "$CPID" 2>/dev/null || true
    rm -rf "$CDIR/spool"
}
# loadgen LABEL URL PID [args...]: one JSON line into results.jsonl, echoed
loadgen() {
    local label="$1" url="$2" pid="$3"; shift 3
    local extra=()
    [[ "$pid" != 0 ]] && extra+=(--pid "$pid")
    "$BIN/rhc-loadgen" --url "$url" --batch 1000 --concurrency 4 --json --label "$label" "${extra[@]}" "$@" \
        | tee -a "$RESULTS" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print("bench:  %-22s %9.0f ev/s %7.1f MB/s  p50 %6.1f  p99 %6.1f ms  rss %s MiB  non-2xx %d" % (j["label"], j["events_per_s"], j["mb_per_s"], j["p50_ms"], j["p99_ms"], j.get("rss_peak_mib","-"), j["non_2xx"]))' >&2
}
last() { tail -1 "$RESULTS" | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$1'])"; }

# The ingest-only configuration: no segment is sealed during a run (so no upload competes
# for the CPU) and the budget never pushes back; the spool is dropped after each run.
INGEST=(--max-segment-bytes 4GiB --rotation-interval 1h --max-spool-bytes 64GiB)

# dd: sequential write of 512 MiB + one fdatasync, on the spool's filesystem.
dd_round() {
    local ddout ddmb
    ddout="$(dd if=/dev/zero of="$OUT/run/dd.bin" bs=1M count=512 conv=fdatasync 2>&1 | tail -1)"
    rm -f "$OUT/run/dd.bin"
    ddmb="$(echo "$ddout" | python3 -c 'import re,sys; t=sys.stdin.read(); b=int(t.split()[0]); s=float(re.search(r"copied, ([0-9.]+) s", t).group(1)); print(round(b/s/1e6,1))')"
    emit "{\"label\":\"$1\",\"mb_per_s\":$ddmb}"
    log "  dd conv=fdatasync ($1)  $ddmb MB/s"
}

# ------------------------------------------------------------------ rounds
for r in $(seq "$ROUNDS"); do
    log "round $r/$ROUNDS (loadavg $(cut -d' ' -f1 /proc/loadavg))"
    emit "{\"label\":\"loadavg/r$r\",\"loadavg\":$(cut -d' ' -f1 /proc/loadavg)}"

    dd_round "dd/r$r"

    # Null sink: the HTTP bound, same generator.
    NPORT="$(free_port)"
    "$BIN/rhc-null-sink" --listen "127.0.0.1:$NPORT" >/dev/null 2>&1 &
    NPID=$!; PIDS+=("$NPID")
    for _ in $(seq 100); do curl -s -o /dev/null -X POST "http://127.0.0.1:$NPORT/" && break; sleep 0.05; done
    loadgen "null_max/r$r" "http://127.0.0.1:$NPORT/v1/events" "$NPID" --duration "$DUR" --warmup "$WARM"
    kill "$NPID" 2>/dev/null || true; wait "$NPID" 2>/dev/null || true

    # Collector: idle, then maximum durable ingest.
    start_collector "max-r$r" "${INGEST[@]}"
    sleep 3
    emit "{\"label\":\"idle/r$r\",\"rss_mib\":$(rss_mib "$CPID")}"
    loadgen "ingest_max/r$r" "http://127.0.0.1:$CPORT/v1/events" "$CPID" --duration "$DUR" --warmup "$WARM" \
        --metrics-url "http://127.0.0.1:$CPORT/metrics"
    max_eps="$(last events_per_s)"
    # dd again right after: the disk's bandwidth moves within a round (367-658 MB/s across
    # the rounds of one run), so the baseline is the mean of before and after.
    dd_round "dd_after/r$r"
    # The collector gives freed memory back after 5 s without writes; sampled after that.
    sleep 7
    emit "{\"label\":\"idle_after/r$r\",\"rss_mib\":$(rss_mib "$CPID")}"
    stop_collector

    # Half the maximum rate of this round.
    half="$(python3 -c "print(int($max_eps/2))")"
    start_collector "half-r$r" "${INGEST[@]}"
    loadgen "ingest_half/r$r" "http://127.0.0.1:$CPORT/v1/events" "$CPID" --duration "$DUR" --warmup "$WARM" \
        --rate "$half" --metrics-url "http://127.0.0.1:$CPORT/metrics"
    stop_collector

    # 10,000 distinct jobs: 10,000 segment files, at most --max-open-segments (512) open.
    start_collector "jobs-r$r" --max-spool-bytes 64GiB
    loadgen "jobs10k/r$r" "http://127.0.0.1:$CPORT/v1/events" "$CPID" --duration "$DUR" --warmup "$WARM" \
        --jobs 10000 --metrics-url "http://127.0.0.1:$CPORT/metrics"
    emit "{\"label\":\"fd_limit/r$r\",\"fd_limit\":$(awk '/Max open files/ {print $4}' "/proc/$CPID/limits")}"
    stop_collector
done

# ------------------------------------------------------------------ sweep (the plot)
for r in $(seq "$SWEEP_ROUNDS"); do
    for rate in $SWEEP_RATES; do
        log "sweep round $r: offered ${rate} events/s (0 = unlimited)"
        start_collector "sweep" "${INGEST[@]}"
        loadgen "sweep_collector/$rate/r$r" "http://127.0.0.1:$CPORT/v1/events" "$CPID" \
            --duration "$SWEEP_DUR" --warmup 1 --rate "$rate"
        stop_collector
        NPORT="$(free_port)"
        "$BIN/rhc-null-sink" --listen "127.0.0.1:$NPORT" >/dev/null 2>&1 &
        NPID=$!; PIDS+=("$NPID")
        for _ in $(seq 100); do curl -s -o /dev/null -X POST "http://127.0.0.1:$NPORT/" && break; sleep 0.05; done
        loadgen "sweep_null/$rate/r$r" "http://127.0.0.1:$NPORT/v1/events" "$NPID" \
            --duration "$SWEEP_DUR" --warmup 1 --rate "$rate"
        kill "$NPID" 2>/dev/null || true; wait "$NPID" 2>/dev/null || true
    done
done

# ------------------------------------------------------------------ sustained with uploads
# Defaults (gzip, 64 MiB segments, 5 min rotation) and uploads to S3 (moto): does the
# upload side keep pace (the spool does not grow)?
for r in $(seq "$SUSTAIN_RUNS"); do
    log "sustained $SUSTAIN s at $SUSTAIN_RATE events/s with gzip uploads to moto, run $r"
    new_bucket
    start_collector "sustained-r$r"
    loadgen "sustained/r$r" "http://127.0.0.1:$CPORT/v1/events" "$CPID" --duration "$SUSTAIN" --warmup 0 \
        --rate "$SUSTAIN_RATE" --metrics-url "http://127.0.0.1:$CPORT/metrics" --timeline
    # What is left to upload when the load stops: drain time while running.
    t0=$(date +%s.%N)
    up0="$(curl -s "http://127.0.0.1:$CPORT/metrics" | awk '/^rhc_upload_bytes_total/ {s+=$2} END {print s+0}')"
    t1=$(date +%s.%N)
    kill -TERM "$CPID"; wait "$CPID" || true
    t2=$(date +%s.%N)
    failures="$(grep -c 'upload failed' "$CDIR/collector.log" || true)"
    emit "{\"label\":\"sustained_term/r$r\",\"shutdown_s\":$(python3 -c "print(round($t2-$t1,2))"),\"uploaded_before_term\":$up0,\"upload_failures_logged\":$failures}"
    rm -rf "$CDIR/spool"
done
kill -9 "$S3_PID" 2>/dev/null || true

# ------------------------------------------------------------------ SIGTERM backlog, 2 GB log
log "SIGTERM with 256 MB of spool to moto ($BACKLOG_RUNS runs)"
"$BIN/rhc-chaos" --collector "$BIN/ray-history-collector" --storage "moto:$MOTO" \
    --only sigterm-backlog --repeat "$BACKLOG_RUNS" --work-dir "$OUT/chaos" --json "$OUT/chaos.jsonl" >&2 || true
log "one ${LOG_MIB} MiB log file to moto ($LOG_RUNS runs)"
"$BIN/rhc-chaos" --collector "$BIN/ray-history-collector" --storage "moto:$MOTO" \
    --only logs-2g --log-mib "$LOG_MIB" --repeat "$LOG_RUNS" --work-dir "$OUT/chaos-logs" --json "$OUT/chaos.jsonl" >&2 || true
rm -rf "$OUT/chaos" "$OUT/chaos-logs"

echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"

# ------------------------------------------------------------------ summary and plot
python3 bench/summarize.py "$OUT"
if ((PLOT)); then
    "$DEPS/venv/bin/python" bench/plot.py "$OUT/results.jsonl" "$OUT/throughput_p99.png"
fi
if ((!QUICK)); then
    mkdir -p bench/results
    cp "$OUT/summary.json" "$OUT/table.md" "$OUT/machine.txt" bench/results/
    ((PLOT)) && cp "$OUT/throughput_p99.png" bench/throughput_p99.png
fi
rm -rf "$OUT/run"
log "done: $OUT/table.md"
cat "$OUT/table.md"
