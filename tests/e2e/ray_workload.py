"""Workload for tests/ray_e2e.rs: a small Ray job whose events go to the collector.

Started by the Rust test with the Ray event-export variables already in the
environment (RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR points at the
collector). With ray_common.py (next to this script) it:

1. starts a private local Ray instance (`ray.init(address="local", ...)`) whose
   temp dir is RHC_E2E_RAY_TEMP_DIR, with the dashboard (the aggregator agent
   that POSTs the events is part of the dashboard agent);
2. runs nested tasks, a task that prints to stderr and raises (caught), and a small
   actor; then, when RHC_E2E_TIMELINE is set, writes Ray's own Chrome trace of the live
   cluster there (`ray.timeline`, what `ray timeline` writes), after waiting for the
   workers' profile events to reach the GCS;
3. prints ONE JSON line on stdout: {"job_id", "session", "node_id", "failing_task_id", ...};
4. waits until the collector at RHC_COLLECTOR_URL has stopped receiving events
   (`rhc_events_accepted_total` > 0 and unchanged for RHC_E2E_QUIET_SECONDS),
   because Ray's dashboard agent exits on shutdown without flushing its buffer;
5. calls ray.shutdown().

Exit codes: 0 success; 1 any failure (message on stderr).
Everything it waits for is bounded.
"""

import os
import sys
import time

# ray_common.py is next to this script, whatever the current directory; no
# __pycache__ in the source tree.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import ray_common  # noqa: E402
from ray_common import log  # noqa: E402


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
        print("rhc-e2e: the failing task's own stderr", file=sys.stderr, flush=True)
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
    failing = fails.remote()
    try:
        ray.get(failing, timeout=60)
    except ray.exceptions.RayTaskError as e:
        failed = "rhc-e2e intentional failure" in str(e)
    if not failed:
        raise SystemExit("the failing task did not raise RayTaskError")

    counter = Counter.remote()
    assert ray.get([counter.add.remote(k) for k in (1, 2, 3)], timeout=60) == [1, 3, 6]
    ray.kill(counter)
    log(f"workload took {time.monotonic() - t0:.1f} s")

    timeline = os.environ.get("RHC_E2E_TIMELINE")
    if timeline:
        # Workers send their profile events to the GCS every second.
        time.sleep(3)
        ray.timeline(filename=timeline)
        log(f"ray timeline written to {timeline}")

    ray_common.report_and_wait(
        ray,
        {"failing_task_name": "fails", "failing_task_id": failing.task_id().hex()},
        log_progress=True,
    )


if __name__ == "__main__":
    ray_common.run(run_workload, num_cpus=2)
