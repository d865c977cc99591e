//! The harness of the end-to-end tests with real Ray (`ray_e2e.rs`, `ray_train_e2e.rs`):
//! a short temp dir for everything Ray writes with a drop guard that kills Ray's leftover
//! processes, the collector and the Python workload (`tests/e2e/*.py`) set up to talk to
//! each other, and the workload's JSON result line.
//!
//! Everything Ray writes lives in one short temp dir (`/tmp/<prefix>XXXXXX`, short because
//! of the ~107-byte limit on unix socket paths), `$HOME` included (Ray 2.60 writes
//! `~/.ray/auth_token`). Ray's processes carry a marker variable; the drop guard kills, by
//! pid, any process still carrying it when the test ends, however it ends.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::collector::Collector;
use crate::repo_root;
use crate::services::{run_with_timeout, tool, CommandOutput};

/// How long Ray's processes may take to exit after `ray.shutdown()` returned.
pub const RAY_EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long the collector may take to exit after SIGTERM.
pub const TERMINATE_LIMIT: Duration = Duration::from_secs(30);

/// The Python with Ray (`RHC_PYTHON`), or `None` after printing why the test is skipped
/// (panics instead when `RHC_REQUIRE_SERVICES=1`, as [`tool`] does).
pub fn ray_python() -> Option<PathBuf> {
    let python = tool("RHC_PYTHON");
    if python.is_none() {
        eprintln!(
            "skipping: RHC_PYTHON is not set, so Ray is not available (run ./scripts/test.sh)"
        );
    }
    python
}

// ------------------------------------------------------------------------ Ray processes

/// The test's temp dir (`/tmp/<prefix>XXXXXX`), with `spool/`, `store/`, `ray/` (Ray's temp
/// dir) and `home/` in it. On drop, first kills (SIGKILL, by pid) every process that still
/// carries this test's marker variable (`<marker_var>=<this dir>`) in its environment: only
/// the workload gets it, and every Ray process inherits it (the collector, whose command line
/// also names this dir, does not). `ray.shutdown()` normally leaves none. Then the dir is
/// removed.
pub struct RayWorkDir {
    dir: Option<tempfile::TempDir>,
    /// The test's name, for messages.
    test: &'static str,
    /// Environment variable set on the workload; every Ray process inherits it.
    marker_var: &'static str,
}

impl RayWorkDir {
    /// Creates `/tmp/<prefix>XXXXXX` and its subdirs. `test` names the test in messages.
    pub fn new(test: &'static str, prefix: &str, marker_var: &'static str) -> RayWorkDir {
        // In /tmp, not $TMPDIR: Ray's unix socket paths under it must stay short.
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .unwrap_or_else(|e| panic!("create /tmp/{prefix}* temp dir: {e}"));
        let work = RayWorkDir {
            dir: Some(dir),
            test,
            marker_var,
        };
        for d in [work.spool(), work.store(), work.ray_tmp(), work.home()] {
            std::fs::create_dir_all(d).expect("create test dir");
        }
        work
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("temp dir").path()
    }

    /// The collector's spool dir.
    pub fn spool(&self) -> PathBuf {
        self.path().join("spool")
    }

    /// The `file://` bucket.
    pub fn store(&self) -> PathBuf {
        self.path().join("store")
    }

    /// Ray's temp dir (`ray.init(_temp_dir=...)`, the collector's `--ray-tmp-dir`).
    pub fn ray_tmp(&self) -> PathBuf {
        self.path().join("ray")
    }

    /// `$HOME` of the workload.
    pub fn home(&self) -> PathBuf {
        self.path().join("home")
    }

    /// The value of the marker variable for this test: the dir's path, unique while it
    /// exists.
    pub fn marker(&self) -> String {
        self.path().display().to_string()
    }

