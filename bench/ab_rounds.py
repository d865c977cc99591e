#!/usr/bin/env python3
"""Interleaved rounds of several collector binaries under one load generator.

    bench/ab_rounds.py --mode rate25k --rounds 6 --loadgen target/release/rhc-loadgen OLD NEW...
    bench/ab_rounds.py --mode max --rounds 4 --loadgen ... OLD NEW...
    bench/ab_rounds.py --mode max --to-bucket --rounds 3 --loadgen ... OLD NEW...
    bench/ab_rounds.py --mode rate25k --loadgen ... BIN "BIN --gzip-level 3"

A binary may be given with collector flags of its own, as one argument ("BIN --flag value").

Each round runs every binary once, a fresh process and run directory each, the order
reversed every other round (so no binary always follows the same one). Modes:

- ``rate25k``: the collector with gzip and ``--rotation-interval 5s`` on ``file://`` (sealing,
  compression, uploads and deletes fall inside the window), loaded by ``rhc-loadgen --rate
  25000 --duration 30 --warmup 2``: CPU per event at a busy node's rate.
- ``max``: ingest only (``--max-segment-bytes 4GiB --rotation-interval 1h --max-spool-bytes
  64GiB``: nothing sealed in the window), ``rhc-loadgen --duration 6 --warmup 2`` unpaced.

Both with ``--enable-log-collector false --enable-export-events false``, 4 clients and
1,000-event batches (the load generator's defaults). CPU per event is the collector's CPU
over the window (``rhc-loadgen --pid``: user + system from /proc) divided by the events
acknowledged. ``--to-bucket`` adds the fair figure for binaries that compress at different
times (``max`` mode seals nothing inside the window, so the window's CPU leaves out the
compression of a collector that compresses at the seal, and charges one that compresses
while it publishes): the collector's whole CPU from its start until it has uploaded
everything and exited after SIGTERM (its rusage), over the event lines in the bucket
(``us_per_event_to_bucket``); a run whose collector does not exit 0 fails. In ``rate25k``
mode, after the collector has uploaded everything and exited
(SIGTERM), the event objects in the bucket are measured too: bytes stored per event, over
all the events they hold (the warm-up's included). Prints one line per run and, at the end, one JSON line per binary: medians,
ranges and the median of the same-round ratios to the first binary. Machines are noisy:
compare the ratios, not the absolute figures of different runs.

Loopback only; every run is bounded in time; every process started is stopped.
"""
import argparse
import gzip
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from log_growth import free_port


def stored_per_event(bucket):
    """Bytes of event objects in ``bucket`` per event line they hold."""
    size = lines = 0
    for root, _dirs, files in os.walk(bucket):
        for name in files:
            if "_events" not in root or not name.endswith((".jsonl", ".jsonl.gz")):
                continue
            path = os.path.join(root, name)
            size += os.path.getsize(path)
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    lines += block.count(b"\n")
    return size / lines if lines else float("nan")


