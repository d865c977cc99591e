//! Node loss: the node vanishes under a steady load. The collector is killed with SIGKILL and
//! its spool directory deleted (the pod's emptyDir gone with a reclaimed spot node, a dead
//! node, an eviction), then the bucket is read back. What was not in the bucket at that
//! moment is gone for good.
//!
//! `node-loss` runs the collector as a user would (only storage, spool, port and identity
//! set; `--upload-window` given only when this tool is asked to, through
//! `RHC_UPLOAD_WINDOW`, which an older binary ignores) under Ray-like task events at 20, 200,
//! 2,000 and 25,000 events/s over 8 jobs (8 open partitions), on a `file://` bucket and on the
//! S3 server, and kills it at seeded random moments. For every case it reports:
//! - the events acknowledged (200) and, of those, the ones missing from the bucket;
//! - the loss window: the kill's time minus the acknowledgement time of the oldest missing
//!   event (0 when none is missing). The collector promises that every event acknowledged
//!   more than the upload window (10 s by default) before the node vanished is in the
//!   bucket, so the window must not exceed it;
//! - objects per partition against the segments the collector may seal in that time (one per
//!   rotation, and one more per 64 MiB, the default `--max-segment-bytes`): the open object
//!   grows in place, it is not split into extra objects;
//! - whether every object is a valid gzip of whole members holding whole JSON lines;
//! - while the load runs, a reader polls a few objects about once a second: every version it
//!   sees must decode whole and hold whole lines, and its lines must be a prefix of the next
//!   version's.
//!
//! PASS when every case of ours holds all of that. With `--peer` (KubeRay's collector) and an
//! S3 server, the same cases run against it at its defaults and are reported beside ours,
//! not judged.
//!
//! `node-loss-logs` does the same to the log path: Ray-like session logs are written (three
//! files, a line every 100 ms each), the collector runs at its defaults (log snapshots every
//! `--log-upload-interval`, 60 s), and several collectors, one per random moment, are killed
//! between 65 s and 130 s after their start. The logs' loss window is the kill's time minus
//! the time the oldest line missing from the bucket was written. Expected: up to the snapshot
//! interval (PASS up to the interval plus 5 s for the round itself).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::load::{Ledger, Load, LoadSpec, ACKED, SESSION};
use crate::storage::{Storage, StoreKind};
use crate::verify::IdOnly;
use crate::{Ctx, Verdict};
use object_store::{ObjectStore, ObjectStoreExt};
use rhc_testkit::collector::Collector;
use rhc_testkit::peer::{peer_collector_bin, PeerCollector, PeerSettings};
use serde_json::json;

/// Events per second of the full run: a quiet node to a large node's (BENCHMARKS.md).
const RATES: &[f64] = &[20.0, 200.0, 2_000.0, 25_000.0];
/// The smoke case's rate (a debug build in CI).
const SMOKE_RATE: f64 = 200.0;
/// Jobs of the load, one open partition each (task events are filed under their job).
const JOBS: u32 = 8;
/// Load clients, each one batch at a time like Ray's publisher.
pub(crate) const CLIENTS: usize = 4;
/// The collector's default upload window (`--upload-window`), when this tool sets none.
const DEFAULT_WINDOW_S: f64 = 10.0;
/// The window the smoke case sets: short, so that the case is short.
const SMOKE_WINDOW_S: f64 = 2.0;
/// The collector's default `--max-segment-bytes`: a segment sealed by size starts a new object.
const MAX_SEGMENT_BYTES: u64 = 64 << 20;
/// This node's id (the events' `nodeId`, in hex).
pub(crate) const NODE_HEX: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
/// How many objects the reader follows during the load, and how often it reads them.
const POLLED_OBJECTS: usize = 3;
const POLL_EVERY: Duration = Duration::from_secs(1);
/// The log writer: one line per file every `LOG_TICK`.
const LOG_TICK: Duration = Duration::from_millis(100);
/// When the log collectors are killed: after the first snapshot round, anywhere in the next
/// interval (the default 60 s).
const LOG_KILL_FROM_S: f64 = 65.0;
const LOG_KILL_TO_S: f64 = 130.0;
/// The collector's default `--log-upload-interval`.
const LOG_INTERVAL_S: f64 = 60.0;
/// What a snapshot round itself may take on a busy machine, on top of the interval.
const LOG_ROUND_SLACK_S: f64 = 5.0;

// ------------------------------------------------------------------ seeded moments

