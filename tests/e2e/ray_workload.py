"""Workload for tests/ray_e2e.rs: a small Ray job whose events go to the collector.

Started by the Rust test with the Ray event-export variables already in the
environment (RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR points at the
collector). It:

1. starts a private local Ray instance (`ray.init(address="local", ...)`) whose
   temp dir is RHC_E2E_RAY_TEMP_DIR, with the dashboard (the aggregator agent
   that POSTs the events is part of the dashboard agent);
2. runs nested tasks, a task that raises (caught), and a small actor;
3. prints ONE JSON line on stdout: {"job_id", "session", "node_id", ...};
4. waits until the collector at RHC_COLLECTOR_URL has stopped receiving events
   (`rhc_events_accepted_total` > 0 and unchanged for RHC_E2E_QUIET_SECONDS),
   because Ray's dashboard agent exits on shutdown without flushing its buffer;
5. calls ray.shutdown().

Exit codes: 0 success; 1 any failure (message on stderr).
Everything it waits for is bounded.
"""

import json
import os
import sys
import time
import urllib.request

# Fail fast with a clear message rather than hang if something is misconfigured.
COLLECTOR_URL = os.environ["RHC_COLLECTOR_URL"].rstrip("/")
RAY_TEMP_DIR = os.environ["RHC_E2E_RAY_TEMP_DIR"]
QUIET_SECONDS = float(os.environ.get("RHC_E2E_QUIET_SECONDS", "3"))
WAIT_LIMIT_SECONDS = float(os.environ.get("RHC_E2E_WAIT_LIMIT_SECONDS", "60"))
METRIC = "rhc_events_accepted_total"


def log(msg):
    print(f"ray_workload: {msg}", file=sys.stderr, flush=True)


def accepted_events():
    """Sum of rhc_events_accepted_total over its label sets, or None if unreachable."""
    try:
        # No proxy: the collector is on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{COLLECTOR_URL}/metrics", timeout=5) as resp:
            text = resp.read().decode("utf-8", "replace")
    except OSError as e:
        log(f"GET /metrics failed: {e}")
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(METRIC) and line[len(METRIC):len(METRIC) + 1] in (" ", "{"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def wait_for_quiet_collector():
    """Waits until the accepted-events counter is > 0 and has not moved for
    QUIET_SECONDS; gives up (returns False) after WAIT_LIMIT_SECONDS."""
    start = time.monotonic()
    deadline = start + WAIT_LIMIT_SECONDS
    last = None
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        value = accepted_events()
        now = time.monotonic()
        if value != last:
            log(f"collector accepted {value} events ({now - start:.1f} s)")
            last = value
            last_change = now
        elif value and now - last_change >= QUIET_SECONDS:
            log(f"collector quiet at {value} events after {now - start:.1f} s")
            return True
        time.sleep(0.25)
    log(f"collector still not quiet after {WAIT_LIMIT_SECONDS} s (last value {last})")
    return False


def main():
    import ray

    t0 = time.monotonic()
    ray.init(
        address="local",  # never attach to some other cluster (RAY_ADDRESS, /tmp/ray)
        num_cpus=2,
        include_dashboard=True,  # the dashboard agent hosts the event aggregator
        dashboard_host="127.0.0.1",
        dashboard_port=int(os.environ["RHC_E2E_DASHBOARD_PORT"]),
        log_to_driver=False,  # keep stdout for our one JSON line
        _temp_dir=RAY_TEMP_DIR,
    )
    log(f"ray.init took {time.monotonic() - t0:.1f} s")
    try:
        run_workload(ray)
    finally:
        t1 = time.monotonic()
        ray.shutdown()
        log(f"ray.shutdown took {time.monotonic() - t1:.1f} s")


def run_workload(ray):
    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    def sum_of_squares(n):
        # Nested: a task that submits tasks and waits for them.
        return sum(ray.get([square.remote(i) for i in range(n)]))

    @ray.remote(max_retries=0)
    def fails():
        raise RuntimeError("rhc-e2e intentional failure")

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0

        def add(self, k):
            self.n += k
            return self.n

    t0 = time.monotonic()
    assert ray.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
    assert ray.get(sum_of_squares.remote(4)) == 14

    failed = False
    try:
        ray.get(fails.remote(), timeout=60)
    except ray.exceptions.RayTaskError as e:
        failed = "rhc-e2e intentional failure" in str(e)
    if not failed:
        raise SystemExit("the failing task did not raise RayTaskError")

    counter = Counter.remote()
    assert ray.get([counter.add.remote(k) for k in (1, 2, 3)], timeout=60) == [1, 3, 6]
    ray.kill(counter)
    log(f"workload took {time.monotonic() - t0:.1f} s")

    ctx = ray.get_runtime_context()
    node = ray._private.worker.global_worker.node
    result = {
        "job_id": ctx.get_job_id(),
        "session": node.session_name,
        "node_id": ctx.get_node_id(),
        "ray_version": ray.__version__,
        "failing_task_name": "fails",
    }
    print(json.dumps(result), flush=True)

    if not wait_for_quiet_collector():
        raise SystemExit("the collector did not receive the job's events in time")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # report, then exit 1
        import traceback

        traceback.print_exc()
        log(f"failed: {e!r}")
        sys.exit(1)
