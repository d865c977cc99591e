//! Runs the real `ray-history-collector` binary for integration tests, and reads back
//! what it wrote to a bucket.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt};

use super::services::{free_port, try_http_request, HttpResponse};

/// A collector process on a free loopback port, with its own spool dir.
pub struct Collector {
    pub port: u16,
    pub spool: PathBuf,
    pub log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Collector {
    /// Starts the binary with `args` (plus `--listen` and `--spool-dir`) and `env`, and waits
    /// until `/healthz` answers.
    pub fn start(spool: &Path, args: &[&str], env: &[(&str, &str)]) -> Collector {
        let mut c = Collector {
            port: free_port(),
            spool: spool.to_path_buf(),
            log: spool.with_extension("log"),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open collector log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--spool-dir")
            .arg(&self.spool)
            .args(&self.args)
            .env_remove("RUST_LOG")
            .env("RUST_LOG", "info,ray_history_collector=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log);
        for k in [
            "STORAGE_BACKEND",
            "RHC_STORAGE",
            "EVENTS_PORT",
            "RAY_ROLE",
            "RHC_NODE_ID",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("start the collector binary"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // Healthy, and done starting (the server answers before the log side is set up).
            if let Ok(r) = self.get("/healthz") {
                if r.status == 200 && self.log_text().contains("collector ready") {
                    return;
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("collector exited early with {status}:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "collector not ready:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the same configuration again (after a crash or a clean stop).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn post(&self, body: &[u8]) -> HttpResponse {
        self.post_with(body, &[])
    }

    pub fn post_with(&self, body: &[u8], headers: &[(&str, &str)]) -> HttpResponse {
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(headers);
        try_http_request("POST", &self.url("/v1/events"), &h, body).expect("POST /v1/events")
    }

    pub fn get(&self, path: &str) -> std::io::Result<HttpResponse> {
        try_http_request("GET", &self.url(path), &[], b"")
    }

    /// A metric's value from `/metrics` (sum over label sets), 0 when absent.
    pub fn metric(&self, name: &str) -> f64 {
        let Ok(r) = self.get("/metrics") else {
            return f64::NAN;
        };
        String::from_utf8_lossy(&r.body)
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Sends SIGTERM and waits (up to `limit`) for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = child.try_wait().expect("wait") {
                return s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "collector did not exit within {limit:?}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9: no chance to flush or upload anything.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Every object in `store` (key → bytes).
pub fn read_all(store: &Arc<dyn ObjectStore>) -> BTreeMap<String, Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use futures::TryStreamExt;
        let metas: Vec<_> = store.list(None).try_collect().await.expect("list");
        let mut out = BTreeMap::new();
        for m in metas {
            let bytes = store
                .get(&m.location)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("body");
            out.insert(m.location.to_string(), bytes.to_vec());
        }
        out
    })
}

/// gunzips if the key says so.
pub fn decode(key: &str, bytes: &[u8]) -> Vec<u8> {
    if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{key}: not gzip: {e}"));
        out
    } else {
        bytes.to_vec()
    }
}

/// The history server's accepted event-file name pattern.
pub fn history_server_accepts(name: &str) -> bool {
    let re =
        regex::Regex::new(r"-\d{4}-\d{2}-\d{2}-\d{2}(-\d+)?(\.jsonl)?(\.gz)?$").expect("regex");
    re.is_match(name)
}
