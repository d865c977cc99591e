//! Integration tests of the head's dashboard snapshots through the public API, against a
//! small fake Ray dashboard (hyper on loopback) and a real `LocalFileSystem` bucket.
//!
//! The fake serves the endpoints KubeRay's collector polls, logs every request (URI and
//! auth headers), and can require a token, answer slowly on one endpoint, or go down. The
//! bucket is wrapped in a store that counts (and on demand fails) uploads and otherwise
//! delegates to `LocalFileSystem`, so "not uploaded again" is observed, not inferred.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use ray_history_collector::contract::endpoints::endpoint_object_name;
use ray_history_collector::contract::{ClusterLayout, Owner};
use ray_history_collector::dashboard::{
    node_id_by_ip, DashboardConfig, DashboardPoller, PollReport,
};
use ray_history_collector::node::session::ActiveSession;

const SESSION_A: &str = "session_2026-11-22_02-06-54_202993_1";
const SESSION_B: &str = "session_2026-11-22_03-10-00_000001_2";
const PREFIX: &str = "root/cluster-history/raycluster/default/raycluster-historyserver";
const TOKEN: &str = "s3cr3t-token-0123456789abcdef0123456789";
const EXTRA: &str = "/api/train/v2/runs/v1";
const PG: &str = "/api/v0/placement_groups?detail=1&limit=10000";
const SERVE: &str = "/api/serve/applications/";
const META: &str = "/api/v0/cluster_metadata";
const TZ: &str = "/timezone";
const JOB: &str = "02000000";

// ---------------------------------------------------------------- the fake dashboard

#[derive(Debug, Clone)]
struct Logged {
    uri: String,
    authorization: Option<String>,
    x_ray_authorization: Option<String>,
}

#[derive(Default)]
struct FakeState {
    /// When set, requests without `Authorization: Bearer <token>` get 401 (none) or 403 (wrong).
    token: Option<String>,
    /// This request URI is answered only after the delay.
    slow: Option<(String, Duration)>,
    /// Bodies by request URI (path and query, exactly as received).
    bodies: HashMap<String, Vec<u8>>,
    log: Vec<Logged>,
    connections: Vec<AbortHandle>,
}

struct FakeDashboard {
    addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    accept: AbortHandle,
}

fn default_bodies() -> HashMap<String, Vec<u8>> {
    let mut b = HashMap::new();
    let mut put = |uri: &str, body: &str| b.insert(uri.to_string(), body.as_bytes().to_vec());
    put(
        META,
        r#"{"result": true, "msg": "", "data": {"rayVersion": "2.60.0", "pythonVersion": "3.11.9"}}"#,
    );
    put(TZ, r#"{"offset": "+00:00", "value": "UTC"}"#);
    put(
        SERVE,
        r#"{"proxy_location": "EveryNode", "applications": {"app1": {"status": "RUNNING"}}}"#,
    );
    put(
        PG,
        r#"{"result": true, "msg": "", "data": {"result": {"total": 1, "result": [{"placement_group_id": "aa", "state": "CREATED", "bundles": []}]}}}"#,
    );
    put(
        "/api/jobs/",
        r#"[{"type": "SUBMISSION", "job_id": null, "submission_id": "raysubmit_pending", "status": "PENDING"},
            {"type": "SUBMISSION", "job_id": "02000000", "submission_id": "raysubmit_run", "status": "RUNNING"}]"#,
    );
    put(
        &format!("/api/data/datasets/{JOB}"),
        r#"{"datasets": [{"dataset": "dataset_1_0", "job_id": "02000000", "state": "RUNNING"}]}"#,
    );
    put(
        "/api/v0/nodes?limit=10000",
        r#"{"result": true, "msg": "", "data": {"result": {"total": 3, "num_after_truncation": 3, "result": [
            {"node_id": "0F690C018F332312C5B989CB5E700A26DBAE9B206FEB5F1F086485EE", "node_ip": "10.1.2.3", "state": "DEAD", "start_time_ms": 1000},
            {"node_id": "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5", "node_ip": "10.1.2.3", "state": "ALIVE", "start_time_ms": 900},
            {"node_id": "ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000", "node_ip": "10.1.2.4", "state": "ALIVE", "start_time_ms": 1}
        ]}}}"#,
    );
    put(EXTRA, r#"{"runs": [{"id": "run-1"}]}"#);
    b
}

