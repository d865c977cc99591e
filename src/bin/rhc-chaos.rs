//! Chaos suite: runs fault scenarios against a collector binary and prints one verdict line
//! per scenario, with its figures.
//!
//! Everything runs on 127.0.0.1: the collector under test, an S3 server (moto or s3s-fs,
//! or plain files), a TCP relay between the two that can be cut (a storage outage that keeps
//! the server's state), and load clients that behave like Ray's publisher (one batch at a
//! time per connection, a refused or unanswered batch resent as is). Each client remembers
//! which events were acknowledged, so every scenario ends by reading the whole bucket back
//! and checking that every acknowledged event is there exactly once, in a valid JSON line.
//!
//! ```text
//! rhc-chaos --collector target/release/ray-history-collector \
//!           --storage moto:.test-deps/venv/bin/moto_server     # the full suite
//! rhc-chaos --collector ... --storage moto:$RHC_MOTO_SERVER --smoke   # the CI subset
//! rhc-chaos --list
//! ```
//!
//! Exit code 0 when no scenario failed (skipped ones do not count), 1 otherwise, 2 for bad
//! arguments. Every wait is bounded; a stuck scenario fails rather than hangs.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use base64::Engine;
use clap::Parser;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::json;

#[allow(dead_code)]
#[path = "common/tcp_relay.rs"]
mod tcp_relay;
use tcp_relay::TcpRelay;

/// Runs fault scenarios against a collector binary.
#[derive(Parser, Debug)]
#[command(name = "rhc-chaos")]
struct Args {
    /// The collector binary under test.
    #[arg(long, default_value = "target/release/ray-history-collector")]
    collector: PathBuf,
    /// Object store: `moto:<path to moto_server>`, `s3s-fs:<path to s3s-fs>`, or `file`
    /// (local directory; the scenarios that cut the storage are then skipped). s3s-fs 0.14.1
    /// answers 500 to keys longer than about 170 bytes, which every event key here is.
    #[arg(long, default_value = "file")]
    storage: String,
    /// The short CI subset: small loads, short outages.
    #[arg(long)]
    smoke: bool,
    /// Run only these scenarios (comma-separated); see --list.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run each selected scenario this many times.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Scratch directory (default: a new one under the system temp dir, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Keep the scratch directory (spools, collector logs, file buckets).
    #[arg(long)]
    keep: bool,
    /// Append every verdict as one JSON object per line to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Size of the spool backlog for `sigterm-backlog`, in MiB.
    #[arg(long, default_value_t = 256)]
    backlog_mib: u64,
    /// Length of the storage outage for `outage`, in seconds (default 60, smoke 6).
    #[arg(long)]
    outage_secs: Option<f64>,
    /// Size of the log file for `logs-2g`, in MiB.
    #[arg(long, default_value_t = 2048)]
    log_mib: u64,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
}

/// name, in the default (full) suite, in the smoke subset, needs a storage that can be cut,
/// what it shows.
const SCENARIOS: &[(&str, bool, bool, bool, &str)] = &[
    (
        "kill9",
        true,
        true,
        false,
        "kill -9 under load, restart, resend: every acked event exactly once",
    ),
    (
        "outage",
        true,
        true,
        true,
        "storage cut under load: 200s until the disk budget, then 503s, then a full drain",
    ),
    (
        "budget",
        true,
        true,
        true,
        "disk budget exhausted: 503 with Retry-After and /readyz 503, then recovery",
    ),
    (
        "sigterm",
        true,
        true,
        false,
        "SIGTERM under load: every acked event uploaded before exit 0",
    ),
    (
        "sigterm-backlog",
        true,
        false,
        false,
        "SIGTERM with --backlog-mib of un-uploaded spool: exit 0 within 15 s",
    ),
    (
        "torn",
        true,
        true,
        false,
        "a spool segment cut mid-line at start: the rest uploaded, the torn line quarantined",
    ),
    (
        "slowloris",
        true,
        true,
        false,
        "slowloris and slow bodies: connections time out, memory flat, Ray's posts still served",
    ),
    (
        "oversized",
        true,
        true,
        false,
        "bodies over --max-body-bytes (declared, chunked, gzip bomb): 413, memory flat",
    ),
    (
        "malformed",
        true,
        true,
        false,
        "a storm of malformed bodies: all 400, no crash, memory flat",
    ),
    (
        "logs-2g",
        false,
        false,
        false,
        "(benchmark) ship one --log-mib log file: time and peak RSS",
    ),
];

// ------------------------------------------------------------------ verdicts

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pass,
    Fail,
    Skip,
}

struct Verdict {
    outcome: Outcome,
    text: String,
    figures: serde_json::Value,
}

impl Verdict {
    fn new(pass: bool, text: String, figures: serde_json::Value) -> Verdict {
        Verdict {
            outcome: if pass { Outcome::Pass } else { Outcome::Fail },
            text,
            figures,
        }
    }
}

type Scenario = fn(&Ctx) -> Result<Verdict, String>;

fn scenario_fn(name: &str) -> Option<Scenario> {
    Some(match name {
        "kill9" => kill9,
        "outage" => outage,
        "budget" => budget,
        "sigterm" => sigterm,
        "sigterm-backlog" => sigterm_backlog,
        "torn" => torn,
        "slowloris" => slowloris,
        "oversized" => oversized,
        "malformed" => malformed,
        "logs-2g" => logs_2g,
        _ => return None,
    })
}

// ------------------------------------------------------------------ small helpers

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn mib(bytes: f64) -> f64 {
    (bytes / 1048576.0 * 10.0).round() / 10.0
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 100.0).round() / 100.0
}

/// Resident memory of `pid` in bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// Samples a process's RSS every 50 ms until dropped; keeps the peak.
struct RssMonitor {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl RssMonitor {
    fn start(pid: u32) -> RssMonitor {
        let peak = Arc::new(AtomicU64::new(rss_bytes(pid).unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let handle = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(r) = rss_bytes(pid) {
                    p.fetch_max(r, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        RssMonitor {
            peak,
            stop,
            handle: Some(handle),
        }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for RssMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ------------------------------------------------------------------ HTTP client

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16, timeout: Duration) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            r: BufReader::with_capacity(16 * 1024, s),
        })
    }

    /// Sends one request; returns the answer and whether the server will close.
    fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<(Resp, bool)> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let s = self.r.get_mut();
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        read_response(&mut self.r)
    }
}

fn read_response(r: &mut BufReader<TcpStream>) -> std::io::Result<(Resp, bool)> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    let mut len = 0usize;
    let mut close = false;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_string(), v.trim().to_string());
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse().unwrap_or(0);
            }
            if k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close") {
                close = true;
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok((
        Resp {
            status,
            headers,
            body,
        },
        close,
    ))
}

/// One request on a fresh connection.
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut c = Conn::open(port, Duration::from_secs(30))?;
    c.request(method, path, headers, body).map(|(r, _)| r)
}

// ------------------------------------------------------------------ events

const NODE_B64: &str = "OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==";
const SESSION: &str = "session_2026-11-22_02-06-36_260774_21819";

/// A Ray 2.60 task lifecycle event of about 0.9 KB with the given id and job. Worker,
/// timestamps and names vary with `seq` as in a real stream (real Ray events gzip about
/// 10:1; identical ones would gzip 100:1 and make the upload side look cheaper than it is).
fn event_json(out: &mut Vec<u8>, id: &str, job: u32, seq: u64) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let job_b64 = b64.encode(job.to_le_bytes());
    let h = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let h2 = h.rotate_left(29) ^ 0xd6e8_feb8_6659_fd93;
    let mut worker = [0u8; 28];
    worker[..8].copy_from_slice(&(h % 64).to_le_bytes());
    worker[8..16].copy_from_slice(&(h2 % 64).wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    let worker = b64.encode(worker);
    let pid = 40_000 + h % 64;
    let funcs = [
        "train_step",
        "load_shard",
        "preprocess",
        "evaluate",
        "checkpoint",
        "map_batches",
        "reduce",
        "fetch",
    ];
    let func = funcs[(h2 % funcs.len() as u64) as usize];
    let (m, sec, ns) = (seq / 60_000 % 60, seq / 1000 % 60, h % 1_000_000_000);
    let t = |k: u64| {
        format!(
            "2026-11-22T02:{m:02}:{sec:02}.{:09}Z",
            (ns + k * 7_919_113) % 1_000_000_000
        )
    };
    let _ = write!(
        out,
        r#"{{"eventId":"{id}","sourceType":"CORE_WORKER","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"{}","severity":"INFO","sessionName":"{SESSION}","nodeId":"{NODE_B64}","taskLifecycleEvent":{{"taskId":"{id}","taskAttempt":0,"jobId":"{job_b64}","nodeId":"{NODE_B64}","workerId":"{worker}","workerPid":{pid},"stateTransitions":[{{"state":"PENDING_ARGS_AVAIL","timestamp":"{}"}},{{"state":"PENDING_NODE_ASSIGNMENT","timestamp":"{}"}},{{"state":"SUBMITTED_TO_WORKER","timestamp":"{}"}},{{"state":"RUNNING","timestamp":"{}"}},{{"state":"FINISHED","timestamp":"{}"}}],"rayErrorInfo":null,"isDebuggerPaused":false,"actorReprName":"","funcOrClassName":"{func}","parentTaskId":"//////////////////////////////8BAAAA"}},"message":""}}"#,
        t(6),
        t(0),
        t(1),
        t(2),
        t(3),
        t(5)
    );
}

