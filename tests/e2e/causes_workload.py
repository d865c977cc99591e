"""Workload for tests/inspect_causes_e2e.rs: a two-raylet Ray cluster on this machine whose
job fails and hangs in every way `inspect` must explain, with Ray's own answers recorded.

Started by the Rust test with the Ray event-export variables already in the environment
(RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR points at the collector), it:

1. starts a head (`ray start --head`) and a second raylet (`ray start --address`), both on
   127.0.0.1 with their own ports, Ray's temp dir RHC_E2E_RAY_TEMP_DIR, the dashboard on
   RHC_E2E_DASHBOARD_PORT, a fast health check (a dead raylet is noticed in about 2 s) and a
   memory monitor whose threshold is today's use of this machine plus MEMORY_MARGIN: the
   only task that allocates (bounded by HOG_LIMIT) crosses it and is killed, and nothing else
   comes near it;
2. as a driver, makes each cause happen for real, one after the other:
   - `hog`: killed by the memory monitor (twice: one OOM retry);
   - `sigkill_self`, `exit_self`: a worker that kills itself (SIGKILL, `os._exit(3)`);
   - `flaky`: its first attempt's worker exits, the retry succeeds;
   - `Doomed.crash`: an actor whose worker exits;
   - `on_node2` x2: running on the second raylet when it is SIGKILLed;
   - a placement group of 64 CPUs (never scheduled) and a task asking for a GPU (never
     scheduled): what "hangs" looks like;
   - `forever`: still running when the cluster stops;
3. writes Ray's own answers (ray.util.state list_tasks / list_workers / list_nodes /
   list_placement_groups / list_actors with detail=True, address=DASHBOARD) to RHC_E2E_RAY_STATE;
4. prints ONE JSON line on stdout: {"job_id", "session", "node_id", "node2_id", ...};
5. waits until the collector has stopped receiving events, then stops the cluster the hard
   way: SIGKILL to every process carrying this test's marker variable (the head, its
   workers and agents), by pid, except itself; the job is left running.

Not `ray stop --force`: it kills every Ray process of this user on the machine, including
other tests' clusters.

Exit codes: 0 success; 1 any failure (message on stderr). Everything it waits for is bounded.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import ray_common  # noqa: E402
from ray_common import log  # noqa: E402

GiB = 1 << 30
# Headroom above the machine's memory use when the cluster starts: the memory monitor's
# threshold. Large enough that other programs on a shared machine do not cross it during
# the test's minute, small enough that the hog crosses it well within HOG_LIMIT.
MEMORY_MARGIN = int(float(os.environ.get("RHC_E2E_MEMORY_MARGIN_GIB", "2.5")) * GiB)
# The most the hog allocates: the margin plus room for other programs freeing memory.
HOG_LIMIT = MEMORY_MARGIN + 2 * GiB
HOG_STEP = 128 << 20
RAY_STATE = os.environ["RHC_E2E_RAY_STATE"]
# Ray's state API, named: left to find "the" cluster, it refuses when another test's Ray
# runs on the machine.
DASHBOARD = f"http://127.0.0.1:{os.environ['RHC_E2E_DASHBOARD_PORT']}"
MARKER_VAR = os.environ.get("RHC_E2E_MARKER_VAR", "RHC_E2E_MARKER")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def meminfo():
    values = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, rest = line.split(":", 1)
            values[name] = int(rest.split()[0]) * 1024
    return values["MemTotal"], values["MemTotal"] - values["MemAvailable"]


def ray_cli():
    return os.path.join(os.path.dirname(sys.executable), "ray")


# `ray start --address` for a second node on this machine, everything on 127.0.0.1. Ray's
# CLI refuses a second node unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1, and that variable
# also makes it trade 127.0.0.1 for the host's external address, where nothing listens: so
# the check is switched off and 127.0.0.1 kept, in the CLI process only.
SECOND_NODE_CLI = """
import sys
import ray._private.services as services
import ray._private.ray_constants as constants
services.resolve_ip_for_localhost = lambda host: host
constants.ENABLE_RAY_CLUSTER = True
from ray.scripts.scripts import main
sys.argv = ["ray"] + sys.argv[1:]
main()
"""


def start_node(args, env, what, head):
    t0 = time.monotonic()
    if head:
        cmd = [ray_cli(), "start", *args]
    else:
        cmd = [sys.executable, "-c", SECOND_NODE_CLI, "start", *args]
    # Output to a file, not a pipe: the daemons `ray start` leaves behind inherit its
    # descriptors, and a pipe would then never reach its end.
    path = os.path.join(ray_common.RAY_TEMP_DIR, f"ray-start-{what.replace(' ', '-')}.out")
    with open(path, "w") as out:
        code = subprocess.run(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=120
        ).returncode
    if code != 0:
        with open(path) as f:
            raise SystemExit(f"{what}: {' '.join(cmd)} exited {code}\n{f.read()}")
    log(f"{what} started in {time.monotonic() - t0:.1f} s")


def node_ports():
    """The ports of one raylet and its agents, each free now."""
    return {
        "node-manager-port": free_port(),
        "object-manager-port": free_port(),
        "metrics-export-port": free_port(),
        "dashboard-agent-listen-port": free_port(),
        "dashboard-agent-grpc-port": free_port(),
        "runtime-env-agent-port": free_port(),
    }


def port_args(ports):
    # Workers take any free port (0): a fixed range could collide with other tests.
    return [f"--{name}={port}" for name, port in ports.items()] + [
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]


def marked_pids():
    """Pids of processes (not this one) carrying this test's marker."""
    entry = f"{MARKER_VAR}={os.environ[MARKER_VAR]}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:
            pass
    return pids


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def wait_until(what, predicate, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out after {limit} s waiting for {what}")


def run_workload(ray, node2_manager_port):
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: F401
    from ray.util import state

    started_dir = os.path.join(ray_common.RAY_TEMP_DIR, "started")
    os.makedirs(started_dir, exist_ok=True)
    expect = {}

    # 1. The memory monitor. max_retries counts failures other than OOM; OOM retries are
    # bounded by RAY_task_oom_retries (1).
    @ray.remote(max_retries=0)
    def hog(limit, step):
        held = []
        total = 0
        while total < limit:
            held.append(b"\x01" * step)  # written: the pages are really used
            total += step
            time.sleep(0.05)
        time.sleep(5)
        return total

    ref = hog.remote(HOG_LIMIT, HOG_STEP)
    try:
        got = ray.get(ref, timeout=120)
        raise SystemExit(f"hog allocated {got} bytes and was not killed by the memory monitor")
    except ray.exceptions.OutOfMemoryError:
        expect["hog"] = "OUT_OF_MEMORY"
    log("hog: killed by the memory monitor")

    # 2. Workers that kill themselves.
    @ray.remote(max_retries=0)
    def sigkill_self():
        os.kill(os.getpid(), signal.SIGKILL)

    @ray.remote(max_retries=0)
    def exit_self():
        print("rhc-e2e: exit_self is about to os._exit(3)", file=sys.stderr, flush=True)
        os._exit(3)

    for f, name in ((sigkill_self, "sigkill_self"), (exit_self, "exit_self")):
        try:
            ray.get(f.remote(), timeout=60)
            raise SystemExit(f"{name} returned")
        except ray.exceptions.WorkerCrashedError:
            expect[name] = "WORKER_DIED"

    # 3. Retried after its worker died: the first attempt exits, the second succeeds.
    @ray.remote(max_retries=2)
    def flaky(marker):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return "second time lucky"

    assert ray.get(flaky.remote(os.path.join(started_dir, "flaky")), timeout=60) == "second time lucky"

    # 4. An actor whose worker exits.
    @ray.remote(max_restarts=0)
    class Doomed:
        def crash(self):
            os._exit(7)

    doomed = Doomed.remote()
    try:
        ray.get(doomed.crash.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        pass

    # 5. The second raylet SIGKILLed while two tasks run on it.
    @ray.remote(max_retries=0, resources={"node2": 1})
    def on_node2(marker):
        open(marker, "w").close()
        time.sleep(120)

    refs = [on_node2.remote(os.path.join(started_dir, f"node2-{i}")) for i in range(2)]
    wait_until(
        "both tasks running on node 2",
        lambda: all(os.path.exists(os.path.join(started_dir, f"node2-{i}")) for i in range(2)),
        60,
    )
    raylet = [
        p for p in marked_pids()
        if "raylet" in cmdline(p).split(" ")[0] and f"--node_manager_port={node2_manager_port}" in cmdline(p)
    ]
    if len(raylet) != 1:
        raise SystemExit(f"node 2's raylet not found: {raylet}")
    os.kill(raylet[0], signal.SIGKILL)
    log(f"node 2's raylet (pid {raylet[0]}) SIGKILLed")
    for r in refs:
        try:
            ray.get(r, timeout=60)
            raise SystemExit("a task of node 2 returned")
        except (ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError) as e:
            log(f"node 2's task: {type(e).__name__}")
    wait_until(
        "node 2 dead in the GCS",
        lambda: any(n.state == "DEAD" for n in state.list_nodes(detail=True, address=DASHBOARD)),
        60,
    )

    # 6. What hangs: a placement group and a task no node can hold.
    pg = placement_group([{"CPU": 64}, {"CPU": 1}], strategy="STRICT_PACK", name="rhc-e2e-never")

    @ray.remote(num_gpus=1)
    def needs_gpu():
        return 1

    pending = needs_gpu.remote()  # noqa: F841 (kept alive until the end)

    # 7. Still running when the cluster stops.
    @ray.remote
    def forever(marker):
        open(marker, "w").close()
        time.sleep(600)

    running = forever.remote(os.path.join(started_dir, "forever"))  # noqa: F841
    wait_until("forever running", lambda: os.path.exists(os.path.join(started_dir, "forever")), 60)
    # Tasks report their states every second; give the GCS time to have them.
    time.sleep(3)

    # Ray's own answers, while it is alive.
    def dump(items):
        out = []
        for item in items:
            d = item if isinstance(item, dict) else item.__dict__
            out.append(json.loads(json.dumps(d, default=str)))
        return out

    answers = {
        "tasks": dump(state.list_tasks(detail=True, address=DASHBOARD, limit=10000, raise_on_missing_output=False)),
        "workers": dump(state.list_workers(detail=True, address=DASHBOARD, limit=10000, raise_on_missing_output=False)),
        "nodes": dump(state.list_nodes(detail=True, address=DASHBOARD, limit=10000, raise_on_missing_output=False)),
        "placement_groups": dump(state.list_placement_groups(detail=True, address=DASHBOARD, limit=10000, raise_on_missing_output=False)),
        "actors": dump(state.list_actors(detail=True, address=DASHBOARD, limit=10000, raise_on_missing_output=False)),
        "expect": expect,
        "pg_id": pg.id.hex(),
    }
    with open(RAY_STATE, "w") as f:
        json.dump(answers, f, indent=1)
    log(f"Ray's answers: {len(answers['tasks'])} tasks, {len(answers['workers'])} workers, "
        f"{len(answers['nodes'])} nodes, {len(answers['placement_groups'])} placement groups")
    node2 = [n for n in answers["nodes"] if not n.get("is_head_node")]
    ctx = ray.get_runtime_context()
    print(
        json.dumps(
            {
                "job_id": ctx.get_job_id(),
                "session": ray._private.worker.global_worker.node.session_name,
                "node_id": ctx.get_node_id(),
                "node2_id": node2[0]["node_id"] if node2 else None,
                "ray_version": ray.__version__,
            }
        ),
        flush=True,
    )
    wait_for_trickle()


def wait_for_trickle():
    """Waits until the collector has the events of all that happened. Unlike the other
    workloads' wait for quiet, a trickle is enough: the pending task and placement group
    keep a few events a second coming while the cluster lives."""
    start = time.monotonic()
    history = []
    while time.monotonic() - start < 60:
        value = ray_common.accepted_events() or 0
        now = time.monotonic()
        history.append((now, value))
        old = [v for t, v in history if now - t >= 4]
        if value > 0 and now - start >= 8 and old and value - old[-1] <= 12:
            log(f"collector at a trickle: {value} events after {now - start:.1f} s")
            return
        time.sleep(0.25)
    raise SystemExit("the collector did not receive the job's events in time")


def main():
    import ray

    temp_dir = ray_common.RAY_TEMP_DIR
    total, used = meminfo()
    threshold = min(0.95, (used + MEMORY_MARGIN) / total)
    log(f"memory: {used / GiB:.1f} of {total / GiB:.1f} GiB used; monitor threshold {threshold:.3f}")
    env = dict(os.environ)
    env.update(
        {
            "RAY_memory_usage_threshold": f"{threshold:.4f}",
            "RAY_memory_monitor_refresh_ms": "100",
            "RAY_task_oom_retries": "1",
            # A dead raylet is declared dead after about 3 missed checks of 0.5 s.
            "RAY_health_check_period_ms": "500",
            "RAY_health_check_timeout_ms": "500",
            "RAY_health_check_failure_threshold": "3",
            "RAY_health_check_initial_delay_ms": "0",
        }
    )
    gcs_port = free_port()
    head = node_ports()
    start_node(
        [
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs_port}",
            f"--temp-dir={temp_dir}",
            "--num-cpus=2",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={os.environ['RHC_E2E_DASHBOARD_PORT']}",
            f"--ray-client-server-port={free_port()}",
            "--disable-usage-stats",
            *port_args(head),
        ],
        env,
        "head",
        head=True,
    )
    node2 = node_ports()
    start_node(
        [
            f"--address=127.0.0.1:{gcs_port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            '--resources={"node2": 4}',
            *port_args(node2),
        ],
        env,
        "node 2",
        head=False,
    )
    try:
        ray.init(address=f"127.0.0.1:{gcs_port}", log_to_driver=False)
        run_workload(ray, node2["node-manager-port"])
    finally:
        # The cluster stops the hard way: no shutdown, no flush; the job stays unfinished.
        for pid in marked_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        log("cluster SIGKILLed")
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:
        import traceback

        traceback.print_exc()
        log(f"failed: {e!r}")
        sys.exit(1)
