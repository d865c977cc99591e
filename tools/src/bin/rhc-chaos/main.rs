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
//! rhc-chaos --collector ... --storage moto:... --peer <KubeRay's collector> \
//!           --only side-kill9,side-sigterm,side-outage   # the same faults against both
//! ```
//!
//! Exit code 0 when no scenario failed (skipped ones do not count), 1 otherwise, 2 for bad
//! arguments. Every wait is bounded; a stuck scenario fails rather than hangs.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

mod compare;
mod cost;
mod faults;
mod hostile;
mod load;
mod logs;
mod memory;
mod node_loss;
mod partitions;
mod process;
mod storage;
mod verify;

use faults::{budget, outage};
use hostile::{busy_probes, malformed, oversized, slowloris, unsent_bodies};
use logs::logs_2g;
use process::{kill9, kill9_seal, sigterm, sigterm_backlog, torn};
use rhc_testkit::collector::{rss_bytes, Collector};
use rhc_testkit::http::{Conn, HttpResponse};
use rhc_testkit::relay::TcpRelay;
use storage::{Storage, StoreKind};

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
    /// KubeRay's Go collector, for the side-by-side scenarios (`side-*`; default:
    /// $RHC_PEER_COLLECTOR).
    #[arg(long)]
    peer: Option<PathBuf>,
    /// Seed of the random kill moments of `kill9-seal`, `node-loss` and `node-loss-logs`
    /// (default: from the clock; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Kill moments per rate of `node-loss` (default 3, smoke 1), collectors of
    /// `node-loss-logs` per store (default 3).
    #[arg(long)]
    kill_moments: Option<usize>,
    /// The upload window `node-loss` sets (`RHC_UPLOAD_WINDOW`) and holds the collector to, in
    /// seconds (default: none set, the collector's default 10 s; smoke 2 s).
    #[arg(long)]
    upload_window: Option<f64>,
    /// The rates of `node-loss`, events/s (default 20,200,2000,25000; smoke 200).
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// The partitions (jobs) of `upload-cost` (default 8,64,1; one partition is measured at
    /// 2,000 events/s only, after 45 s: the largest objects).
    #[arg(long, value_delimiter = ',')]
    cost_partitions: Vec<u32>,
    /// The open partitions of `sigterm-partitions`, one round each (default 5000).
    #[arg(long, value_delimiter = ',')]
    partitions: Vec<u32>,
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
        "kill9-seal",
        true,
        true,
        false,
        "kill -9 at seeded random moments under load with 16 KiB segments (every group seals what it wrote: answered batches uploaded and deleted before the kill), restart, resend each client's last answered and unanswered batch: none accepted again, every acked event exactly once",
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
        "memory",
        true,
        true,
        false,
        "hostile bodies ([0,0,…], [{},{},…], distinct integers, 64 MiB), 4 clients each, then dashboard answers of 62 MB polled every second: peak RSS <= 256 MiB, spool <= 2x received",
    ),
    (
        "unsent-bodies",
        true,
        true,
        false,
        "connections declaring a body (chunked, 32 MiB) and sending none, or part of it and stalling (12 x 4 MiB + 1, 8 MiB + 1): a Ray batch and a 9 MB one still get 200 within 3 s and /healthz answers",
    ),
    (
        "busy-probes",
        true,
        true,
        false,
        "256 keep-alive connections asking for /healthz every 5 s, then 256 with bodies 2 s late and pipelined heads and 16 holding the reserved places: a Ray batch still gets 200 within 3 s and /healthz answers",
    ),
    (
        "side-kill9",
        false,
        false,
        false,
        "(comparison) kill -9 under 25,000 events/s against ours and KubeRay's collector (--peer): acked events lost, duplicated",
    ),
    (
        "side-sigterm",
        false,
        false,
        false,
        "(comparison) SIGTERM under 25,000 events/s against ours and KubeRay's collector: acked events lost, duplicated",
    ),
    (
        "side-outage",
        false,
        false,
        true,
        "(comparison) 60 s storage outage under 20,000 events/s against ours and KubeRay's collector: acked events lost, duplicated",
    ),
    (
        "node-loss",
        true,
        true,
        false,
        "SIGKILL + spool deleted at seeded random moments under 20, 200, 2,000 and 25,000 events/s (file:// and the S3 server; smoke: 200 events/s, window 2 s): every event acked more than the upload window before the kill is in the bucket, objects per partition as many as segments, every object and every version a reader polled whole gzip of whole lines, each a prefix of the next",
    ),
    (
        "node-loss-logs",
        true,
        false,
        false,
        "(measurement) SIGKILL + spool deleted while Ray-like logs are written, collectors killed 65 to 130 s after their start: the logs' loss window (the snapshot interval, 60 s)",
    ),
    (
        "upload-cost",
        false,
        false,
        true,
        "(benchmark) requests per second to S3 and dollars per day at 200 and 2,000 events/s over 8 and 64 partitions (and one partition at 2,000 events/s: the largest objects), at the default upload window, counted by a proxy",
    ),
    (
        "sigterm-partitions",
        false,
        false,
        false,
        "(benchmark) --partitions open partitions (default 5,000; one job each) posted in a burst, SIGTERM at once: up to 5,000 exit 0 within 20 s, what more leaves in the spool uploaded by the next start; every acked event exactly once",
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
pub(crate) enum Outcome {
    Pass,
    Fail,
    Skip,
}

pub(crate) struct Verdict {
    pub(crate) outcome: Outcome,
    pub(crate) text: String,
    pub(crate) figures: serde_json::Value,
}

impl Verdict {
    pub(crate) fn new(pass: bool, text: String, figures: serde_json::Value) -> Verdict {
        Verdict {
            outcome: if pass { Outcome::Pass } else { Outcome::Fail },
            text,
            figures,
        }
    }
}

pub(crate) type Scenario = fn(&Ctx) -> Result<Verdict, String>;

pub(crate) fn scenario_fn(name: &str) -> Option<Scenario> {
    Some(match name {
        "kill9" => kill9,
        "kill9-seal" => kill9_seal,
        "outage" => outage,
        "budget" => budget,
        "sigterm" => sigterm,
        "sigterm-backlog" => sigterm_backlog,
        "torn" => torn,
        "slowloris" => slowloris,
        "oversized" => oversized,
        "malformed" => malformed,
        "memory" => memory::memory,
        "unsent-bodies" => unsent_bodies,
        "busy-probes" => busy_probes,
        "logs-2g" => logs_2g,
        "node-loss" => node_loss::node_loss,
        "node-loss-logs" => node_loss::node_loss_logs,
        "upload-cost" => cost::upload_cost,
        "sigterm-partitions" => partitions::sigterm_partitions,
        "side-kill9" => compare::side_kill9,
        "side-sigterm" => compare::side_sigterm,
        "side-outage" => compare::side_outage,
        _ => return None,
    })
}

// ------------------------------------------------------------------ small helpers

pub(crate) fn mib(bytes: f64) -> f64 {
    (bytes / 1048576.0 * 10.0).round() / 10.0
}

pub(crate) fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 100.0).round() / 100.0
}