/// `[e, e, ...]` for ids `<tag>-<client>-<first..first+n>`.
fn batch_body(tag: &str, client: usize, first: u64, n: usize, jobs: u32) -> Vec<u8> {
    let mut body = Vec::with_capacity(n * 1000 + 2);
    body.push(b'[');
    for i in 0..n as u64 {
        if i > 0 {
            body.push(b',');
        }
        let seq = first + i;
        let id = format!("{tag}-{client}-{seq}");
        event_json(&mut body, &id, (seq % jobs.max(1) as u64) as u32 + 1, seq);
    }
    body.push(b']');
    body
}

const NONE: u8 = 0;
const ACKED: u8 = 1;
const PENDING: u8 = 2;
/// Deliberately destroyed (the torn line): may be missing.
const CUT: u8 = 3;

/// What the clients were told, per `(tag, client)`, indexed by sequence number.
#[derive(Default)]
struct Ledger {
    states: HashMap<(String, usize), Vec<u8>>,
}

impl Ledger {
    fn mark(&mut self, tag: &str, client: usize, first: u64, n: usize, state: u8) {
        let v = self.states.entry((tag.to_string(), client)).or_default();
        let end = (first as usize) + n;
        if v.len() < end {
            v.resize(end, NONE);
        }
        for s in &mut v[first as usize..end] {
            *s = state;
        }
    }

    fn count(&self, state: u8) -> u64 {
        self.states
            .values()
            .map(|v| v.iter().filter(|s| **s == state).count() as u64)
            .sum()
    }
}

// ------------------------------------------------------------------ load clients

#[derive(Clone)]
struct LoadSpec {
    tag: String,
    clients: usize,
    batch: usize,
    /// Events per second over all clients; 0 = as fast as answers come.
    rate: f64,
    jobs: u32,
    /// Hard bound on the load's life.
    max: Duration,
    /// Pause after a 503 (Ray waits before resending).
    retry_pause: Duration,
}

impl LoadSpec {
    fn new(tag: &str, clients: usize, batch: usize) -> LoadSpec {
        LoadSpec {
            tag: tag.to_string(),
            clients,
            batch,
            rate: 0.0,
            jobs: 4,
            max: Duration::from_secs(180),
            retry_pause: Duration::from_millis(100),
        }
    }
}

/// What one client saw.
struct ClientLog {
    client: usize,
    /// (first seq, state) per batch sent.
    batches: Vec<(u64, u8)>,
    /// (ms since the load started, status; 0 = no answer).
    answers: Vec<(u32, u16)>,
    /// 503 answers without a usable Retry-After.
    missing_retry_after: u64,
    /// The batch that was being sent when the load stopped.
    pending: Option<u64>,
}

struct Load {
    spec: LoadSpec,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    started: Instant,
    handles: Vec<JoinHandle<ClientLog>>,
}

impl Load {
    fn start(port: u16, spec: LoadSpec) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let handles = (0..spec.clients)
            .map(|client| {
                let (spec, stop, acked) = (spec.clone(), stop.clone(), acked.clone());
                thread::spawn(move || client_loop(port, client, spec, stop, acked, started))
            })
            .collect();
        Load {
            spec,
            stop,
            acked,
            started,
            handles,
        }
    }

    fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Stops the clients and records what they were told in `ledger`.
    fn finish(self, ledger: &mut Ledger) -> Vec<ClientLog> {
        self.stop.store(true, Ordering::SeqCst);
        let mut logs = Vec::new();
        for h in self.handles {
            if let Ok(log) = h.join() {
                for (first, state) in &log.batches {
                    ledger.mark(&self.spec.tag, log.client, *first, self.spec.batch, *state);
                }
                logs.push(log);
            }
        }
        logs
    }
}

