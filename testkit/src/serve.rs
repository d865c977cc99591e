//! `ray-history-collector serve` as a real process on a free loopback port, and the bucket
//! it reads written by the real collector from posted fixtures (with the head's dashboard
//! snapshots, from testkit's dashboard stand-in).
//!
//! A [`Serve`] is ready when `/readz` answers 200; it is killed and reaped on drop, however a
//! test ends. Requests carry cookies as a browser would send them back.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::collector::{collector_bin, Collector};
use crate::dashboard::DashboardStandIn;
use crate::http::{try_http_request, HttpResponse};
use crate::services::free_port;

/// How long a start may take until `/readz` answers.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// A `serve` process.
pub struct Serve {
    pub port: u16,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Serve {
    /// Starts this build's binary as `serve --storage <storage> --listen 127.0.0.1:<free>
    /// <extra>` with `env`, its output in `log`; waits until `/readz` answers.
    pub fn try_start(
        storage: &str,
        log: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Serve, String> {
        let port = free_port();
        let out = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(collector_bin());
        cmd.arg("serve")
            .arg("--storage")
            .arg(storage)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .env_remove("STORAGE_ROOT_DIR")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| format!("starting serve: {e}"))?;
        let mut s = Serve {
            port,
            log: log.to_path_buf(),
            child: Some(child),
        };
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            if s.get("/readz", &[]).is_ok_and(|r| r.status == 200) {
                return Ok(s);
            }
            if let Some(status) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                s.child = None;
                return Err(format!(
                    "serve exited at start ({status}):\n{}",
                    s.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "serve not ready within {READY_LIMIT:?}:\n{}",
                    s.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`Serve::try_start`], panicking on failure.
    pub fn start(storage: &str, log: &Path, extra: &[&str], env: &[(&str, &str)]) -> Serve {
        Serve::try_start(storage, log, extra, env).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `GET path` with `cookies` sent back in one `Cookie` header.
    pub fn get(&self, path: &str, cookies: &[(String, String)]) -> std::io::Result<HttpResponse> {
        let line = cookie_header(cookies);
        let headers: Vec<(&str, &str)> = if line.is_empty() {
            Vec::new()
        } else {
            vec![("Cookie", line.as_str())]
        };
        try_http_request(
            "GET",
            &format!("http://127.0.0.1:{}{path}", self.port),
            &headers,
            b"",
        )
    }

    /// SIGTERM, then waits up to `limit` for the exit; kills it after that and says so.
    pub fn terminate(&mut self, limit: Duration) -> Result<(ExitStatus, Duration), String> {
        let Some(mut child) = self.child.take() else {
            return Err("serve is not running".into());
        };
        let t = Instant::now();
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok((s, t.elapsed()));
            }
            if t.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "serve did not exit within {limit:?}:\n{}",
                    self.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `cookies` as one `Cookie` header's value (`k=v; k2=v2`; empty for none).
pub fn cookie_header(cookies: &[(String, String)]) -> String {
    cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The cookies an answer sets (`Set-Cookie`), as (name, value), in order.
pub fn set_cookies(r: &HttpResponse) -> Vec<(String, String)> {
    r.headers
        .iter()
        .filter(|(k, _)| k == "set-cookie")
        .filter_map(|(_, v)| {
            let pair = v.split(';').next()?;
            let (k, v) = pair.split_once('=')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Writes a bucket with the real collector: a head (`--role head`) whose Ray session
/// `session` is the active one (so the dashboard poller snapshots `dash`'s answers under it),
/// posted every line of each of `posts` (each a POST body of Ray's events), then stopped
/// with SIGTERM (the final flush and the final poll). `storage` is a `--storage` value,
/// `env` its credentials; `snapshots_stored` says when the first poll's snapshots are in the
/// bucket (waited for, up to 30 s, before the collector is stopped).
#[allow(clippy::too_many_arguments)]
pub fn write_bucket(
    work: &Path,
    storage: &str,
    env: &[(&str, &str)],
    cluster: &str,
    session: &str,
    dash: &DashboardStandIn,
    posts: &[&str],
    snapshots_stored: &dyn Fn() -> bool,
) {
    let ray = work.join("ray");
    fs::create_dir_all(ray.join(session).join("logs")).expect("creating the Ray session dir");
    let latest = ray.join("session_latest");
    if !latest.exists() {
        std::os::unix::fs::symlink(ray.join(session), &latest).expect("linking session_latest");
    }
    let address = dash.address();
    let mut c = Collector::start(
        &work.join("spool"),
        &[
            "--storage",
            storage,
            "--cluster-name",
            cluster,
            "--role",
            "head",
            "--ray-tmp-dir",
            ray.to_str().expect("a UTF-8 temp path"),
            "--dashboard-address",
            &address,
            "--endpoint-poll-interval",
            "1h",
            "--enable-log-collector",
            "false",
        ],
        env,
    );
    for body in posts.iter().flat_map(|p| p.lines()) {
        let r = c.post(body.as_bytes());
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let waited = Instant::now();
    while !snapshots_stored() {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the dashboard snapshots were not stored within 30 s:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "collector: {status}\n{}", c.log_text());
}

/// Whether Ray's own `JobDetails` model (what Ray's `JobSubmissionClient.list_jobs` builds
/// of each entry, rejecting the whole list for one it does not take) takes every entry of
/// `jobs` (a `/api/jobs/` answer), checked with the Ray of `RHC_PYTHON` when the test setup
/// installed it (`Ok` without it); `Err` with pydantic's words otherwise. `work`: where the
/// entries are written for it.
pub fn rays_job_details_take(work: &Path, jobs: &serde_json::Value) -> Result<(), String> {
    let Some(python) = crate::services::tool("RHC_PYTHON") else {
        return Ok(());
    };
    let file = work.join("job-details-check.json");
    fs::write(&file, jobs.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
    let check = "import json, sys\n\
        from ray.dashboard.modules.job.pydantic_models import JobDetails\n\
        for j in json.load(open(sys.argv[1])):\n    JobDetails(**j)\n";
    let mut cmd = Command::new(python);
    cmd.args(["-c", check]).arg(&file);
    let out = crate::services::run_with_timeout(&mut cmd, Duration::from_secs(120));
    if out.status.success() {
        Ok(())
    } else {
        Err(out.stderr)
    }
}
