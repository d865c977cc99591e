"""What the Ray workloads of the end-to-end tests share (ray_workload.py for
tests/ray_e2e.rs, ray_train_workload.py for tests/ray_train_e2e.rs, history_workload.py for
tests/history_e2e.rs).

Started by the Rust tests (testkit/src/ray.rs) with the Ray event-export
variables already in the environment (RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR
points at the collector), a workload calls `run(run_workload, num_cpus)`, which:

1. starts a private local Ray instance (`ray.init(address="local", ...)`) whose
   temp dir is RHC_E2E_RAY_TEMP_DIR, with the dashboard on
   RHC_E2E_DASHBOARD_PORT (the aggregator agent that POSTs the events is part of
   the dashboard agent);
2. calls `run_workload(ray)`, which ends with `report_and_wait(ray, ...)`: it
   prints ONE JSON line on stdout ({"job_id", "session", "node_id",
   "ray_version", ...}), then waits until the collector at RHC_COLLECTOR_URL has
   stopped receiving events (`rhc_events_accepted_total` > 0 and unchanged for
   RHC_E2E_QUIET_SECONDS), because Ray's dashboard agent exits on shutdown
   without flushing its buffer;
3. calls ray.shutdown().

Exit codes: 0 success; 1 any failure (message on stderr).
Everything it waits for is bounded.

Nothing here may be used inside a Ray task or actor: the workers cannot import
this module (functions of the script itself travel to them by value).
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

# The workload's name in messages: its script's name (ray_workload, ...).
NAME = os.path.splitext(os.path.basename(sys.argv[0]))[0]


def log(msg):
    print(f"{NAME}: {msg}", file=sys.stderr, flush=True)


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


def wait_for_quiet_collector(log_progress):
    """Waits until the accepted-events counter is > 0 and has not moved for
    QUIET_SECONDS; gives up (returns False) after WAIT_LIMIT_SECONDS. With
    log_progress, logs every change of the counter."""
    start = time.monotonic()
    deadline = start + WAIT_LIMIT_SECONDS
    last = None
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        value = accepted_events()
        now = time.monotonic()
        if value != last:
            if log_progress:
                log(f"collector accepted {value} events ({now - start:.1f} s)")
            last = value
            last_change = now
        elif value and now - last_change >= QUIET_SECONDS:
            log(f"collector quiet at {value} events after {now - start:.1f} s")
            return True
        time.sleep(0.25)
    log(f"collector still not quiet after {WAIT_LIMIT_SECONDS} s (last value {last})")
    return False


def report_and_wait(ray, extra, log_progress=False):
    """Prints the result line (the job, session, node and Ray version, then the
    items of `extra`), then waits for the collector to go quiet."""
    ctx = ray.get_runtime_context()
    node = ray._private.worker.global_worker.node
    result = {
        "job_id": ctx.get_job_id(),
        "session": node.session_name,
        "node_id": ctx.get_node_id(),
        "ray_version": ray.__version__,
        **extra,
    }
    print(json.dumps(result), flush=True)
    if not wait_for_quiet_collector(log_progress):
        raise SystemExit("the collector did not receive the job's events in time")


def with_ray(run_workload, num_cpus, **init_args):
    """Starts the private Ray instance (with `init_args`, e.g. resources and labels), calls
    run_workload(ray), shuts Ray down."""
    import ray

    t0 = time.monotonic()
    ray.init(
        address="local",  # never attach to some other cluster (RAY_ADDRESS, /tmp/ray)
        num_cpus=num_cpus,
        **init_args,
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


def run(run_workload, num_cpus, **init_args):
    """The workload script's main: with_ray(...); any failure other than
    SystemExit is reported and exits 1."""
    try:
        with_ray(run_workload, num_cpus, **init_args)
    except SystemExit:
        raise
    except BaseException as e:  # report, then exit 1
        import traceback

        traceback.print_exc()
        log(f"failed: {e!r}")
        sys.exit(1)
