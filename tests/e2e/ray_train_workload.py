"""Workload for tests/ray_train_e2e.rs: a Ray Train V2 run and a failing task.

Started by the Rust test with the Ray event-export variables already in the
environment (RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR points at the
collector), plus RAY_TRAIN_V2_ENABLED=1, RAY_TRAIN_ENABLE_STATE_TRACKING=1 and
RAY_enable_export_api_write=1 so that Ray Train writes its run and attempt
state to <session>/logs/export_events/event_EXPORT_TRAIN_STATE.log. It:

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
import urllib.request

COLLECTOR_URL = os.environ["RHC_COLLECTOR_URL"].rstrip("/")
RAY_TEMP_DIR = os.environ["RHC_E2E_RAY_TEMP_DIR"]
STORAGE_PATH = os.environ["RHC_E2E_TRAIN_STORAGE"]
RUN_NAME = os.environ.get("RHC_E2E_RUN_NAME", "rhc-train-run")
FAILURE_TEXT = os.environ.get("RHC_E2E_FAILURE_TEXT", "rhc-train-e2e intentional failure")
QUIET_SECONDS = float(os.environ.get("RHC_E2E_QUIET_SECONDS", "3"))
WAIT_LIMIT_SECONDS = float(os.environ.get("RHC_E2E_WAIT_LIMIT_SECONDS", "60"))
METRIC = "rhc_events_accepted_total"


def log(msg):
    print(f"ray_train_workload: {msg}", file=sys.stderr, flush=True)


def accepted_events():
    """Sum of rhc_events_accepted_total over its label sets, or None if unreachable."""
    try:
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
            last = value
            last_change = now
        elif value and now - last_change >= QUIET_SECONDS:
            log(f"collector quiet at {value} events after {now - start:.1f} s")
            return True
        time.sleep(0.25)
    log(f"collector still not quiet after {WAIT_LIMIT_SECONDS} s (last value {last})")
    return False


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


def main():
    import ray

    t0 = time.monotonic()
    ray.init(
        address="local",  # never attach to some other cluster (RAY_ADDRESS, /tmp/ray)
        num_cpus=4,  # 2 train workers, the controller and the failing task
        include_dashboard=True,
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

    ctx = ray.get_runtime_context()
    node = ray._private.worker.global_worker.node
    status = wait_for_finished_run(node.get_session_dir_path())
    if status != "FINISHED":
        raise SystemExit(f"the run's exported status is {status}, not FINISHED")
    print(
        json.dumps(
            {
                "job_id": ctx.get_job_id(),
                "session": node.session_name,
                "node_id": ctx.get_node_id(),
                "ray_version": ray.__version__,
                "run_name": RUN_NAME,
            }
        ),
        flush=True,
    )
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
