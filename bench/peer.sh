#!/usr/bin/env bash
# Side by side with KubeRay's Go collector: both collectors driven by the same load
# generator against the same S3 server (moto) and the same disk, in interleaved rounds, then
# the same faults against both. Writes the section "Side by side with KubeRay's collector"
# of BENCHMARKS.md and the side-by-side rows of the sizing table (docs/sizing-and-cost.md). About 15 minutes
# (--quick: about 4). Loopback only; every load is bounded in time.
#
#   RHC_PEER_COLLECTOR=/path/to/kuberay/collector bench/peer.sh
#   bench/peer.sh --quick          # 1 short round, 10 s outage: a check of the harness
#   bench/peer.sh --rounds 5 --skip-build --no-chaos --no-docs
#
# KubeRay's collector is not built by this repository. RHC_PEER_COLLECTOR names its binary,
# which is what the pinned
#   GOTOOLCHAIN=local go install github.com/ray-project/kuberay/historyserver/cmd/collector@v0.0.0-20260819132152-feeaf72facab
# installs when the Go module proxy serves KubeRay's module (the proxy of this project's
# machines answers 403 "This module version is not available"; see BENCHMARKS.md).
#
# Per round, for each offered rate (2,000 and 25,000 events/s) and then unpaced, each
# collector in turn (the order rotates every round), fresh process, spool and bucket for
# every run: `rhc-peer-bench` starts it, runs rhc-loadgen (4 clients, 1,000-event batches)
# against it, SIGTERMs it and reaps it (CPU and peak RSS of its whole life, from wait4),
# and reads the bucket back. The subjects and every setting: tools/src/bin/rhc-peer-bench.rs
# and testkit/src/peer.rs. Then `rhc-chaos --only side-kill9,side-sigterm,side-outage`.
#
# Output: .bench-deps/results/peer-<timestamp>/ (results.jsonl, chaos.jsonl, machine.txt,
# summary.json, table.md); a full run also refreshes bench/results/peer/ and, unless
# --no-docs, the generated parts of BENCHMARKS.md and docs/sizing-and-cost.md (bench/peer_summary.py).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
DEPS="$REPO/.bench-deps"

ROUNDS=3
QUICK=0
BUILD=1
CHAOS=1
DOCS=1
while (($#)); do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --quick) QUICK=1; ROUNDS=1; shift ;;
        --skip-build) BUILD=0; shift ;;
        --no-chaos) CHAOS=0; shift ;;
        --no-docs) DOCS=0; shift ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "bench/peer.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

PEER="${RHC_PEER_COLLECTOR:-}"
if [[ -z "$PEER" || ! -x "$PEER" ]]; then
    cat >&2 <<'EOF'
bench/peer.sh: RHC_PEER_COLLECTOR must name KubeRay's collector binary. It is what
  GOTOOLCHAIN=local go install github.com/ray-project/kuberay/historyserver/cmd/collector@v0.0.0-20260819132152-feeaf72facab
installs (then RHC_PEER_COLLECTOR=$(go env GOPATH)/bin/collector), when the Go module proxy
serves KubeRay's module; this repository does not build it.
EOF
    exit 2
fi

if ((QUICK)); then
    DUR=6; WARM=1; MAX_DUR=5; OUTAGE=10
else
    DUR=15; WARM=2; MAX_DUR=10; OUTAGE=60
fi
RATES="${PEER_RATES:-2000 25000}"

log() { echo "bench: $*" >&2; }

if ((BUILD)); then
    log "cargo build --release --workspace --bins"
    cargo build --release --workspace --bins --locked >&2
fi
eval "$("$REPO/scripts/install-test-deps.sh")"
MOTO="${RHC_MOTO_SERVER:?install-test-deps.sh did not export RHC_MOTO_SERVER}"

OUT="$DEPS/results/peer-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT/bin" "$OUT/run"
# Frozen copies: other builds in this checkout must not change the binaries mid-run.
for b in ray-history-collector rhc-loadgen rhc-peer-bench rhc-chaos; do
    cp "target/release/$b" "$OUT/bin/"
