//! KubeRay's Go collector as a peer for the side-by-side benchmark and chaos comparison, and
//! the smallest stand-ins for what it needs to start.
//!
//! The binary is not part of this repository: [`peer_collector_bin`] takes its path from
//! `RHC_PEER_COLLECTOR`; [`PEER_INSTALL`] is the pinned `go install` that provides it when
//! the Go module proxy serves KubeRay's module.
//!
//! Before it listens, KubeRay's collector (1) asks the Ray dashboard at
//! `http://$FQ_RAY_IP:$RAY_DASHBOARD_PORT/api/v0/nodes?limit=10000` for the node whose
//! `node_ip` is `$POD_IP` and whose `state` is `ALIVE` (and asks again every 5 s while it
//! runs), and (2) resolves `$RAY_TMP_ROOT/session_latest` to a session directory whose
//! `sockets/raylet` unix socket accepts a connection; it gives up after about 60 s of either.
//! [`RayStandIn`] is exactly that and nothing more: a loopback HTTP server that answers every
//! request with a one-node list (this host, `127.0.0.1`, `ALIVE`), and a session directory
//! with a listening unix socket that accepts and closes connections. No Ray runs.
//!
//! [`PeerCollector`] runs the binary with its own documented environment (S3 backend,
//! cluster name, event data dir, rotation, disk budget, compression; the log collector off),
//! in a clean environment, and is ready when `POST /v1/events` of `[]` answers 200. It is
//! killed and reaped on drop. [`AnyCollector`] lets a tool drive ours and the peer alike.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::collector::Collector;
use crate::http::try_http_request;
use crate::services::free_port;
use crate::usage::{wait_usage, Usage};

/// The pinned install of KubeRay's collector (commit feeaf72, the same pin as the history
/// server of the end-to-end test).
pub const PEER_INSTALL: &str = "GOTOOLCHAIN=local go install github.com/ray-project/kuberay/historyserver/cmd/collector@v0.0.0-20260819132152-feeaf72facab";

/// Its startup gives up after about 60 s (12 tries, 5 s apart) of either stand-in missing;
/// with them it is ready in about a second.
const READY_LIMIT: Duration = Duration::from_secs(90);

/// How often the stand-in's accept loops look for a connection (and for the stop flag).
const ACCEPT_POLL: Duration = Duration::from_millis(10);

/// A unix socket path must fit `sun_path` (108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The node id the stand-in dashboard reports (28 bytes in hex, like a Ray node id).
pub const STANDIN_NODE_ID: &str = "5eed0000000000000000000000000000000000000000000000000001";

/// The cluster name and namespace the peer runs as.
pub const PEER_CLUSTER: &str = "bench";
pub const PEER_NAMESPACE: &str = "default";

/// KubeRay's collector binary: `$RHC_PEER_COLLECTOR` when it names a file.
pub fn peer_collector_bin() -> Option<PathBuf> {
    std::env::var_os("RHC_PEER_COLLECTOR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_file())
}

// ------------------------------------------------------------------ stand-ins

/// A Ray node as far as KubeRay's collector looks at one at start: the dashboard's node list
/// and a live raylet socket. Stopped on drop.
pub struct RayStandIn {
    /// `RAY_TMP_ROOT`: holds `session_latest` → the session dir.
    pub tmp_root: PathBuf,
    pub session: String,
    /// The dashboard stand-in's port on 127.0.0.1 (`RAY_DASHBOARD_PORT`).
    pub dashboard_port: u16,
    stop: Arc<AtomicBool>,
    socket_path: PathBuf,
    threads: Vec<JoinHandle<()>>,
}

impl RayStandIn {
    /// Creates `<tmp_root>/<session>/sockets/raylet` (listening), the `session_latest` link
    /// and the node list on a free loopback port.
    pub fn start(tmp_root: &Path, session: &str) -> Result<RayStandIn, String> {
        let sockets = tmp_root.join(session).join("sockets");
        fs::create_dir_all(&sockets).map_err(|e| format!("{}: {e}", sockets.display()))?;
        let latest = tmp_root.join("session_latest");
        let _ = fs::remove_file(&latest);
        std::os::unix::fs::symlink(session, &latest)
            .map_err(|e| format!("{}: {e}", latest.display()))?;
        let socket_path = sockets.join("raylet");
        if socket_path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(format!(
                "{} is longer than a unix socket path may be ({MAX_SOCKET_PATH} bytes): use a shorter RAY_TMP_ROOT",
                socket_path.display()
            ));
        }
        let _ = fs::remove_file(&socket_path);
        let unix = UnixListener::bind(&socket_path)
            .map_err(|e| format!("binding {}: {e}", socket_path.display()))?;
        let http = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let dashboard_port = http.local_addr().map_err(|e| e.to_string())?.port();
        let stop = Arc::new(AtomicBool::new(false));
        // Both accept loops poll, so that dropping the stand-in never waits on a peer that
        // is gone (or on a socket file someone removed).
        unix.set_nonblocking(true).map_err(|e| e.to_string())?;
        http.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut threads = Vec::new();
        {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                // Accepting is all a liveness probe needs; the connection is closed at once.
                while !stop.load(Ordering::SeqCst) {
                    match unix.accept() {
                        Ok((conn, _)) => drop(conn),
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            }));
        }
        {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match http.accept() {
                        Ok((conn, _)) => {
                            let _ = conn.set_nonblocking(false);
                            std::thread::spawn(move || answer_node_list(conn));
                        }
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            }));
        }
        Ok(RayStandIn {
            tmp_root: tmp_root.to_path_buf(),
            session: session.to_string(),
            dashboard_port,
            stop,
            socket_path,
            threads,
        })
    }
}