/// splitmix64: the kill moments are random but reproducible from the printed seed.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`, to the millisecond.
    pub(crate) fn between(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((lo + u * (hi - lo)) * 1000.0).round() / 1000.0
    }
}

/// The seed given (`--seed`), or one from the clock; printed either way.
pub(crate) fn seed(ctx: &Ctx, what: &str) -> u64 {
    let s = ctx.args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!("{what}: seed {s} (--seed {s} repeats these kill moments)");
    s
}

// ------------------------------------------------------------------ reading the bucket back

/// Decodes an object as a reader would: gzip members (all of them, each whole) when the key
/// says `.gz`, then whole lines only.
fn decode_strict(key: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let text = if key.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| format!("{key}: not a whole gzip ({} bytes): {e}", bytes.len()))?;
        out
    } else {
        bytes.to_vec()
    };
    if !text.is_empty() && !text.ends_with(b"\n") {
        return Err(format!("{key}: ends inside a line"));
    }
    Ok(text)
}

/// The partition an event object belongs to: its directory and `<node>-<YYYY-MM-DD-HH>`, the
/// name without the segment number and the extensions.
fn partition_of(key: &str) -> String {
    let (dir, name) = key.rsplit_once('/').unwrap_or(("", key));
    let stem = name.trim_end_matches(".gz").trim_end_matches(".jsonl");
    let parts: Vec<&str> = stem.split('-').collect();
    let keep = if parts.len() >= 6 { 5 } else { parts.len() };
    format!("{dir}/{}", parts[..keep].join("-"))
}

fn is_event_key(key: &str) -> bool {
    // On file:// a new version of an object is written to `.<name>.<node>.rhc-tmp` beside it
    // and renamed: no reader takes that for an object (the history server and inspect do not).
    let temporary = key.rsplit('/').next().is_some_and(|name| {
        name.ends_with(ray_history_collector::storage::append::LOCAL_TEMP_SUFFIX)
    });
    !temporary && (key.contains("/node_events/") || key.contains("/job_events/"))
}

/// What the bucket held once the node was gone.
#[derive(Default)]
struct ReadBack {
    objects: usize,
    /// Per partition: (objects, decoded bytes).
    partitions: BTreeMap<String, (usize, u64)>,
    /// Per client: how many times each sequence number is in the bucket.
    present: HashMap<usize, Vec<u8>>,
    lines: u64,
    problems: Vec<String>,
}

fn read_back(store: &Arc<dyn ObjectStore>, tag: &str) -> Result<ReadBack, String> {
    let mut rb = ReadBack::default();
    crate::storage::for_each_object(store, |key, bytes| {
        if !is_event_key(key) {
            return;
        }
        rb.objects += 1;
        let text = match decode_strict(key, bytes) {
            Ok(t) => t,
            Err(e) => {
                rb.problems.push(e);
                return;
            }
        };
        let p = rb.partitions.entry(partition_of(key)).or_default();
        p.0 += 1;
        p.1 += text.len() as u64;
        for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            rb.lines += 1;
            let id = match serde_json::from_slice::<IdOnly>(line) {
                Ok(IdOnly { event_id: Some(id) }) => id,
                _ => {
                    if rb.problems.len() < 5 {
                        rb.problems
                            .push(format!("{key}: a line that is not an event"));
                    }
                    continue;
                }
            };
            let mut parts = id.rsplitn(3, '-');
            let (Some(seq), Some(client), Some(t)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(seq), Ok(client)) = (seq.parse::<usize>(), client.parse::<usize>()) else {
                continue;
            };
            if t != tag {
                continue;
            }
            let v = rb.present.entry(client).or_default();
            if v.len() <= seq {
                v.resize(seq + 1, 0);
            }
            v[seq] = v[seq].saturating_add(1);
        }
    })?;
    Ok(rb)
}

// ------------------------------------------------------------------ a reader during the load

/// What the polling reader saw.
#[derive(Default)]
struct Versions {
    /// Distinct versions read (a new length of an object).
    versions: u64,
    reads: u64,
    problems: Vec<String>,
}

/// Reads up to [`POLLED_OBJECTS`] event objects about once a second until stopped: every
/// version must decode whole, hold whole lines, and its lines must be a prefix of the next's.
struct Reader {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Versions>>,
}

