//! The load: events like Ray's (real ids, a session, jobs), batches, and clients that behave
//! like Ray's publisher (one batch at a time per connection, a refused or unanswered batch
//! resent as is), each remembering which events were acknowledged.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{connect, http};
use base64::Engine;
use rhc_testkit::http::Conn;

// ------------------------------------------------------------------ events

pub(crate) const NODE_B64: &str = "OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==";
pub(crate) const SESSION: &str = "session_2026-11-22_02-06-36_260774_21819";

/// A Ray 2.60 task lifecycle event of about 0.9 KB with the given id and job. Worker,
/// timestamps and names vary with `seq` as in a real stream (real Ray events gzip about
/// 10:1; identical ones would gzip 100:1 and make the upload side look cheaper than it is).
pub(crate) fn event_json(out: &mut Vec<u8>, id: &str, job: u32, seq: u64) {
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
pub(crate) fn batch_body(tag: &str, client: usize, first: u64, n: usize, jobs: u32) -> Vec<u8> {
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

pub(crate) const NONE: u8 = 0;
pub(crate) const ACKED: u8 = 1;
pub(crate) const PENDING: u8 = 2;
/// Deliberately destroyed (the torn line): may be missing.
pub(crate) const CUT: u8 = 3;

/// What the clients were told, per `(tag, client)`, indexed by sequence number.
#[derive(Default)]
pub(crate) struct Ledger {
    pub(crate) states: HashMap<(String, usize), Vec<u8>>,
}

impl Ledger {
    pub(crate) fn mark(&mut self, tag: &str, client: usize, first: u64, n: usize, state: u8) {
        let v = self.states.entry((tag.to_string(), client)).or_default();
        let end = (first as usize) + n;
        if v.len() < end {
            v.resize(end, NONE);
        }
        for s in &mut v[first as usize..end] {
            *s = state;
        }
    }

    pub(crate) fn count(&self, state: u8) -> u64 {
        self.states
            .values()
            .map(|v| v.iter().filter(|s| **s == state).count() as u64)
            .sum()
    }
}

// ------------------------------------------------------------------ load clients

#[derive(Clone)]
pub(crate) struct LoadSpec {
    pub(crate) tag: String,
    pub(crate) clients: usize,
    pub(crate) batch: usize,
    /// Events per second over all clients; 0 = as fast as answers come.
    pub(crate) rate: f64,
    pub(crate) jobs: u32,
    /// Hard bound on the load's life.
    pub(crate) max: Duration,
    /// Pause after a 503 (Ray waits before resending).
    pub(crate) retry_pause: Duration,
}

impl LoadSpec {
    pub(crate) fn new(tag: &str, clients: usize, batch: usize) -> LoadSpec {
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
pub(crate) struct ClientLog {
    pub(crate) client: usize,
    /// (first seq, state) per batch sent.
    pub(crate) batches: Vec<(u64, u8)>,
    /// (ms since the load started, status; 0 = no answer).
    pub(crate) answers: Vec<(u32, u16)>,
    /// (first seq, ms since the load started) of every acknowledged batch, when its 200
    /// arrived: the acknowledgement times the node-loss scenario measures its window from.
    pub(crate) acks: Vec<(u64, u32)>,
    /// 503 answers without a usable Retry-After.
    pub(crate) missing_retry_after: u64,
    /// The batch that was being sent when the load stopped.
    pub(crate) pending: Option<u64>,
}

pub(crate) struct Load {
    pub(crate) spec: LoadSpec,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) acked: Arc<AtomicU64>,
    pub(crate) started: Instant,
    pub(crate) handles: Vec<JoinHandle<ClientLog>>,
}

impl Load {
    pub(crate) fn start(port: u16, spec: LoadSpec) -> Load {
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

    pub(crate) fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Stops the clients and records what they were told in `ledger`.
    pub(crate) fn finish(self, ledger: &mut Ledger) -> Vec<ClientLog> {
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

pub(crate) fn client_loop(
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
        acks: Vec::new(),
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
            conn = connect(port, Duration::from_secs(30)).ok();
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
            Ok(r) => {
                if r.closes() {
                    conn = None;
                }
                log.answers.push((ms, r.status));
                if r.status == 200 {
                    log.batches.push((first, ACKED));
                    log.acks.push((first, ms));
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
pub(crate) fn resend(
    port: u16,
    spec: &LoadSpec,
    client: usize,
    first: u64,
    limit: Duration,
) -> bool {
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

pub(crate) fn count_status(logs: &[ClientLog], status: u16) -> u64 {
    logs.iter()
        .flat_map(|l| l.answers.iter())
        .filter(|(_, s)| *s == status)
        .count() as u64
}
