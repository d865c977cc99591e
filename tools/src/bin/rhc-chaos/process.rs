//! Scenarios about the process: kill -9 under load and restart, SIGTERM under load and with
//! a backlog, a segment torn mid-line at start.
//!
//! After every restart the kill -9 scenarios resend, besides the batch each client got no
//! answer for, the last batch each client had acknowledged (as Ray does when an answer was
//! lost on the way), with a deduplication window a few batches wide: each must come back
//! all duplicates, and the bucket must hold every event once. `kill9-seal` kills at seeded
//! random moments with 16 KiB segments, so that the answered batches' segments have been
//! sealed, uploaded and deleted before the kill.

use std::path::{Path, PathBuf};
use std::thread::{self};
use std::time::{Duration, Instant};

use crate::load::{batch_body, count_status, resend, Ledger, Load, LoadSpec, ACKED, CUT};
use crate::verify::{verify, IdOnly};
use crate::{http, mib, secs, Ctx, RssMonitor, Verdict};
use serde_json::json;

// ------------------------------------------------------------------ scenarios

/// Posts an acknowledged batch again until it is answered 200, up to `limit`; returns the
/// answer's (accepted, duplicates).
fn resend_acked(
    port: u16,
    spec: &LoadSpec,
    client: usize,
    first: u64,
    limit: Duration,
) -> Result<(u64, u64), String> {
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
                let v: serde_json::Value =
                    serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
                let n = |k: &str| v[k].as_u64().unwrap_or(0);
                return Ok((n("accepted"), n("duplicates")));
            }
        }
        thread::sleep(Duration::from_millis(200));
    }
    Err("the resent acknowledged batch was never answered 200".into())
}

pub(crate) fn kill9(ctx: &Ctx) -> Result<Verdict, String> {
    kill9_cycles(
        ctx,
        "kill9",
        &["--rotation-interval", "1s"],
        ctx.pick(1, 3),
        None,
    )
}

/// kill -9 at seeded random moments with segments so small that every group seals the
/// segments it wrote: the last answered batch of each client has usually been uploaded and
/// its segment deleted when the kill comes, so only the ids journal recognises its resend
/// (issue 40: 42 to 473 events stored twice before it).
pub(crate) fn kill9_seal(ctx: &Ctx) -> Result<Verdict, String> {
    let seed = crate::node_loss::seed(ctx, "kill9-seal");
    kill9_cycles(
        ctx,
        "kill9-seal",
        &[
            "--rotation-interval",
            "1s",
            "--max-segment-bytes",
            "16KiB",
            "--upload-window",
            "1s",
        ],
        ctx.pick(3, 8),
        Some(seed),
    )
}

