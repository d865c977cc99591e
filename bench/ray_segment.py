#!/usr/bin/env python3
"""A segment of real Ray events, for measuring compression on what Ray really sends.

Starts the collector (ingest only: no rotation within the run, no logs), runs a real Ray
session pointed at it that submits 30 rounds of 1,000 tasks and one actor with 300 calls
(about 150,000 events, 140 MB), stops Ray, stops the collector with SIGKILL (so nothing is
sealed or uploaded) and copies the largest spooled segment, the job's events exactly as Ray
sent them, to OUT. Then:

    RHC_GZIP_INPUT=OUT cargo bench --bench gzip

prints the ratio of each `--gzip-level`, igzip's other levels and one zlib-rs level 3
stream on it.

    bench/ray_segment.py --collector target/release/ray-history-collector \
        --python .test-deps/venv/bin/python --out /tmp/ray-segment.jsonl

The Python must have Ray (scripts/install-test-deps.sh installs it into .test-deps/venv).
Loopback only; the collector and Ray are stopped however the run ends.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from log_growth import free_port, wait_http

WORKLOAD = r"""
import ray, time
ray.init(num_cpus=2, include_dashboard=True)

@ray.remote
def f(i):
    return i * 2

@ray.remote
class A:
    def g(self, x):
        return x + 1

for _ in range(30):
    ray.get([f.remote(i) for i in range(1000)])
    a = A.remote()
    ray.get([a.g.remote(i) for i in range(300)])
    ray.kill(a)
# The aggregator publishes in batches: give it time to send the last ones.
time.sleep(8)
ray.shutdown()
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collector", required=True)
    p.add_argument("--python", required=True, help="a Python with Ray")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()

    work = tempfile.mkdtemp(prefix="rhc-ray-segment-")
    port = free_port()
    collector = subprocess.Popen(
        [a.collector, "--spool-dir", f"{work}/spool", "--storage", f"{work}/bucket",
         "--listen", f"127.0.0.1:{port}", "--enable-log-collector", "false",
         "--enable-export-events", "false", "--rotation-interval", "1h",
         "--max-segment-bytes", "4GiB"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz")
        env = dict(os.environ)
        env.update({
            "RAY_enable_ray_event": "true",
            "RAY_enable_core_worker_ray_event_to_aggregator": "true",
            "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR": f"http://127.0.0.1:{port}/v1/events",
            "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES": "ALL",
            "RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES": "ALL",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": f"{work}/ray",
        })
        started = time.time()
        subprocess.run([a.python, "-c", WORKLOAD], env=env, check=True, timeout=a.timeout,
                       stdout=subprocess.DEVNULL)
        segments = []
        for root, _, files in os.walk(f"{work}/spool/events"):
            segments += [os.path.join(root, f) for f in files if f.endswith(".jsonl")]
        if not segments:
            sys.exit("ray_segment: the collector spooled no events; is Ray >= 2.54?")
        biggest = max(segments, key=os.path.getsize)
        # Copy before the collector can seal it (it only would at SIGTERM or in an hour).
        shutil.copyfile(biggest, a.out)
        with open(a.out, "rb") as fh:
            lines = sum(1 for _ in fh)
        print(f"ray_segment: {a.out}: {lines} events, {os.path.getsize(a.out)} bytes "
              f"(Ray ran {time.time() - started:.0f} s)")
    finally:
        collector.send_signal(signal.SIGKILL)
        collector.wait()
        subprocess.run(["pkill", "-f", f"{work}/ray"], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
