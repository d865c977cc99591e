//! Side by side with KubeRay's Go collector: the same fault, the same load and the same
//! bucket check against ours and against the peer (`--peer`, or `RHC_PEER_COLLECTOR`), one
//! after the other, each with a fresh bucket on the same S3 server and its data on the same
//! disk.
//!
//! The peer acknowledges a batch once it is in the page cache (no fsync before the 200) and
//! keeps no memory of event ids, so the check does not judge it: it counts, for every event
//! a client was told was accepted, how many times it is in the bucket: once, never (lost),
//! more than once (duplicated: a batch resent after a lost answer is stored again). The
//! verdict is PASS when ours lost and duplicated nothing; the peer's figures are reported.
//!
//! Both run with the settings of the benchmark (`bench/peer.sh`): ours with gzip,
//! `--rotation-interval 5s`, `--role worker`; the peer with compression on,
//! `RAY_COLLECTOR_EVENT_ROTATION_INTERVAL=5s` (it checks every 30 s). The disk budget is the
//! same for both: unlimited in practice (64 GiB) for kill -9 and SIGTERM, 256 MiB in the
//! outage (ours refuses from 90 % of it, the peer from 80 %). `--smoke` makes the loads small
//! (4,000 events/s; the outage 6 s at 2,000 events/s with 8 MiB), for debug builds.

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use crate::load::{count_status, resend, Ledger, Load, LoadSpec, ACKED};
use crate::storage::StoreKind;
use crate::verify::{verify, Check};
use crate::{skip, Ctx, Verdict};
use rhc_testkit::peer::{
    dir_bytes, peer_collector_bin, AnyCollector, PeerCollector, PeerSettings, PEER_INSTALL,
};
use rhc_testkit::relay::TcpRelay;
use serde_json::{json, Value};

/// Events per batch: Ray's publisher sends up to thousands; the benchmark's size.
const BATCH: usize = 1000;
/// The rate of the kill -9 and SIGTERM loads: a large node's (BENCHMARKS.md), which both
/// collectors sustain; with `--smoke` (debug builds in the tests) a small node's.
fn load_rate(ctx: &Ctx) -> f64 {
    ctx.pick(4_000.0, 25_000.0)
}

/// The outage load and disk budget: the load fills the budget in about a quarter of the
/// outage (60 s, `--smoke` 6 s).
fn outage_load(ctx: &Ctx) -> (f64, u64, Duration) {
    let secs = ctx.args.outage_secs.unwrap_or(ctx.pick(6.0, 60.0));
    (
        ctx.pick(2_000.0, 20_000.0),
        ctx.pick(8 << 20, 256 << 20),
        Duration::from_secs_f64(secs),
    )
}
/// The peer's SIGTERM drain has no deadline of its own; ours has `--shutdown-timeout`.
const EXIT_LIMIT: Duration = Duration::from_secs(180);
/// How long the spool may take to empty once the storage is back and the load stopped
/// (the peer rotates only on its 30 s check, then retries failed uploads every 5 s).
const DRAIN_LIMIT: Duration = Duration::from_secs(180);

/// Which collector.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
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

/// One collector set up for one scenario: its bucket, and the relay in front of the store.
struct Side {
    collector: AnyCollector,
    bucket: String,
    relay: Option<TcpRelay>,
    /// The peer's stand-in Ray tmp root (removed at the end).
    ray_tmp: Option<PathBuf>,
}

