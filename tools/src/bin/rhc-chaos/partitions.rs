//! `sigterm-partitions` (a measurement, not in the CI smoke set): many open partitions (one
//! job each) posted in a burst, then SIGTERM at once, before the publisher could grow their
//! objects: the worst case of a shutdown, one upload per partition.
//!
//! For each `--partitions N`: N events into N jobs (batches of [`BATCH`], each within the
//! collector's partitions-per-request bound), posted by [`CLIENTS`] clients; SIGTERM right
//! after the last answer; the shutdown's length, exit code and the segments left in the
//! spool. Up to [`MUST_DRAIN_UP_TO`] partitions the shutdown must exit 0 within
//! [`DRAIN_LIMIT`]. Whatever is left is then uploaded by a restart: the scenario measures the
//! restart's start and how long until the spool is empty, stops it, and checks that every
//! acknowledged event is in the bucket exactly once.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::load::{resend, Ledger, LoadSpec, ACKED};
use crate::process::walk_files;
use crate::verify::verify;
use crate::{secs, Ctx, Verdict};
use rhc_testkit::usage::cpu_seconds;

/// Events per request: below the collector's 512 partitions per request, so every event
/// is stored in its own job's partition, none quarantined as `too_many_partitions`.
const BATCH: usize = 500;
/// Clients posting the burst at once.
const CLIENTS: usize = 8;
/// The partitions up to which a shutdown must drain in time (the bar).
const MUST_DRAIN_UP_TO: u32 = 5_000;
/// The bar: exit 0 within this time of the SIGTERM.
const DRAIN_LIMIT: Duration = Duration::from_secs(20);
/// The collector's shutdown deadline here (its default).
const SHUTDOWN_TIMEOUT: &str = "25s";
/// How long the restart may take to upload what the shutdown left.
const RESTART_LIMIT: Duration = Duration::from_secs(600);

pub(crate) fn sigterm_partitions(ctx: &Ctx) -> Result<Verdict, String> {
    let counts = if ctx.args.partitions.is_empty() {
        vec![MUST_DRAIN_UP_TO]
    } else {
        ctx.args.partitions.clone()
    };
    let mut pass = true;
    let mut texts = Vec::new();
    let mut figures = Vec::new();
    for n in counts {
        let (ok, text, fig) = one_round(ctx, n)?;
        pass &= ok;
        texts.push(text);
        figures.push(fig);
    }
    Ok(Verdict::new(pass, texts.join("; "), json!(figures)))
}

fn one_round(ctx: &Ctx, n: u32) -> Result<(bool, String, serde_json::Value), String> {
    let mut s = ctx.setup(
        "partitions",
        false,
        &[
            "--rotation-interval",
            "1h",
            "--shutdown-timeout",
            SHUTDOWN_TIMEOUT,
            "--max-spool-bytes",
            "8GiB",
        ],
    )?;
    let mut spec = LoadSpec::new("parts", CLIENTS, BATCH);
    spec.jobs = n;
    let batches = (n as usize).div_ceil(BATCH);
    let posted = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let spec = spec.clone();
            let port = s.collector.port;
            thread::spawn(move || {
                let mut acked = Vec::new();
                for b in (c..batches).step_by(CLIENTS) {
                    // Consecutive sequence numbers: batch b holds jobs b*BATCH.. (mod n).
                    let first = (b * BATCH) as u64;
                    if !resend(port, &spec, c, first, Duration::from_secs(60)) {
                        return Err(format!("batch {b} not acknowledged within 60 s"));
                    }
                    acked.push(first);
                }
                Ok(acked)
            })
        })
        .collect();
    let mut ledger = Ledger::default();
    for (c, h) in handles.into_iter().enumerate() {
        let acked = h.join().map_err(|_| "a client panicked".to_string())??;
        for first in acked {
            ledger.mark("parts", c, first, BATCH, ACKED);
        }
    }
    let post_s = posted.elapsed();
    let spool_at_term = s.collector.metric("rhc_spool_bytes");
    let published_at_term = s.collector.metric("rhc_event_publications_total");
    // The shutdown's own CPU: the whole life's (from wait4) less what was spent before it.
    let cpu_before = cpu_seconds(s.collector.pid()).unwrap_or(0.0);
    let t = Instant::now();
    s.collector.signal_term();
    let (status, usage) = s.collector.wait_exit_usage(Duration::from_secs(120))?;
    let (code, took) = (status.code(), t.elapsed());
    let shutdown_cpu = usage.cpu_s() - cpu_before;
    let left = walk_files(&s.collector.spool.join("events"));
    let drained = code == Some(0) && left == 0;
    // What is left is uploaded by the next start.
    let (restart_s, empty_s) = if left > 0 {
        let start = s.collector.try_spawn()?;
        let t = Instant::now();
        while walk_files(&s.collector.spool.join("events")) > 0 && t.elapsed() < RESTART_LIMIT {
            thread::sleep(Duration::from_millis(200));
        }
        let empty = t.elapsed();
        s.collector.try_terminate(Duration::from_secs(120))?;
        (Some(secs(start)), Some(secs(empty)))
    } else {
        (None, None)
    };
    let left_after = walk_files(&s.collector.spool.join("events"));
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let acked = ledger.count(ACKED);
    let in_time = took <= DRAIN_LIMIT;
    let ok = check.ok() && left_after == 0 && (n > MUST_DRAIN_UP_TO || (drained && in_time));
    let text = format!(
        "{n} partitions ({acked} events posted in {:.2} s, {:.1} MB in the spool, {published_at_term} publications before the SIGTERM): exit {code:?} after {:.2} s ({shutdown_cpu:.2} CPU-s) (bar: ≤ {} s up to {MUST_DRAIN_UP_TO}), {left} segments left{}; {}",
        post_s.as_secs_f64(),
        spool_at_term / 1e6,
        took.as_secs_f64(),
        DRAIN_LIMIT.as_secs(),
        match (restart_s, empty_s) {
            (Some(r), Some(e)) => format!(", uploaded by the restart (ready after {r} s) within {e} s, {left_after} left"),
            _ => String::new(),
        },
        check.summary(),
    );
    let fig = json!({"partitions": n, "acked": acked, "post_s": secs(post_s), "spool_mb_at_term": spool_at_term / 1e6,
                     "shutdown_s": secs(took), "shutdown_cpu_s": shutdown_cpu, "exit_code": code, "segments_left": left,
                     "restart_ready_s": restart_s, "restart_upload_s": empty_s, "left_after_restart": left_after,
                     "check": check.figures()});
    Ok((ok, text, fig))
}
