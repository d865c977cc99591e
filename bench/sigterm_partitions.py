#!/usr/bin/env python3
"""SIGTERM with many open partitions on S3 (moto), and what the next start does with the rest.

Issue 35, item 6. For each run: moto_server on 127.0.0.1, the collector (`--storage
s3://...` pointed at it), N events posted in a burst into N jobs (one open partition each,
batches of 500: below the collector's 512 partitions per request), SIGTERM right after the
last answer. Measured: SIGTERM to exit, exit code, event objects in the bucket against N,
spool files left, and the shutdown's own "left on disk" line. Then the same spool is
started again: time to "collector ready", and, with a few new events (another session)
posted as soon as it is ready, when the leftovers are all in the bucket against when the
new events' objects appear there ("leftovers first": the last leftover before the first
new object). Every process is bounded in time and stopped; one JSON line per run on stdout.

    RHC_MOTO_SERVER=.../venv/bin/moto_server  .../venv/bin/python bench/sigterm_partitions.py \
        --bin target/release/ray-history-collector --partitions 5000 --runs 3

Needs boto3 (the test venv has it). Scratch under --workdir, deleted after each run.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from base64 import b64encode

import boto3
from botocore.config import Config

BUCKET = "bench"
SESSION_OLD = "session_2026-11-22_02-06-54_202993_22498"
SESSION_NEW = "session_2026-11-22_03-00-00_000000_22499"
NODE_B64 = "OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ=="
BATCH = 500
CLIENTS = 4
NEW_EVENTS = 100


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def event(eid, session, job):
    jb = b64encode(job.to_bytes(4, "big")).decode()
    return (
        '{"eventId":"%s","sourceType":"CORE_WORKER","eventType":"TASK_LIFECYCLE_EVENT",'
        '"timestamp":"2026-11-22T02:06:40.945470430Z","severity":"INFO","sessionName":"%s",'
        '"nodeId":"%s","taskLifecycleEvent":{"taskId":"%s","jobId":"%s","stateTransitions":'
        '[{"state":"RUNNING","timestamp":"2026-11-22T02:06:40.945470430Z"}]},"message":""}'
        % (eid, session, NODE_B64, eid, jb)
    )


def post(port, body, limit=60):
    end = time.monotonic() + limit
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=limit)
            c.request("POST", "/v1/events", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return
            err = "status %d" % r.status
        except OSError as e:
            err = str(e)
        if time.monotonic() > end:
            raise RuntimeError("a batch was not acknowledged within %d s: %s" % (limit, err))
        time.sleep(0.2)


def post_burst(port, session, first_job, n, tag):
    """n events into jobs first_job.., batches of BATCH, CLIENTS at once."""
    batches = [(b, min(BATCH, n - b)) for b in range(0, n, BATCH)]
    errors = []

    def client(c):
        try:
            for b, k in batches[c::CLIENTS]:
                body = "[%s]" % ",".join(
                    event("%s-%d" % (tag, b + i), session, first_job + b + i) for i in range(k)
                )
                post(port, body.encode())
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


class Run:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.spool = os.path.join(work, "spool")
        self.ray = os.path.join(work, "ray")
        os.makedirs(self.ray)
        self.moto_port = free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.moto_port
        self.moto = subprocess.Popen(
            [args.moto, "-H", "127.0.0.1", "-p", str(self.moto_port)],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "moto.log"), "w"),
        )
        if not wait_port(self.moto_port, 30):
            raise RuntimeError("moto did not listen within 30 s")
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 10}),
        )
        self.s3.create_bucket(Bucket=BUCKET)
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        self.port = free_port()
        self.log = os.path.join(self.work, "collector-%d.log" % self.starts)
        env = dict(os.environ)
        env.update(
            AWS_ENDPOINT=self.endpoint,
            AWS_ALLOW_HTTP="true",
            AWS_ACCESS_KEY_ID="test",
            AWS_SECRET_ACCESS_KEY="test",
            AWS_REGION="us-east-1",
            RUST_LOG=os.environ.get("RHC_BENCH_RUST_LOG", "info"),
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        cmd = [
            self.args.bin,
            "--listen", "127.0.0.1:%d" % self.port,
            "--spool-dir", self.spool,
            "--ray-tmp-dir", self.ray,
            "--storage", "s3://%s" % BUCKET,
            "--rotation-interval", "1h",
            "--max-spool-bytes", "8GiB",
            "--shutdown-timeout", self.args.shutdown_timeout,
        ]
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        end = t0 + self.args.kill_after
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("the collector exited at start: %s" % self.tail())
            if "collector ready" in self.text():
                try:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                    c.request("GET", "/healthz")
                    if c.getresponse().status == 200:
                        return time.monotonic() - t0
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("not ready within %d s" % self.args.kill_after)

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def tail(self, n=15):
        return "".join(self.text().splitlines(True)[-n:])

    def cpu_s(self, pid=None):
        """CPU seconds the running collector (or `pid`) has used so far (/proc)."""
        with open("/proc/%d/stat" % (pid or self.proc.pid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def term(self):
        """SIGTERM, wait at most --kill-after, then SIGKILL. (seconds, exit code or None,
        CPU seconds of the shutdown)."""
        before = self.cpu_s()
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        end = t0 + self.args.kill_after
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > end:
                self.proc.kill()
                pid, status, usage = os.wait4(self.proc.pid, 0)
                break
            time.sleep(0.02)
        took = time.monotonic() - t0
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        code = self.proc.returncode if os.WIFEXITED(status) else None
        return round(took, 2), code, round(usage.ru_utime + usage.ru_stime - before, 2)

    def keys(self, session):
        prefix_hits = []
        token = None
        while True:
            kw = dict(Bucket=BUCKET, MaxKeys=1000)
            if token:
                kw["ContinuationToken"] = token
            r = self.s3.list_objects_v2(**kw)
            prefix_hits += [o["Key"] for o in r.get("Contents", []) if "/%s/" % session in o["Key"]
                            and "/job_events/" in o["Key"]]
            if not r.get("IsTruncated"):
                return prefix_hits
            token = r["NextContinuationToken"]

    def moto_requests(self):
        """Requests moto logged so far, by method (its werkzeug access log)."""
        out = {}
        with open(os.path.join(self.work, "moto.log"), errors="replace") as f:
            for m in re.finditer(r'"(GET|PUT|POST|HEAD|DELETE) ', f.read()):
                out[m.group(1)] = out.get(m.group(1), 0) + 1
        return out

    def spool_files(self):
        n = 0
        for _, _, files in os.walk(os.path.join(self.spool, "events")):
            n += len(files)
        return n

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.moto.terminate()
        try:
            self.moto.wait(10)
        except subprocess.TimeoutExpired:
            self.moto.kill()
            self.moto.wait()


def left_line(text):
    """The shutdown's last line, as key=value pairs (text log format)."""
    for line in reversed(text.splitlines()):
        if "shutdown deadline reached" in line or "everything uploaded" in line or "left on disk" in line:
            pairs = dict(re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", line))
            pairs.pop("first", None)
            pairs["message"] = "deadline" if "deadline" in line else (
                "clean" if "everything uploaded" in line else "left")
            return pairs
    return {}


def moto_put_rate(args, n=2000, threads=32):
    """moto's own ceiling here: n PUTs of 1 KB from `threads` connections, no collector."""
    work = tempfile.mkdtemp(prefix="moto-rate-", dir=args.workdir)
    r = Run(args, work)
    try:
        body = b"x" * 1024
        auth = ("AWS4-HMAC-SHA256 Credential=test/20261122/us-east-1/s3/aws4_request, "
                "SignedHeaders=host, Signature=0")

        def worker(t):
            c = http.client.HTTPConnection("127.0.0.1", r.moto_port, timeout=60)
            for i in range(t, n, threads):
                c.request("PUT", "/%s/rate/%d" % (BUCKET, i), body, {"Authorization": auth})
                resp = c.getresponse()
                resp.read()
                if resp.status != 200:
                    raise RuntimeError("moto answered %d" % resp.status)
            c.close()

        t0 = time.monotonic()
        ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return round(n / (time.monotonic() - t0), 1)
    finally:
        r.close()
        shutil.rmtree(work, ignore_errors=True)


def one_run(args, n):
    work = tempfile.mkdtemp(prefix="sigterm-parts-", dir=args.workdir)
    r = Run(args, work)
    fig = {"partitions": n}
    try:
        fig["ready_s"] = round(r.start(), 2)
        fig["load"] = round(os.getloadavg()[0], 1)
        t0 = time.monotonic()
        post_burst(r.port, SESSION_OLD, 1, n, "old")
        fig["post_s"] = round(time.monotonic() - t0, 2)
        at_term = r.moto_requests()
        fig["shutdown_s"], fig["exit"], fig["shutdown_cpu_s"] = r.term()
        fig["shutdown_log"] = left_line(r.text())
        after = r.moto_requests()
        fig["shutdown_requests"] = {k: v - at_term.get(k, 0) for k, v in after.items() if v > at_term.get(k, 0)}
        fig["spool_files_left"] = r.spool_files()
        t = time.monotonic()
        fig["objects_after_shutdown"] = len(r.keys(SESSION_OLD))
        fig["list_s"] = round(time.monotonic() - t, 2)
        if fig["objects_after_shutdown"] < n or fig["spool_files_left"] > 0:
            # The next start: ready, then a few new events of another session at once.
            t_start = time.monotonic()
            fig["restart_ready_s"] = round(r.start(), 2)
            t_ready = time.monotonic()
            post_burst(r.port, SESSION_NEW, 1_000_000, NEW_EVENTS, "new")
            recovered = re.search(r"found files of an earlier run.*? files=(\d+)", r.text())
            fig["restart_found_files"] = int(recovered.group(1)) if recovered else None
            left_done = new_first = new_all = None
            cpu0, moto0 = r.cpu_s(), r.cpu_s(r.moto.pid)
            end = t_ready + args.restart_limit
            while time.monotonic() < end and (left_done is None or new_all is None):
                now = time.monotonic() - t_start
                if new_first is None or new_all is None:
                    k = len(r.keys(SESSION_NEW))
                    if k > 0 and new_first is None:
                        new_first = now
                    if k >= NEW_EVENTS:
                        new_all = now
                if left_done is None:
                    # Leftovers are in the old session's directories; new events in the new one.
                    old = 0
                    for d, _, files in os.walk(os.path.join(r.spool, "events")):
                        if SESSION_OLD in d:
                            old += len(files)
                    if old == 0:
                        left_done = now
                        fig["restart_leftovers_cpu_s"] = round(r.cpu_s() - cpu0, 2)
                        fig["restart_leftovers_moto_cpu_s"] = round(r.cpu_s(r.moto.pid) - moto0, 2)
                time.sleep(0.5)
            fig["restart_leftovers_uploaded_s"] = None if left_done is None else round(left_done, 2)
            fig["restart_new_first_s"] = None if new_first is None else round(new_first, 2)
            fig["restart_new_all_s"] = None if new_all is None else round(new_all, 2)
            fig["leftovers_first"] = (left_done is not None and
                                      (new_first is None or left_done <= new_first + 0.5))
            fig["restart_shutdown_s"], fig["restart_exit"], _ = r.term()
            keys = r.keys(SESSION_OLD)
            fig["objects_final"] = len(keys)
            fig["jobs_final"] = len({k.split("/job_events/")[1].split("/")[0] for k in keys})
        return fig
    except Exception as e:  # noqa: BLE001 (a run that failed is a figure too)
        fig["error"] = str(e)
        fig["log_tail"] = r.tail() if r.proc else ""
        return fig
    finally:
        r.close()
        if args.keep:
            print("kept " + work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="the collector binary (release)")
    p.add_argument("--moto", default=os.environ.get("RHC_MOTO_SERVER"), help="moto_server (RHC_MOTO_SERVER)")
    p.add_argument("--partitions", type=int, action="append", help="open partitions (repeatable; default 5000)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--shutdown-timeout", default="25s")
    p.add_argument("--kill-after", type=float, default=120, help="SIGKILL a shutdown (or a start) after this many s")
    p.add_argument("--restart-limit", type=float, default=300, help="stop watching the restart after this many s")
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep each run's directory (logs, spool)")
    p.add_argument("--moto-rate", action="store_true", help="first measure moto's own PUT rate")
    args = p.parse_args()
    if not args.moto:
        sys.exit("set RHC_MOTO_SERVER or --moto")
    if args.moto_rate:
        print(json.dumps({"moto_put_per_s": moto_put_rate(args), "load": os.getloadavg()[0]}), flush=True)
    for n in args.partitions or [5000]:
        figs = []
        for i in range(args.runs):
            f = one_run(args, n)
            f["run"] = i + 1
            print(json.dumps(f), flush=True)
            figs.append(f)
        ok = [f for f in figs if "error" not in f]
        if len(ok) > 1:
            med = {k: statistics.median(f[k] for f in ok if isinstance(f.get(k), (int, float)))
                   for k in ("post_s", "shutdown_s", "objects_after_shutdown", "spool_files_left",
                             "restart_ready_s", "restart_leftovers_uploaded_s", "restart_new_first_s")
                   if any(isinstance(f.get(k), (int, float)) for f in ok)}
            print(json.dumps({"partitions": n, "runs": len(ok), "median": med}), flush=True)


if __name__ == "__main__":
    main()
