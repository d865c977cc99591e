#!/usr/bin/env bash
# The local quickstart in one go, with no cloud: runs the collector with a
# file:// bucket, posts the sample events, stops it with SIGTERM (which seals
# and uploads everything) and shows where the objects landed. CI runs it
# (scripts/check-deploy.sh); README.md beside it walks through the same steps.
#
#   examples/quickstart/run.sh [WORK_DIR]
#
# WORK_DIR (default: a new /tmp/rhc-quickstart.XXXXXX, kept) holds the spool
# and the bucket. COLLECTOR=/path/to/ray-history-collector skips cargo build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=examples/lib.sh
source "$here/../lib.sh"

work="${1:-$(mktemp -d /tmp/rhc-quickstart.XXXXXX)}"
mkdir -p "$work"
bucket="$work/bucket"
collector="$(rhc_collector_path)"
port="$(rhc_free_port)"
cluster=quickstart

pid=
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() { if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi; }
trap cleanup EXIT

# No Ray runs here, so log shipping (Ray's session logs, dashboard snapshots) is off.
echo "== starting the collector on 127.0.0.1:$port, bucket file://$bucket"
"$collector" --listen "127.0.0.1:$port" --storage "file://$bucket" \
    --spool-dir "$work/spool" --cluster-name "$cluster" --cluster-namespace default \
    --enable-log-collector=false \
    >"$work/collector.log" 2>&1 &
pid=$!
rhc_wait_http "http://127.0.0.1:$port/healthz" 30

echo "== sending the sample events"
"$here/send-sample.sh" "http://127.0.0.1:$port/v1/events"

echo "== stopping the collector (SIGTERM: seal and upload everything)"
status=0
rhc_stop "$pid" 30 || status=$?
pid=
if ((status != 0)); then
    echo "quickstart: the collector exited with $status; its log:" >&2
    cat "$work/collector.log" >&2
    exit 1
fi

echo "== objects in the bucket"
(cd "$bucket" && find . -type f | sed 's|^\./||' | sort)

# What KubeRay's History Server needs: the session marker, node events and the
# job's events, under the cluster's prefix.
session="$(grep -o '"sessionName":"[^"]*"' "$here/sample-events.jsonl" | head -1 | cut -d'"' -f4)"
prefix="$bucket/cluster-history/raycluster/default/$cluster/$session"
missing=0
expect() {
    if ! compgen -G "$1" >/dev/null; then
        echo "quickstart: expected object missing: ${1#"$bucket"/}" >&2
        missing=1
    fi
}
expect "$bucket/cluster-metadata/raycluster/default_$cluster/$session"
expect "$prefix/*/node_events/*.jsonl.gz"
expect "$prefix/*/job_events/*/*.jsonl.gz"
if ((missing)); then
    exit 1
fi
echo "quickstart: ok (work dir $work)"