async fn answer(
    state: &Arc<Mutex<FakeState>>,
    req: &Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let uri = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let logged = Logged {
        uri: uri.clone(),
        authorization: header("authorization"),
        x_ray_authorization: header("x-ray-authorization"),
    };
    let (token, slow, body) = {
        let mut st = state.lock().unwrap();
        st.log.push(logged.clone());
        (
            st.token.clone(),
            st.slow.clone(),
            st.bodies.get(&uri).cloned(),
        )
    };
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    if let Some(t) = token {
        match &logged.authorization {
            None => {
                return reply(
                    StatusCode::UNAUTHORIZED,
                    b"Unauthorized: Missing authentication token".to_vec(),
                )
            }
            Some(h) if *h != format!("Bearer {t}") => {
                return reply(
                    StatusCode::FORBIDDEN,
                    b"Forbidden: Invalid authentication token".to_vec(),
                )
            }
            Some(_) => {}
        }
    }
    if let Some((slow_uri, delay)) = slow {
        if slow_uri == uri {
            tokio::time::sleep(delay).await;
        }
    }
    match body {
        Some(b) => reply(StatusCode::OK, b),
        None => reply(StatusCode::NOT_FOUND, b"404: Not Found".to_vec()),
    }
}

impl FakeDashboard {
    async fn start() -> FakeDashboard {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(FakeState {
            bodies: default_bodies(),
            ..FakeState::default()
        }));
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let st2 = st.clone();
                let conn = tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let st3 = st2.clone();
                        async move { Ok::<_, Infallible>(answer(&st3, &req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
                st.lock().unwrap().connections.push(conn.abort_handle());
            }
        })
        .abort_handle();
        FakeDashboard {
            addr,
            state,
            accept,
        }
    }

    fn address(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn require_token(&self, token: Option<&str>) {
        self.state.lock().unwrap().token = token.map(str::to_string);
    }

    fn set_slow(&self, uri: &str, delay: Duration) {
        self.state.lock().unwrap().slow = Some((uri.to_string(), delay));
    }

    fn set_body(&self, uri: &str, body: &str) {
        self.state
            .lock()
            .unwrap()
            .bodies
            .insert(uri.to_string(), body.as_bytes().to_vec());
    }

    fn body(&self, uri: &str) -> Vec<u8> {
        self.state.lock().unwrap().bodies[uri].clone()
    }

    fn requests(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    fn count(&self, uri: &str) -> usize {
        self.requests().iter().filter(|l| l.uri == uri).count()
    }

    /// Stops listening and drops every open connection: the port refuses connections.
    async fn go_down(&self) {
        self.accept.abort();
        for c in self.state.lock().unwrap().connections.drain(..) {
            c.abort();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for FakeDashboard {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut st) = self.state.lock() {
            for c in st.connections.drain(..) {
                c.abort();
            }
        }
    }
}

// ---------------------------------------------------------------- a counting bucket

/// `LocalFileSystem` that records every PUT and can be told to fail them.
#[derive(Debug)]
struct CountingStore {
    inner: LocalFileSystem,
    puts: Mutex<Vec<String>>,
    fail_puts: AtomicBool,
}

impl CountingStore {
    fn new(dir: &Path) -> Arc<CountingStore> {
        Arc::new(CountingStore {
            inner: LocalFileSystem::new_with_prefix(dir).unwrap(),
            puts: Mutex::new(Vec::new()),
            fail_puts: AtomicBool::new(false),
        })
    }

    fn puts(&self) -> Vec<String> {
        self.puts.lock().unwrap().clone()
    }
}

impl fmt::Display for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = object_store::Result<T>> + Send + 'a>>;

// Written out by hand: the trait is declared with `async_trait`, which is not a dependency.
impl ObjectStore for CountingStore {
    fn put_opts<'life0, 'life1, 'async_trait>(
        &'life0 self,
        location: &'life1 ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> BoxFut<'async_trait, PutResult>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            if self.fail_puts.load(Ordering::SeqCst) {
                return Err(object_store::Error::Generic {
                    store: "counting",
                    source: "injected failure".into(),
                });
            }
            self.puts.lock().unwrap().push(location.to_string());
            self.inner.put_opts(location, payload, opts).await
        })
    }

    fn put_multipart_opts<'life0, 'life1, 'async_trait>(
        &'life0 self,
        location: &'life1 ObjectPath,
        opts: PutMultipartOptions,
    ) -> BoxFut<'async_trait, Box<dyn MultipartUpload>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            self.puts.lock().unwrap().push(location.to_string());
            self.inner.put_multipart_opts(location, opts).await
        })
    }

    fn get_opts<'life0, 'life1, 'async_trait>(
        &'life0 self,
        location: &'life1 ObjectPath,
        options: GetOptions,
    ) -> BoxFut<'async_trait, GetResult>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { self.inner.get_opts(location, options).await })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_delimiter<'life0, 'life1, 'async_trait>(
        &'life0 self,
        prefix: Option<&'life1 ObjectPath>,
    ) -> BoxFut<'async_trait, ListResult>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { self.inner.list_with_delimiter(prefix).await })
    }

    fn copy_opts<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        from: &'life1 ObjectPath,
        to: &'life2 ObjectPath,
        options: CopyOptions,
    ) -> BoxFut<'async_trait, ()>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { self.inner.copy_opts(from, to, options).await })
    }
}

