"""Workload for tests/ray_train_e2e.rs: a Ray Train V2 run and a failing task.

Started by the Rust test with the Ray event-export variables already in the
environment (RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR points at the
collector), plus RAY_TRAIN_V2_ENABLED=1, RAY_TRAIN_ENABLE_STATE_TRACKING=1 and
RAY_enable_export_api_write=1 so that Ray Train writes its run and attempt
state to <session>/logs/export_events/event_EXPORT_TRAIN_STATE.log. With
ray_common.py (next to this script) it:

1. starts a private local Ray instance (`ray.init(address="local", ...)`) whose
   temp dir is RHC_E2E_RAY_TEMP_DIR, with the dashboard (its agent hosts the
   event aggregator that POSTs to the collector);
2. runs a task that raises (caught);
3. runs a DataParallelTrainer with 2 workers and no framework whose loop calls
   ray.train.report a few times;
4. waits until the export file holds the run's FINISHED status (Ray Train
   writes it from its state actor, shortly after fit() returns);
5. prints ONE JSON line on stdout: {"job_id", "session", "node_id", "run_name", ...};
6. waits until the collector at RHC_COLLECTOR_URL has stopped receiving pushed
   events, because Ray's dashboard agent exits on shutdown without flushing;
7. calls ray.shutdown().

Exit codes: 0 success; 1 any failure (message on stderr).
Everything it waits for is bounded.
"""

import json
import os
import sys
import time

# ray_common.py is next to this script, whatever the current directory; no
# __pycache__ in the source tree.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import ray_common  # noqa: E402
from ray_common import log  # noqa: E402

STORAGE_PATH = os.environ["RHC_E2E_TRAIN_STORAGE"]
RUN_NAME = os.environ.get("RHC_E2E_RUN_NAME", "rhc-train-run")
FAILURE_TEXT = os.environ.get("RHC_E2E_FAILURE_TEXT", "rhc-train-e2e intentional failure")


def wait_for_finished_run(session_dir, limit_seconds=45.0):
    """Waits until event_EXPORT_TRAIN_STATE.log holds an EXPORT_TRAIN_RUN line for
    RUN_NAME in a terminal status; returns that status, or None on timeout."""
    path = os.path.join(session_dir, "logs", "export_events", "event_EXPORT_TRAIN_STATE.log")
    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue  # a line being written
                    data = event.get("event_data", {})
                    if (
                        event.get("source_type") == "EXPORT_TRAIN_RUN"
                        and data.get("name") == RUN_NAME
                        and data.get("status") in ("FINISHED", "ERRORED", "ABORTED")
                    ):
                        return data["status"]
        except FileNotFoundError:
            pass
        time.sleep(0.25)
    log(f"no terminal EXPORT_TRAIN_RUN for {RUN_NAME} in {path} after {limit_seconds} s")
    return None


def train_loop(config):
    import ray.train

    loss = 1.0
    for epoch in range(config["epochs"]):
        loss *= 0.5
        ray.train.report({"epoch": epoch, "loss": loss})


def run_workload(ray):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    @ray.remote(max_retries=0)
    def fails():
        raise RuntimeError(FAILURE_TEXT)

    failed = False
    try:
        ray.get(fails.remote(), timeout=60)
    except ray.exceptions.RayTaskError as e:
        failed = FAILURE_TEXT in str(e)
    if not failed:
        raise SystemExit("the failing task did not raise RayTaskError")

    t0 = time.monotonic()
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=RUN_NAME, storage_path=STORAGE_PATH),
    )
    result = trainer.fit()
    log(f"fit took {time.monotonic() - t0:.1f} s; metrics {result.metrics}")
    if result.error is not None:
        raise SystemExit(f"the training run failed: {result.error!r}")

    node = ray._private.worker.global_worker.node
    status = wait_for_finished_run(node.get_session_dir_path())
    if status != "FINISHED":
        raise SystemExit(f"the run's exported status is {status}, not FINISHED")
    ray_common.report_and_wait(ray, {"run_name": RUN_NAME})


if __name__ == "__main__":
    # 2 train workers, the controller and the failing task.
    ray_common.run(run_workload, num_cpus=4)