    /// Waits up to `limit` for the marked processes to exit; returns those still alive
    /// (pid and command line).
    pub fn wait_for_ray_exit(&self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        loop {
            let pids = self.marked_processes();
            if pids.is_empty() || Instant::now() >= deadline {
                return pids
                    .into_iter()
                    .map(|pid| format!("{pid} {}", command_line(pid)))
                    .collect();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Pids of live processes (other than this one) that carry the marker.
    fn marked_processes(&self) -> Vec<i32> {
        let own = std::process::id() as i32;
        let env_entry = format!("{}={}", self.marker_var, self.marker());
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if pid == own {
                continue;
            }
            let proc_dir = PathBuf::from("/proc").join(pid.to_string());
            // Unreadable (another user's process) or empty (a zombie): not ours to kill.
            let marked = std::fs::read(proc_dir.join("environ"))
                .map(|b| b.split(|&c| c == 0).any(|v| v == env_entry.as_bytes()))
                .unwrap_or(false);
            if marked {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for RayWorkDir {
    fn drop(&mut self) {
        let test = self.test;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut killed = BTreeSet::new();
        loop {
            let pids = self.marked_processes();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if killed.insert(pid) {
                    eprintln!(
                        "{test}: killing leftover Ray process {pid}: {}",
                        command_line(pid)
                    );
                }
                // SAFETY: sending a signal to a process this test started (it carries our
                // marker); kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if Instant::now() >= deadline {
                eprintln!("{test}: some Ray processes are still alive after 10 s");
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                eprintln!("{test}: cannot remove {}: {e}", path.display());
            }
        }
    }
}

/// A process's command line (shortened), for messages.
pub fn command_line(pid: i32) -> String {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    short_to(cmd.trim(), 160)
}

// ------------------------------------------------------------------------ collector and workload

/// Starts the collector as a Ray head's (role `head`, 2 s rotation, 20 s shutdown timeout)
/// with the bucket in [`RayWorkDir::store`], Ray's temp dir [`RayWorkDir::ray_tmp`], the given
/// cluster identity, and `extra` arguments.
pub fn start_collector(
    work: &RayWorkDir,
    namespace: &str,
    cluster: &str,
    extra: &[&str],
) -> Collector {
    let store = work.store();
    let storage = store.to_str().expect("utf-8 temp path");
    start_collector_with(work, namespace, cluster, storage, extra, &[])
}

/// [`start_collector`] with another `--storage` and environment (e.g. an S3 bucket).
pub fn start_collector_with(
    work: &RayWorkDir,
    namespace: &str,
    cluster: &str,
    storage: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Collector {
    let ray_tmp = work.ray_tmp();
    let mut args = vec![
        "--storage",
        storage,
        "--cluster-name",
        cluster,
        "--cluster-namespace",
        namespace,
        "--role",
        "head",
        "--rotation-interval",
        "2s",
        "--shutdown-timeout",
        "20s",
        "--ray-tmp-dir",
        ray_tmp.to_str().expect("utf-8 temp path"),
    ];
    args.extend_from_slice(extra);
    Collector::start(&work.spool(), &args, env)
}

/// `python tests/e2e/<script>`, run in the work dir, with the environment a workload
/// needs: Ray's events pushed to `collector`'s `/v1/events` (camelCase JSON, all event
/// types), a private Ray (never `RAY_ADDRESS`) on 127.0.0.1 with its temp dir, `$HOME` and
/// dashboard port from the test, the collector's URL for the script's wait for quiet, and
/// the marker variable. Callers add their own variables.
pub fn workload_command(
    python: &Path,
    script: &str,
    work: &RayWorkDir,
    collector: &Collector,
    dashboard_port: &str,
) -> Command {
    let script = repo_root().join("tests/e2e").join(script);
    let mut cmd = Command::new(python);
    cmd.arg(&script)
        .current_dir(work.path())
        // Never attach to another cluster; keep the event JSON camelCase (the default).
        .env_remove("RAY_ADDRESS")
        .env_remove("RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME")
        .env("RAY_enable_ray_event", "true")
        .env("RAY_enable_core_worker_ray_event_to_aggregator", "true")
        .env(
            "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR",
            collector.url("/v1/events"),
        )
        .env(
            "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES",
            "ALL",
        )
        .env(
            "RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES",
            "ALL",
        )
        .env("RAY_USAGE_STATS_ENABLED", "0")
        // Makes Ray use 127.0.0.1 as the node address instead of the host's external IP
        // (the variable only switches the node-IP lookup on Linux).
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("HOME", work.home())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("PYTHONUNBUFFERED", "1")
        .env("RHC_COLLECTOR_URL", collector.url(""))
        .env("RHC_E2E_RAY_TEMP_DIR", work.ray_tmp())
        .env("RHC_E2E_DASHBOARD_PORT", dashboard_port)
        .env("RHC_E2E_QUIET_SECONDS", "3")
        .env("RHC_E2E_WAIT_LIMIT_SECONDS", "60")
        .env(work.marker_var, work.marker());
    cmd
}

/// A finished workload that succeeded and printed its result line.
pub struct WorkloadRun {
    pub out: CommandOutput,
    /// How long the workload ran, in seconds.
    pub secs: f64,
    /// Ray processes still alive [`RAY_EXIT_GRACE`] after the workload exited (pid and
    /// command line); the drop guard kills them.
    pub lingering: Vec<String>,
    pub result: WorkloadResult,
    collector_log_tail: usize,
}

impl WorkloadRun {
    /// The workload's exit status, stdout and stderr's tail, and the collector log's tail,
    /// for failure messages.
    pub fn diagnostics(&self, collector: &Collector) -> String {
        diagnostics(&self.out, collector, self.collector_log_tail)
    }

    /// SIGTERM to the collector, which must exit 0 within [`TERMINATE_LIMIT`] (after sealing
    /// and uploading everything); returns how long it took, in seconds.
    pub fn terminate_collector(&self, collector: &mut Collector) -> f64 {
        let started = Instant::now();
        let status = collector.terminate(TERMINATE_LIMIT);
        let secs = started.elapsed().as_secs_f64();
        assert!(
            status.success(),
            "collector exited with {status} after SIGTERM\n{}",
            self.diagnostics(collector)
        );
        secs
    }

    /// [`WorkloadRun::lingering`] on one line, or `none`.
    pub fn lingering_summary(&self) -> String {
        if self.lingering.is_empty() {
            "none".to_string()
        } else {
            self.lingering.join("; ")
        }
    }
}

/// Runs the workload `cmd` (from [`workload_command`]) for at most `timeout`; it must
/// succeed. Then gives Ray's processes [`RAY_EXIT_GRACE`] to finish exiting, and reads the
/// result line. Failure messages end with the last `collector_log_tail` bytes of the
/// collector's log.
pub fn run_workload(
    cmd: &mut Command,
    timeout: Duration,
    work: &RayWorkDir,
    collector: &Collector,
    collector_log_tail: usize,
) -> WorkloadRun {
    let started = Instant::now();
    let out = run_with_timeout(cmd, timeout);
    let secs = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "the Ray workload failed\n{}",
        diagnostics(&out, collector, collector_log_tail)
    );
    // ray.shutdown() has returned; give its processes a moment to finish exiting.
    let lingering = work.wait_for_ray_exit(RAY_EXIT_GRACE);
    let result = workload_result(&out.stdout).unwrap_or_else(|| {
        panic!(
            "no JSON result line from the workload\n{}",
            diagnostics(&out, collector, collector_log_tail)
        )
    });
    WorkloadRun {
        out,
        secs,
        lingering,
        result,
        collector_log_tail,
    }
}

fn diagnostics(out: &CommandOutput, collector: &Collector, collector_log_tail: usize) -> String {
    format!(
        "--- workload exit: {}\n--- workload stdout ---\n{}\n\
         --- workload stderr (tail) ---\n{}\n--- collector log (tail) ---\n{}",
        out.status,
        out.stdout,
        tail(&out.stderr, 24 * 1024),
        tail(&collector.log_text(), collector_log_tail)
    )
}

// ------------------------------------------------------------------------ workload output

/// What the workload's result line names.
pub struct WorkloadResult {
    /// Lower-case hex.
    pub job_id: String,
    pub session: String,
    /// Lower-case hex.
    pub node_id: String,
    pub ray_version: String,
}

/// The workload's JSON line, whole (the last stdout line that is a JSON object with
/// `job_id`): a workload may add what it saw while the cluster lived.
pub fn workload_value(stdout: &str) -> Option<Value> {
    stdout.lines().rev().find_map(|line| {
        let v: Value = serde_json::from_str(line.trim()).ok()?;
        v["job_id"].is_string().then_some(v)
    })
}

/// The workload's JSON line (the last stdout line that is a JSON object with `job_id`).
pub fn workload_result(stdout: &str) -> Option<WorkloadResult> {
    workload_value(stdout).and_then(|v| {
        let s = |k: &str| v[k].as_str().map(str::to_string);
        Some(WorkloadResult {
            job_id: s("job_id")?.to_ascii_lowercase(),
            session: s("session")?,
            node_id: s("node_id")?.to_ascii_lowercase(),
            ray_version: s("ray_version").unwrap_or_default(),
        })
    })
}

// ------------------------------------------------------------------------ text

/// `s` cut to at most `max` bytes (on a char boundary), with `...` where it was cut.
pub fn short_to(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

/// The last `max` bytes of `s` (from a char boundary), with `...` before them where it was
/// cut.
pub fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("...{}", &s[cut..])
}