impl Drop for RayStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = fs::remove_file(&self.socket_path);
    }
}

/// The dashboard's `/api/v0/nodes` answer for one live node on 127.0.0.1.
pub fn node_list_json() -> String {
    format!(
        r#"{{"result":true,"msg":"","data":{{"result":{{"total":1,"result":[{{"node_id":"{STANDIN_NODE_ID}","node_ip":"127.0.0.1","state":"ALIVE"}}]}}}}}}"#
    )
}

/// Reads one request head (GET, no body) and answers with the node list, then closes.
fn answer_node_list(stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line.trim().is_empty() => break,
            Ok(_) => {}
        }
    }
    let body = node_list_json();
    let _ = write!(
        writer,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

// ------------------------------------------------------------------ the peer

/// The settings the peer runs with; every one becomes one of its environment variables.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// `S3_ENDPOINT`: the S3 server (or a relay in front of it).
    pub s3_endpoint: String,
    /// `S3_BUCKET`.
    pub bucket: String,
    /// `RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED`.
    pub compression: bool,
    /// `RAY_COLLECTOR_EVENT_ROTATION_INTERVAL` (Go duration; checked every 30 s by the peer).
    pub rotation: String,
    /// `RAY_COLLECTOR_EVENT_MAX_DISK_MB` (503 at 80 % of it).
    pub max_disk_mb: u64,
    /// `RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB`.
    pub max_file_mb: u64,
    /// The session the stand-in reports as `session_latest`.
    pub session: String,
}

impl PeerSettings {
    /// The peer's defaults (5 min rotation, 100 MB files, 200 MB disk budget, no
    /// compression) against `s3_endpoint`/`bucket`.
    pub fn defaults(s3_endpoint: &str, bucket: &str, session: &str) -> PeerSettings {
        PeerSettings {
            s3_endpoint: s3_endpoint.to_string(),
            bucket: bucket.to_string(),
            compression: false,
            rotation: "5m".into(),
            max_disk_mb: 200,
            max_file_mb: 100,
            session: session.to_string(),
        }
    }
}

