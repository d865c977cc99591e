"""Workload for tests/ray_train_e2e.rs: two Ray Train V2 runs and a failing task.

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
3. runs run A: a DataParallelTrainer with 2 workers and no framework, a ray.data
   dataset passed as `datasets=`, a `train_loop_config` with a learning rate
   (LR_A) and FailureConfig(max_failures=1); rank 0 raises on its first attempt
   only (a marker file remembers that it did), so the run has two attempts and
   finishes;
4. then run B in the same session: the same settings but the learning rate LR_B
   (it never fails);
5. waits until the export file holds both runs' terminal status (Ray Train
   writes it from its state actor, shortly after fit() returns);
6. records, while the cluster lives, the dashboard's answers to Ray Train's run
   endpoints (LIVE_PATHS: in Ray 2.60 `/api/train/v2/runs/v1` is the Train V2
   runs API, `/api/train/v2/runs` the Train V1 one) and to its job list
   (`/api/jobs/`, after the Train answers) as
   {"path", "status", "body"}: the body parsed when it is JSON, else its text;
7. prints ONE JSON line on stdout: {"job_id", "session", "node_id", "run_name",
   "lr_a", "lr_b", "live_answers", "internal_jobs" (the job table's jobs in Ray's
   `_ray_internal_` namespaces, which `/api/jobs/` leaves out), ...};
8. waits until the collector at RHC_COLLECTOR_URL has stopped receiving pushed
   events, because Ray's dashboard agent exits on shutdown without flushing;
9. calls ray.shutdown().

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
# Run A's and run B's learning rates: the one setting in which they differ.
LR_A = float(os.environ.get("RHC_E2E_LR_A", "0.01"))
LR_B = float(os.environ.get("RHC_E2E_LR_B", "0.001"))
# Text rank 0 raises on run A's first attempt.
FAIL_ONCE_TEXT = os.environ.get("RHC_E2E_FAIL_ONCE_TEXT", "rhc-train-e2e rank 0 fails once")
DASHBOARD_PORT = int(os.environ["RHC_E2E_DASHBOARD_PORT"])
# Ray Train's run endpoints and the job list on the dashboard, recorded while the cluster
# lives.
LIVE_PATHS = ("/api/train/v2/runs/v1", "/api/train/v2/runs", "/api/jobs/")
TERMINAL = ("FINISHED", "ERRORED", "ABORTED")


def terminal_runs(session_dir):
    """{run id: status} of the EXPORT_TRAIN_RUN lines for RUN_NAME in a terminal status."""
    path = os.path.join(session_dir, "logs", "export_events", "event_EXPORT_TRAIN_STATE.log")
    found = {}
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
                    and data.get("status") in TERMINAL
                ):
                    found[data.get("id")] = data["status"]
    except FileNotFoundError:
        pass
    return found


def wait_for_finished_runs(session_dir, count, limit_seconds=45.0):
    """Waits until the export file holds `count` runs named RUN_NAME in a terminal status;
    returns {run id: status} (fewer on timeout)."""
    deadline = time.monotonic() + limit_seconds
    while True:
        found = terminal_runs(session_dir)
        if len(found) >= count or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    if len(found) < count:
        log(f"{len(found)} of {count} terminal EXPORT_TRAIN_RUN for {RUN_NAME} after {limit_seconds} s")
    return found


def live_answer(path):
    """GET path from the dashboard: {"path", "status", "body"} (body parsed if JSON)."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://127.0.0.1:{DASHBOARD_PORT}{path}")
    # Ray 2.60 turns token authentication on and keeps the token in ~/.ray/auth_token
    # ($HOME is the test's work dir).
    try:
        with open(os.path.expanduser("~/.ray/auth_token"), encoding="utf-8") as f:
            request.add_header("Authorization", f"Bearer {f.read().strip()}")
    except FileNotFoundError:
        pass
    try:
        with opener.open(request, timeout=30) as resp:
            status, text = resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        return {"path": path, "status": None, "body": f"request failed: {e}"}
    try:
        body = json.loads(text)
    except ValueError:
        body = text
    return {"path": path, "status": status, "body": body}


