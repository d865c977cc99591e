#!/usr/bin/env bash
# `inspect` on a session of many small objects (BENCHMARKS.md, "inspect on big sessions"):
# what a 1,000-node cluster leaves in an hour. The bucket is written directly (no
# collector): NODES nodes, each with OBJECTS/NODES gzip event objects in node_events/, each
# object EVENTS/OBJECTS events in Ray 2.60's camelCase shapes (a task's definition and its
# lifecycle to FINISHED, every task its own Ray-shaped id: EVENTS/2 task attempts). Then
# `inspect --session latest --json` runs under /usr/bin/time -v and `ulimit -n NOFILE`, RUNS
# times; the medians are printed, and every run must report every object read and no
# problem.
#
#   bench/inspect_many_objects.sh                     # 1M events in 100,000 objects
#   NOFILE=64 RUNS=3 bench/inspect_many_objects.sh 1000000 100000
#   BASELINE=/path/to/older/ray-history-collector bench/inspect_many_objects.sh
#
# Needs target/release/ray-history-collector and python3. The bucket is kept in DIR
# (default .bench-deps/inspect-objects-<EVENTS>-<OBJECTS>) and reused when it is there.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EVENTS="${1:-1000000}"
OBJECTS="${2:-100000}"
DIR="${3:-$REPO/.bench-deps/inspect-objects-$EVENTS-$OBJECTS}"
NODES="${NODES:-1000}"
RUNS="${RUNS:-3}"
NOFILE="${NOFILE:-1024}"
BIN="${BIN:-$REPO/target/release/ray-history-collector}"

log() { echo "inspect_many_objects: $*" >&2; }

if [[ ! -d "$DIR/store/cluster-metadata" ]]; then
    rm -rf "$DIR"
    mkdir -p "$DIR/store"
    log "writing $EVENTS events in $OBJECTS objects on $NODES nodes into $DIR/store"
    python3 - "$DIR/store" "$EVENTS" "$OBJECTS" "$NODES" <<'PY'
import base64, gzip, json, os, sys
root, events, objects, nodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
session = "session_2026-11-26_10-00-00_000000_1"
prefix = f"{root}/cluster-history/raycluster/default/many/{session}"
os.makedirs(f"{root}/cluster-metadata/raycluster/default_many")
open(f"{root}/cluster-metadata/raycluster/default_many/{session}", "w").close()
per_object = events // objects
b64 = lambda b: base64.b64encode(b).decode()
job = b64(bytes([1, 0, 0, 0]))
task = 0
for o in range(objects):
    node = o % nodes
    node_hex = f"{node:056x}"
    node_id = b64(bytes.fromhex(node_hex))
    lines = []
    for _ in range(per_object // 2):
        # Ray's shape: 8 unique bytes, a nil actor part, the job.
        tid = b64(task.to_bytes(8, "little") + b"\xff" * 12 + bytes([1, 0, 0, 0]))
        t = f"2026-11-26T10:{(task // 60000) % 60:02d}:{(task // 1000) % 60:02d}.{task % 1000:03d}000000Z"
        lines.append(json.dumps({"eventId": b64(b"d" + task.to_bytes(16, "big")), "sourceType": "CORE_WORKER",
            "eventType": "TASK_DEFINITION_EVENT", "timestamp": t, "severity": "INFO", "sessionName": session,
            "taskDefinitionEvent": {"taskId": tid, "taskAttempt": 0, "taskName": "work", "jobId": job,
                "taskType": "NORMAL_TASK", "requiredResources": {"CPU": 1.0}}, "message": ""}))
        lines.append(json.dumps({"eventId": b64(b"l" + task.to_bytes(16, "big")), "sourceType": "CORE_WORKER",
            "eventType": "TASK_LIFECYCLE_EVENT", "timestamp": t, "severity": "INFO", "sessionName": session,
            "nodeId": node_id, "taskLifecycleEvent": {"taskId": tid, "taskAttempt": 0, "jobId": job, "nodeId": node_id,
                "stateTransitions": [{"state": "RUNNING", "timestamp": t}, {"state": "FINISHED", "timestamp": t}]},
            "message": ""}))
        task += 1
    d = f"{prefix}/{node_hex}/node_events"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/{node_hex}-2026-11-26-10-{o // nodes}.jsonl.gz", "wb") as f:
        f.write(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
print(f"{task * 2} events, {task} task attempts", file=sys.stderr)
PY
fi
log "bucket: $(du -sh "$DIR/store" | cut -f1), $(find "$DIR/store" -type f | wc -l) objects"

# What a report says: "<objects listed> <read> <unreadable problems> <events> <task attempts>".
summary() {
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["objects"]["event_objects_listed"], r["objects"]["read"],
      r["problems"]["unreadable_objects"], r["events"]["total"], r["tasks"]["total"])' "$1"
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

[[ "$RUNS" -gt 0 ]] || exit 0
# Each run's log line ends with what its report says.
run_note() {
    if [[ "$1" == new ]]; then
        echo "; listed, read, unreadable, events, attempts: $(summary "$DIR/report-new.json")"
    else
        echo "; $(summary "$DIR/report-baseline.json" 2>/dev/null || echo 'no report')"
    fi
}
INSPECT_NOFILE="$NOFILE"
source "$REPO/bench/lib/inspect_runs.sh"
inspect_runs
echo "median of $RUNS (ulimit -n $NOFILE): $(median "${walls[@]}") s, CPU $(median "${cpus[@]}") s, max RSS $(( $(median "${rss[@]}") / 1024 )) MiB"
if [[ -n "${BASELINE:-}" ]]; then
    echo "baseline median: $(median "${base_walls[@]}") s, CPU $(median "${base_cpus[@]}") s, max RSS $(( $(median "${base_rss[@]}") / 1024 )) MiB"
fi