/// `cycles` times: load from 4 clients, kill -9 (after a fixed load time shifted by 370 ms a
/// cycle, or at a moment drawn from `seed`), restart, resend each client's unanswered batch
/// and its last answered one. Every acknowledged event must be in the bucket once, and no
/// answered batch resent may be accepted again.
fn kill9_cycles(
    ctx: &Ctx,
    name: &str,
    extra: &[&str],
    cycles: usize,
    seed: Option<u64>,
) -> Result<Verdict, String> {
    const CLIENTS: usize = 4;
    let batch = ctx.pick(200, 1000);
    // A few batches per client: the spool holds far more ids than the window after a few
    // seconds, so only the newest ids reloaded at start recognise the resends.
    let window = (CLIENTS * batch * 3).to_string();
    let mut args = extra.to_vec();
    args.extend(["--dedup-window", window.as_str()]);
    let mut s = ctx.setup(name, false, &args)?;
    let mut rng = seed.map(crate::node_loss::Rng::new);
    let mut acked_resent = 0u64;
    let mut stored_again = 0u64;
    let load_for = ctx.pick(Duration::from_millis(2500), Duration::from_secs(4));
    let mut ledger = Ledger::default();
    let mut recovered_files = 0u64;
    let mut reloaded_ids = 0u64;
    let mut ready_max = Duration::ZERO;
    let mut resent = 0u64;
    let mut acked_before_kill = 0u64;
    let mut kills_ms = Vec::new();
    for cycle in 0..cycles {
        let mut spec = LoadSpec::new(&format!("k9c{cycle}"), CLIENTS, batch);
        spec.max = Duration::from_secs(60);
        // The smoke run uses a debug build: a modest rate keeps its upload short.
        spec.rate = ctx.pick(4_000.0, 0.0);
        let load = Load::start(s.collector.port, spec.clone());
        // A different phase each cycle, so the kill lands at different points of a group.
        let wait = match rng.as_mut() {
            Some(r) => Duration::from_secs_f64(r.between(1.0, load_for.as_secs_f64())),
            None => load_for + Duration::from_millis(370 * cycle as u64),
        };
        kills_ms.push(wait.as_millis() as u64);
        thread::sleep(wait);
        s.collector.kill9();
        acked_before_kill += load.acked();
        let logs = load.finish(&mut ledger);
        let before = s.collector.log_text().len();
        ready_max = ready_max.max(s.collector.try_spawn()?);
        let log = s.collector.log_text();
        let started = &log[before..];
        // Both start lines (files found, or only the journal reloaded) say how many ids the
        // deduplication window was refilled with.
        reloaded_ids += log_field(started, "dedup_ids=").unwrap_or(0);
        if let Some(i) = started.find("found files of an earlier run") {
            recovered_files += log_field(&started[i..], "files=").unwrap_or(0);
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
            // The last acknowledged batch again, as if its answer had been lost.
            if let Some((first, _)) = l.batches.iter().rev().find(|(_, st)| *st == ACKED) {
                let (accepted, _) = resend_acked(
                    s.collector.port,
                    &spec,
                    l.client,
                    *first,
                    Duration::from_secs(30),
                )
                .map_err(|e| format!("cycle {cycle}: {e}"))?;
                acked_resent += spec.batch as u64;
                stored_again += accepted;
            }
        }
    }
    let (code, took) = s
        .collector
        .try_terminate(Duration::from_secs(90))
        .map(|(s, d)| (s.code(), d))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let acked = ledger.count(ACKED);
    let pass = check.ok()
        && code == Some(0)
        && acked_before_kill > 0
        // With small segments a kill often finds every segment sealed and uploaded: then
        // only the ids journal refills the window, and that is what `kill9-seal` tests.
        && (recovered_files > 0 || name != "kill9")
        && reloaded_ids > 0
        && acked_resent > 0
        && stored_again == 0;
    Ok(Verdict::new(
        pass,
        format!(
            "{cycles} kill -9 under load ({CLIENTS} clients × {batch}, {}, dedup window {window}, killed after {kills_ms:?} ms): {acked} acked events ({resent} resent after restart); {acked_resent} acknowledged events resent after restart, {stored_again} of them accepted again; {}; {recovered_files} files recovered, {reloaded_ids} ids reloaded, ready {:.2} s after restart; exit {code:?} after {:.1} s",
            extra.join(" "),
            check.summary(),
            ready_max.as_secs_f64(),
            took.as_secs_f64(),
        ),
        json!({"cycles": cycles, "seed": seed, "kills_ms": kills_ms, "acked": acked, "resent": resent, "acked_resent": acked_resent,
               "acked_resent_stored_again": stored_again, "recovered_files": recovered_files, "reloaded_ids": reloaded_ids,
               "ready_after_restart_s": secs(ready_max), "exit_code": code, "shutdown_s": secs(took),
               "check": check.figures()}),
    ))
}

pub(crate) fn sigterm(ctx: &Ctx) -> Result<Verdict, String> {
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
    let code = s
        .collector
        .wait_exit(Duration::from_secs(60))
        .map(|s| s.code());
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

pub(crate) fn walk_files(dir: &Path) -> u64 {
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

pub(crate) fn sigterm_backlog(ctx: &Ctx) -> Result<Verdict, String> {
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
    let (code, took) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
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

pub(crate) fn torn(ctx: &Ctx) -> Result<Verdict, String> {
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
    s.collector.try_spawn()?;
    let log = s.collector.log_text()[before..].to_string();
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
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

pub(crate) fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

/// The number after the first `key` (`name=`) among `text`'s words: a field of a log line.
fn log_field(text: &str, key: &str) -> Option<u64> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|n| n.parse().ok())
}
