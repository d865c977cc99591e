"""Workload for tests/history_e2e.rs: a Ray job whose history must read back the way Ray
served it live.

Started by the Rust test with the Ray event-export variables in the environment (and, for
the snake_case run, RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME=1). With
ray_common.py it starts a private Ray with a custom resource and a node label, and runs:

- nested tasks (a task that submits tasks and waits for them);
- a task that needs the custom resource;
- a task that fails with a known message (max_retries=0);
- a named actor that is called, then killed;
- a placement group, a task scheduled into it, then the group removed.

Before shutting Ray down it records Ray's own answers through its state API (tasks with
their final states and errors, actors, the job, the node), once every task has reached a
final state there, and writes them as one JSON document to RHC_E2E_LIVE_FILE. Then it
prints the result line and waits for the collector to go quiet, like the other workloads.

Exit codes: 0 success; 1 any failure (message on stderr). Every wait is bounded.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import ray_common  # noqa: E402
from ray_common import log  # noqa: E402

FAILURE_MESSAGE = "rhc-history intentional failure"
STDOUT_LINE = "rhc-history: the failing task writes to stdout"
STDERR_LINE = "rhc-history: the failing task writes to stderr"
CUSTOM_RESOURCE = "rhc_accelerator"
NODE_LABEL = ("rhc.example/zone", "zone-a")
ACTOR_NAME = "rhc-history-counter"
LIVE_FILE = os.environ["RHC_E2E_LIVE_FILE"]
FINAL_STATES = {"FINISHED", "FAILED"}
# Every normal task the workload runs, by name: the state API must list them all.
TASK_NAMES = {"square", "sum_of_squares", "uses_accelerator", "fails", "in_group"}


def run_workload(ray):
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from ray.util import state

    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    def sum_of_squares(n):
        return sum(ray.get([square.remote(i) for i in range(n)]))

    @ray.remote(resources={CUSTOM_RESOURCE: 1})
    def uses_accelerator():
        return "ok"

    @ray.remote(max_retries=0)
    def fails():
        # Something in each of the task's streams, for the log-by-task-id comparison.
        print(STDOUT_LINE)
        print(STDERR_LINE, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        raise RuntimeError(FAILURE_MESSAGE)

    @ray.remote
    def in_group():
        return "placed"

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0

        def add(self, k):
            self.n += k
            return self.n

    t0 = time.monotonic()
    assert ray.get(sum_of_squares.remote(4), timeout=60) == 14
    assert ray.get(uses_accelerator.remote(), timeout=60) == "ok"
    try:
        ray.get(fails.remote(), timeout=60)
        raise SystemExit("the failing task did not raise")
    except ray.exceptions.RayTaskError as e:
        if FAILURE_MESSAGE not in str(e):
            raise SystemExit(f"unexpected error from the failing task: {e}")
    counter = Counter.options(name=ACTOR_NAME).remote()
    assert ray.get([counter.add.remote(k) for k in (1, 2, 3)], timeout=60) == [1, 3, 6]
    ray.kill(counter)
    pg = placement_group([{"CPU": 1}], strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    strategy = PlacementGroupSchedulingStrategy(placement_group=pg)
    assert ray.get(in_group.options(scheduling_strategy=strategy).remote(), timeout=60) == "placed"
    remove_placement_group(pg)
    log(f"workload took {time.monotonic() - t0:.1f} s")

    # Ray's own answers, once its state API has every normal task in a final state and the
    # killed actor dead (task and actor events reach the GCS with a delay).
    deadline = time.monotonic() + 60
    while True:
        tasks = state.list_tasks(detail=True, limit=10000, raise_on_missing_output=False)
        actors = state.list_actors(detail=True, limit=10000, raise_on_missing_output=False)
        normal = [t for t in tasks if t.type == "NORMAL_TASK"]
        settled = TASK_NAMES <= {t.name for t in normal} and all(
            t.state in FINAL_STATES for t in normal
        )
        dead = any(a.name == ACTOR_NAME and a.state == "DEAD" for a in actors)
        if settled and dead:
            break
        if time.monotonic() > deadline:
            raise SystemExit(
                f"the state API did not settle: {[(t.name, t.state) for t in normal]}"
            )
        time.sleep(0.5)
    jobs = state.list_jobs(detail=True, raise_on_missing_output=False)
    # The dashboard's /events (Ray's legacy event files, logs/events/event_*.log).
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    port = os.environ["RHC_E2E_DASHBOARD_PORT"]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/events")
    # Ray 2.60 starts its dashboard with a token, written to ~/.ray/auth_token.
    token_file = os.path.expanduser("~/.ray/auth_token")
    if os.path.exists(token_file):
        with open(token_file) as f:
            request.add_header("Authorization", f"Bearer {f.read().strip()}")
    with opener.open(request, timeout=30) as resp:
        dashboard_events = json.loads(resp.read())
    nodes = state.list_nodes(detail=True, raise_on_missing_output=False)
    # The failed task's own output, as the dashboard serves it by task id (the byte range of
    # the worker's files that Ray recorded for the task), whole (tail=-1).
    failed = [t for t in normal if t.name == "fails" and t.state == "FAILED"]
    task_logs = {}
    if failed:
        for suffix in ("out", "err"):
            task_logs[suffix] = "".join(
                state.get_log(task_id=failed[0].task_id, suffix=suffix, tail=-1)
            )
        for suffix, line in (("out", STDOUT_LINE), ("err", STDERR_LINE)):
            if line not in task_logs[suffix]:
                raise SystemExit(f"Ray's {suffix} log of the failed task lacks {line!r}: {task_logs[suffix]!r}")
    # Ray's own answers of the log routes, byte for byte with their content type, for
    # tests/serve_dashboard.rs: the head node's log list, and the failed task's output by task
    # id as the dashboard's log viewer asks for it (its query: lines=50000, colour codes
    # filtered) and whole, in both streams.
    def dashboard_get(path):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        if os.path.exists(token_file):
            with open(token_file) as f:
                req.add_header("Authorization", f"Bearer {f.read().strip()}")
        try:
            with opener.open(req, timeout=30) as resp:
                body = resp.read()
                status, ctype = resp.status, resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            body, status, ctype = e.read(), e.code, e.headers.get("Content-Type", "")
        return {"status": status, "content_type": ctype, "text": body.decode("utf-8", "replace")}

    log_answers = {}
    if nodes:
        head = nodes[0].node_id
        log_answers[f"/api/v0/logs?node_id={head}"] = dashboard_get(f"/api/v0/logs?node_id={head}")
    if failed:
        tid = failed[0].task_id
        for suffix in ("out", "err"):
            for query in (f"task_id={tid}&suffix={suffix}&lines=50000&filter_ansi_code=true",
                          f"task_id={tid}&suffix={suffix}&lines=-1",
                          f"task_id={tid}&suffix={suffix}&lines=1"):
                path = f"/api/v0/logs/file?{query}"
                log_answers[path] = dashboard_get(path)
    live = {
        "log_answers": log_answers,
        "tasks": [
            {
                "task_id": t.task_id,
                "attempt": t.attempt_number,
                "name": t.name,
                "type": t.type,
                "state": t.state,
                "job_id": t.job_id,
                "node_id": t.node_id,
                "worker_id": t.worker_id,
                "error_type": t.error_type,
                "error_message": t.error_message,
                "required_resources": t.required_resources,
            }
            for t in tasks
        ],
        "actors": [
            {
                "actor_id": a.actor_id,
                "class_name": a.class_name,
                "name": a.name,
                "state": a.state,
            }
            for a in actors
        ],
        "jobs": [
            {"job_id": j.job_id, "status": str(j.status), "type": str(j.type)} for j in jobs
        ],
        "dashboard_events": dashboard_events,
        "failed_task_logs": task_logs,
        "nodes": [
            {
                "node_id": n.node_id,
                "state": n.state,
                "node_ip": n.node_ip,
                "labels": n.labels,
                "resources_total": n.resources_total,
            }
            for n in nodes
        ],
    }
    with open(LIVE_FILE, "w") as f:
        json.dump(live, f, indent=1, sort_keys=True)
    log(f"recorded {len(tasks)} tasks, {len(actors)} actors, {len(jobs)} jobs, {len(nodes)} nodes")

    ray_common.report_and_wait(
        ray,
        {"failure_message": FAILURE_MESSAGE, "actor_name": ACTOR_NAME},
        log_progress=True,
    )


if __name__ == "__main__":
    ray_common.run(
        run_workload,
        num_cpus=2,
        resources={CUSTOM_RESOURCE: 2},
        labels=dict([NODE_LABEL]),
    )