pub(crate) fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// Samples a process's RSS every 50 ms until dropped; keeps the peak.
pub(crate) struct RssMonitor {
    pub(crate) peak: Arc<AtomicU64>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) handle: Option<JoinHandle<()>>,
}

impl RssMonitor {
    pub(crate) fn start(pid: u32) -> RssMonitor {
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

    pub(crate) fn peak(&self) -> u64 {
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

/// A keep-alive connection to the collector under test on `port`.
pub(crate) fn connect(port: u16, timeout: Duration) -> std::io::Result<Conn> {
    Conn::open(&format!("127.0.0.1:{port}"), timeout)
}

/// One request on a fresh connection to `127.0.0.1:<port>`.
pub(crate) fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    connect(port, Duration::from_secs(30))?.request(method, path, headers, body)
}

// ------------------------------------------------------------------ context

pub(crate) struct Ctx {
    pub(crate) bin: PathBuf,
    pub(crate) storage: Storage,
    pub(crate) work: PathBuf,
    pub(crate) smoke: bool,
    pub(crate) args: Args,
    pub(crate) seq: AtomicUsize,
}

/// A fresh bucket and collector for one scenario; uploads go through a relay when asked.
pub(crate) struct Setup {
    pub(crate) bucket: String,
    pub(crate) collector: Collector,
    pub(crate) relay: Option<TcpRelay>,
}

impl Ctx {
    pub(crate) fn pick<T>(&self, smoke: T, full: T) -> T {
        if self.smoke {
            smoke
        } else {
            full
        }
    }

    pub(crate) fn setup(&self, name: &str, relay: bool, extra: &[&str]) -> Result<Setup, String> {
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
        let mut collector = Collector::configure(self.bin.clone(), &dir.join("spool"), &args, &env);
        collector.log = dir.join("collector.log");
        collector.try_spawn()?;
        Ok(Setup {
            bucket,
            collector,
            relay,
        })
    }
}

pub(crate) fn skip(why: &str) -> Verdict {
    Verdict {
        outcome: Outcome::Skip,
        text: why.to_string(),
        figures: json!({}),
    }
}

// ------------------------------------------------------------------ main

pub(crate) fn parse_storage(s: &str) -> Result<StoreKind, String> {
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
