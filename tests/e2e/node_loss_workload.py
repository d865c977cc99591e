"""Workload for tests/ray_node_loss.rs: a Ray job that keeps finishing tasks while the
test SIGKILLs the collector and deletes its spool (the node is gone).

Started by the Rust test with the Ray event-export variables already in the environment
(RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR points at the collector). With
ray_common.py (next to this script) it:

1. starts a private local Ray instance;
2. prints ONE JSON line on stdout as soon as Ray is up: {"job_id", "session", "node_id",
   "ray_version"}, so the test knows the session while the job runs;
3. for RHC_E2E_RUN_SECONDS, submits small batches of tasks and waits for each batch;
   after each batch it rewrites RHC_E2E_TASKS (a JSON list of {"task_id" (hex), "done"
   (Unix seconds when ray.get returned, so at or after the task finished)});
4. calls ray.shutdown(). It does not wait for the collector: the test killed it.

Exit codes: 0 success; 1 any failure (message on stderr). Everything is bounded.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import ray_common  # noqa: E402
from ray_common import log  # noqa: E402

RUN_SECONDS = float(os.environ.get("RHC_E2E_RUN_SECONDS", "30"))
TASKS_FILE = os.environ["RHC_E2E_TASKS"]
BATCH = 8


def run_workload(ray):
    @ray.remote(max_retries=0)
    def step(i):
        time.sleep(0.05)
        return i

    ctx = ray.get_runtime_context()
    node = ray._private.worker.global_worker.node
    print(
        json.dumps(
            {
                "job_id": ctx.get_job_id(),
                "session": node.session_name,
                "node_id": ctx.get_node_id(),
                "ray_version": ray.__version__,
            }
        ),
        flush=True,
    )

    done = []
    deadline = time.monotonic() + RUN_SECONDS
    i = 0
    while time.monotonic() < deadline:
        refs = [step.remote(i + k) for k in range(BATCH)]
        ray.get(refs)
        now = time.time()
        done.extend({"task_id": r.task_id().hex(), "done": now} for r in refs)
        i += BATCH
        tmp = TASKS_FILE + ".tmp"
        with open(tmp, "w") as f:
            json.dump(done, f)
        os.replace(tmp, TASKS_FILE)
        time.sleep(0.2)
    log(f"{len(done)} tasks finished in {RUN_SECONDS:.0f} s")


if __name__ == "__main__":
    ray_common.run(run_workload, num_cpus=2)