// ---------------------------------------------------------------- helpers

fn layout() -> ClusterLayout {
    ClusterLayout {
        root: "root".into(),
        namespace: "default".into(),
        cluster: "raycluster-historyserver".into(),
        owner: Owner::RayCluster,
    }
}

fn config(fake: &FakeDashboard, env: &[(&str, &str)]) -> DashboardConfig {
    let mut vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.push((
        "RAY_COLLECTOR_ADDITIONAL_ENDPOINTS".into(),
        format!(" {EXTRA} ,"),
    ));
    let lookup = move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (mut cfg, _warnings) =
        DashboardConfig::from_env(fake.address(), Duration::from_millis(200), &lookup).unwrap();
    cfg.request_timeout = Duration::from_millis(1500);
    cfg
}

struct Bucket {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: Arc<CountingStore>,
}

fn bucket() -> Bucket {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let store = CountingStore::new(&root);
    Bucket {
        _dir: dir,
        root,
        store,
    }
}

fn poller(cfg: DashboardConfig, b: &Bucket) -> DashboardPoller {
    DashboardPoller::new(cfg, b.store.clone(), layout()).unwrap()
}

fn key(session: &str, uri: &str) -> String {
    format!(
        "{PREFIX}/{session}/fetched_endpoints/{}",
        endpoint_object_name(uri)
    )
}

