#!/usr/bin/env python3
"""Live logs at linear cost, measured: one collector, one Ray session whose worker log grows
at a steady rate, and a small log that gets one line a second.

The collector (a real process, the release binary) ships the session's logs to file:// or to
S3 (moto) at --log-upload-interval. While it runs, the script writes the big log in 100 ms
steps, stamps the small log once a second, and reads the small log's object from the bucket
every half second to measure how stale it is (now minus the time the first line the bucket
does not have yet was written). At the end it reads the collector's log metrics and its CPU
time (the collector does nothing but logs here), sends SIGTERM, and checks that both objects
equal their files byte for byte.

Prints one JSON line: bytes written (the two files' final sizes), bytes uploaded (the
collector's counter plus what the final flush sends), their ratio, uploads by kind, the worst
and median staleness of the small log in intervals, CPU seconds, peak RSS.

    bench/log_growth.py --collector target/release/ray-history-collector \
        --storage file --rate 1000000 --duration 600 --interval 60
    bench/log_growth.py ... --storage s3 --moto .test-deps/venv/bin/moto_server [--no-appends]
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

NODE = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708"
SESSION = "session_2026-11-25_00-00-00_000000_1"
BIG = "worker-aa-01000000-1.out"
SMALL = "raylet.out"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(url, limit=30):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except Exception:
            time.sleep(0.1)
    raise SystemExit(f"no answer from {url}")


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collector", required=True)
    ap.add_argument("--storage", choices=["file", "s3"], required=True)
    ap.add_argument("--moto", help="moto_server program (for --storage s3)")
    ap.add_argument("--rate", type=int, default=1_000_000, help="bytes per second into the big log")
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--interval", type=int, default=60, help="--log-upload-interval, seconds")
    ap.add_argument("--no-appends", action="store_true", help="--log-appends false")
    ap.add_argument("--label", default="")
    ap.add_argument("--before-appends", action="store_true",
                    help="the collector predates --log-appends (for a same-run comparison)")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="rhc-loggrowth-")
    ray = os.path.join(work, "ray")
    logs = os.path.join(ray, SESSION, "logs")
    os.makedirs(logs)
    os.symlink(os.path.join(ray, SESSION), os.path.join(ray, "session_latest"))
    small_path = os.path.join(logs, SMALL)
    big_path = os.path.join(logs, BIG)
    with open(small_path, "w") as f:
        f.write(f"[0] (raylet) main.cc:711: Setting node ID node_id={NODE}\n")
    open(big_path, "w").close()

    moto = None
    env = {"PATH": os.environ.get("PATH", ""), "RUST_LOG": "warn"}
    prefix = "cluster-history/raycluster/default/growth"
    if args.storage == "file":
        bucket_dir = os.path.join(work, "bucket")
        storage = f"file://{bucket_dir}"

        def read_object(name):
            try:
                with open(os.path.join(bucket_dir, prefix, SESSION, NODE, "logs", name), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
    else:
        import boto3

        moto_port = free_port()
        moto = subprocess.Popen([args.moto, "-H", "127.0.0.1", "-p", str(moto_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = f"http://127.0.0.1:{moto_port}"
        wait_http(endpoint)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="testsecret")
        s3.create_bucket(Bucket="growth")
        storage = "s3://growth"
        env.update({"AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                    "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "testsecret"})

        def read_object(name):
            try:
                return s3.get_object(Bucket="growth",
                                     Key=f"{prefix}/{SESSION}/{NODE}/logs/{name}")["Body"].read()
            except s3.exceptions.NoSuchKey:
                return None

    port = free_port()
    cmd = [args.collector, "--storage", storage, "--cluster-name", "growth",
           "--spool-dir", os.path.join(work, "spool"), "--ray-tmp-dir", ray,
           "--listen", f"127.0.0.1:{port}", "--log-upload-interval", f"{args.interval}s",
           "--enable-export-events", "false"]
    if not args.before_appends:
        cmd += ["--log-appends", "false" if args.no_appends else "true"]
    collector = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(work, "collector.log"), "w"))
    wait_http(f"http://127.0.0.1:{port}/healthz")
    cpu0 = cpu_seconds(collector.pid)

    # The small log: line k written at stamps[k] (line 0 before the start).
    stamps = [time.time()]
    small_len = [os.path.getsize(small_path)]
    staleness = []
    chunk = bytearray()
    line_no = 0
    start = time.time()
    next_small = start + 1
    next_read = start + 0.5
    written = 0
    while True:
        now = time.time()
        elapsed = now - start
        if elapsed >= args.duration:
            break
        due = int(args.rate * min(elapsed + 0.1, args.duration)) - written
        if due > 0:
            while len(chunk) < due:
                chunk += f"{line_no:012} the worker says something about step {line_no}\n".encode()
                line_no += 1
            with open(big_path, "ab") as f:
                f.write(chunk[:due])
            del chunk[:due]
            written += due
        if now >= next_small:
            with open(small_path, "a") as f:
                f.write(f"[{len(stamps)}] heartbeat at {now:.3f}\n")
            stamps.append(now)
            small_len.append(os.path.getsize(small_path))
            next_small += 1
        if now >= next_read:
            got = read_object(SMALL)
            have = len(got) if got is not None else 0
            # The first line the bucket lacks: its age is the staleness.
            missing = next((k for k, n in enumerate(small_len) if n > have), None)
            staleness.append(0.0 if missing is None else now - stamps[missing])
            next_read += 0.5
        time.sleep(0.1)

    m = metrics(port)
    cpu = cpu_seconds(collector.pid) - cpu0
    rss = peak_rss_mib(collector.pid)
    # What the final flush will send (the metrics end with the process): the new bytes where
    # they are appended, else the whole file.
    min_append = 0 if args.storage == "file" else 5 << 20
    final_flush = 0
    for path, name in ((big_path, BIG), (small_path, SMALL)):
        obj = read_object(name)
        have = len(obj) if obj is not None else 0
        size = os.path.getsize(path)
        if size != have:
            appendable = (not args.no_appends and not args.before_appends
                          and have >= min_append and have > 0)
            final_flush += size - have if appendable else size
    collector.send_signal(signal.SIGTERM)
    code = collector.wait(timeout=120)
    big_ok = read_object(BIG) == open(big_path, "rb").read()
    small_ok = read_object(SMALL) == open(small_path, "rb").read()
    if moto:
        moto.terminate()
        moto.wait()

    def metric(name, label=None):
        return sum(v for k, v in m.items()
                   if (k == name or k.startswith(name + "{")) and (label is None or label in k))

    up = metric("rhc_log_bytes_uploaded_total") + final_flush
    wr = os.path.getsize(big_path) + os.path.getsize(small_path)
    out = {
        "label": args.label,
        "storage": args.storage,
        "appends": not args.no_appends,
        "rate_bytes_per_s": args.rate,
        "duration_s": args.duration,
        "interval_s": args.interval,
        "big_log_bytes": os.path.getsize(big_path),
        "bytes_written": wr,
        "bytes_uploaded": up,
        "of_which_final_flush": final_flush,
        "collector_counted_written": metric("rhc_log_bytes_written_total"),
        "bytes_read": metric("rhc_log_bytes_read_total"),
        "uploaded_per_written": up / wr if wr else None,
        "uploads_whole": metric("rhc_log_uploads_total", 'kind="whole"')
        or metric("rhc_log_files_uploaded_total"),
        "uploads_append": metric("rhc_log_uploads_total", 'kind="append"'),
        "small_log_staleness_max_intervals": max(staleness) / args.interval,
        "small_log_staleness_median_intervals": statistics.median(staleness) / args.interval,
        "cpu_seconds": round(cpu, 2),
        "cpu_share_of_a_core": round(cpu / args.duration, 4),
        "peak_rss_mib": round(rss, 1),
        "exit_code": code,
        "final_big_equal": big_ok,
        "final_small_equal": small_ok,
    }
    print(json.dumps(out))
    if code != 0 or not big_ok or not small_ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