/// KubeRay's collector as a process, with its stand-ins, its data dir and its log.
pub struct PeerCollector {
    pub bin: PathBuf,
    /// `EVENTS_PORT` (it listens on every interface; requests go to 127.0.0.1).
    pub port: u16,
    /// `RAY_COLLECTOR_EVENT_DATA_DIR`.
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub settings: PeerSettings,
    standin: RayStandIn,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl PeerCollector {
    /// A peer not started yet: its data dir and log under `dir`, its stand-in Ray tmp root
    /// under `ray_tmp` (a short path: the raylet socket path must fit 107 bytes).
    pub fn configure(
        bin: PathBuf,
        dir: &Path,
        ray_tmp: &Path,
        settings: PeerSettings,
    ) -> Result<PeerCollector, String> {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let standin = RayStandIn::start(ray_tmp, &settings.session)?;
        let port = free_port();
        let data_dir = dir.join("data");
        let env = peer_env(&settings, port, &data_dir, &standin, dir);
        Ok(PeerCollector {
            bin,
            port,
            data_dir,
            log: dir.join("peer.log"),
            settings,
            standin,
            env,
            child: None,
        })
    }

    /// The environment it runs with (nothing else is inherited but `PATH`).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Where its unrotated and rotated event files live: `<data dir>/<cluster>_<namespace>`.
    pub fn events_dir(&self) -> PathBuf {
        self.data_dir
            .join(format!("{PEER_CLUSTER}_{PEER_NAMESPACE}"))
    }

    /// The Ray tmp root of its stand-in.
    pub fn ray_tmp(&self) -> &Path {
        &self.standin.tmp_root
    }

    /// Starts the process and waits until `POST /v1/events` of `[]` answers 200; returns
    /// how long that took.
    pub fn try_spawn(&mut self) -> Result<Duration, String> {
        if self.child.is_some() {
            return Err("the peer is already running".into());
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("opening {}: {e}", self.log.display()))?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let started = Instant::now();
        self.child = Some(
            cmd.spawn()
                .map_err(|e| format!("starting {}: {e}", self.bin.display()))?,
        );
        let url = format!("http://127.0.0.1:{}/v1/events", self.port);
        loop {
            if let Ok(r) =
                try_http_request("POST", &url, &[("Content-Type", "application/json")], b"[]")
            {
                if r.status == 200 {
                    return Ok(started.elapsed());
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "the peer exited at start ({status}):\n{}",
                    log_tail(&self.log, 30)
                ));
            }
            if started.elapsed() > READY_LIMIT {
                self.kill9();
                return Err(format!(
                    "the peer was not ready within {READY_LIMIT:?}:\n{}",
                    log_tail(&self.log, 30)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id, 0 when not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn signal_term(&self) {
        if let Some(c) = &self.child {
            // SAFETY: sending a signal to our own child process.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
    }

    /// Waits up to `limit` for the exit; kills it after that and says so.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus, String> {
        self.wait_exit_usage(limit).map(|(s, _)| s)
    }

    /// Like [`PeerCollector::wait_exit`], with what the whole life of the process cost.
    pub fn wait_exit_usage(&mut self, limit: Duration) -> Result<(ExitStatus, Usage), String> {
        let child = self.child.take().ok_or("the peer is not running")?;
        wait_usage(child, limit).map_err(|e| format!("{e}:\n{}", log_tail(&self.log, 30)))
    }

    /// kill -9, and reaped. Nothing when not running.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PeerCollector {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The peer's environment: its documented variables (KubeRay's `cmd/collector/main.go` and
/// `pkg/storage/s3/config.go`), all set explicitly.
fn peer_env(
    s: &PeerSettings,
    port: u16,
    data_dir: &Path,
    standin: &RayStandIn,
    home: &Path,
) -> Vec<(String, String)> {
    let v = |k: &str, v: String| (k.to_string(), v);
    vec![
        // Its node-id discovery and session lookup, answered by the stand-in.
        v("POD_IP", "127.0.0.1".into()),
        v("FQ_RAY_IP", "127.0.0.1".into()),
        v("RAY_DASHBOARD_PORT", standin.dashboard_port.to_string()),
        v("RAY_TMP_ROOT", standin.tmp_root.display().to_string()),
        v("RAY_ROLE", "Worker".into()),
        v("RAY_CLUSTER_NAME", PEER_CLUSTER.into()),
        v("RAY_CLUSTER_NAMESPACE", PEER_NAMESPACE.into()),
        v("EVENTS_PORT", port.to_string()),
        v("ENABLE_EVENT_COLLECTOR", "true".into()),
        v("ENABLE_LOG_COLLECTOR", "false".into()),
        // Storage: S3 against the local server, path-style, plain HTTP, static keys.
        v("STORAGE_BACKEND", "s3".into()),
        v("S3_BUCKET", s.bucket.clone()),
        v("S3_ENDPOINT", s.s3_endpoint.clone()),
        v("S3_REGION", "us-east-1".into()),
        v("S3FORCE_PATH_STYLE", "true".into()),
        v("S3DISABLE_SSL", "true".into()),
        v("AWS_ACCESS_KEY_ID", "test".into()),
        v("AWS_SECRET_ACCESS_KEY", "testsecret".into()),
        // Its disk-first event pipeline.
        v(
            "RAY_COLLECTOR_EVENT_DATA_DIR",
            data_dir.display().to_string(),
        ),
        v(
            "RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED",
            s.compression.to_string(),
        ),
        v("RAY_COLLECTOR_EVENT_ROTATION_INTERVAL", s.rotation.clone()),
        v("RAY_COLLECTOR_EVENT_MAX_DISK_MB", s.max_disk_mb.to_string()),
        v(
            "RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB",
            s.max_file_mb.to_string(),
        ),
        // No ~/.aws of this machine.
        v("HOME", home.display().to_string()),
    ]
}

fn log_tail(path: &Path, lines: usize) -> String {
    let t = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = t.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ------------------------------------------------------------------ either collector

/// Ours or the peer, driven alike by the comparison tools.
pub enum AnyCollector {
    Ours(Collector),
    Peer(PeerCollector),
}

impl AnyCollector {
    pub fn port(&self) -> u16 {
        match self {
            AnyCollector::Ours(c) => c.port,
            AnyCollector::Peer(p) => p.port,
        }
    }

    pub fn pid(&self) -> u32 {
        match self {
            AnyCollector::Ours(c) => c.pid(),
            AnyCollector::Peer(p) => p.pid(),
        }
    }

    pub fn try_spawn(&mut self) -> Result<Duration, String> {
        match self {
            AnyCollector::Ours(c) => c.try_spawn(),
            AnyCollector::Peer(p) => p.try_spawn(),
        }
    }

    pub fn kill9(&mut self) {
        match self {
            AnyCollector::Ours(c) => c.kill9(),
            AnyCollector::Peer(p) => p.kill9(),
        }
    }

    pub fn signal_term(&self) {
        match self {
            AnyCollector::Ours(c) => c.signal_term(),
            AnyCollector::Peer(p) => p.signal_term(),
        }
    }

    pub fn wait_exit_usage(&mut self, limit: Duration) -> Result<(ExitStatus, Usage), String> {
        match self {
            AnyCollector::Ours(c) => c.wait_exit_usage(limit),
            AnyCollector::Peer(p) => p.wait_exit_usage(limit),
        }
    }

    /// The directory holding its event files not uploaded yet.
    pub fn events_dir(&self) -> PathBuf {
        match self {
            AnyCollector::Ours(c) => c.spool.join("events"),
            AnyCollector::Peer(p) => p.events_dir(),
        }
    }

    /// Bytes of event files not uploaded yet (both keep a file until its upload succeeded).
    pub fn spool_bytes(&self) -> u64 {
        dir_bytes(&self.events_dir())
    }

    pub fn log_text(&self) -> String {
        match self {
            AnyCollector::Ours(c) => c.log_text(),
            AnyCollector::Peer(p) => p.log_text(),
        }
    }
}

/// Total size of the regular files under `dir` (0 when it does not exist).
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => n += dir_bytes(&e.path()),
                Ok(t) if t.is_file() => n += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_answers_like_a_ray_head() {
        let tmp = tempfile::Builder::new()
            .prefix("rhc-si")
            .tempdir_in("/tmp")
            .expect("tmp");
        let session = "session_2026-11-22_00-00-00_000000_1";
        let standin = RayStandIn::start(tmp.path(), session).expect("stand-in");
        // session_latest resolves to a dir whose raylet socket accepts a connection.
        let latest = fs::canonicalize(tmp.path().join("session_latest")).expect("link");
        assert_eq!(latest.file_name().and_then(|n| n.to_str()), Some(session));
        std::os::unix::net::UnixStream::connect(latest.join("sockets/raylet")).expect("raylet");
        let r = try_http_request(
            "GET",
            &format!(
                "http://127.0.0.1:{}/api/v0/nodes?limit=10000",
                standin.dashboard_port
            ),
            &[],
            b"",
        )
        .expect("node list");
        assert_eq!(r.status, 200);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        let node = &v["data"]["result"]["result"][0];
        assert_eq!(node["node_ip"], "127.0.0.1");
        assert_eq!(node["state"], "ALIVE");
        assert_eq!(node["node_id"], STANDIN_NODE_ID);
        let socket = latest.join("sockets/raylet");
        drop(standin);
        assert!(!socket.exists());
    }

    #[test]
    fn stops_even_when_its_directory_is_gone() {
        let tmp = tempfile::Builder::new()
            .prefix("rhc-si")
            .tempdir_in("/tmp")
            .expect("tmp");
        let standin =
            RayStandIn::start(tmp.path(), "session_2026-11-22_00-00-00_000000_1").expect("start");
        fs::remove_dir_all(tmp.path()).expect("remove");
        let t = Instant::now();
        drop(standin);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn refuses_a_socket_path_that_cannot_be_bound() {
        let tmp = tempfile::tempdir().expect("tmp");
        let deep = tmp.path().join("x".repeat(90));
        let e = RayStandIn::start(&deep, "session_2026-11-22_00-00-00_000000_1")
            .err()
            .expect("too long");
        assert!(e.contains("unix socket path"), "{e}");
    }
}