/// Object names under `P/<session>/fetched_endpoints/` as files on disk.
fn stored_names(b: &Bucket, session: &str) -> BTreeSet<String> {
    let dir = b.root.join(PREFIX).join(session).join("fetched_endpoints");
    match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// The object's bytes, read back through object_store with the exact key.
async fn object(b: &Bucket, session: &str, uri: &str) -> Vec<u8> {
    let path = ObjectPath::parse(key(session, uri)).unwrap();
    b.store
        .get(&path)
        .await
        .unwrap_or_else(|e| panic!("{uri}: {e}"))
        .bytes()
        .await
        .unwrap()
        .to_vec()
}

fn all_stored() -> BTreeSet<String> {
    [
        "restful__api__v0__cluster_metadata",
        "restful__timezone",
        "restful__api__serve__applications",
        "restful__api__v0__placement_groups?detail=1&limit=10000",
        "restful__api__data__datasets__02000000",
        "restful__api__train__v2__runs__v1",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

async fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn session(name: &str) -> Option<ActiveSession> {
    Some(ActiveSession {
        name: name.to_string(),
        dir: PathBuf::from("/tmp/ray").join(name),
    })
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_land_under_kuberay_keys_byte_for_byte() {
    let fake = FakeDashboard::start().await;
    let b = bucket();
    let mut p = poller(config(&fake, &[]), &b);
    let report = p.poll_once(SESSION_A).await;
    assert_eq!(report.failed, Vec::<(String, String)>::new());
    assert_eq!(report.uploaded, 6, "{report:?}");
    assert_eq!(
        report.fetched, 7,
        "six snapshots and the job list: {report:?}"
    );

    // The files on disk carry the exact names ('?', '&', '=' verbatim, no percent-encoding).
    assert_eq!(stored_names(&b, SESSION_A), all_stored());
    let on_disk = b
        .root
        .join(PREFIX)
        .join(SESSION_A)
        .join("fetched_endpoints")
        .join("restful__api__v0__placement_groups?detail=1&limit=10000");
    assert_eq!(std::fs::read(on_disk).unwrap(), fake.body(PG));

    // Keys through object_store, and bodies, are byte-identical to what the dashboard sent.
    let uris = [META, TZ, SERVE, PG, EXTRA, "/api/data/datasets/02000000"];
    for uri in uris {
        assert_eq!(object(&b, SESSION_A, uri).await, fake.body(uri), "{uri}");
    }
    let mut put_keys = b.store.puts();
    put_keys.sort();
    let mut want: Vec<String> = uris.iter().map(|u| key(SESSION_A, u)).collect();
    want.sort();
    assert_eq!(put_keys, want);
    assert!(put_keys.contains(&format!(
        "{PREFIX}/{SESSION_A}/fetched_endpoints/restful__api__v0__placement_groups?detail=1&limit=10000"
    )));
    assert!(put_keys.contains(&format!(
        "{PREFIX}/{SESSION_A}/fetched_endpoints/restful__api__data__datasets__{JOB}"
    )));

    // The job without a job_id is skipped; the request URIs are the ones KubeRay sends.
    let asked: BTreeSet<String> = fake.requests().into_iter().map(|l| l.uri).collect();
    let want: BTreeSet<String> = [
        META,
        TZ,
        SERVE,
        PG,
        EXTRA,
        "/api/jobs/",
        "/api/data/datasets/02000000",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(asked, want);
    // Without a token configured, no auth header is sent.
    assert!(fake.requests().iter().all(|l| l.authorization.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_bodies_are_not_uploaded_again_and_changed_ones_are() {
    let fake = FakeDashboard::start().await;
    let b = bucket();
    let mut p = poller(config(&fake, &[]), &b);
    assert_eq!(p.poll_once(SESSION_A).await.uploaded, 6);
    let after_first = b.store.puts().len();

    let second = p.poll_once(SESSION_A).await;
    assert_eq!(second.uploaded, 0, "{second:?}");
    assert_eq!(
        second.unchanged, 4,
        "serve, placement groups, extra, datasets: {second:?}"
    );
    assert_eq!(b.store.puts().len(), after_first, "nothing rewritten");
    assert_eq!(
        fake.count(META),
        1,
        "one-shot endpoints are asked once per session"
    );
    assert_eq!(fake.count(TZ), 1);
    assert_eq!(fake.count(PG), 2, "periodic endpoints are asked every poll");

    // A longer list (`poll_once` is the final poll, which keeps the longer snapshot).
    let changed = r#"{"result": true, "msg": "", "data": {"result": {"total": 2, "result": [{"placement_group_id": "aa"}, {"placement_group_id": "bb"}]}}}"#;
    fake.set_body(PG, changed);
    let third = p.poll_once(SESSION_A).await;
    assert_eq!(third.uploaded, 1, "{third:?}");
    assert_eq!(b.store.puts().len(), after_first + 1);
    assert_eq!(b.store.puts().last().unwrap(), &key(SESSION_A, PG));
    assert_eq!(object(&b, SESSION_A, PG).await, changed.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_uploads_are_retried_on_the_next_poll() {
    let fake = FakeDashboard::start().await;
    let b = bucket();
    let mut p = poller(config(&fake, &[]), &b);
    b.store.fail_puts.store(true, Ordering::SeqCst);
    let r = p.poll_once(SESSION_A).await;
    assert_eq!(r.uploaded, 0);
    assert_eq!(r.failed.len(), 6, "{r:?}");
    assert!(
        r.failed.iter().all(|(_, why)| why.contains("upload")),
        "{r:?}"
    );
    assert!(stored_names(&b, SESSION_A).is_empty());

    b.store.fail_puts.store(false, Ordering::SeqCst);
    let r = p.poll_once(SESSION_A).await;
    assert_eq!(
        r.uploaded, 6,
        "nothing was marked uploaded by the failed poll: {r:?}"
    );
    assert_eq!(
        fake.count(META),
        2,
        "a one-shot endpoint whose upload failed is asked again"
    );
    assert_eq!(stored_names(&b, SESSION_A), all_stored());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_from_env_and_from_file() {
    let fake = FakeDashboard::start().await;
    fake.require_token(Some(TOKEN));
    let b = bucket();

    // Without a token: every request is refused, reported, nothing stored, no panic.
    let mut p = poller(config(&fake, &[("RAY_AUTH_MODE", "token")]), &b);
    let r = p.poll_once(SESSION_A).await;
    assert_eq!(r.uploaded, 0);
    assert_eq!(
        r.failed.len(),
        6,
        "five static endpoints and the job list: {r:?}"
    );
    for (_, why) in &r.failed {
        assert_eq!(
            why,
            "unauthorized (RAY_AUTH_MODE=token needs RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
        );
    }
    // Unlike KubeRay, one-shot endpoints are asked again after a 401.
    p.poll_once(SESSION_A).await;
    assert_eq!(fake.count(META), 2);
    assert!(stored_names(&b, SESSION_A).is_empty());

    // A wrong token: 403, reported as such.
    let mut p = poller(config(&fake, &[("RAY_AUTH_TOKEN", "wrong")]), &b);
    let r = p.poll_once(SESSION_A).await;
    assert!(
        r.failed
            .iter()
            .all(|(_, why)| why.starts_with("unauthorized (the dashboard rejected")),
        "{r:?}"
    );

    // RAY_AUTH_MODE=token + RAY_AUTH_TOKEN.
    let mut p = poller(
        config(
            &fake,
            &[("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN", TOKEN)],
        ),
        &b,
    );
    let r = p.poll_once(SESSION_A).await;
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(stored_names(&b, SESSION_A), all_stored());
    let last = fake.requests().pop().unwrap();
    assert_eq!(
        last.authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(
        last.x_ray_authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );

    // RAY_AUTH_MODE=token + RAY_AUTH_TOKEN_PATH (trailing newline as a mounted Secret has).
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("auth_token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut p = poller(
        config(
            &fake,
            &[
                ("RAY_AUTH_MODE", "token"),
                ("RAY_AUTH_TOKEN_PATH", token_file.to_str().unwrap()),
            ],
        ),
        &b,
    );
    let r = p.poll_once(SESSION_B).await;
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(r.uploaded, 6);
    assert_eq!(stored_names(&b, SESSION_B), all_stored());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_does_not_hold_up_the_others() {
    let fake = FakeDashboard::start().await;
    fake.set_slow(PG, Duration::from_secs(5));
    let b = bucket();
    let mut cfg = config(&fake, &[]);
    cfg.request_timeout = Duration::from_millis(500);
    let mut p = poller(cfg, &b);
    let started = Instant::now();
    let r = p.poll_once(SESSION_A).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "poll took {took:?}");
    assert_eq!(
        r.failed,
        vec![(PG.to_string(), "timed out after 500ms".to_string())]
    );
    assert_eq!(r.uploaded, 5, "{r:?}");
    let mut want = all_stored();
    want.remove("restful__api__v0__placement_groups?detail=1&limit=10000");
    assert_eq!(stored_names(&b, SESSION_A), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_that_is_down_is_reported_not_fatal() {
    let fake = FakeDashboard::start().await;
    let b = bucket();
    let mut p = poller(config(&fake, &[]), &b);
    assert!(p.poll_once(SESSION_A).await.failed.is_empty());
    fake.go_down().await;

    let r: PollReport = p.poll_once(SESSION_A).await;
    assert!(!r.failed.is_empty());
    assert_eq!(r.uploaded, 0);
    // The one-shot endpoints are done; periodic ones, the extra one and the job list fail.
    let failed: BTreeSet<&str> = r.failed.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(failed, BTreeSet::from([SERVE, PG, EXTRA, "/api/jobs/"]));
    for (uri, why) in &r.failed {
        assert_eq!(why, "dashboard unreachable", "{uri}");
    }

    // The loop keeps going while the dashboard is down, and still stops on shutdown.
    let (_stx, srx) = watch::channel(session(SESSION_A));
    let (dtx, drx) = watch::channel(false);
    let task = tokio::spawn(async move {
        p.run(srx, drx).await;
        p
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    dtx.send(true).unwrap();
    let p = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("run returns after shutdown")
        .expect("run does not panic");
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_follows_sessions_and_stops_on_shutdown() {
    let fake = FakeDashboard::start().await;
    let b = bucket();
    let mut p = poller(config(&fake, &[]), &b);
    let (stx, srx) = watch::channel(None);
    let (dtx, drx) = watch::channel(false);
    let task = tokio::spawn(async move {
        p.run(srx, drx).await;
        p
    });

    // No session yet: nothing to store under, nothing asked.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fake.requests().is_empty());

    stx.send(session(SESSION_A)).unwrap();
    wait_until("three periodic polls", Duration::from_secs(3), || {
        fake.count(PG) >= 3
    })
    .await;
    assert_eq!(stored_names(&b, SESSION_A), all_stored());
    assert_eq!(fake.count(META), 1, "one-shot once per session");
    assert_eq!(fake.count(TZ), 1);
    let puts_a = b.store.puts().len();
    assert_eq!(
        puts_a, 6,
        "unchanged bodies are not uploaded again by the loop"
    );

    // A new session: one-shot endpoints again, everything stored under the new prefix.
    stx.send(session(SESSION_B)).unwrap();
    wait_until(
        "the new session's snapshots",
        Duration::from_secs(3),
        || stored_names(&b, SESSION_B) == all_stored(),
    )
    .await;
    assert_eq!(fake.count(META), 2);
    assert_eq!(fake.count(TZ), 2);
    assert!(b.store.puts()[puts_a..]
        .iter()
        .all(|k| k.starts_with(&format!("{PREFIX}/{SESSION_B}/fetched_endpoints/"))));

    let stopped = Instant::now();
    dtx.send(true).unwrap();
    let mut p = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("run returns after shutdown")
        .unwrap();
    assert!(stopped.elapsed() < Duration::from_secs(1));

    // The final poll at SIGTERM reuses the session's state: nothing changed, nothing written.
    let before = b.store.puts().len();
    let r = p.poll_once(SESSION_B).await;
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(r.uploaded, 0);
    assert_eq!(b.store.puts().len(), before);
    assert_eq!(fake.count(META), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_poll_keeps_serve_and_datasets_snapshots_over_empty_answers() {
    let fake = FakeDashboard::start().await;
    let b = bucket();
    let mut p = poller(config(&fake, &[]), &b);
    assert_eq!(p.poll_once(SESSION_A).await.uploaded, 6);
    let serve = fake.body(SERVE);
    let datasets_uri = format!("/api/data/datasets/{JOB}");
    let datasets = fake.body(&datasets_uri);

    // A Serve controller shutting down and an evicted Ray Data stats actor answer empty.
    fake.set_body(
        SERVE,
        r#"{"proxy_location": "EveryNode", "applications": {}}"#,
    );
    fake.set_body(&datasets_uri, r#"{"datasets": []}"#);
    let r = p.poll_once(SESSION_A).await;
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(r.uploaded, 0, "{r:?}");
    assert_eq!(r.empty, 2, "{r:?}");
    assert_eq!(object(&b, SESSION_A, SERVE).await, serve);
    assert_eq!(object(&b, SESSION_A, &datasets_uri).await, datasets);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_id_by_ip_finds_the_node() {
    let fake = FakeDashboard::start().await;
    fake.require_token(Some(TOKEN));
    let cfg = config(&fake, &[("RAY_AUTH_TOKEN", TOKEN)]);
    // Two nodes share the IP after a raylet restart: the ALIVE one wins, in lower case.
    assert_eq!(
        node_id_by_ip(&cfg, "10.1.2.3").await.unwrap().as_deref(),
        Some("1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5")
    );
    assert_eq!(
        node_id_by_ip(&cfg, "10.1.2.4").await.unwrap().as_deref(),
        Some("ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000ffff0000")
    );
    assert_eq!(node_id_by_ip(&cfg, "10.9.9.9").await.unwrap(), None);
    assert_eq!(
        fake.requests().last().map(|l| l.uri.clone()).as_deref(),
        Some("/api/v0/nodes?limit=10000")
    );

    let no_token = config(&fake, &[]);
    let e = node_id_by_ip(&no_token, "10.1.2.3").await.unwrap_err();
    assert_eq!(e.outcome(), "unauthorized", "{e}");

    fake.go_down().await;
    let e = node_id_by_ip(&cfg, "10.1.2.3").await.unwrap_err();
    assert_eq!(e.to_string(), "dashboard unreachable");
}