impl Reader {
    fn start(store: Arc<dyn ObjectStore>) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = thread::spawn(move || {
            let mut seen = Versions::default();
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                seen.problems.push("no runtime for the reader".into());
                return seen;
            };
            let mut last: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            while !s.load(Ordering::Relaxed) {
                rt.block_on(poll_once(&store, &mut last, &mut seen));
                let until = Instant::now() + POLL_EVERY;
                while Instant::now() < until && !s.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(50));
                }
            }
            seen
        });
        Reader {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> Versions {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

async fn poll_once(
    store: &Arc<dyn ObjectStore>,
    last: &mut BTreeMap<String, Vec<u8>>,
    seen: &mut Versions,
) {
    use futures::TryStreamExt;
    let Ok(metas) = store.list(None).try_collect::<Vec<_>>().await else {
        return;
    };
    for m in &metas {
        let key = m.location.as_ref();
        if last.len() < POLLED_OBJECTS && is_event_key(key) && !last.contains_key(key) {
            last.insert(key.to_string(), Vec::new());
        }
    }
    let keys: Vec<String> = last.keys().cloned().collect();
    for key in keys {
        let path = object_store::path::Path::from(key.as_str());
        let Ok(got) = store.get(&path).await else {
            continue;
        };
        let Ok(bytes) = got.bytes().await else {
            continue;
        };
        seen.reads += 1;
        let text = match decode_strict(&key, &bytes) {
            Ok(t) => t,
            Err(e) => {
                seen.problems.push(format!("a reader saw {e}"));
                continue;
            }
        };
        if text
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
            .any(|l| serde_json::from_slice::<IdOnly>(l).is_err())
        {
            seen.problems
                .push(format!("a reader saw {key} with a broken line"));
        }
        let prev = last.get(&key).map(Vec::as_slice).unwrap_or_default();
        if !text.starts_with(prev) {
            seen.problems.push(format!(
                "a reader saw {key} change: {} bytes of lines, then {} bytes that do not begin with them",
                prev.len(),
                text.len()
            ));
        }
        if text.len() != prev.len() {
            seen.versions += 1;
        }
        last.insert(key, text);
    }
}

// ------------------------------------------------------------------ one case

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Who {
    Ours,
    Peer,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::Ours => "ours",
            Who::Peer => "KubeRay's",
        }
    }
}

/// One kill of one collector under one load.
struct Case {
    backend: String,
    who: Who,
    rate: f64,
    kill_at_s: f64,
    acked: u64,
    lost: u64,
    duplicated: u64,
    window_s: f64,
    objects: usize,
    partitions: usize,
    max_per_partition: usize,
    /// Partitions with more objects than the segments the collector may seal.
    split_partitions: usize,
    versions: Versions,
    problems: Vec<String>,
}

impl Case {
    fn holds(&self, window: f64) -> bool {
        self.acked > 0
            && self.window_s <= window
            && self.duplicated == 0
            && self.split_partitions == 0
            && self.problems.is_empty()
            && self.versions.problems.is_empty()
    }

    fn row(&self) -> String {
        format!(
            "| {:<5} | {:<9} | {:>6} | {:>6.1} | {:>9} | {:>9} | {:>7.1} | {:>3} / {:<3} | {:>3} | {:<5} | {:>3} / {:<3} |",
            self.backend,
            self.who.label(),
            self.rate,
            self.kill_at_s,
            self.acked,
            self.lost,
            self.window_s,
            self.max_per_partition,
            self.partitions,
            self.duplicated,
            if self.problems.is_empty() { "yes" } else { "NO" },
            self.versions.versions,
            self.versions.problems.len(),
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({"backend": self.backend, "collector": self.who.label(), "rate": self.rate,
               "kill_at_s": self.kill_at_s, "acked": self.acked, "lost": self.lost,
               "lost_pct": if self.acked > 0 { (self.lost as f64 * 1000.0 / self.acked as f64).round() / 10.0 } else { 0.0 },
               "loss_window_s": self.window_s, "duplicated": self.duplicated,
               "objects": self.objects, "partitions": self.partitions,
               "max_objects_per_partition": self.max_per_partition,
               "split_partitions": self.split_partitions,
               "versions_read": self.versions.versions, "reads": self.versions.reads,
               "version_problems": self.versions.problems, "problems": self.problems})
    }
}

const TABLE_HEAD: &str = "| store | collector | ev/s   | kill s | acked     | lost      | window s | max objects / partitions | dup | valid | versions / bad |\n|---|---|---|---|---|---|---|---|---|---|---|";

/// The collector under test, or the peer, with a fresh bucket; killed on drop.
pub(crate) enum Node {
    Ours(Collector),
    Peer(Box<PeerCollector>, PathBuf),
}

impl Node {
    pub(crate) fn port(&self) -> u16 {
        match self {
            Node::Ours(c) => c.port,
            Node::Peer(p, _) => p.port,
        }
    }

