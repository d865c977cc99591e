#!/usr/bin/env bash
# A quick same-round comparison of the collector's durable ingest with three disk baselines
# (about 2 min): dd writing 512 MiB and syncing once at the end (conv=fdatasync, the
# baseline of BENCHMARKS.md), dd writing 3 GiB the same way (about what the collector writes
# in its 8 s run: this VM's disk absorbs a short burst faster than it sustains), dd syncing
# after every 1 MiB write (oflag=dsync: a service that syncs before each answer of ~1 MB
# cannot beat it by much), and the collector at full speed (4 clients x 1,000-event
# batches, ~0.87 MB per request, ingest-only settings).
#
#   bench/disk_ratio.sh [rounds]      # default 5; needs target/release (cargo build --release --workspace --bins)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$REPO/target/release"
ROUNDS="${1:-5}"
WORK="$(mktemp -d "$REPO/.bench-deps/disk-ratio.XXXXXX")"
trap 'kill "${CPID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dd_mb_s() { dd if=/dev/zero of="$WORK/dd.bin" bs=1M count="$1" "$2" 2>&1 | awk '/copied/ {print $(NF-1)}'; rm -f "$WORK/dd.bin"; }
printf '%-6s %14s %14s %14s %14s %10s %10s %10s\n' round dd_fdatasync dd_3GiB dd_dsync_1M collector_MB/s vs_fdatasync vs_3GiB vs_dsync
for r in $(seq "$ROUNDS"); do
    a=$(dd_mb_s 512 conv=fdatasync)
    g=$(dd_mb_s 3072 conv=fdatasync)
    b=$(dd_mb_s 256 oflag=dsync)
    rm -rf "$WORK/spool" "$WORK/bucket"
    "$BIN/ray-history-collector" --listen "127.0.0.1:$PORT" --spool-dir "$WORK/spool" --storage "$WORK/bucket" \
        --max-segment-bytes 4GiB --rotation-interval 1h --max-spool-bytes 64GiB \
        --enable-log-collector false --enable-export-events false --ray-tmp-dir "$WORK/ray" >"$WORK/c.log" 2>&1 &
    CPID=$!
    for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/healthz" && break; sleep 0.1; done
    c=$("$BIN/rhc-loadgen" --url "http://127.0.0.1:$PORT/v1/events" --batch 1000 --concurrency 4 \
        --duration 8 --warmup 2 --metrics-url "http://127.0.0.1:$PORT/metrics" --json |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["spool_written_mb_per_s"],1))')
    kill "$CPID"; wait "$CPID" 2>/dev/null || true; CPID=
    python3 -c "a,g,b,c=$a,$g,$b,$c; print(f'{$r:<6} {a:14} {g:14} {b:14} {c:14} {c/a:10.2f} {c/g:10.2f} {c/b:10.2f}')"
done