def bucket_lines(bucket):
    """Event lines in the event objects of ``bucket``."""
    lines = 0
    for root, _dirs, files in os.walk(bucket):
        for name in files:
            if "_events" not in root or not name.endswith((".jsonl", ".jsonl.gz")):
                continue
            opener = gzip.open if name.endswith(".gz") else open
            with opener(os.path.join(root, name), "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    lines += block.count(b"\n")
    return lines


def stop_with_rusage(proc, timeout):
    """SIGTERM, then the exit status and CPU seconds (user + system) of ``proc``."""
    proc.terminate()
    end = time.time() + timeout
    while time.time() < end:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, ru.ru_utime + ru.ru_stime
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    return "timeout", float("nan")


def one_run(mode, loadgen, spec, scratch, to_bucket=False):
    d = tempfile.mkdtemp(dir=scratch)
    port = free_port()
    binary, *extra = shlex.split(spec)
    args = [binary, *extra, "--spool-dir", d + "/spool", "--storage", d + "/bucket",
            "--listen", f"127.0.0.1:{port}",
            "--enable-log-collector", "false", "--enable-export-events", "false"]
    if mode == "max":
        args += ["--max-segment-bytes", "4GiB", "--rotation-interval", "1h",
                 "--max-spool-bytes", "64GiB"]
    else:
        args += ["--rotation-interval", "5s"]
    collector = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        lg = [loadgen, "--url", f"http://127.0.0.1:{port}/v1/events",
              "--pid", str(collector.pid), "--json"]
        if mode == "max":
            lg += ["--duration", "6", "--warmup", "2"]
        else:
            lg += ["--rate", "25000", "--duration", "30", "--warmup", "2"]
        out = subprocess.run(lg, capture_output=True, text=True, timeout=120)
        lines = out.stdout.strip().splitlines()
        if out.returncode != 0 or not lines:
            raise SystemExit(f"rhc-loadgen failed against {binary}: {out.stderr.strip()}")
        result = json.loads(lines[-1])
    finally:
        rc, cpu_total = stop_with_rusage(collector, 60)
    try:
        if to_bucket:
            if rc != 0:
                raise SystemExit(f"{binary} exited {rc} at SIGTERM: not everything uploaded")
            n = bucket_lines(d + "/bucket")
            result["us_per_event_to_bucket"] = cpu_total / n * 1e6 if n else float("nan")
        if mode == "rate25k":
            result["stored_bytes_per_event"] = stored_per_event(d + "/bucket")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    result["us_per_event"] = result["cpu_cores"] / result["events_per_s"] * 1e6
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["rate25k", "max"], required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--loadgen", required=True, help="one rhc-loadgen for all binaries")
    ap.add_argument("--scratch", default=None,
                    help="where run directories go (default: a temporary directory)")
    ap.add_argument("--to-bucket", action="store_true",
                    help="also the whole CPU from start to the bucket holding every event")
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()
    scratch = a.scratch or tempfile.mkdtemp(prefix="rhc-ab-")
    os.makedirs(scratch, exist_ok=True)
    res = {b: [] for b in a.binaries}
    for r in range(a.rounds):
        order = a.binaries if r % 2 == 0 else list(reversed(a.binaries))
        for b in order:
            j = one_run(a.mode, a.loadgen, b, scratch, a.to_bucket)
            res[b].append(j)
            print(f"round {r} {b}: {j['events_per_s']:.0f} ev/s, {j['us_per_event']:.2f} us/ev, "
                  f"rss {j['rss_peak_mib']:.1f} MiB, p50 {j['p50_ms']} ms, p99 {j['p99_ms']} ms"
                  + (f", {j['us_per_event_to_bucket']:.2f} us/ev to the bucket"
                     if "us_per_event_to_bucket" in j else "")
                  + (f", {j['stored_bytes_per_event']:.1f} B/ev stored"
                     if "stored_bytes_per_event" in j else ""),
                  flush=True)
    base = res[a.binaries[0]]
    for b in a.binaries:
        xs = res[b]

        def med(k):
            return statistics.median(x[k] for x in xs)

        def ratio(k):
            return statistics.median(x[k] / y[k] for x, y in zip(xs, base))

        stored = ({"stored_bytes_per_event": med("stored_bytes_per_event")}
                  if "stored_bytes_per_event" in xs[0] else {})
        fair = ({"us_per_event_to_bucket": med("us_per_event_to_bucket"),
                 "same_round_ratio_us_to_bucket": ratio("us_per_event_to_bucket")}
                if "us_per_event_to_bucket" in xs[0] else {})
        print(json.dumps({
            "bin": b,
            **stored,
            **fair,
            "events_per_s": med("events_per_s"),
            "us_per_event": med("us_per_event"),
            "us_per_event_range": [min(x["us_per_event"] for x in xs),
                                   max(x["us_per_event"] for x in xs)],
            "rss_peak_mib": med("rss_peak_mib"),
            "p50_ms": med("p50_ms"),
            "p99_ms": med("p99_ms"),
            "same_round_ratio_events": ratio("events_per_s"),
            "same_round_ratio_us": ratio("us_per_event"),
            "events_per_s_range": [min(x["events_per_s"] for x in xs),
                                   max(x["events_per_s"] for x in xs)],
        }))
    if not a.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