    pub(crate) fn kill9(&mut self) {
        match self {
            Node::Ours(c) => c.kill9(),
            Node::Peer(p, _) => p.kill9(),
        }
    }

    /// The node's disk: what vanishes with it.
    fn disk(&self) -> PathBuf {
        match self {
            Node::Ours(c) => c.spool.clone(),
            Node::Peer(p, _) => p.data_dir.clone(),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
        if let Node::Peer(_, ray_tmp) = self {
            let _ = std::fs::remove_dir_all(ray_tmp);
        }
    }
}

/// `--storage`, identity and nothing else: the collector as a user starts it, reaching the
/// store on `via` (the store's port, or a proxy's in front of it).
pub(crate) fn start_ours(
    ctx: &Ctx,
    storage: &Storage,
    via: u16,
    bucket: &str,
    dir: &Path,
    window: Option<f64>,
) -> Result<Node, String> {
    let (url, mut env) = storage.collector_config(bucket, via);
    if let Some(w) = window {
        env.push((
            "RHC_UPLOAD_WINDOW".into(),
            format!("{}ms", (w * 1000.0) as u64),
        ));
    }
    let raytmp = dir.join("ray");
    std::fs::create_dir_all(&raytmp).map_err(|e| format!("{}: {e}", raytmp.display()))?;
    let args: Vec<String> = vec![
        "--storage".into(),
        url,
        "--cluster-name".into(),
        "chaos".into(),
        "--node-id".into(),
        NODE_HEX.into(),
        "--role".into(),
        "worker".into(),
        "--ray-tmp-dir".into(),
        raytmp.display().to_string(),
    ];
    let mut c = Collector::configure(ctx.bin.clone(), &dir.join("spool"), &args, &env);
    c.log = dir.join("collector.log");
    c.try_spawn()?;
    Ok(Node::Ours(c))
}

/// KubeRay's collector at its defaults (5 min rotation, no compression) on the S3 server.
fn start_peer(ctx: &Ctx, bin: PathBuf, bucket: &str, dir: &Path, n: usize) -> Result<Node, String> {
    let ray_tmp = std::env::temp_dir().join(format!("rhc-nl-{}-{n}", std::process::id()));
    let settings = PeerSettings::defaults(
        &format!("http://127.0.0.1:{}", ctx.storage.port),
        bucket,
        SESSION,
    );
    let mut p = PeerCollector::configure(bin, dir, &ray_tmp, settings)?;
    p.try_spawn()?;
    Ok(Node::Peer(Box::new(p), ray_tmp))
}

pub(crate) fn batch_for(rate: f64) -> usize {
    // About five batches a second per client, as Ray's publisher sends at a steady rate.
    ((rate / CLIENTS as f64 / 5.0).round() as usize).clamp(1, 1000)
}

#[allow(clippy::too_many_arguments)]
fn one_case(
    ctx: &Ctx,
    storage: &Storage,
    who: Who,
    peer: Option<PathBuf>,
    rate: f64,
    kill_at_s: f64,
    window: Option<f64>,
) -> Result<Case, String> {
    let n = ctx.seq.fetch_add(1, Ordering::Relaxed);
    let bucket = format!("chaos-node-loss-{n}");
    storage.create_bucket(&bucket)?;
    let dir = ctx.work.join(format!("node-loss-{n}"));
    let mut node = match (who, peer) {
        (Who::Peer, Some(bin)) => start_peer(ctx, bin, &bucket, &dir, n)?,
        _ => start_ours(ctx, storage, storage.port, &bucket, &dir, window)?,
    };
    let store = storage.store(&bucket)?;
    let tag = format!("nl{n}");
    let batch = batch_for(rate);
    let mut spec = LoadSpec::new(&tag, CLIENTS, batch);
    spec.rate = rate;
    spec.jobs = JOBS;
    spec.max = Duration::from_secs_f64(kill_at_s + 60.0);
    let reader = Reader::start(store.clone());
    let load = Load::start(node.port(), spec.clone());
    let kill_at = load.started + Duration::from_secs_f64(kill_at_s);
    while Instant::now() < kill_at {
        thread::sleep((kill_at - Instant::now()).min(Duration::from_millis(50)));
    }
    let kill_ms = load.started.elapsed().as_millis() as u32;
    node.kill9();
    let versions = reader.finish();
    let mut ledger = Ledger::default();
    let logs = load.finish(&mut ledger);
    // The node is gone, its disk with it.
    let disk = node.disk();
    std::fs::remove_dir_all(&disk).map_err(|e| format!("deleting {}: {e}", disk.display()))?;
    let rb = read_back(&store, &tag)?;
    let mut acked_at: HashMap<(usize, u64), u32> = HashMap::new();
    for l in &logs {
        for (first, ms) in &l.acks {
            acked_at.insert((l.client, *first), *ms);
        }
    }
    let mut acked = 0u64;
    let mut lost = 0u64;
    let mut duplicated = 0u64;
    let mut oldest_missing: Option<u32> = None;
    for ((_, client), states) in &ledger.states {
        let present = rb.present.get(client);
        for (seq, st) in states.iter().enumerate() {
            let count = present.and_then(|p| p.get(seq)).copied().unwrap_or(0);
            if count > 1 {
                duplicated += 1;
            }
            if *st != ACKED {
                continue;
            }
            acked += 1;
            if count == 0 {
                lost += 1;
                let first = (seq / batch * batch) as u64;
                let at = acked_at.get(&(*client, first)).copied().unwrap_or(0);
                oldest_missing = Some(oldest_missing.map_or(at, |o| o.min(at)));
            }
        }
    }
    let window_s = oldest_missing
        .map(|at| kill_ms.saturating_sub(at) as f64 / 1000.0)
        .unwrap_or(0.0);
    // The segments the collector may seal in that time: one per partition, one more per
    // `--max-segment-bytes` of its lines (lost lines counted at the mean line's size).
    let mean_line = rb
        .partitions
        .values()
        .map(|p| p.1)
        .sum::<u64>()
        .checked_div(rb.lines)
        .unwrap_or(1000);
    let lost_per_partition = lost * mean_line / rb.partitions.len().max(1) as u64;
    let split_partitions = if who == Who::Ours {
        rb.partitions
            .values()
            .filter(|(objects, bytes)| {
                (*objects as u64) > (bytes + lost_per_partition) / MAX_SEGMENT_BYTES + 1
            })
            .count()
    } else {
        0
    };
    let _ = std::fs::remove_dir_all(&dir);
    if let StoreKind::File = storage.kind {
        let _ = std::fs::remove_dir_all(storage.root.join(&bucket));
    }
    Ok(Case {
        backend: match storage.kind {
            StoreKind::File => "file".into(),
            _ => "S3".into(),
        },
        who,
        rate,
        kill_at_s: kill_ms as f64 / 1000.0,
        acked,
        lost,
        duplicated,
        window_s,
        objects: rb.objects,
        partitions: rb.partitions.len(),
        max_per_partition: rb.partitions.values().map(|p| p.0).max().unwrap_or(0),
        split_partitions,
        versions,
        problems: rb.problems,
    })
}

// ------------------------------------------------------------------ the scenario

pub(crate) fn node_loss(ctx: &Ctx) -> Result<Verdict, String> {
    let window = ctx.args.upload_window.or(if ctx.smoke {
        Some(SMOKE_WINDOW_S)
    } else {
        None
    });
    let limit = window.unwrap_or(DEFAULT_WINDOW_S);
    let rates: Vec<f64> = if !ctx.args.rates.is_empty() {
        ctx.args.rates.clone()
    } else if ctx.smoke {
        vec![SMOKE_RATE]
    } else {
        RATES.to_vec()
    };
    let moments = ctx.args.kill_moments.unwrap_or(ctx.pick(1, 3)).max(1);
    let mut rng = Rng::new(seed(ctx, "node-loss"));
    // A kill after a few windows: the events older than the window are many, and at the
    // higher rates a segment may seal by size before it.
    let (from, to) = ctx.pick((3.0 * limit, 4.0 * limit), (limit + 5.0, limit + 20.0));
    // Every backend at hand: a directory always, the S3 server when there is one.
    let file = Storage::start(StoreKind::File, &ctx.work.join("node-loss-file"))?;
    let mut stores: Vec<&Storage> = vec![&file];
    if ctx.storage.can_cut() {
        stores.push(&ctx.storage);
    }
    let peer = ctx.args.peer.clone().or_else(peer_collector_bin);
    println!(
        "node-loss: upload window {limit} s ({}), kill between {from:.0} and {to:.0} s, {moments} moment(s) per rate, {JOBS} partitions; KubeRay's collector {}",
        if window.is_some() { "RHC_UPLOAD_WINDOW" } else { "the collector's default" },
        match &peer {
            Some(p) if ctx.storage.can_cut() => format!("{}", p.display()),
            Some(_) => "given, but it needs the S3 server (no file backend)".into(),
            None => "not given (--peer or RHC_PEER_COLLECTOR): not run".into(),
        }
    );
    println!("{TABLE_HEAD}");
    let mut cases = Vec::new();
    for store in &stores {
        for &rate in &rates {
            for _ in 0..moments {
                let at = rng.between(from, to);
                let mut whos = vec![Who::Ours];
                if peer.is_some() && !matches!(store.kind, StoreKind::File) {
                    whos.push(Who::Peer);
                }
                for who in whos {
                    let c = one_case(ctx, store, who, peer.clone(), rate, at, window)?;
                    println!("{}", c.row());
                    let _ = std::io::stdout().flush();
                    cases.push(c);
                }
            }
        }
    }
    let ours: Vec<&Case> = cases.iter().filter(|c| c.who == Who::Ours).collect();
    let pass = !ours.is_empty() && ours.iter().all(|c| c.holds(limit));
    let worst = |backend: &str, who: Who| {
        cases
            .iter()
            .filter(|c| c.backend == backend && c.who == who)
            .map(|c| c.window_s)
            .fold(None, |a: Option<f64>, w| Some(a.map_or(w, |a| a.max(w))))
    };
    let lost: u64 = ours.iter().map(|c| c.lost).sum();
    let acked: u64 = ours.iter().map(|c| c.acked).sum();
    let mut why: Vec<String> = Vec::new();
    for c in &ours {
        if c.acked == 0 {
            why.push(format!(
                "{} at {} ev/s: no event acknowledged before the kill",
                c.backend, c.rate
            ));
        }
        if c.window_s > limit {
            why.push(format!(
                "{} at {} ev/s: window {:.1} s",
                c.backend, c.rate, c.window_s
            ));
        }
        if c.split_partitions > 0 {
            why.push(format!(
                "{} at {} ev/s: {} partitions in more objects than segments",
                c.backend, c.rate, c.split_partitions
            ));
        }
        why.extend(c.problems.iter().take(2).cloned());
        why.extend(c.versions.problems.iter().take(2).cloned());
        if c.duplicated > 0 {
            why.push(format!(
                "{} at {} ev/s: {} duplicated",
                c.backend, c.rate, c.duplicated
            ));
        }
    }
    why.truncate(6);
    let fmt_worst = |w: Option<f64>| w.map(|w| format!("{w:.1} s")).unwrap_or("-".into());
    let mut text = format!(
        "{} kills under {} events/s ({} cases): worst loss window file {}, S3 {} (limit {limit} s); {lost} of {acked} acknowledged events lost",
        ours.len(),
        rates.iter().map(|r| format!("{r}")).collect::<Vec<_>>().join("/"),
        cases.len(),
        fmt_worst(worst("file", Who::Ours)),
        fmt_worst(worst("S3", Who::Ours)),
    );
    if let Some(w) = worst("S3", Who::Peer) {
        let (pl, pa): (u64, u64) = cases
            .iter()
            .filter(|c| c.who == Who::Peer)
            .fold((0, 0), |(l, a), c| (l + c.lost, a + c.acked));
        text.push_str(&format!(
            "; KubeRay's: worst window {w:.1} s, {pl} of {pa} lost"
        ));
    }
    if !why.is_empty() {
        text.push_str(&format!(" ({})", why.join("; ")));
    }
    Ok(Verdict::new(
        pass,
        text,
        json!({"window_limit_s": limit, "cases": cases.iter().map(Case::json).collect::<Vec<_>>()}),
    ))
}

// ------------------------------------------------------------------ logs

/// Appends a line to each log file every [`LOG_TICK`] until stopped; returns when each line
/// (by sequence number) was written, in ms since `t0`.
fn log_writer(
    files: Vec<PathBuf>,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<Vec<u32>, String>> {
    thread::spawn(move || {
        let mut handles = Vec::new();
        for p in &files {
            handles.push(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("{}: {e}", p.display()))?,
            );
        }
        let mut times = Vec::new();
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let ms = t0.elapsed().as_millis() as u32;
            for f in &mut handles {
                let line = format!(
                    "{seq:09} {ms:09} [2026-11-22 02:06:36,{:03} I 48213 48213] core_worker.cc:{}: task finished\n",
                    seq % 1000,
                    seq % 5000
                );
                f.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
            }
            times.push(ms);
            seq += 1;
            let next = t0 + LOG_TICK * (seq as u32);
            while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                thread::sleep((next - Instant::now()).min(Duration::from_millis(20)));
            }
        }
        Ok(times)
    })
}