impl Drop for Side {
    fn drop(&mut self) {
        self.collector.kill9();
        if let Some(d) = &self.ray_tmp {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The peer's binary, or why the comparison cannot run.
fn peer_bin(ctx: &Ctx) -> Result<PathBuf, Verdict> {
    if !matches!(ctx.storage.kind, StoreKind::Moto(_) | StoreKind::S3sFs(_)) {
        return Err(skip(
            "needs an S3 server (--storage moto:…): KubeRay's collector has no file backend",
        ));
    }
    ctx.args.peer.clone().or_else(peer_collector_bin).ok_or_else(|| {
        skip(&format!(
            "KubeRay's collector not given (--peer or RHC_PEER_COLLECTOR; `{PEER_INSTALL}` provides it)"
        ))
    })
}

fn setup(ctx: &Ctx, name: &str, who: Who, relay: bool, budget: u64) -> Result<Side, String> {
    match who {
        Who::Ours => {
            let budget = budget.to_string();
            let s = ctx.setup(
                name,
                relay,
                &[
                    "--rotation-interval",
                    "5s",
                    "--role",
                    "worker",
                    "--max-spool-bytes",
                    &budget,
                    "--shutdown-timeout",
                    "60s",
                ],
            )?;
            Ok(Side {
                collector: AnyCollector::Ours(s.collector),
                bucket: s.bucket,
                relay: s.relay,
                ray_tmp: None,
            })
        }
        Who::Peer => {
            let bin = ctx
                .args
                .peer
                .clone()
                .or_else(peer_collector_bin)
                .ok_or("no peer")?;
            let n = ctx.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let bucket = format!("chaos-{name}-{n}");
            ctx.storage.create_bucket(&bucket)?;
            let relay = if relay {
                Some(TcpRelay::start(&format!("127.0.0.1:{}", ctx.storage.port))?)
            } else {
                None
            };
            let via = relay.as_ref().map(|r| r.port).unwrap_or(ctx.storage.port);
            // A short path: the raylet socket's path must fit 107 bytes.
            let ray_tmp = std::env::temp_dir().join(format!("rhc-cp-{}-{n}", std::process::id()));
            let mut settings = PeerSettings::defaults(
                &format!("http://127.0.0.1:{via}"),
                &bucket,
                crate::load::SESSION,
            );
            settings.compression = true;
            settings.rotation = "5s".into();
            settings.max_disk_mb = budget >> 20;
            let mut p = PeerCollector::configure(
                bin,
                &ctx.work.join(format!("{name}-{n}")),
                &ray_tmp,
                settings,
            )?;
            p.try_spawn()?;
            Ok(Side {
                collector: AnyCollector::Peer(p),
                bucket,
                relay,
                ray_tmp: Some(ray_tmp),
            })
        }
    }
}

/// What one collector's run came to.
struct Outcome {
    who: Who,
    acked: u64,
    check: Check,
    text: String,
    figures: Value,
}

impl Outcome {
    fn once(&self) -> u64 {
        self.acked
            .saturating_sub(self.check.lost + self.check.duplicated)
    }

    fn line(&self) -> String {
        format!(
            "{}: {} acked, {} in the bucket once, {} lost, {} duplicated{}; {}",
            self.who.label(),
            self.acked,
            self.once(),
            self.check.lost,
            self.check.duplicated,
            if self.check.broken_lines > 0 || !self.check.problems.is_empty() {
                format!(" ({})", self.check.summary())
            } else {
                String::new()
            },
            self.text
        )
    }

    fn json(&self) -> Value {
        let mut f = json!({"acked": self.acked, "once": self.once(), "lost": self.check.lost,
                           "duplicated": self.check.duplicated, "check": self.check.figures()});
        if let (Some(o), Some(extra)) = (f.as_object_mut(), self.figures.as_object()) {
            o.extend(extra.clone());
        }
        f
    }
}

/// Runs `one` for ours and for the peer, and makes the verdict of the pair.
fn both(
    ctx: &Ctx,
    what: &str,
    one: fn(&Ctx, Who) -> Result<Outcome, String>,
) -> Result<Verdict, String> {
    if let Err(v) = peer_bin(ctx) {
        return Ok(v);
    }
    let ours = one(ctx, Who::Ours)?;
    let peer = one(ctx, Who::Peer)?;
    let pass = ours.check.ok() && ours.acked > 0 && peer.acked > 0;
    Ok(Verdict::new(
        pass,
        format!("{what} | {} | {}", ours.line(), peer.line()),
        json!({"ours": ours.json(), "peer": peer.json()}),
    ))
}

// ------------------------------------------------------------------ scenarios

pub(crate) fn side_kill9(ctx: &Ctx) -> Result<Verdict, String> {
    both(
        ctx,
        &format!(
            "3 × kill -9 under {:.0} events/s (4 clients × 1,000-event batches), restart, resend the unanswered batches",
            load_rate(ctx)
        ),
        kill9_one,
    )
}

fn kill9_one(ctx: &Ctx, who: Who) -> Result<Outcome, String> {
    let mut s = setup(ctx, "side-kill9", who, false, 64 << 30)?;
    let mut ledger = Ledger::default();
    let mut resent = 0u64;
    let mut ready_max = Duration::ZERO;
    for cycle in 0..3u64 {
        let mut spec = LoadSpec::new(&format!("k9c{cycle}"), 4, BATCH);
        spec.rate = load_rate(ctx);
        spec.max = Duration::from_secs(60);
        let load = Load::start(s.collector.port(), spec.clone());
        // A different phase each cycle, so the kill lands at different points.
        thread::sleep(Duration::from_millis(ctx.pick(2500, 4000) + 370 * cycle));
        s.collector.kill9();
        let logs = load.finish(&mut ledger);
        ready_max = ready_max.max(s.collector.try_spawn()?);
        for l in &logs {
            if let Some(first) = l.pending {
                if !resend(
                    s.collector.port(),
                    &spec,
                    l.client,
                    first,
                    Duration::from_secs(60),
                ) {
                    return Err(format!(
                        "{}: cycle {cycle}: a resent batch was never acknowledged",
                        who.label()
                    ));
                }
                ledger.mark(&spec.tag, l.client, first, spec.batch, ACKED);
                resent += spec.batch as u64;
            }
        }
    }
    let (code, took) = terminate(&mut s)?;
    let check = verify(&ctx.storage.store(&s.bucket)?, &ledger);
    Ok(Outcome {
        who,
        acked: ledger.count(ACKED),
        text: format!(
            "{resent} unanswered events resent after a restart; ready {:.2} s after restart; exit {code:?} after {:.1} s",
            ready_max.as_secs_f64(),
            took.as_secs_f64()
        ),
        figures: json!({"resent": resent, "ready_after_restart_s": ready_max.as_secs_f64(),
                        "exit_code": code, "shutdown_s": took.as_secs_f64()}),
        check,
    })
}

pub(crate) fn side_sigterm(ctx: &Ctx) -> Result<Verdict, String> {
    both(
        ctx,
        &format!(
            "SIGTERM after 5 s of {:.0} events/s; the clients keep posting until the exit",
            load_rate(ctx)
        ),
        sigterm_one,
    )
}

fn sigterm_one(ctx: &Ctx, who: Who) -> Result<Outcome, String> {
    let mut s = setup(ctx, "side-sigterm", who, false, 64 << 30)?;
    let mut ledger = Ledger::default();
    let mut spec = LoadSpec::new("term", 4, BATCH);
    spec.rate = load_rate(ctx);
    let load = Load::start(s.collector.port(), spec);
    thread::sleep(Duration::from_secs(5));
    let spool_at_term = s.collector.spool_bytes();
    let (code, took) = terminate(&mut s)?;
    let logs = load.finish(&mut ledger);
    let left = dir_bytes(&s.collector.events_dir());
    let check = verify(&ctx.storage.store(&s.bucket)?, &ledger);
    Ok(Outcome {
        who,
        acked: ledger.count(ACKED),
        text: format!(
            "{:.0} MB in the spool at the signal, exit {code:?} after {:.2} s, {} requests answered 503 meanwhile, {} bytes of event files left on disk",
            spool_at_term as f64 / 1e6,
            took.as_secs_f64(),
            count_status(&logs, 503),
            left
        ),
        figures: json!({"spool_mb_at_term": spool_at_term as f64 / 1e6, "exit_code": code,
                        "shutdown_s": took.as_secs_f64(), "refused_503": count_status(&logs, 503),
                        "bytes_left": left}),
        check,
    })
}

pub(crate) fn side_outage(ctx: &Ctx) -> Result<Verdict, String> {
    let (rate, budget, secs) = outage_load(ctx);
    both(
        ctx,
        &format!(
            "storage cut for {:.0} s under {rate:.0} events/s, disk budget {} MiB",
            secs.as_secs_f64(),
            budget >> 20
        ),
        outage_one,
    )
}

fn outage_one(ctx: &Ctx, who: Who) -> Result<Outcome, String> {
    let (rate, budget, outage_for) = outage_load(ctx);
    let mut s = setup(ctx, "side-outage", who, true, budget)?;
    let mut spec = LoadSpec::new("outage", 4, BATCH);
    spec.rate = rate;
    spec.max = Duration::from_secs(600);
    let load = Load::start(s.collector.port(), spec);
    thread::sleep(Duration::from_secs(2));
    let cut_ms = load.started.elapsed().as_millis() as u32;
    if let Some(r) = s.relay.as_mut() {
        r.cut();
    }
    let mut spool_peak = 0u64;
    let end = Instant::now() + outage_for;
    while Instant::now() < end {
        spool_peak = spool_peak.max(s.collector.spool_bytes());
        thread::sleep(Duration::from_millis(250));
    }
    let acked_at_restore = load.acked();
    if let Some(r) = s.relay.as_mut() {
        r.restore()?;
    }
    let restored = Instant::now();
    let restored_ms = load.started.elapsed().as_millis() as u32;
    // The load goes on until answers are 200 again, and 3 s more; then the spool must
    // empty while the collector runs.
    let mut recovered = None;
    let mut load = Some(load);
    let mut logs = Vec::new();
    let mut ledger = Ledger::default();
    let mut stop_at: Option<Instant> = None;
    let mut drained = None;
    while restored.elapsed() < DRAIN_LIMIT {
        if let Some(l) = &load {
            if recovered.is_none() && l.acked() > acked_at_restore {
                recovered = Some(restored.elapsed());
                stop_at = Some(Instant::now() + Duration::from_secs(3));
            }
        }
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            if let Some(l) = load.take() {
                logs = l.finish(&mut ledger);
            }
            stop_at = None;
        }
        let spool = s.collector.spool_bytes();
        spool_peak = spool_peak.max(spool);
        if load.is_none() && spool == 0 {
            drained = Some(restored.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    if let Some(l) = load.take() {
        logs = l.finish(&mut ledger);
    }
    let (code, took) = terminate(&mut s)?;
    let check = verify(&ctx.storage.store(&s.bucket)?, &ledger);
    let during: Vec<u16> = logs
        .iter()
        .flat_map(|l| l.answers.iter())
        .filter(|(t, _)| *t >= cut_ms && *t < restored_ms)
        .map(|(_, s)| *s)
        .collect();
    let ok_during = (during.iter().filter(|s| **s == 200).count() * BATCH) as u64;
    let refused = during.iter().filter(|s| **s == 503).count();
    let first_503 = logs
        .iter()
        .flat_map(|l| l.answers.iter())
        .filter(|(t, s)| *t >= cut_ms && *s == 503)
        .map(|(t, _)| *t)
        .min()
        .map(|t| (t - cut_ms) as f64 / 1000.0);
    let fmt = |d: Option<Duration>| {
        d.map(|d| format!("{:.1} s", d.as_secs_f64()))
            .unwrap_or_else(|| "NEVER".into())
    };
    Ok(Outcome {
        who,
        acked: ledger.count(ACKED),
        text: format!(
            "{ok_during} events acked during the outage, first 503 {} after the cut, {refused} × 503; 200 again {} after the restore, spool empty {} after it (peak {:.0} MB); exit {code:?} after {:.1} s",
            first_503.map(|f| format!("{f:.1} s")).unwrap_or_else(|| "never".into()),
            fmt(recovered),
            fmt(drained),
            spool_peak as f64 / 1e6,
            took.as_secs_f64()
        ),
        figures: json!({"outage_s": outage_for.as_secs_f64(), "acked_during_outage": ok_during,
                        "first_503_after_cut_s": first_503, "refused_503": refused,
                        "recovered_s": recovered.map(|d| d.as_secs_f64()),
                        "drained_s": drained.map(|d| d.as_secs_f64()),
                        "spool_peak_mb": spool_peak as f64 / 1e6, "exit_code": code,
                        "shutdown_s": took.as_secs_f64()}),
        check,
    })
}

/// SIGTERM and the wait for the exit: (exit code, how long it took).
fn terminate(s: &mut Side) -> Result<(Option<i32>, Duration), String> {
    let t = Instant::now();
    s.collector.signal_term();
    let (status, _) = s.collector.wait_exit_usage(EXIT_LIMIT)?;
    Ok((status.code(), t.elapsed()))
}