fn client_loop(
    port: u16,
    client: usize,
    spec: LoadSpec,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    started: Instant,
) -> ClientLog {
    let mut log = ClientLog {
        client,
        batches: Vec::new(),
        answers: Vec::new(),
        missing_retry_after: 0,
        pending: None,
    };
    let mut conn: Option<Conn> = None;
    let mut next_seq = 0u64;
    let per_client = spec.rate / spec.clients.max(1) as f64;
    let phase = spec.batch as f64 * client as f64 / spec.clients.max(1) as f64;
    let mut scheduled = 0u64;
    let mut body: Option<(u64, Vec<u8>)> = None;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < spec.max {
        if per_client > 0.0 {
            let due = started + Duration::from_secs_f64((scheduled as f64 + phase) / per_client);
            while Instant::now() < due && !stop.load(Ordering::Relaxed) {
                thread::sleep((due - Instant::now()).min(Duration::from_millis(50)));
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        scheduled += spec.batch as u64;
        let first = match log.pending {
            Some(f) => f,
            None => {
                let f = next_seq;
                next_seq += spec.batch as u64;
                log.pending = Some(f);
                f
            }
        };
        if body.as_ref().map(|(f, _)| *f) != Some(first) {
            body = Some((
                first,
                batch_body(&spec.tag, client, first, spec.batch, spec.jobs),
            ));
        }
        let Some((_, b)) = body.as_ref() else { break };
        if conn.is_none() {
            conn = Conn::open(port, Duration::from_secs(30)).ok();
        }
        let result = match conn.as_mut() {
            Some(c) => c.request(
                "POST",
                "/v1/events",
                &[("Content-Type", "application/json")],
                b,
            ),
            None => Err(std::io::ErrorKind::ConnectionRefused.into()),
        };
        let ms = started.elapsed().as_millis() as u32;
        match result {
            Ok((r, close)) => {
                if close {
                    conn = None;
                }
                log.answers.push((ms, r.status));
                if r.status == 200 {
                    log.batches.push((first, ACKED));
                    log.pending = None;
                    acked.fetch_add(spec.batch as u64, Ordering::Relaxed);
                } else {
                    if r.status == 503
                        && r.header("retry-after")
                            .and_then(|v| v.parse::<u32>().ok())
                            .is_none()
                    {
                        log.missing_retry_after += 1;
                    }
                    thread::sleep(spec.retry_pause);
                }
            }
            Err(_) => {
                conn = None;
                log.answers.push((ms, 0));
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    if let Some(f) = log.pending {
        log.batches.push((f, PENDING));
    }
    log
}

/// Posts one batch until it is acknowledged (Ray's resend), up to `limit`.
fn resend(port: u16, spec: &LoadSpec, client: usize, first: u64, limit: Duration) -> bool {
    let body = batch_body(&spec.tag, client, first, spec.batch, spec.jobs);
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(r) = http(
            port,
            "POST",
            "/v1/events",
            &[("Content-Type", "application/json")],
            &body,
        ) {
            if r.status == 200 {
                return true;
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    false
}

fn count_status(logs: &[ClientLog], status: u16) -> u64 {
    logs.iter()
        .flat_map(|l| l.answers.iter())
        .filter(|(_, s)| *s == status)
        .count() as u64
}

// ------------------------------------------------------------------ storage

#[derive(Clone, Debug)]
enum StoreKind {
    File,
    Moto(PathBuf),
    S3sFs(PathBuf),
}

const S3_KEY: &str = "test";
const S3_SECRET: &str = "testsecret";
const S3_REGION: &str = "us-east-1";
const MOTO_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000";

/// The object store the collectors upload to.
struct Storage {
    kind: StoreKind,
    child: Option<Child>,
    port: u16,
    root: PathBuf,
}

impl Storage {
    fn start(kind: StoreKind, dir: &Path) -> Result<Storage, String> {
        let root = dir.join("storage");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let mut s = Storage {
            kind: kind.clone(),
            child: None,
            port: 0,
            root,
        };
        let (program, args): (PathBuf, Vec<String>) = match &kind {
            StoreKind::File => return Ok(s),
            StoreKind::Moto(p) => (p.clone(), vec![]),
            StoreKind::S3sFs(p) => (
                p.clone(),
                vec![
                    "--access-key".into(),
                    S3_KEY.into(),
                    "--secret-key".into(),
                    S3_SECRET.into(),
                ],
            ),
        };
        for _attempt in 0..3 {
            let port = free_port();
            let log = std::fs::File::create(dir.join("storage.log")).map_err(|e| e.to_string())?;
            let mut cmd = Command::new(&program);
            match &kind {
                StoreKind::Moto(_) => {
                    cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
                }
                _ => {
                    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
                        .args(&args)
                        .arg(&s.root);
                }
            }
            let child = cmd
                .current_dir(dir)
                .env("NO_PROXY", "127.0.0.1,localhost")
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .spawn()
                .map_err(|e| format!("starting {}: {e}", program.display()))?;
            s.child = Some(child);
            s.port = port;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if http(port, "GET", "/", &[], b"").is_ok() {
                    return Ok(s);
                }
                if let Some(c) = s.child.as_mut() {
                    if c.try_wait().ok().flatten().is_some() {
                        s.child = None;
                        break;
                    }
                }
                if Instant::now() > deadline {
                    return Err(format!("{} did not answer within 60 s", program.display()));
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
        Err(format!("{} exited at start three times", program.display()))
    }

    fn can_cut(&self) -> bool {
        !matches!(self.kind, StoreKind::File)
    }

    fn describe(&self) -> String {
        match &self.kind {
            StoreKind::File => "file".into(),
            StoreKind::Moto(_) => "moto (S3)".into(),
            StoreKind::S3sFs(_) => "s3s-fs (S3)".into(),
        }
    }

    fn create_bucket(&self, name: &str) -> Result<(), String> {
        match &self.kind {
            StoreKind::Moto(_) => {
                let r = http(
                    self.port,
                    "PUT",
                    &format!("/{name}"),
                    &[("Authorization", MOTO_AUTH)],
                    b"",
                )
                .map_err(|e| format!("creating bucket {name}: {e}"))?;
                if r.status != 200 {
                    return Err(format!("creating bucket {name}: HTTP {}", r.status));
                }
                Ok(())
            }
            _ => std::fs::create_dir_all(self.root.join(name)).map_err(|e| e.to_string()),
        }
    }

    /// `--storage` value and environment for a collector reaching the store on `port`.
    fn collector_config(&self, bucket: &str, port: u16) -> (String, Vec<(String, String)>) {
        match &self.kind {
            StoreKind::File => (
                format!("file://{}", self.root.join(bucket).display()),
                vec![],
            ),
            _ => (
                format!("s3://{bucket}"),
                vec![
                    ("AWS_ENDPOINT".into(), format!("http://127.0.0.1:{port}")),
                    ("AWS_ALLOW_HTTP".into(), "true".into()),
                    ("AWS_ACCESS_KEY_ID".into(), S3_KEY.into()),
                    ("AWS_SECRET_ACCESS_KEY".into(), S3_SECRET.into()),
                    ("AWS_REGION".into(), S3_REGION.into()),
                ],
            ),
        }
    }

    fn store(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, String> {
        match &self.kind {
            StoreKind::File => {
                object_store::local::LocalFileSystem::new_with_prefix(self.root.join(bucket))
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
                    .map_err(|e| e.to_string())
            }
            _ => object_store::aws::AmazonS3Builder::new()
                .with_endpoint(format!("http://127.0.0.1:{}", self.port))
                .with_bucket_name(bucket)
                .with_allow_http(true)
                .with_region(S3_REGION)
                .with_access_key_id(S3_KEY)
                .with_secret_access_key(S3_SECRET)
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
                .map_err(|e| e.to_string()),
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Calls `f` with every object of the bucket (key, bytes as stored).
fn for_each_object(
    store: &Arc<dyn ObjectStore>,
    mut f: impl FnMut(&str, &[u8]),
) -> Result<usize, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        use futures::TryStreamExt;
        let metas: Vec<_> = store
            .list(None)
            .try_collect()
            .await
            .map_err(|e| format!("listing the bucket: {e}"))?;
        for m in &metas {
            let bytes = store
                .get(&m.location)
                .await
                .map_err(|e| format!("GET {}: {e}", m.location))?
                .bytes()
                .await
                .map_err(|e| format!("GET {}: {e}", m.location))?;
            f(m.location.as_ref(), &bytes);
        }
        Ok(metas.len())
    })
}

fn gunzip_if(key: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| format!("{key}: not gzip: {e}"))?;
        Ok(out)
    } else {
        Ok(bytes.to_vec())
    }
}

#[derive(serde::Deserialize)]
struct IdOnly<'a> {
    #[serde(rename = "eventId", borrow)]
    event_id: Option<Cow<'a, str>>,
}

/// The bucket checked against the ledger.
#[derive(Default, Debug)]
struct Check {
    objects: usize,
    event_objects: usize,
    lines: u64,
    broken_lines: u64,
    unknown: u64,
    lost: u64,
    duplicated: u64,
    pending_stored: u64,
    compressed_bytes: u64,
    quarantine_lines: Vec<String>,
    problems: Vec<String>,
    /// How long reading the bucket back took.
    seconds: f64,
}

impl Check {
    fn ok(&self) -> bool {
        self.broken_lines == 0
            && self.unknown == 0
            && self.lost == 0
            && self.duplicated == 0
            && self.problems.is_empty()
    }

    fn summary(&self) -> String {
        let mut s = format!(
            "{} lost, {} duplicated, {} broken lines, {} unknown",
            self.lost, self.duplicated, self.broken_lines, self.unknown
        );
        if !self.problems.is_empty() {
            s.push_str(&format!(" ({})", self.problems.join("; ")));
        }
        s
    }

    fn figures(&self) -> serde_json::Value {
        json!({"objects": self.objects, "event_lines": self.lines, "lost": self.lost,
               "duplicated": self.duplicated, "broken_lines": self.broken_lines,
               "unknown": self.unknown, "pending_stored": self.pending_stored,
               "verify_s": (self.seconds * 100.0).round() / 100.0})
    }
}

fn verify(store: &Arc<dyn ObjectStore>, ledger: &Ledger) -> Check {
    let started = Instant::now();
    let mut check = Check::default();
    let mut counts: HashMap<(String, usize), Vec<u8>> = ledger
        .states
        .iter()
        .map(|(k, v)| (k.clone(), vec![0u8; v.len()]))
        .collect();
    let listed = for_each_object(store, |key, bytes| {
        let is_events = key.contains("/node_events/") || key.contains("/job_events/");
        let is_quarantine = key.contains("collector-quarantine/") && !key.contains("/bodies/");
        if !is_events && !is_quarantine {
            return;
        }
        let text = match gunzip_if(key, bytes) {
            Ok(t) => t,
            Err(e) => {
                check.problems.push(e);
                return;
            }
        };
        if is_quarantine {
            for l in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                check
                    .quarantine_lines
                    .push(String::from_utf8_lossy(l).into_owned());
            }
            return;
        }
        check.event_objects += 1;
        check.compressed_bytes += bytes.len() as u64;
        if !text.is_empty() && !text.ends_with(b"\n") {
            check
                .problems
                .push(format!("{key} does not end with a newline"));
        }
        for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            check.lines += 1;
            let Ok(parsed) = serde_json::from_slice::<IdOnly>(line) else {
                check.broken_lines += 1;
                continue;
            };
            let Some(id) = parsed.event_id else {
                check.unknown += 1;
                continue;
            };
            let mut parts = id.rsplitn(3, '-');
            let (Some(seq), Some(client), Some(tag)) = (parts.next(), parts.next(), parts.next())
            else {
                check.unknown += 1;
                continue;
            };
            let (Ok(seq), Ok(client)) = (seq.parse::<usize>(), client.parse::<usize>()) else {
                check.unknown += 1;
                continue;
            };
            match counts.get_mut(&(tag.to_string(), client)) {
                Some(c) if seq < c.len() => c[seq] = c[seq].saturating_add(1),
                _ => check.unknown += 1,
            }
        }
    });
    match listed {
        Ok(n) => check.objects = n,
        Err(e) => check.problems.push(e),
    }
    check.seconds = started.elapsed().as_secs_f64();
    for (k, states) in &ledger.states {
        let Some(c) = counts.get(k) else { continue };
        for (s, n) in states.iter().zip(c) {
            match (*s, *n) {
                (ACKED, 0) => check.lost += 1,
                (PENDING, 1) => check.pending_stored += 1,
                (_, n) if n > 1 => check.duplicated += 1,
                (NONE, n) if n > 0 => check.unknown += 1,
                _ => {}
            }
        }
    }
    check
}

// ------------------------------------------------------------------ the collector

struct Collector {
    bin: PathBuf,
    port: u16,
    spool: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Collector {
    fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Starts the process and waits for /healthz; returns how long that took.
    fn spawn(&mut self) -> Result<Duration, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--spool-dir")
            .arg(&self.spool)
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        for k in [
            "STORAGE_BACKEND",
            "RHC_STORAGE",
            "EVENTS_PORT",
            "RAY_ROLE",
            "RHC_NODE_ID",
            "RHC_LISTEN",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let started = Instant::now();
        self.child = Some(
            cmd.spawn()
                .map_err(|e| format!("starting {}: {e}", self.bin.display()))?,
        );
        let deadline = started + Duration::from_secs(30);
        loop {
            if let Ok(r) = http(self.port, "GET", "/healthz", &[], b"") {
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
                    "collector exited at start ({status}):\n{}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "collector not ready within 30 s:\n{}",
                    self.log_tail()
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal_term(&self) {
        if let Some(c) = &self.child {
            // SAFETY: a signal to our own child process.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
    }

    /// Waits for the exit (after a SIGTERM); kills it after `limit`.
    fn wait_exit(&mut self, limit: Duration) -> Result<Option<i32>, String> {
        let Some(mut child) = self.child.take() else {
            return Err("not running".into());
        };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok(s.code());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("collector did not exit within {limit:?}"));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM and wait; returns the exit code and how long the shutdown took.
    fn terminate(&mut self, limit: Duration) -> Result<(Option<i32>, Duration), String> {
        let t = Instant::now();
        self.signal_term();
        let code = self.wait_exit(limit)?;
        Ok((code, t.elapsed()))
    }

    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    fn rss(&self) -> u64 {
        rss_bytes(self.pid()).unwrap_or(0)
    }

    /// A metric from /metrics (sum over label sets), NaN when it cannot be read.
    fn metric(&self, name: &str) -> f64 {
        let Ok(r) = http(self.port, "GET", "/metrics", &[], b"") else {
            return f64::NAN;
        };
        String::from_utf8_lossy(&r.body)
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let t = self.log_text();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.kill9();
    }
}

// ------------------------------------------------------------------ context

struct Ctx {
    bin: PathBuf,
    storage: Storage,
    work: PathBuf,
    smoke: bool,
    args: Args,
    seq: AtomicUsize,
}

/// A fresh bucket and collector for one scenario; uploads go through a relay when asked.
struct Setup {
    bucket: String,
    collector: Collector,
    relay: Option<TcpRelay>,
}

impl Ctx {
    fn pick<T>(&self, smoke: T, full: T) -> T {
        if self.smoke {
            smoke
        } else {
            full
        }
    }

    fn setup(&self, name: &str, relay: bool, extra: &[&str]) -> Result<Setup, String> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let bucket = format!("chaos-{name}-{n}");
        self.storage.create_bucket(&bucket)?;
        let relay = if relay {
            Some(TcpRelay::start(&format!(
                "127.0.0.1:{}",
                self.storage.port
            ))?)
        } else {
            None
        };
        let via = relay.as_ref().map(|r| r.port).unwrap_or(self.storage.port);
        let (url, env) = self.storage.collector_config(&bucket, via);
        let dir = self.work.join(format!("{name}-{n}"));
        let raytmp = dir.join("ray");
        std::fs::create_dir_all(&raytmp).map_err(|e| e.to_string())?;
        let mut args: Vec<String> = vec![
            "--storage".into(),
            url,
            "--cluster-name".into(),
            "chaos".into(),
            "--enable-log-collector".into(),
            "false".into(),
            "--enable-export-events".into(),
            "false".into(),
            "--ray-tmp-dir".into(),
            raytmp.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut collector = Collector {
            bin: self.bin.clone(),
            port: free_port(),
            spool: dir.join("spool"),
            log: dir.join("collector.log"),
            args,
            env,
            child: None,
        };
        collector.spawn()?;
        Ok(Setup {
            bucket,
            collector,
            relay,
        })
    }
}

// ------------------------------------------------------------------ scenarios

fn kill9(ctx: &Ctx) -> Result<Verdict, String> {
    let mut s = ctx.setup("kill9", false, &["--rotation-interval", "1s"])?;
    let cycles = ctx.pick(1, 3);
    let load_for = ctx.pick(Duration::from_millis(2500), Duration::from_secs(4));
    let mut ledger = Ledger::default();
    let mut recovered_files = 0u64;
    let mut ready_max = Duration::ZERO;
    let mut resent = 0u64;
    let mut acked_before_kill = 0u64;
    for cycle in 0..cycles {
        let mut spec = LoadSpec::new(&format!("k9c{cycle}"), 4, ctx.pick(200, 1000));
        spec.max = Duration::from_secs(60);
        // The smoke run uses a debug build: a modest rate keeps its upload short.
        spec.rate = ctx.pick(4_000.0, 0.0);
        let load = Load::start(s.collector.port, spec.clone());
        // A different phase each cycle, so the kill lands at different points of a group.
        thread::sleep(load_for + Duration::from_millis(370 * cycle as u64));
        s.collector.kill9();
        acked_before_kill += load.acked();
        let logs = load.finish(&mut ledger);
        let before = s.collector.log_text().len();
        ready_max = ready_max.max(s.collector.spawn()?);
        let log = s.collector.log_text();
        if let Some(i) = log[before..].find("found files of an earlier run") {
            let rest = &log[before + i..];
            if let Some(n) = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("files="))
                .and_then(|n| n.parse::<u64>().ok())
            {
                recovered_files += n;
            }
        }
        for l in &logs {
            if let Some(first) = l.pending {
                if !resend(
                    s.collector.port,
                    &spec,
                    l.client,
                    first,
                    Duration::from_secs(30),
                ) {
                    return Err(format!(
                        "cycle {cycle}: the resent batch was never acknowledged"
                    ));
                }
                ledger.mark(&spec.tag, l.client, first, spec.batch, ACKED);
                resent += spec.batch as u64;
            }
        }
    }
    let (code, took) = s.collector.terminate(Duration::from_secs(90))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let acked = ledger.count(ACKED);
    let pass = check.ok() && code == Some(0) && acked_before_kill > 0 && recovered_files > 0;
    Ok(Verdict::new(
        pass,
        format!(
            "{cycles} kill -9 under load (4 clients × {}): {acked} acked events ({resent} resent after restart), {}; {recovered_files} files recovered, ready {:.2} s after restart; exit {code:?} after {:.1} s",
            ctx.pick(200, 1000),
            check.summary(),
            ready_max.as_secs_f64(),
            took.as_secs_f64(),
        ),
        json!({"cycles": cycles, "acked": acked, "resent": resent, "recovered_files": recovered_files,
               "ready_after_restart_s": secs(ready_max), "exit_code": code, "shutdown_s": secs(took),
               "check": check.figures()}),
    ))
}

fn sigterm(ctx: &Ctx) -> Result<Verdict, String> {
    let mut s = ctx.setup("sigterm", false, &[])?;
    let mut ledger = Ledger::default();
    let mut spec = LoadSpec::new("term", 4, ctx.pick(200, 1000));
    spec.rate = ctx.pick(4_000.0, 0.0);
    let load = Load::start(s.collector.port, spec);
    thread::sleep(ctx.pick(Duration::from_secs(2), Duration::from_secs(5)));
    let spool_at_term = s.collector.metric("rhc_spool_bytes");
    let t = Instant::now();
    s.collector.signal_term();
    // The clients keep posting through the shutdown, as Ray would.
    let code = s.collector.wait_exit(Duration::from_secs(60));
    let took = t.elapsed();
    let logs = load.finish(&mut ledger);
    let code = code?;
    let refused_503 = count_status(&logs, 503);
    let left = walk_files(&s.collector.spool.join("events"));
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let acked = ledger.count(ACKED);
    let pass = check.ok() && code == Some(0) && left == 0 && acked > 0;
    Ok(Verdict::new(
        pass,
        format!(
            "SIGTERM under load (4 clients × {}) with {:.1} MB in the spool: exit {code:?} after {:.2} s; {acked} acked events, {}; {refused_503} requests got 503 while shutting down; {left} segments left",
            ctx.pick(200, 1000),
            spool_at_term / 1e6,
            took.as_secs_f64(),
            check.summary()
        ),
        json!({"acked": acked, "shutdown_s": secs(took), "exit_code": code, "spool_mb_at_term": spool_at_term / 1e6,
               "shutting_down_503": refused_503, "segments_left": left, "check": check.figures()}),
    ))
}

fn walk_files(dir: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += walk_files(&p);
            } else {
                n += 1;
            }
        }
    }
    n
}

fn sigterm_backlog(ctx: &Ctx) -> Result<Verdict, String> {
    let target = ctx.args.backlog_mib << 20;
    let budget = format!("{}", (target * 4).max(1 << 30));
    let mut s = ctx.setup(
        "backlog",
        false,
        &[
            "--rotation-interval",
            "1h",
            "--max-segment-bytes",
            "4GiB",
            "--max-spool-bytes",
            &budget,
            "--shutdown-timeout",
            "25s",
        ],
    )?;
    let mut ledger = Ledger::default();
    let spec = LoadSpec::new("backlog", 4, 1000);
    let load = Load::start(s.collector.port, spec);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut spool = 0.0;
    while Instant::now() < deadline {
        spool = s.collector.metric("rhc_spool_bytes");
        if spool >= target as f64 {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    load.finish(&mut ledger);
    spool = s.collector.metric("rhc_spool_bytes").max(spool);
    let uploaded_before = s
        .collector
        .metric("rhc_upload_bytes_total{kind=\"events\"}");
    let rss = RssMonitor::start(s.collector.pid());
    let (code, took) = s.collector.terminate(Duration::from_secs(60))?;
    let rss_peak = rss.peak();
    drop(rss);
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let acked = ledger.count(ACKED);
    let within = took <= Duration::from_secs(15);
    let pass = check.ok() && code == Some(0) && within && spool >= target as f64;
    Ok(Verdict::new(
        pass,
        format!(
            "SIGTERM with {:.0} MB un-uploaded in the spool ({acked} events, to {}): exit {code:?} after {:.2} s (target ≤ 15 s), {:.0} MB/s of spool; uploaded {:.1} MB gzip; {}; RSS peak {:.1} MiB",
            spool / 1e6,
            ctx.storage.describe(),
            took.as_secs_f64(),
            spool / 1e6 / took.as_secs_f64(),
            check.compressed_bytes as f64 / 1e6,
            check.summary(),
            mib(rss_peak as f64),
        ),
        json!({"spool_mb": spool / 1e6, "acked": acked, "shutdown_s": secs(took), "exit_code": code,
               "uploaded_before_term": uploaded_before, "gzip_mb": check.compressed_bytes as f64 / 1e6,
               "rss_peak_mib": mib(rss_peak as f64), "check": check.figures()}),
    ))
}

fn torn(ctx: &Ctx) -> Result<Verdict, String> {
    let mut s = ctx.setup("torn", false, &[])?;
    let mut ledger = Ledger::default();
    let spec = LoadSpec::new("torn", 1, 100);
    for b in 0..5u64 {
        if !resend(s.collector.port, &spec, 0, b * 100, Duration::from_secs(10)) {
            return Err("could not post the batches".into());
        }
        ledger.mark("torn", 0, b * 100, 100, ACKED);
    }
    s.collector.kill9();
    // The biggest segment left open by the crash gets its last line cut in half.
    let mut segs = Vec::new();
    collect_files(&s.collector.spool.join("events"), &mut segs);
    segs.retain(|p| p.extension().is_some_and(|e| e == "jsonl"));
    segs.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
    let seg = segs.pop().ok_or("no segment in the spool after kill -9")?;
    let data = std::fs::read(&seg).map_err(|e| e.to_string())?;
    let body = &data[..data.len() - 1];
    let last_start = body
        .iter()
        .rposition(|&c| c == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    let last = &data[last_start..data.len() - 1];
    let cut_at = last_start + last.len() / 2;
    let id: String = serde_json::from_slice::<IdOnly>(last)
        .ok()
        .and_then(|e| e.event_id.map(|c| c.into_owned()))
        .ok_or("cannot read the last event of the segment")?;
    let seq: u64 = id
        .rsplit('-')
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or("bad id")?;
    ledger.mark("torn", 0, seq, 1, CUT);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .map_err(|e| e.to_string())?;
    f.set_len(cut_at as u64).map_err(|e| e.to_string())?;
    drop(f);
    let before = s.collector.log_text().len();
    s.collector.spawn()?;
    let log = s.collector.log_text()[before..].to_string();
    let (code, _) = s.collector.terminate(Duration::from_secs(60))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let seg_name = seg
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let quarantined = check
        .quarantine_lines
        .iter()
        .find(|l| l.contains("\"torn_line\""));
    let quarantine_ok = quarantined.is_some_and(|l| {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
        v["source_file"].as_str() == Some(seg_name.as_str())
            && v["source_offset"].as_u64() == Some(last_start as u64)
            && v["raw"]
                .as_str()
                .is_some_and(|r| r.as_bytes() == &data[last_start..cut_at])
    });
    let logged = log.contains("torn_lines=1");
    let pass = check.ok() && code == Some(0) && quarantine_ok && logged;
    Ok(Verdict::new(
        pass,
        format!(
            "segment cut mid-line at byte {cut_at} of {}: {} of {} events uploaded, {}; torn line in quarantine with its offset: {}; exit {code:?}",
            data.len(),
            check.lines,
            ledger.count(ACKED) + 1,
            check.summary(),
            if quarantine_ok { "yes" } else { "NO" },
        ),
        json!({"segment_bytes": data.len(), "cut_at": cut_at, "uploaded_lines": check.lines,
               "quarantined": quarantine_ok, "logged": logged, "exit_code": code, "check": check.figures()}),
    ))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                collect_files(&p, out);
            } else {
                out.push(p);
            }
        }
    }
}

fn budget(ctx: &Ctx) -> Result<Verdict, String> {
    if !ctx.storage.can_cut() {
        return Ok(skip(
            "needs an S3 server to cut (--storage moto:… or s3s-fs:…)",
        ));
    }
    let budget_bytes: u64 = ctx.pick(2 << 20, 64 << 20);
    let mut s = ctx.setup(
        "budget",
        true,
        &[
            "--max-spool-bytes",
            &budget_bytes.to_string(),
            "--rotation-interval",
            "1s",
        ],
    )?;
    let Some(relay) = s.relay.as_mut() else {
        return Err("no relay".into());
    };
    relay.cut();
    let mut ledger = Ledger::default();
    let spec = LoadSpec::new("budget", 1, ctx.pick(100, 1000));
    let port = s.collector.port;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first = 0u64;
    let mut refused: Option<Resp> = None;
    let mut conn = Conn::open(port, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    while Instant::now() < deadline {
        let body = batch_body(&spec.tag, 0, first, spec.batch, spec.jobs);
        let (r, _) = conn
            .request(
                "POST",
                "/v1/events",
                &[("Content-Type", "application/json")],
                &body,
            )
            .map_err(|e| e.to_string())?;
        match r.status {
            200 => {
                ledger.mark(&spec.tag, 0, first, spec.batch, ACKED);
                first += spec.batch as u64;
            }
            503 => {
                refused = Some(r);
                break;
            }
            other => return Err(format!("unexpected HTTP {other} while filling the spool")),
        }
    }
    let Some(refused) = refused else {
        return Ok(Verdict::new(
            false,
            "never answered 503 while the storage was down".into(),
            json!({}),
        ));
    };
    let accepted_before = first;
    let spool_at_503 = s.collector.metric("rhc_spool_bytes");
    let retry_after = refused.header("retry-after").map(str::to_string);
    let says_why = String::from_utf8_lossy(&refused.body).contains("watermark");
    let ready_503 = http(port, "GET", "/readyz", &[], b"")
        .map(|r| r.status)
        .unwrap_or(0)
        == 503;
    // Still refusing while the storage stays down.
    thread::sleep(Duration::from_millis(500));
    let body = batch_body(&spec.tag, 0, first, spec.batch, spec.jobs);
    let still = http(
        port,
        "POST",
        "/v1/events",
        &[("Content-Type", "application/json")],
        &body,
    )
    .map(|r| r.status)
    .unwrap_or(0);
    ledger.mark(&spec.tag, 0, first, spec.batch, PENDING);
    if let Some(r) = s.relay.as_mut() {
        r.restore()?;
    }
    let restored = Instant::now();
    let mut recovered = None;
    while restored.elapsed() < Duration::from_secs(90) {
        if let Ok(r) = http(
            port,
            "POST",
            "/v1/events",
            &[("Content-Type", "application/json")],
            &body,
        ) {
            if r.status == 200 {
                recovered = Some(restored.elapsed());
                ledger.mark(&spec.tag, 0, first, spec.batch, ACKED);
                break;
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    let ready_after = http(port, "GET", "/readyz", &[], b"")
        .map(|r| r.status)
        .unwrap_or(0);
    let (code, _) = s.collector.terminate(Duration::from_secs(60))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let ra_ok = retry_after
        .as_deref()
        .and_then(|v| v.parse::<u32>().ok())
        .is_some();
    let pass = check.ok()
        && code == Some(0)
        && ra_ok
        && says_why
        && ready_503
        && still == 503
        && recovered.is_some()
        && ready_after == 200;
    Ok(Verdict::new(
        pass,
        format!(
            "budget {:.0} MiB, storage down: {accepted_before} events accepted ({:.1} MB spooled), then 503 Retry-After: {}, /readyz {}; storage back: 200 again after {}, /readyz {ready_after}; {}; exit {code:?}",
            mib(budget_bytes as f64),
            spool_at_503 / 1e6,
            retry_after.as_deref().unwrap_or("MISSING"),
            if ready_503 { 503 } else { 200 },
            recovered.map(|d| format!("{:.2} s", d.as_secs_f64())).unwrap_or_else(|| "NEVER".into()),
            check.summary()
        ),
        json!({"budget_bytes": budget_bytes, "accepted_before_503": accepted_before, "spool_bytes_at_503": spool_at_503,
               "retry_after": retry_after, "readyz_503": ready_503, "recovered_s": recovered.map(secs),
               "exit_code": code, "check": check.figures()}),
    ))
}

fn outage(ctx: &Ctx) -> Result<Verdict, String> {
    if !ctx.storage.can_cut() {
        return Ok(skip(
            "needs an S3 server to cut (--storage moto:… or s3s-fs:…)",
        ));
    }
    let outage_for = Duration::from_secs_f64(ctx.args.outage_secs.unwrap_or(ctx.pick(6.0, 60.0)));
    let budget_bytes: u64 = ctx.pick(8 << 20, 256 << 20);
    let mut s = ctx.setup(
        "outage",
        true,
        &[
            "--max-spool-bytes",
            &budget_bytes.to_string(),
            "--rotation-interval",
            "1s",
            "--shutdown-timeout",
            "60s",
        ],
    )?;
    let mut spec = LoadSpec::new("outage", 4, ctx.pick(100, 1000));
    // Fills the budget in about a quarter of the outage: 200s, then 503s.
    spec.rate = ctx.pick(2_000.0, 20_000.0);
    spec.max = Duration::from_secs(600);
    let port = s.collector.port;
    let pid = s.collector.pid();
    let rss = RssMonitor::start(pid);
    let load = Load::start(port, spec);
    thread::sleep(Duration::from_secs(2));
    let cut_at = load.started.elapsed();
    if let Some(r) = s.relay.as_mut() {
        r.cut();
    }
    let mut spool_peak: f64 = 0.0;
    let outage_end = Instant::now() + outage_for;
    while Instant::now() < outage_end {
        spool_peak = spool_peak.max(s.collector.metric("rhc_spool_bytes"));
        thread::sleep(Duration::from_millis(250));
    }
    let failures = s.collector.metric("rhc_upload_failures_total");
    if let Some(r) = s.relay.as_mut() {
        r.restore()?;
    }
    let restored = Instant::now();
    let restored_at = load.started.elapsed();
    // Load goes on until the answers are 200 again (plus a little), then stops, and the
    // spool must drain to zero while the collector keeps running.
    let mut drained = None;
    let mut load = Some(load);
    let mut ledger = Ledger::default();
    let mut logs = Vec::new();
    let mut stop_load_at: Option<Instant> = None;
    let accepted_before = s.collector.metric("rhc_events_accepted_total");
    let mut recovered_at = None;
    while restored.elapsed() < Duration::from_secs(180) {
        if load.is_some()
            && recovered_at.is_none()
            && s.collector.metric("rhc_events_accepted_total") > accepted_before
        {
            recovered_at = Some(restored.elapsed());
            stop_load_at = Some(Instant::now() + Duration::from_secs(3));
        }
        if stop_load_at.is_some_and(|t| Instant::now() >= t) {
            if let Some(l) = load.take() {
                logs = l.finish(&mut ledger);
            }
            stop_load_at = None;
        }
        let spool = s.collector.metric("rhc_spool_bytes");
        spool_peak = spool_peak.max(spool);
        if load.is_none() && spool == 0.0 {
            drained = Some(restored.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    if let Some(l) = load.take() {
        logs = l.finish(&mut ledger);
    }
    let rss_peak = rss.peak();
    drop(rss);
    let (code, took) = s.collector.terminate(Duration::from_secs(90))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    // The answers during the outage: 200s first, then 503s.
    let cut_ms = cut_at.as_millis() as u32;
    let restored_ms = restored_at.as_millis() as u32;
    let mut during: Vec<(u32, u16)> = logs
        .iter()
        .flat_map(|l| l.answers.iter().copied())
        .filter(|(t, _)| *t >= cut_ms && *t < restored_ms)
        .collect();
    during.sort_unstable();
    let ok_during = during.iter().filter(|(_, s)| *s == 200).count();
    let refused_during = during.iter().filter(|(_, s)| *s == 503).count();
    let first_503 = during.iter().find(|(_, s)| *s == 503).map(|(t, _)| *t);
    let ok_after_first_503 = first_503.map_or(0, |f| {
        during
            .iter()
            .filter(|(t, s)| *t > f + 1000 && *s == 200)
            .count()
    });
    let other = logs
        .iter()
        .flat_map(|l| l.answers.iter())
        .filter(|(_, s)| *s != 200 && *s != 503 && *s != 0)
        .count();
    // Connections the server closed under a client that wanted to reuse them (after a
    // 503 whose body was not read): a resend on a new connection follows.
    let dropped = count_status(&logs, 0);
    let mut dropped_at: Vec<f64> = logs
        .iter()
        .flat_map(|l| l.answers.iter())
        .filter(|(_, s)| *s == 0)
        .map(|(t, _)| (*t as f64 - cut_ms as f64) / 1000.0)
        .collect();
    dropped_at.sort_by(f64::total_cmp);
    dropped_at.truncate(8);
    let missing_ra: u64 = logs.iter().map(|l| l.missing_retry_after).sum();
    let batch = ctx.pick(100, 1000);
    let pass = check.ok()
        && code == Some(0)
        && ok_during > 0
        && refused_during > 0
        && missing_ra == 0
        && other == 0
        && recovered_at.is_some()
        && drained.is_some()
        && failures > 0.0;
    Ok(Verdict::new(
        pass,
        format!(
            "storage cut {:.0} s under {:.0} events/s (budget {:.0} MiB): {} events acked during the outage, first 503 {:.1} s after the cut, then {refused_during} × 503 (all with Retry-After: {}), {ok_after_first_503} × 200 in between, {other} other answers, {dropped} dropped connections, {failures} failed uploads; after restore: 200 again in {}, spool drained to 0 in {} (peak {:.0} MB); RSS peak {:.1} MiB; {}; exit {code:?} after {:.1} s",
            outage_for.as_secs_f64(),
            ctx.pick(2_000.0, 20_000.0),
            mib(budget_bytes as f64),
            ok_during * batch,
            first_503.map(|f| (f - cut_ms) as f64 / 1000.0).unwrap_or(f64::NAN),
            if missing_ra == 0 { "yes" } else { "NO" },
            recovered_at.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_else(|| "NEVER".into()),
            drained.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_else(|| "NEVER".into()),
            spool_peak / 1e6,
            mib(rss_peak as f64),
            check.summary(),
            took.as_secs_f64()
        ),
        json!({"outage_s": outage_for.as_secs_f64(), "budget_bytes": budget_bytes, "acked_during_outage": ok_during * batch,
               "first_503_after_cut_s": first_503.map(|f| (f - cut_ms) as f64 / 1000.0), "refused_503": refused_during,
               "ok_after_first_503": ok_after_first_503, "other_statuses": other, "dropped_connections": dropped, "dropped_s_after_cut": dropped_at, "missing_retry_after": missing_ra,
               "recovered_s": recovered_at.map(secs), "drained_s": drained.map(secs), "spool_peak_mb": spool_peak / 1e6,
               "upload_failures": failures, "rss_peak_mib": mib(rss_peak as f64), "exit_code": code,
               "check": check.figures()}),
    ))
}

fn slowloris(ctx: &Ctx) -> Result<Verdict, String> {
    let mut s = ctx.setup("slowloris", false, &[])?;
    let port = s.collector.port;
    let pid = s.collector.pid();
    // Warm: one real batch so the baseline includes the steady-state buffers.
    let spec = LoadSpec::new("slow", 1, 100);
    let mut ledger = Ledger::default();
    if !resend(port, &spec, 0, 0, Duration::from_secs(10)) {
        return Err("warm-up batch refused".into());
    }
    ledger.mark("slow", 0, 0, 100, ACKED);
    // The paced client runs alone first, so the baseline holds its buffers too.
    let mut legit = LoadSpec::new("slowok", 1, 100);
    legit.rate = 500.0;
    let warm = Load::start(port, legit.clone());
    thread::sleep(Duration::from_secs(3));
    warm.finish(&mut ledger);
    legit.tag = "slowok2".into();
    let rss_before = s.collector.rss();
    let fds_before = open_fds(pid);
    let rss = RssMonitor::start(pid);
    let n_headers = ctx.pick(20, 300);
    let n_bodies = ctx.pick(0, 40);
    // Slowloris: a request line and then one header byte per second, never finishing.
    let mut slow: Vec<(TcpStream, bool, Option<Duration>)> = Vec::new();
    for i in 0..n_headers + n_bodies {
        let mut st =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        let head = if i < n_headers {
            "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_string()
        } else {
            "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n[".to_string()
        };
        st.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
        st.set_nonblocking(true).map_err(|e| e.to_string())?;
        slow.push((st, i < n_headers, None));
    }
    let started = Instant::now();
    // Meanwhile Ray's publisher keeps posting.
    let load = Load::start(port, legit);
    let limit = Duration::from_secs(if n_bodies > 0 { 75 } else { 30 });
    let mut tick = 0u32;
    let mut answered_408 = 0;
    while started.elapsed() < limit && slow.iter().any(|(_, _, c)| c.is_none()) {
        for (st, is_header, closed) in slow.iter_mut() {
            if closed.is_some() {
                continue;
            }
            let mut buf = [0u8; 512];
            match st.read(&mut buf) {
                Ok(0) => *closed = Some(started.elapsed()),
                Ok(n) => {
                    if String::from_utf8_lossy(&buf[..n]).contains(" 408 ") {
                        answered_408 += 1;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => *closed = Some(started.elapsed()),
            }
            if closed.is_none() && tick % 10 == 0 {
                let byte: &[u8] = if *is_header { b"a" } else { b" " };
                if let Err(e) = st.write(byte) {
                    if e.kind() != std::io::ErrorKind::WouldBlock {
                        *closed = Some(started.elapsed());
                    }
                }
            }
        }
        tick += 1;
        thread::sleep(Duration::from_millis(100));
    }
    let logs = load.finish(&mut ledger);
    let open_left = slow.iter().filter(|(_, _, c)| c.is_none()).count();
    let header_closed: Vec<f64> = slow
        .iter()
        .filter(|(_, h, _)| *h)
        .filter_map(|(_, _, c)| c.map(|d| d.as_secs_f64()))
        .collect();
    let body_closed: Vec<f64> = slow
        .iter()
        .filter(|(_, h, _)| !*h)
        .filter_map(|(_, _, c)| c.map(|d| d.as_secs_f64()))
        .collect();
    drop(slow);
    thread::sleep(Duration::from_millis(500));
    let rss_peak = rss.peak();
    drop(rss);
    let rss_after = s.collector.rss();
    let fds_after = open_fds(pid);
    let alive = s.collector.alive();
    let lat: Vec<u32> = latency_gaps(&logs);
    let legit_ok = count_status(&logs, 200);
    let legit_bad = logs
        .iter()
        .flat_map(|l| l.answers.iter())
        .filter(|(_, s)| *s != 200)
        .count();
    let (code, _) = s.collector.terminate(Duration::from_secs(60))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    // Bounded by the connection cap: at most 256 connections' buffers (64 KiB each) above
    // the baseline, whatever the number of slow clients; glibc keeps what it freed, so the
    // end is compared with the peak, not the start.
    let flat = rss_peak <= rss_before + (16 << 20) && rss_after <= rss_peak;
    // At the cap, stalled connections make room within 2 s: the paced client must never
    // wait for their 10 s header timeout.
    let longest_gap_ms = lat.iter().max().copied().unwrap_or(0);
    let pass = check.ok()
        && open_left == 0
        && longest_gap_ms < 5_000
        && alive
        && flat
        && legit_ok > 0
        && code == Some(0)
        && fds_after <= fds_before + 2;
    Ok(Verdict::new(
        pass,
        format!(
            "{n_headers} slowloris + {n_bodies} slow-body connections: all closed by the server: {} (headers by {:.1} s, bodies by {:.1} s, {answered_408} answered 408); RSS {:.1} → peak {:.1} → {:.1} MiB, fds {fds_before} → {fds_after}; a paced client meanwhile: {legit_ok} × 200, {legit_bad} other, longest gap {:.1} s; {}; exit {code:?}",
            if open_left == 0 { "yes".to_string() } else { format!("NO, {open_left} still open") },
            max(&header_closed),
            max(&body_closed),
            mib(rss_before as f64),
            mib(rss_peak as f64),
            mib(rss_after as f64),
            longest_gap_ms as f64 / 1000.0,
            check.summary()
        ),
        json!({"slow_headers": n_headers, "slow_bodies": n_bodies, "left_open": open_left,
               "headers_closed_by_s": max(&header_closed), "bodies_closed_by_s": max(&body_closed),
               "answered_408": answered_408, "rss_before_mib": mib(rss_before as f64), "rss_peak_mib": mib(rss_peak as f64),
               "rss_after_mib": mib(rss_after as f64), "fds_before": fds_before, "fds_after": fds_after,
               "legit_ok": legit_ok, "legit_other": legit_bad,
               "legit_longest_gap_s": lat.iter().max().copied().unwrap_or(0) as f64 / 1000.0,
               "exit_code": code, "check": check.figures()}),
    ))
}

/// Longest time between consecutive answers of each client, in ms.
fn latency_gaps(logs: &[ClientLog]) -> Vec<u32> {
    logs.iter()
        .map(|l| {
            // From the start to the first answer, and between answers.
            let first = l.answers.first().map(|a| a.0).unwrap_or(0);
            l.answers
                .windows(2)
                .map(|w| w[1].0.saturating_sub(w[0].0))
                .max()
                .unwrap_or(0)
                .max(first)
        })
        .collect()
}

/// Sends `head` and then `body` from another thread, and reads the answer here, so an
/// early answer is seen even while the body is still being written.
fn send_and_read(port: u16, head: String, body: Arc<Vec<u8>>, chunked: bool) -> (u16, Duration) {
    let t = Instant::now();
    let Ok(st) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, t.elapsed());
    };
    let _ = st.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut w) = st.try_clone() else {
        return (0, t.elapsed());
    };
    let writer = thread::spawn(move || {
        if w.write_all(head.as_bytes()).is_err() {
            return;
        }
        if chunked {
            for c in body.chunks(64 * 1024) {
                if w.write_all(format!("{:x}\r\n", c.len()).as_bytes())
                    .is_err()
                    || w.write_all(c).is_err()
                    || w.write_all(b"\r\n").is_err()
                {
                    return;
                }
            }
            let _ = w.write_all(b"0\r\n\r\n");
        } else {
            let _ = w.write_all(&body);
        }
    });
    let mut r = BufReader::new(st);
    let status = read_response(&mut r).map(|(r, _)| r.status).unwrap_or(0);
    let took = t.elapsed();
    let _ = r.get_ref().shutdown(Shutdown::Both);
    let _ = writer.join();
    (status, took)
}

fn oversized(ctx: &Ctx) -> Result<Verdict, String> {
    let limit: u64 = ctx.pick(1 << 20, 64 << 20);
    let mut s = ctx.setup(
        "oversized",
        false,
        &["--max-body-bytes", &limit.to_string()],
    )?;
    let port = s.collector.port;
    let pid = s.collector.pid();
    let mut ledger = Ledger::default();
    let spec = LoadSpec::new("big", 1, 100);
    if !resend(port, &spec, 0, 0, Duration::from_secs(10)) {
        return Err("warm-up batch refused".into());
    }
    ledger.mark("big", 0, 0, 100, ACKED);
    let rss_before = s.collector.rss();
    let rss = RssMonitor::start(pid);
    // A body of valid events, just over the limit.
    let mut big = Vec::with_capacity(limit as usize + (1 << 20));
    big.push(b'[');
    let mut i = 0u64;
    while (big.len() as u64) <= limit {
        if i > 0 {
            big.push(b',');
        }
        event_json(&mut big, &format!("big-9-{i}"), 1, i);
        i += 1;
    }
    big.push(b']');
    let big = Arc::new(big);
    let bomb = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![b' '; 1 << 20];
        for _ in 0..(limit >> 20) + 2 {
            let _ = e.write_all(&zeros);
        }
        Arc::new(e.finish().unwrap_or_default())
    };
    let rounds = ctx.pick(3, 10);
    let mut statuses: BTreeMap<String, BTreeMap<u16, u32>> = BTreeMap::new();
    let mut declared_ms = Vec::new();
    let mut rss_after_first = 0;
    for round in 0..rounds {
        let (st, took) = send_and_read(
            port,
            format!("POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", big.len()),
            Arc::new(Vec::new()),
            false,
        );
        declared_ms.push(took.as_secs_f64() * 1000.0);
        *statuses
            .entry("declared".into())
            .or_default()
            .entry(st)
            .or_default() += 1;
        let (st, _) = send_and_read(
            port,
            "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
            big.clone(),
            true,
        );
        *statuses
            .entry("chunked".into())
            .or_default()
            .entry(st)
            .or_default() += 1;
        let (st, _) = send_and_read(
            port,
            format!("POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n", bomb.len()),
            bomb.clone(),
            false,
        );
        *statuses
            .entry("gzip_bomb".into())
            .or_default()
            .entry(st)
            .or_default() += 1;
        if round == 0 {
            thread::sleep(Duration::from_millis(300));
            rss_after_first = s.collector.rss();
        }
    }
    thread::sleep(Duration::from_millis(500));
    let rss_peak = rss.peak();
    drop(rss);
    let rss_after = s.collector.rss();
    let after_ok = resend(port, &spec, 0, 100, Duration::from_secs(10));
    if after_ok {
        ledger.mark("big", 0, 100, 100, ACKED);
    }
    let alive = s.collector.alive();
    let (code, _) = s.collector.terminate(Duration::from_secs(60))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let all_413 = statuses.values().all(|m| m.keys().all(|k| *k == 413));
    // Flat: repeating the oversized requests does not add memory beyond the first round.
    let flat = rss_after <= rss_after_first + (8 << 20);
    let bounded = rss_peak <= rss_before + 2 * limit + (32 << 20);
    let pass = all_413 && after_ok && alive && flat && bounded && code == Some(0) && check.ok();
    let declared_ms_max = declared_ms.iter().cloned().fold(0.0, f64::max);
    Ok(Verdict::new(
        pass,
        format!(
            "limit {:.0} MiB, {rounds} rounds of declared / chunked / gzip-bomb ({} KB → {:.0} MiB): answers {}; declared-length refusal within {:.1} ms; RSS {:.1} → after 1 round {:.1} → peak {:.1} → end {:.1} MiB; a normal batch afterwards: {}; exit {code:?}",
            mib(limit as f64),
            bomb.len() / 1000,
            mib(((limit >> 20) + 2) as f64 * 1048576.0),
            serde_json::to_string(&statuses).unwrap_or_default(),
            declared_ms_max,
            mib(rss_before as f64),
            mib(rss_after_first as f64),
            mib(rss_peak as f64),
            mib(rss_after as f64),
            if after_ok { "200" } else { "REFUSED" },
        ),
        json!({"limit_bytes": limit, "rounds": rounds, "statuses": statuses, "declared_refusal_ms_max": declared_ms_max,
               "rss_before_mib": mib(rss_before as f64), "rss_after_first_mib": mib(rss_after_first as f64),
               "rss_peak_mib": mib(rss_peak as f64), "rss_after_mib": mib(rss_after as f64),
               "exit_code": code, "check": check.figures()}),
    ))
}

/// Body number `i` of the malformed storm, and its Content-Encoding.
fn malformed_body(i: u64) -> (Vec<u8>, Option<&'static str>) {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match i % 8 {
        0 => {
            // A batch cut in the middle of an event.
            let mut b = batch_body("mal", 0, i * 3, 3, 1);
            let cut = b.len() / 2 + (rnd() % 200) as usize;
            b.truncate(cut);
            (b, None)
        }
        1 => ((0..256).map(|_| rnd() as u8).collect(), None),
        2 => (format!("not json at all {i}").into_bytes(), None),
        3 => {
            // Deep nesting that never closes (balanced deep nesting is valid JSON).
            (vec![b'['; 10_000], None)
        }
        4 => {
            let mut b = format!("[{{\"eventId\":\"bad-utf8-{i}\",\"message\":\"").into_bytes();
            b.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
            b.extend_from_slice(b"\"}]");
            (b, None)
        }
        5 => (
            format!("[{{\"eventId\":\"x{i}\"}}").into_bytes(),
            Some("gzip"),
        ),
        6 => (format!("\"just a string {i}\"").into_bytes(), None),
        _ => (
            format!("[{{\"eventId\":\"trailing-{i}\"}},]").into_bytes(),
            None,
        ),
    }
}

fn malformed(ctx: &Ctx) -> Result<Verdict, String> {
    // Every distinct bad body becomes one quarantine object: give their upload time.
    let mut s = ctx.setup("malformed", false, &["--shutdown-timeout", "90s"])?;
    let port = s.collector.port;
    let pid = s.collector.pid();
    let mut ledger = Ledger::default();
    let spec = LoadSpec::new("mal", 1, 100);
    if !resend(port, &spec, 0, 1_000_000, Duration::from_secs(10)) {
        return Err("warm-up batch refused".into());
    }
    ledger.mark("mal", 0, 1_000_000, 100, ACKED);
    let rss_before = s.collector.rss();
    let rss = RssMonitor::start(pid);
    let total: u64 = ctx.pick(400, 5_000);
    let next = Arc::new(AtomicU64::new(0));
    let statuses: Arc<Mutex<BTreeMap<u16, u64>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let quarter_rss = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (next, statuses, quarter_rss) =
                (next.clone(), statuses.clone(), quarter_rss.clone());
            thread::spawn(move || {
                let mut conn: Option<Conn> = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total || started.elapsed() > Duration::from_secs(300) {
                        return;
                    }
                    if i == total / 4 {
                        quarter_rss.store(rss_bytes(pid).unwrap_or(0), Ordering::Relaxed);
                    }
                    let (body, enc) = malformed_body(i);
                    let mut headers = vec![("Content-Type", "application/json")];
                    if let Some(e) = enc {
                        headers.push(("Content-Encoding", e));
                    }
                    if conn.is_none() {
                        conn = Conn::open(port, Duration::from_secs(30)).ok();
                    }
                    let st = match conn
                        .as_mut()
                        .map(|c| c.request("POST", "/v1/events", &headers, &body))
                    {
                        Some(Ok((r, close))) => {
                            if close {
                                conn = None;
                            }
                            r.status
                        }
                        _ => {
                            conn = None;
                            0
                        }
                    };
                    if let Ok(mut m) = statuses.lock() {
                        *m.entry(st).or_default() += 1;
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let took = started.elapsed();
    thread::sleep(Duration::from_millis(300));
    let rss_peak = rss.peak();
    drop(rss);
    let rss_after = s.collector.rss();
    let rss_quarter = quarter_rss.load(Ordering::Relaxed);
    let alive = s.collector.alive();
    let healthy = http(port, "GET", "/healthz", &[], b"")
        .map(|r| r.status)
        .unwrap_or(0)
        == 200;
    let invalid = s.collector.metric("rhc_invalid_bodies_total");
    let after_ok = resend(port, &spec, 0, 2_000_000, Duration::from_secs(10));
    if after_ok {
        ledger.mark("mal", 0, 2_000_000, 100, ACKED);
    }
    let (code, _) = s.collector.terminate(Duration::from_secs(120))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let statuses = statuses.lock().map(|m| m.clone()).unwrap_or_default();
    let all_400 = statuses.keys().all(|k| *k == 400) && statuses.values().sum::<u64>() == total;
    // Flat: no growth with the number of bodies beyond the upload queue's entries for the
    // quarantine files still waiting (a few hundred bytes each).
    let flat = rss_after <= rss_quarter.max(rss_before) + (8 << 20);
    let pass = all_400
        && alive
        && healthy
        && after_ok
        && flat
        && code == Some(0)
        && check.ok()
        && invalid as u64 == total;
    Ok(Verdict::new(
        pass,
        format!(
            "{total} malformed bodies (8 kinds) from 4 clients in {:.1} s: answers {}; rhc_invalid_bodies_total {invalid}; RSS {:.1} → at 25 % {:.1} → peak {:.1} → end {:.1} MiB; healthy afterwards: {}; a normal batch afterwards: {}; {} quarantine records uploaded; exit {code:?}",
            took.as_secs_f64(),
            serde_json::to_string(&statuses).unwrap_or_default(),
            mib(rss_before as f64),
            mib(rss_quarter as f64),
            mib(rss_peak as f64),
            mib(rss_after as f64),
            if healthy { "yes" } else { "NO" },
            if after_ok { "200" } else { "REFUSED" },
            check.quarantine_lines.len(),
        ),
        json!({"bodies": total, "seconds": secs(took), "statuses": statuses, "invalid_metric": invalid,
               "rss_before_mib": mib(rss_before as f64), "rss_quarter_mib": mib(rss_quarter as f64),
               "rss_peak_mib": mib(rss_peak as f64), "rss_after_mib": mib(rss_after as f64),
               "quarantine_records": check.quarantine_lines.len(), "exit_code": code, "check": check.figures()}),
    ))
}

fn logs_2g(ctx: &Ctx) -> Result<Verdict, String> {
    let size = ctx.args.log_mib << 20;
    let n = ctx.seq.fetch_add(1, Ordering::Relaxed);
    let bucket = format!("chaos-logs-{n}");
    ctx.storage.create_bucket(&bucket)?;
    let dir = ctx.work.join(format!("logs-{n}"));
    let session = "session_2026-11-22_02-06-36_260774_21819";
    let logs = dir.join("ray").join(session).join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    std::os::unix::fs::symlink(
        dir.join("ray").join(session),
        dir.join("ray").join("session_latest"),
    )
    .map_err(|e| e.to_string())?;
    // A worker log of `size` bytes of log-like lines.
    let path = logs.join("worker-big.out");
    {
        let f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let mut written = 0u64;
        let mut i = 0u64;
        while written < size {
            let line = format!(
                "[2026-11-22 02:06:{:02},{:03} I 48213 48213] core_worker.cc:{}: task {} finished in {} us, object store {} bytes\n",
                i % 60,
                i % 1000,
                i % 5000,
                i,
                i * 7 % 100_000,
                i * 31 % 1_000_000_000
            );
            let take = (size - written).min(line.len() as u64) as usize;
            w.write_all(&line.as_bytes()[..take])
                .map_err(|e| e.to_string())?;
            written += take as u64;
            i += 1;
        }
        w.flush().map_err(|e| e.to_string())?;
    }
    let (url, env) = ctx.storage.collector_config(&bucket, ctx.storage.port);
    let mut c = Collector {
        bin: ctx.bin.clone(),
        port: free_port(),
        spool: dir.join("spool"),
        log: dir.join("collector.log"),
        args: vec![
            "--storage".into(),
            url,
            "--cluster-name".into(),
            "chaos".into(),
            "--ray-tmp-dir".into(),
            dir.join("ray").display().to_string(),
            "--node-id".into(),
            "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5".into(),
            "--enable-export-events".into(),
            "false".into(),
        ],
        env,
        child: None,
    };
    let t = Instant::now();
    c.spawn()?;
    let rss = RssMonitor::start(c.pid());
    let mut done = None;
    while t.elapsed() < Duration::from_secs(600) {
        if c.metric("rhc_log_bytes_uploaded_total") >= size as f64 {
            done = Some(t.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let rss_peak = rss.peak();
    drop(rss);
    let (code, _) = c.terminate(Duration::from_secs(60))?;
    let store = ctx.storage.store(&bucket)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let key = format!(
        "cluster-history/raycluster/default/chaos/{session}/3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5/logs/worker-big.out"
    );
    let object_size = rt
        .block_on(store.head(&object_store::path::Path::from(key.as_str())))
        .map(|m| m.size)
        .map_err(|e| format!("HEAD {key}: {e}"))?;
    let _ = std::fs::remove_file(&path);
    let pass = done.is_some() && object_size == size && rss_peak <= 64 << 20 && code == Some(0);
    Ok(Verdict::new(
        pass,
        format!(
            "one {:.0} MB log file to {}: uploaded in {} ({:.0} MB/s), object {} bytes, RSS peak {:.1} MiB (target < 64 MiB); exit {code:?}",
            size as f64 / 1e6,
            ctx.storage.describe(),
            done.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_else(|| "NEVER".into()),
            done.map(|d| size as f64 / 1e6 / d.as_secs_f64()).unwrap_or(0.0),
            object_size,
            mib(rss_peak as f64),
        ),
        json!({"bytes": size, "seconds": done.map(secs), "object_bytes": object_size,
               "rss_peak_mib": mib(rss_peak as f64), "exit_code": code}),
    ))
}

fn skip(why: &str) -> Verdict {
    Verdict {
        outcome: Outcome::Skip,
        text: why.to_string(),
        figures: json!({}),
    }
}

// ------------------------------------------------------------------ main

fn parse_storage(s: &str) -> Result<StoreKind, String> {
    if s == "file" {
        return Ok(StoreKind::File);
    }
    let (kind, path) = s
        .split_once(':')
        .ok_or_else(|| format!("--storage {s:?}: expected moto:<path>, s3s-fs:<path> or file"))?;
    let path = std::fs::canonicalize(path).map_err(|e| format!("--storage: {path}: {e}"))?;
    match kind {
        "moto" => Ok(StoreKind::Moto(path)),
        "s3s-fs" => Ok(StoreKind::S3sFs(path)),
        other => Err(format!(
            "--storage: unknown server {other:?} (moto, s3s-fs, file)"
        )),
    }
}

fn main() {
    let args = Args::parse();
    if args.list {
        for (name, full, smoke, cut, what) in SCENARIOS {
            println!(
                "{name:<16} {}{}{}  {what}",
                if *full { "full " } else { "     " },
                if *smoke { "smoke " } else { "      " },
                if *cut { "S3" } else { "  " },
            );
        }
        return;
    }
    let kind = match parse_storage(&args.storage) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("rhc-chaos: {e}");
            std::process::exit(2);
        }
    };
    let selected: Vec<&str> = if args.only.is_empty() {
        SCENARIOS
            .iter()
            .filter(|s| if args.smoke { s.2 } else { s.1 })
            .map(|s| s.0)
            .collect()
    } else {
        args.only.iter().map(|s| s.as_str()).collect()
    };
    for name in &selected {
        if scenario_fn(name).is_none() {
            eprintln!("rhc-chaos: unknown scenario {name:?} (see --list)");
            std::process::exit(2);
        }
    }
    if !args.collector.exists() {
        eprintln!(
            "rhc-chaos: collector binary {} not found",
            args.collector.display()
        );
        std::process::exit(2);
    }
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("rhc-chaos-{}", std::process::id())),
    };
    if let Err(e) = std::fs::create_dir_all(&work) {
        eprintln!("rhc-chaos: {}: {e}", work.display());
        std::process::exit(2);
    }
    let storage = match Storage::start(kind, &work) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rhc-chaos: starting the storage: {e}");
            std::process::exit(1);
        }
    };
    let bin = std::fs::canonicalize(&args.collector).unwrap_or(args.collector.clone());
    println!(
        "rhc-chaos: {} scenario(s){}, storage {}, collector {}, scratch {}",
        selected.len() * args.repeat.max(1),
        if args.smoke { " (smoke)" } else { "" },
        storage.describe(),
        bin.display(),
        work.display()
    );
    let selected: Vec<String> = selected.iter().map(|s| s.to_string()).collect();
    let keep = args.keep;
    let repeat = args.repeat.max(1);
    let json_out = args.json.clone();
    let ctx = Ctx {
        bin,
        storage,
        work: work.clone(),
        smoke: args.smoke,
        args,
        seq: AtomicUsize::new(0),
    };
    let mut failed = 0;
    let suite = Instant::now();
    for name in &selected {
        for _ in 0..repeat {
            let Some(f) = scenario_fn(name) else { continue };
            let t = Instant::now();
            let v = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&ctx))) {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => Verdict::new(false, format!("error: {e}"), json!({})),
                Err(_) => Verdict::new(false, "the scenario panicked".into(), json!({})),
            };
            let word = match v.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "SKIP",
            };
            if v.outcome == Outcome::Fail {
                failed += 1;
            }
            println!(
                "{word} {name:<15} [{:5.1} s] {}",
                t.elapsed().as_secs_f64(),
                v.text
            );
            let _ = std::io::stdout().flush();
            if let Some(p) = &json_out {
                let line = json!({"scenario": name, "verdict": word, "seconds": secs(t.elapsed()),
                                  "smoke": ctx.smoke, "storage": ctx.storage.describe(), "text": v.text, "figures": v.figures});
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                {
                    let _ = writeln!(f, "{line}");
                }
            }
        }
    }
    println!(
        "rhc-chaos: {} failed, {:.0} s{}",
        failed,
        suite.elapsed().as_secs_f64(),
        if failed > 0 || keep {
            format!("; scratch kept in {}", work.display())
        } else {
            String::new()
        }
    );
    drop(ctx);
    if failed == 0 && !keep {
        let _ = std::fs::remove_dir_all(&work);
    }
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