/// One collector killed under written logs: (window s, lines lost, problems).
struct LogCase {
    backend: String,
    kill_at_s: f64,
    window_s: f64,
    lines_written: u64,
    lines_lost: u64,
    uploads: f64,
    problems: Vec<String>,
}

const LOG_FILES: &[&str] = &[
    "raylet.out",
    "gcs_server.out",
    "python-core-worker-5c1d0a2b3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a_48213.log",
];

fn log_case(ctx: &Ctx, storage: &Storage, kill_at_s: f64) -> Result<LogCase, String> {
    let n = ctx.seq.fetch_add(1, Ordering::Relaxed);
    let bucket = format!("chaos-node-loss-logs-{n}");
    storage.create_bucket(&bucket)?;
    let dir = ctx.work.join(format!("node-loss-logs-{n}"));
    let ray = dir.join("ray");
    let logs = ray.join(SESSION).join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    std::os::unix::fs::symlink(ray.join(SESSION), ray.join("session_latest"))
        .map_err(|e| e.to_string())?;
    let files: Vec<PathBuf> = LOG_FILES.iter().map(|f| logs.join(f)).collect();
    for f in &files {
        std::fs::write(f, b"").map_err(|e| e.to_string())?;
    }
    let (url, env) = storage.collector_config(&bucket, storage.port);
    let args: Vec<String> = vec![
        "--storage".into(),
        url,
        "--cluster-name".into(),
        "chaos".into(),
        "--node-id".into(),
        NODE_HEX.into(),
        "--role".into(),
        "worker".into(),
        "--ray-tmp-dir".into(),
        ray.display().to_string(),
    ];
    let mut c = Collector::configure(ctx.bin.clone(), &dir.join("spool"), &args, &env);
    c.log = dir.join("collector.log");
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = log_writer(files.clone(), t0, stop.clone());
    let spawned = c.try_spawn();
    if let Err(e) = spawned {
        stop.store(true, Ordering::Relaxed);
        let _ = writer.join();
        return Err(e);
    }
    let kill_at = t0 + Duration::from_secs_f64(kill_at_s);
    let mut uploads = 0.0;
    while Instant::now() < kill_at {
        if kill_at - Instant::now() < Duration::from_millis(1500) && uploads == 0.0 {
            uploads = c.metric("rhc_log_files_uploaded_total");
        }
        thread::sleep((kill_at - Instant::now()).min(Duration::from_millis(50)));
    }
    let kill_ms = t0.elapsed().as_millis() as u32;
    // The node vanishes (the writer, Ray's side, is stopped before any error is returned).
    let vanished = c.vanish();
    stop.store(true, Ordering::Relaxed);
    let times = writer
        .join()
        .map_err(|_| "the log writer panicked".to_string())??;
    vanished?;
    let store = storage.store(&bucket)?;
    let mut objects: HashMap<String, Vec<u8>> = HashMap::new();
    crate::storage::for_each_object(&store, |key, bytes| {
        if let Some((_, name)) = key.split_once("/logs/") {
            objects.insert(name.to_string(), bytes.to_vec());
        }
    })?;
    let mut problems = Vec::new();
    let mut window_ms = 0u32;
    let written = times.iter().filter(|t| **t <= kill_ms).count();
    let mut lost = 0u64;
    for name in LOG_FILES {
        let body = objects.get(*name).map(Vec::as_slice).unwrap_or_default();
        // Whole lines in order from the first: the bucket holds a prefix of the file.
        let mut whole = 0usize;
        for (i, line) in body.split(|&c| c == b'\n').enumerate() {
            let seq = std::str::from_utf8(line)
                .ok()
                .and_then(|l| l.split(' ').next())
                .and_then(|s| s.parse::<usize>().ok());
            match seq {
                Some(s) if s == i && line.len() > 20 => whole = i + 1,
                _ => break,
            }
        }
        if !body.is_empty() && whole == 0 {
            problems.push(format!("{name}: the object does not begin with the file"));
        }
        if whole < written {
            lost += (written - whole) as u64;
            window_ms = window_ms.max(kill_ms.saturating_sub(times[whole]));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let StoreKind::File = storage.kind {
        let _ = std::fs::remove_dir_all(storage.root.join(&bucket));
    }
    Ok(LogCase {
        backend: match storage.kind {
            StoreKind::File => "file".into(),
            _ => "S3".into(),
        },
        kill_at_s: kill_ms as f64 / 1000.0,
        window_s: window_ms as f64 / 1000.0,
        lines_written: (written * LOG_FILES.len()) as u64,
        lines_lost: lost,
        uploads,
        problems,
    })
}

pub(crate) fn node_loss_logs(ctx: &Ctx) -> Result<Verdict, String> {
    let moments = ctx.args.kill_moments.unwrap_or(3).max(1);
    let mut rng = Rng::new(seed(ctx, "node-loss-logs"));
    let file = Storage::start(StoreKind::File, &ctx.work.join("node-loss-logs-file"))?;
    let mut stores: Vec<&Storage> = vec![&file];
    if ctx.storage.can_cut() {
        stores.push(&ctx.storage);
    }
    let plan: Vec<(&Storage, f64)> = stores
        .iter()
        .flat_map(|s| (0..moments).map(move |_| *s).collect::<Vec<_>>())
        .map(|s| (s, rng.between(LOG_KILL_FROM_S, LOG_KILL_TO_S)))
        .collect();
    println!(
        "node-loss-logs: {} collectors at once (3 log files, a line every {} ms each), killed between {LOG_KILL_FROM_S:.0} and {LOG_KILL_TO_S:.0} s",
        plan.len(),
        LOG_TICK.as_millis()
    );
    println!("| store | kill s | lines written | lines lost | loss window s | files uploaded before |\n|---|---|---|---|---|---|");
    let results: Mutex<Vec<Result<LogCase, String>>> = Mutex::new(Vec::new());
    thread::scope(|s| {
        for (store, at) in &plan {
            let results = &results;
            s.spawn(move || {
                let r = log_case(ctx, store, *at);
                if let Ok(c) = &r {
                    println!(
                        "| {:<5} | {:>6.1} | {:>7} | {:>7} | {:>6.1} | {:>4} |",
                        c.backend,
                        c.kill_at_s,
                        c.lines_written,
                        c.lines_lost,
                        c.window_s,
                        c.uploads
                    );
                }
                if let Ok(mut v) = results.lock() {
                    v.push(r);
                }
            });
        }
    });
    let results = results.into_inner().map_err(|e| e.to_string())?;
    let mut cases = Vec::new();
    for r in results {
        cases.push(r?);
    }
    let limit = LOG_INTERVAL_S + LOG_ROUND_SLACK_S;
    let worst = cases.iter().map(|c| c.window_s).fold(0.0, f64::max);
    let mut windows: Vec<f64> = cases.iter().map(|c| c.window_s).collect();
    windows.sort_by(|a, b| a.total_cmp(b));
    let median = windows.get(windows.len() / 2).copied().unwrap_or(0.0);
    let problems: Vec<String> = cases.iter().flat_map(|c| c.problems.clone()).collect();
    let pass = !cases.is_empty() && worst <= limit && problems.is_empty();
    Ok(Verdict::new(
        pass,
        format!(
            "{} kills with logs being written, at the default --log-upload-interval ({LOG_INTERVAL_S:.0} s): loss window median {median:.1} s, worst {worst:.1} s (limit {limit:.0} s); {} of {} lines lost{}",
            cases.len(),
            cases.iter().map(|c| c.lines_lost).sum::<u64>(),
            cases.iter().map(|c| c.lines_written).sum::<u64>(),
            if problems.is_empty() { String::new() } else { format!(" ({})", problems.join("; ")) }
        ),
        json!({"interval_s": LOG_INTERVAL_S, "limit_s": limit, "median_window_s": median, "worst_window_s": worst,
               "cases": cases.iter().map(|c| json!({"backend": c.backend, "kill_at_s": c.kill_at_s,
                   "window_s": c.window_s, "lines_written": c.lines_written, "lines_lost": c.lines_lost,
                   "files_uploaded_before_kill": c.uploads, "problems": c.problems})).collect::<Vec<_>>()}),
    ))
}
