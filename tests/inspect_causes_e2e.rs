//! `inspect` explains why a job failed or hung, checked against real Ray 2.60: a two-raylet
//! cluster on this machine (`ray start --head`, then `ray start --address`), both sending
//! their events to one real collector, runs `tests/e2e/causes_workload.py`, whose job meets
//! every cause for real: a task killed by Ray's memory monitor, workers that kill themselves
//! (SIGKILL, `os._exit`), a task retried after its worker died, an actor whose worker exits,
//! the second raylet SIGKILLed while two tasks run on it, a placement group and a task that
//! can never be scheduled, and a task still running when the cluster is SIGKILLed.
//!
//! The workload records Ray's own answers while the cluster is alive (`ray.util.state`
//! `list_tasks` / `list_workers` / `list_nodes` / `list_placement_groups` with
//! `detail=True`); after the collector's SIGTERM, `inspect --json` reads the bucket alone and
//! its causes must agree with Ray's answers for every failed attempt, every dead worker and
//! every node; the hangs and what was left running must be reported as such.
//!
//! Needs `RHC_PYTHON` (Ray, from `./scripts/install-test-deps.sh`); without it the test prints
//! `skipping: ...` and passes, unless `RHC_REQUIRE_SERVICES=1`. The cluster is stopped by
//! SIGKILL to the processes carrying this test's marker variable, by pid (the workload does
//! it, then `RayWorkDir`'s drop guard for whatever is left): `ray stop --force` would kill
//! every Ray process of this user on the machine, other tests' included.
//!
//! `RHC_E2E_KEEP_BUCKET=<dir>` copies the bucket there (how `tests/data/causes-session` was
//! captured).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use rhc_testkit::ray::*;
use rhc_testkit::services::*;

mod causes_oracle;

const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);
const NAMESPACE: &str = "default";
const CLUSTER: &str = "causes";
const MARKER_VAR: &str = "RHC_E2E_CAUSES_MARKER";
const INSPECT_TIMEOUT: Duration = Duration::from_secs(60);

fn run_inspect(args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.arg("inspect").args(args).env_remove("STORAGE_ROOT_DIR");
    let out = run_with_timeout(&mut cmd, INSPECT_TIMEOUT);
    assert!(
        out.status.success(),
        "inspect {args:?} failed with {}:\n{}",
        out.status,
        out.stderr
    );
    out.stdout
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's dir");
    for entry in std::fs::read_dir(from).expect("list the bucket") {
        let entry = entry.expect("bucket entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a bucket file");
        }
    }
}

#[test]
fn inspect_explains_every_failure_of_a_real_two_node_cluster() {
    let Some(python) = ray_python() else {
        return;
    };
    let started = Instant::now();
    let work = RayWorkDir::new("inspect_causes_e2e", "rhc-cause-", MARKER_VAR);
    let store_dir = work.store();
    let dashboard_port = free_port().to_string();
    let dashboard = format!("http://127.0.0.1:{dashboard_port}");
    let mut collector = start_collector(
        &work,
        NAMESPACE,
        CLUSTER,
        &[
            "--log-upload-interval",
            "2s",
            "--dashboard-address",
            &dashboard,
            "--endpoint-poll-interval",
            "2s",
        ],
    );
    let ray_state = work.path().join("ray-state.json");
    let mut cmd = workload_command(
        &python,
        "causes_workload.py",
        &work,
        &collector,
        &dashboard_port,
    );
    cmd.env("RHC_E2E_RAY_STATE", &ray_state)
        .env("RHC_E2E_MARKER_VAR", MARKER_VAR);
    let run = run_workload(&mut cmd, SCRIPT_TIMEOUT, &work, &collector, 48 * 1024);
    let session = run.result.session.clone();
    let terminate_secs = run.terminate_collector(&mut collector);
    println!(
        "workload {:.1} s, collector SIGTERM -> exit {terminate_secs:.2} s",
        run.secs
    );
    if let Some(keep) = std::env::var_os("RHC_E2E_KEEP_BUCKET") {
        copy_dir(&store_dir, Path::new(&keep));
        std::fs::copy(&ray_state, Path::new(&keep).join("ray-state.json"))
            .expect("copy Ray's answers");
    }

    let ray: Value =
        serde_json::from_str(&std::fs::read_to_string(&ray_state).expect("Ray's answers"))
            .expect("Ray's answers are JSON");
    let store_arg = store_dir.to_str().expect("utf-8 temp path");
    let args = [
        store_arg,
        "--session",
        &session,
        "--pending-after",
        "1s",
        "--failed-limit",
        "1000",
    ];
    let json = run_inspect(&[&args[..], &["--json"]].concat());
    let report: Value = serde_json::from_str(&json).expect("inspect --json");
    let text = run_inspect(&args);
    println!("{text}");

    let mut failures = causes_oracle::compare(&ray, &report);
    // The log of a worker that killed itself, found by the worker's id.
    let exit_self = ray["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == "exit_self")
        .and_then(|t| t["worker_id"].as_str())
        .unwrap_or_default()
        .to_string();
    let log = run_inspect(&[
        store_arg,
        "--session",
        &session,
        "--logs",
        &exit_self,
        "--err",
    ]);
    if !log.contains("rhc-e2e: exit_self is about to os._exit(3)") {
        failures.push(format!(
            "--logs {exit_self} --err does not print what exit_self wrote:\n{log}"
        ));
    }
    println!("test {:.1} s", started.elapsed().as_secs_f64());
    // The disagreements are printed after the report too: CI keeps only the tail of a run.
    assert!(
        failures.is_empty(),
        "inspect disagrees with Ray:\n{}\n--- inspect ---\n{text}\n--- the disagreements again ---\n{}",
        failures.join("\n"),
        failures.join("\n")
    );
}
