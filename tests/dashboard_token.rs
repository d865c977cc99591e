//! `RAY_ENABLE_K8S_TOKEN_AUTH=true` through the real binary: the collector sends the pod's
//! projected ServiceAccount token, read from its file for every request as KubeRay's collector
//! does, to a stand-in dashboard on 127.0.0.1 that answers only that token; the file is
//! replaced mid-run (kubelet rotates it) and the next requests carry the new token.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use rhc_testkit::collector::{read_all, Collector};

const SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";
const NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const P: &str = "cluster-history/raycluster/default/token-test";
/// Longest request head the stand-in reads.
const MAX_HEAD_LINES: usize = 100;

/// Each request's URI and `x-ray-authorization` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A dashboard stand-in: 200 with a small JSON body for requests whose `x-ray-authorization`
/// is `Bearer <the current token>`, 401 otherwise; records each request's URI and token.
struct StandIn {
    port: u16,
    token: Arc<Mutex<String>>,
    seen: Seen,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StandIn {
    fn start(token: &str) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let token = Arc::new(Mutex::new(token.to_string()));
        let seen: Seen = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s, st) = (token.clone(), seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => serve(conn, &t, &s),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        StandIn {
            port,
            token,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn tokens_seen(&self) -> Vec<Option<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, t)| t.clone())
            .collect()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request per connection (`Connection: close`).
fn serve(conn: TcpStream, token: &Mutex<String>, seen: &Seen) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let uri = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut auth = None;
    for _ in 0..MAX_HEAD_LINES {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.trim().eq_ignore_ascii_case("x-ray-authorization") {
                auth = Some(value.trim().to_string());
            }
        }
    }
    let ok = auth.as_deref() == Some(&format!("Bearer {}", token.lock().unwrap()));
    seen.lock().unwrap().push((uri.clone(), auth));
    let body = if uri == "/timezone" {
        r#"{"offset":"+00:00","value":"UTC"}"#
    } else {
        r#"{"result":true,"msg":"","data":{}}"#
    };
    let head = if ok { "200 OK" } else { "401 Unauthorized" };
    let _ = write!(
        &conn,
        "HTTP/1.1 {head}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn wait_until(what: &str, c: &Collector, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pred() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            c.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn objects(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::create_dir_all(dir).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap());
    read_all(&store)
}

#[test]
fn k8s_token_auth_sends_the_projected_token_and_follows_its_rotation() {
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let logs = ray.join(SESSION).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(
        logs.join("raylet.out"),
        format!("[..] (raylet) main.cc:711: Setting node ID node_id={NODE}\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink(ray.join(SESSION), ray.join("session_latest")).unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "first-projected-token\n").unwrap();
    let dashboard = StandIn::start("first-projected-token");

    let bucket = tmp.path().join("bucket");
    let storage = format!("file://{}", bucket.display());
    let address = format!("http://127.0.0.1:{}", dashboard.port);
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            &storage,
            "--ray-tmp-dir",
            ray.to_str().unwrap(),
            "--cluster-name",
            "token-test",
            "--role",
            "head",
            "--dashboard-address",
            &address,
            "--endpoint-poll-interval",
            "1s",
        ],
        &[
            ("RAY_AUTH_MODE", "token"),
            ("RAY_ENABLE_K8S_TOKEN_AUTH", "true"),
            ("RHC_K8S_TOKEN_PATH", token_file.to_str().unwrap()),
        ],
    );
    let timezone = format!("{P}/{SESSION}/fetched_endpoints/restful__timezone");
    wait_until("the timezone snapshot", &c, || {
        objects(&bucket).contains_key(&timezone)
    });
    assert_eq!(
        objects(&bucket)[&timezone],
        br#"{"offset":"+00:00","value":"UTC"}"#
    );

    // kubelet replaces the token; the dashboard accepts only the new one from now on.
    std::fs::write(&token_file, "second-projected-token\n").unwrap();
    *dashboard.token.lock().unwrap() = "second-projected-token".into();
    let before = dashboard.tokens_seen().len();
    wait_until("a request with the rotated token", &c, || {
        dashboard.tokens_seen()[before..]
            .iter()
            .any(|t| t.as_deref() == Some("Bearer second-projected-token"))
    });
    let seen = dashboard.tokens_seen();
    assert!(
        seen.iter().all(|t| t.is_some()),
        "every request carries the token: {seen:?}"
    );
    assert!(c.terminate(Duration::from_secs(30)).success());
}
