# Sourced by bench/inspect_big.sh and bench/inspect_many_objects.sh: the timed runs of
# `inspect --session latest --json` over the bucket in "$DIR/store", shared so that both
# measure alike (wall time and CPU from /usr/bin/time -v, the peak RSS), and a baseline
# binary, when given, runs right after this one in each round (a same-run ratio).
#
# Needs from the caller: DIR, RUNS, BIN, `log`; optional BASELINE (an older binary),
# INSPECT_NOFILE (runs under `ulimit -n INSPECT_NOFILE`, and a run that fails is still
# measured), and a `run_note TAG` function whose output ends each run's log line (TAG is
# `new` or `baseline`; nothing by default).
# Fills the arrays walls, rss (KiB), cpus and base_walls, base_rss, base_cpus.

# One timed run of binary $1, its report in "$DIR/report-$2.json":
# "<wall seconds> <max RSS KiB> <CPU seconds, user + system>".
measure() {
    if [[ -n "${INSPECT_NOFILE:-}" ]]; then
        (ulimit -n "$INSPECT_NOFILE"; /usr/bin/time -v "$1" inspect "$DIR/store" --session latest --json \
            >"$DIR/report-$2.json" 2>"$DIR/time-$2.txt") || true
    else
        /usr/bin/time -v "$1" inspect "$DIR/store" --session latest --json \
            >"$DIR/report-$2.json" 2>"$DIR/time-$2.txt"
    fi
    local wall kib cpu
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$DIR/time-$2.txt" \
        | awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
    kib=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$DIR/time-$2.txt")
    cpu=$(awk -F': ' '/(User|System) time \(seconds\)/ {s += $2} END {print s}' "$DIR/time-$2.txt")
    echo "$wall $kib $cpu"
}

if ! declare -F run_note >/dev/null; then
    run_note() { :; }
fi

# RUNS rounds of BIN (and BASELINE), each logged.
inspect_runs() {
    walls=(); rss=(); cpus=(); base_walls=(); base_rss=(); base_cpus=()
    local i wall kib cpu
    for i in $(seq 1 "$RUNS"); do
        read -r wall kib cpu < <(measure "$BIN" new)
        walls+=("$wall"); rss+=("$kib"); cpus+=("$cpu")
        log "run $i: ${wall} s, CPU ${cpu} s, max RSS $((kib / 1024)) MiB (load average $(cut -d' ' -f1 /proc/loadavg))$(run_note new)"
        if [[ -n "${BASELINE:-}" ]]; then
            read -r wall kib cpu < <(measure "$BASELINE" baseline)
            base_walls+=("$wall"); base_rss+=("$kib"); base_cpus+=("$cpu")
            log "run $i, baseline: ${wall} s, CPU ${cpu} s, max RSS $((kib / 1024)) MiB$(run_note baseline)"
        fi
    done
}
