//! KubeRay's history server as a test peer, and the smallest Kubernetes API it needs.
//!
//! The history server replays a stored session only when the RayCluster it belonged to is
//! gone, which it asks the Kubernetes API. [`FakeKubeApi`] serves exactly what that decision
//! takes and nothing more: API discovery (`/api`, `/apis`, `/apis/ray.io/v1` listing
//! `rayclusters`), an empty RayCluster list, and `404 NotFound` (a `metav1.Status`) for every
//! RayCluster asked for. It records the paths it was asked.
//!
//! [`HistoryServer`] runs the binary named by `RHC_HISTORY_SERVER` against an S3 bucket (moto)
//! with KubeRay's own variables, and [`HistoryServer::enter`] opens a session the way the
//! dashboard does (`/enter_cluster/<ns>/raycluster/<name>/<session>`, then its cookies). The
//! server listens on `:8080`, hard-coded; only one test in this repository starts it.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::http::{try_http_request, HttpResponse};
use crate::services::MotoS3;

/// The port the history server listens on; it cannot be changed.
pub const HISTORY_SERVER_PORT: u16 = 8080;

/// The Kubernetes API the history server needs to decide that a cluster is gone.
pub struct FakeKubeApi {
    pub port: u16,
    /// A kubeconfig pointing at it.
    pub kubeconfig: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakeKubeApi {
    /// Serves on a free 127.0.0.1 port until dropped.
    pub fn start() -> FakeKubeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake Kubernetes API");
        let port = listener.local_addr().expect("local addr").port();
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: \
                 http://127.0.0.1:{port}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    \
                 user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user:\n    token: fake\n"
            ),
        )
        .expect("write the kubeconfig");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Ok(s) = stream {
                        let requests = requests.clone();
                        std::thread::spawn(move || serve(s, &requests));
                    }
                }
            })
        };
        FakeKubeApi {
            port,
            kubeconfig,
            requests,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// The paths asked so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for FakeKubeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers the requests of one connection (the client keeps it alive).
fn serve(stream: TcpStream, requests: &Mutex<Vec<String>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        // The request's headers; GETs have no body.
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h.trim().is_empty() {
                break;
            }
        }
        if let Ok(mut r) = requests.lock() {
            r.push(path.clone());
        }
        let (status, body) = answer(&path);
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(body.as_bytes()).is_err()
        {
            return;
        }
    }
}

/// What the API answers to a GET of `path`.
fn answer(path: &str) -> (&'static str, String) {
    let p = path.split('?').next().unwrap_or(path).trim_end_matches('/');
    let ok = "200 OK";
    match p {
        "/api" => (
            ok,
            r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1"}]}"#.into(),
        ),
        "/apis" => (
            ok,
            r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"ray.io","versions":[{"groupVersion":"ray.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"ray.io/v1","version":"v1"}}]}"#.into(),
        ),
        "/apis/ray.io/v1" => (
            ok,
            r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"ray.io/v1","resources":[{"name":"rayclusters","singularName":"raycluster","namespaced":true,"kind":"RayCluster","verbs":["get","list","watch"]}]}"#.into(),
        ),
        _ if p.ends_with("/rayclusters") => (
            ok,
            r#"{"kind":"RayClusterList","apiVersion":"ray.io/v1","metadata":{"resourceVersion":"1"},"items":[]}"#.into(),
        ),
        _ => {
            let name = p.rsplit('/').next().unwrap_or_default();
            (
                "404 Not Found",
                format!(
                    r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"rayclusters.ray.io \"{name}\" not found","reason":"NotFound","details":{{"name":"{name}","group":"ray.io","kind":"rayclusters"}},"code":404}}"#
                ),
            )
        }
    }
}

/// The history server binary, from `RHC_HISTORY_SERVER`; `None` when it is not set.
pub fn history_server_binary() -> Option<PathBuf> {
    std::env::var_os("RHC_HISTORY_SERVER")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// KubeRay's history server, reading `bucket` on `moto`, deciding liveness through `kube`.
pub struct HistoryServer {
    child: Option<Child>,
    log: PathBuf,
    cookies: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl HistoryServer {
    /// Starts `binary` and waits until `/clusters` answers; panics (with its log) otherwise,
    /// or when something already listens on port 8080.
    pub fn start(binary: &Path, moto: &MotoS3, bucket: &str, kube: &FakeKubeApi) -> HistoryServer {
        assert!(
            TcpListener::bind(("0.0.0.0", HISTORY_SERVER_PORT)).is_ok(),
            "port {HISTORY_SERVER_PORT} is taken; the history server cannot listen elsewhere"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("historyserver.log");
        let out = std::fs::File::create(&log).expect("history server log");
        let err = out.try_clone().expect("dup log");
        let dashboard = dir.path().join("dashboard");
        std::fs::create_dir_all(&dashboard).expect("empty dashboard dir");
        let child = Command::new(binary)
            .args(["--storage-backend", "s3", "--kubeconfigs"])
            .arg(&kube.kubeconfig)
            .arg("--dashboard-dir")
            .arg(&dashboard)
            .current_dir(dir.path())
            .env("S3_BUCKET", bucket)
            .env("S3_ENDPOINT", format!("127.0.0.1:{}", moto.port))
            .env("S3_REGION", MotoS3::REGION)
            .env("S3FORCE_PATH_STYLE", "true")
            .env("S3DISABLE_SSL", "true")
            .env("AWS_ACCESS_KEY_ID", MotoS3::ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", MotoS3::SECRET_ACCESS_KEY)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut hs = HistoryServer {
            child: Some(child),
            log,
            cookies: Vec::new(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if hs.get("/clusters").is_ok_and(|r| r.status == 200) {
                return hs;
            }
            if let Some(status) = hs.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("the history server exited ({status}):\n{}", hs.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "the history server did not answer within 30 s:\n{}",
                hs.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// GET `path` with the cookies of the session entered last.
    pub fn get(&self, path: &str) -> std::io::Result<HttpResponse> {
        let cookie = self
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ");
        let mut headers = Vec::new();
        if !cookie.is_empty() {
            headers.push(("Cookie", cookie.as_str()));
        }
        try_http_request(
            "GET",
            &format!("http://127.0.0.1:{HISTORY_SERVER_PORT}{path}"),
            &headers,
            b"",
        )
    }

    /// Opens a session of a RayCluster as the dashboard does, keeping the cookies it sets.
    pub fn enter(&mut self, namespace: &str, cluster: &str, session: &str) -> HttpResponse {
        self.cookies.clear();
        let r = self
            .get(&format!(
                "/enter_cluster/{namespace}/raycluster/{cluster}/{session}"
            ))
            .expect("GET /enter_cluster");
        for (k, v) in &r.headers {
            if k == "set-cookie" {
                if let Some((name, rest)) = v.split_once('=') {
                    let value = rest.split(';').next().unwrap_or_default();
                    self.cookies
                        .push((name.trim().to_string(), value.to_string()));
                }
            }
        }
        r
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for HistoryServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
