#!/usr/bin/env bash
# The collector against a real S3 API, without Docker or a cloud account:
# moto's S3 server on 127.0.0.1 stands in for S3/MinIO. Starts moto, creates
# the bucket, runs the collector with the same settings a pod would use
# (AWS_ENDPOINT, AWS_ALLOW_HTTP, keys, KubeRay-style identity variables),
# posts the sample events, stops the collector with SIGTERM and lists the
# bucket, checking that the History Server's objects are there. CI runs it
# (scripts/check-deploy.sh).
#
#   examples/s3-local/run.sh
#
# Needs moto (and boto3, which comes with it): ./scripts/install-test-deps.sh
# installs both into .test-deps/venv. RHC_MOTO_SERVER overrides the path of
# moto_server; RHC_PYTHON the Python with boto3 (default: the one beside
# moto_server). COLLECTOR=/path/to/ray-history-collector skips cargo build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=examples/lib.sh
source "$here/../lib.sh"

moto="${RHC_MOTO_SERVER:-$RHC_REPO/.test-deps/venv/bin/moto_server}"
python="${RHC_PYTHON:-$(dirname "$moto")/python}"
if [[ ! -x "$moto" || ! -x "$python" ]]; then
    echo "s3-local: $moto not found; run ./scripts/install-test-deps.sh (or set RHC_MOTO_SERVER)" >&2
    exit 1
fi

work="$(mktemp -d /tmp/rhc-s3-local.XXXXXX)"
collector="$(rhc_collector_path)"
s3_port="$(rhc_free_port)"
port="$(rhc_free_port)"
bucket=ray-historyserver

moto_pid=
pid=
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local p
    for p in "$pid" "$moto_pid"; do
        if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
            kill -TERM "$p" 2>/dev/null || true
            sleep 0.5
            kill -KILL "$p" 2>/dev/null || true
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT

# The same variables a pod would carry (deploy/raycluster/raycluster.yaml).
export AWS_ENDPOINT="http://127.0.0.1:$s3_port"
export AWS_ALLOW_HTTP=true
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export RAY_CLUSTER_NAME=s3-demo
export RAY_CLUSTER_NAMESPACE=ray
export OWNER_KIND=rayjob
export OWNER_NAME=nightly-train

echo "== starting moto's S3 server on 127.0.0.1:$s3_port"
"$moto" -H 127.0.0.1 -p "$s3_port" >"$work/moto.log" 2>&1 &
moto_pid=$!
rhc_wait_http "$AWS_ENDPOINT/moto-api/" 60

echo "== creating bucket $bucket (aws s3 mb s3://$bucket --endpoint-url $AWS_ENDPOINT)"
s3() { # s3 mb|ls: a few lines of boto3 instead of the aws CLI
    timeout 60 "$python" - "$@" <<'PY'
import os, sys
import boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT"],
                  config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2}))
cmd, bucket = sys.argv[1], sys.argv[2]
if cmd == "mb":
    s3.create_bucket(Bucket=bucket)
else:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            print(f"{obj['Size']:>8}  {obj['Key']}")
PY
}
s3 mb "$bucket"

# No Ray runs here, so log shipping (Ray's session logs, dashboard snapshots) is off.
echo "== starting the collector on 127.0.0.1:$port, storage s3://$bucket/demo"
"$collector" --listen "127.0.0.1:$port" --storage "s3://$bucket/demo" \
    --spool-dir "$work/spool" --enable-log-collector=false >"$work/collector.log" 2>&1 &
pid=$!
rhc_wait_http "http://127.0.0.1:$port/healthz" 30

echo "== sending the sample events"
"$here/../quickstart/send-sample.sh" "http://127.0.0.1:$port/v1/events"

echo "== stopping the collector (SIGTERM: seal and upload everything)"
status=0
rhc_stop "$pid" 30 || status=$?
pid=
if ((status != 0)); then
    echo "s3-local: the collector exited with $status; its log:" >&2
    cat "$work/collector.log" >&2
    exit 1
fi

echo "== objects in s3://$bucket"
s3 ls "$bucket" | tee "$work/listing"

session="$(grep -o '"sessionName":"[^"]*"' "$here/../quickstart/sample-events.jsonl" | head -1 | cut -d'"' -f4)"
prefix="demo/cluster-history/rayjob/$RAY_CLUSTER_NAMESPACE/$OWNER_NAME/$RAY_CLUSTER_NAME/$session"
missing=0
for pattern in \
    " demo/cluster-metadata/rayjob/${RAY_CLUSTER_NAMESPACE}_${OWNER_NAME}_${RAY_CLUSTER_NAME}/$session\$" \
    " $prefix/[0-9a-f]*/node_events/[0-9a-f]*-[0-9-]*\\.jsonl\\.gz\$" \
    " $prefix/[0-9a-f]*/job_events/[0-9a-f]*/[0-9a-f]*-[0-9-]*\\.jsonl\\.gz\$"; do
    if ! grep -q -- "$pattern" "$work/listing"; then
        echo "s3-local: no object matches${pattern}" >&2
        missing=1
    fi
done
if ((missing)); then
    exit 1
fi
echo "s3-local: ok"