done
BIN="$OUT/bin"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"
log "results in $OUT"

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') ($(nproc) cores)"
    echo "memory: $(free -m | awk '/^Mem:/ {print $2 " MiB total, " $7 " MiB available"}')"
    echo "kernel: $(uname -sr)"
    echo "filesystem: $(df -T "$OUT" | awk 'NR==2 {print $2 " on " $1}')"
    echo "rustc: $(rustc --version)"
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo ' (with local changes in src/)')"
    if command -v go >/dev/null 2>&1; then
        echo "peer: $(go version -m "$PEER" 2>/dev/null | awk 'NR==1 {print $2} $1=="path" {print $2}' | paste -sd' ')"
    fi
    echo "peer sha256: $(sha256sum "$PEER" | cut -d' ' -f1)"
    echo "moto: $("$(dirname "$MOTO")/python" -c 'import moto; print(moto.__version__)' 2>/dev/null || echo '?')"
    echo "rounds: $ROUNDS; loads: ${WARM} s warm-up + ${DUR} s at $RATES events/s, ${WARM} s + ${MAX_DUR} s unpaced"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
S3_PORT="$(free_port)"
"$MOTO" -H 127.0.0.1 -p "$S3_PORT" >"$OUT/moto.log" 2>&1 &
S3_PID=$!
cleanup() { { kill "$S3_PID" && wait "$S3_PID"; } 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/" && break; sleep 0.1; done
RAYTMP="$(mktemp -d /tmp/rhc-pb.XXXXXX)"

# measure SUBJECT LABEL [rhc-peer-bench args...]: one JSON line into results.jsonl
measure() {
    local subject="$1" label="$2"; shift 2
    local line
    if line="$("$BIN/rhc-peer-bench" --subject "$subject" --label "$label" --collector "$BIN/ray-history-collector" \
            --peer "$PEER" --loadgen "$BIN/rhc-loadgen" --s3-port "$S3_PORT" --work-dir "$OUT/run/$subject" \
            --ray-tmp "$RAYTMP/r" "$@")"; then
        echo "$line" >>"$RESULTS"
        echo "$line" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); l=j["load"]; print("bench:  %-30s %8.0f ev/s  p50 %7.1f  p99 %7.1f ms  non-2xx %d  cpu/M %s s  maxrss %s MiB  bucket %s of %s" % (j["subject"]+" "+j["label"], l["events_per_s"], l["p50_ms"], l["p99_ms"], l["non_2xx"], "%.2f" % j["cpu_s_per_million"] if "cpu_s_per_million" in j else "-", "%.1f" % j["max_rss_mib"] if "max_rss_mib" in j else "%.1f (window)" % l.get("rss_peak_mib", 0), j.get("bucket", {}).get("distinct_events", "-"), l.get("acked_total")))' >&2
    else
        log "  $subject $label: the run failed (see above)"
        echo "{\"subject\":\"$subject\",\"label\":\"$label\",\"failed\":true}" >>"$RESULTS"
    fi
}

# rotate N WORDS...: the words, starting at the N-th (so each round has another order)
rotate() { local n="$1"; shift; local a=("$@"); local i; for i in "${!a[@]}"; do echo "${a[$(((i + n) % ${#a[@]}))]}"; done; }

for r in $(seq "$ROUNDS"); do
    log "round $r/$ROUNDS (loadavg $(cut -d' ' -f1 /proc/loadavg))"
    for rate in $RATES; do
        for s in $(rotate "$r" ours peer-gzip peer-plain); do
            measure "$s" "$rate/r$r" --rate "$rate" --duration "$DUR" --warmup "$WARM"
        done
    done
    for s in $(rotate "$r" ours ours-ingest peer-gzip peer-plain); do
        measure "$s" "max/r$r" --rate 0 --duration "$MAX_DUR" --warmup "$WARM" --max
    done
done
{ kill "$S3_PID" && wait "$S3_PID"; } 2>/dev/null || true
rm -rf "$RAYTMP" "$OUT/run"

if ((CHAOS)); then
    log "chaos, side by side: kill -9, SIGTERM, a ${OUTAGE} s storage outage"
    "$BIN/rhc-chaos" --collector "$BIN/ray-history-collector" --peer "$PEER" --storage "moto:$MOTO" \
        --only side-kill9,side-sigterm,side-outage --outage-secs "$OUTAGE" \
        --work-dir "$OUT/chaos" --json "$OUT/chaos.jsonl" >&2 || log "rhc-chaos: a comparison failed (see above)"
    rm -rf "$OUT/chaos"
fi
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"

SUMMARY_ARGS=("$OUT")
if ((!QUICK)); then
    SUMMARY_ARGS+=(--publish bench/results/peer)
    ((DOCS)) && SUMMARY_ARGS+=(--docs "$REPO")
fi
python3 bench/peer_summary.py "${SUMMARY_ARGS[@]}"
log "done: $OUT/table.md"
