#!/usr/bin/env bash
# Posts sample Ray events to a collector, one HTTP request per line of the
# file, the way Ray's dashboard agent does (a JSON array of events per POST).
#
#   examples/quickstart/send-sample.sh [URL] [FILE]
#
# URL defaults to http://127.0.0.1:8084/v1/events; FILE to sample-events.jsonl
# beside this script (3 POST bodies captured from Ray 2.60: node, driver job
# and task events). Prints each answer; exits 1 on the first non-2xx answer.
set -euo pipefail

url="${1:-http://127.0.0.1:8084/v1/events}"
file="${2:-$(dirname "${BASH_SOURCE[0]}")/sample-events.jsonl}"

n=0
while IFS= read -r body || [[ -n "$body" ]]; do
    [[ -z "$body" ]] && continue
    n=$((n + 1))
    answer="$(printf '%s' "$body" | curl -sS --noproxy '*' --max-time 10 \
        -H 'Content-Type: application/json' --data-binary @- \
        -w '\n%{http_code}' "$url")"
    code="${answer##*$'\n'}"
    echo "POST $n -> $code ${answer%$'\n'*}"
    if [[ "$code" != 2* ]]; then
        echo "send-sample: $url answered $code" >&2
        exit 1
    fi
done <"$file"
echo "send-sample: $n requests sent to $url"