def internal_jobs(ray):
    """{job id hex: {"namespace", "entrypoint"}} of the job table's jobs in Ray's internal
    namespaces (`_ray_internal_...`, such as the driver Ray's dashboard starts to answer Ray
    Train's endpoints), which Ray's `/api/jobs/` leaves out; no event says a job's
    namespace, so the test needs them from here. {"error": text} if the table cannot be read."""
    try:
        gcs = ray._private.worker.global_worker.gcs_client
        infos = gcs.get_all_job_info(
            skip_submission_job_info_field=True, skip_is_running_tasks_field=True
        )
        return {
            info.job_id.hex(): {
                "namespace": info.config.ray_namespace,
                "entrypoint": info.entrypoint,
            }
            for info in infos.values()
            if info.config.ray_namespace.startswith("_ray_internal_")
        }
    except Exception as e:  # the test reports it; the workload goes on
        return {"error": repr(e)}


def train_loop(config):
    import ray.train

    # Rank 0 of run A fails on its first attempt, before it reads anything: the marker file
    # (whose path is the same in both runs' settings) remembers that it did.
    marker = config["fail_once_marker"]
    if (
        config["lr"] == LR_A
        and ray.train.get_context().get_world_rank() == 0
        and not os.path.exists(marker)
    ):
        with open(marker, "w", encoding="utf-8") as f:
            f.write("failed once\n")
        raise RuntimeError(FAIL_ONCE_TEXT)
    # The dataset's shard is there; it is not read: starting Ray Data's executor costs 15 s
    # and more on a loaded machine, and the test is about what Ray records of the run.
    if ray.train.get_dataset_shard("train") is None:
        raise RuntimeError("no shard of the dataset 'train'")
    loss = 1.0
    for epoch in range(config["epochs"]):
        loss *= 1.0 - config["lr"]
        ray.train.report({"epoch": epoch, "loss": loss})


def fit(lr):
    """Runs the trainer with learning rate `lr`; what it took, as text."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    t0 = time.monotonic()
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={
            "lr": lr,
            "epochs": 2,
            "fail_once_marker": os.path.join(STORAGE_PATH, "rank0-failed-once"),
        },
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        datasets={"train": ray.data.range(64)},
        run_config=RunConfig(
            name=RUN_NAME,
            storage_path=STORAGE_PATH,
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(f"the training run with lr {lr} failed: {result.error!r}")
    return f"fit with lr {lr} took {time.monotonic() - t0:.1f} s"


def run_workload(ray):
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

    # One after the other: side by side (each fit() from its own task), both runs stalled
    # in Ray Data's execution here.
    log(fit(LR_A))
    log(fit(LR_B))

    node = ray._private.worker.global_worker.node
    statuses = wait_for_finished_runs(node.get_session_dir_path(), 2)
    if sorted(statuses.values()) != ["FINISHED", "FINISHED"]:
        raise SystemExit(f"the runs' exported statuses are {statuses}, not 2 FINISHED")
    t0 = time.monotonic()
    answers = [live_answer(p) for p in LIVE_PATHS]
    log(
        f"live answers {[(a['path'], a['status']) for a in answers]} "
        f"in {time.monotonic() - t0:.1f} s"
    )
    internal = internal_jobs(ray)
    log(f"jobs in Ray's internal namespaces: {internal}")
    ray_common.report_and_wait(
        ray,
        {
            "run_name": RUN_NAME,
            "lr_a": LR_A,
            "lr_b": LR_B,
            "live_answers": answers,
            "internal_jobs": internal,
        },
    )


if __name__ == "__main__":
    # 2 train workers, the controller, Ray Data's coordinator and the failing task.
    ray_common.run(run_workload, num_cpus=4)
