//! Scenarios about the storage: the disk budget exhausted, and an outage under load.

use std::thread::{self};
use std::time::{Duration, Instant};

use crate::load::{batch_body, count_status, Ledger, Load, LoadSpec, ACKED, PENDING};
use crate::verify::verify;
use crate::{connect, http, mib, secs, skip, Ctx, RssMonitor, Verdict};
use rhc_testkit::http::HttpResponse;
use serde_json::json;

pub(crate) fn budget(ctx: &Ctx) -> Result<Verdict, String> {
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
    let mut refused: Option<HttpResponse> = None;
    let mut conn = connect(port, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    while Instant::now() < deadline {
        let body = batch_body(&spec.tag, 0, first, spec.batch, spec.jobs);
        let r = conn
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
    let mut ready_503 = http(port, "GET", "/readyz", &[], b"")
        .map(|r| r.status)
        .unwrap_or(0)
        == 503;
    // Still refusing while the storage stays down. Not necessarily at once: the room held
    // back for the compressed copies of open segments shrinks as they are written (the
    // spool's one budget rule), so a batch may be taken again; but the spool must refuse
    // again within a few batches, never holding more than its budget.
    let mut still = 0;
    let mut over_budget = 0.0f64;
    let refuse_by = Instant::now() + Duration::from_secs(5);
    let mut body = batch_body(&spec.tag, 0, first, spec.batch, spec.jobs);
    while Instant::now() < refuse_by {
        thread::sleep(Duration::from_millis(100));
        still = http(
            port,
            "POST",
            "/v1/events",
            &[("Content-Type", "application/json")],
            &body,
        )
        .map(|r| r.status)
        .unwrap_or(0);
        over_budget = over_budget.max(s.collector.metric("rhc_spool_bytes") - budget_bytes as f64);
        if still != 200 {
            // Not ready while it refuses (asked again here: the first answer may have come
            // just as a copy was written).
            ready_503 |= http(port, "GET", "/readyz", &[], b"")
                .map(|r| r.status)
                .unwrap_or(0)
                == 503;
            break;
        }
        ledger.mark(&spec.tag, 0, first, spec.batch, ACKED);
        first += spec.batch as u64;
        body = batch_body(&spec.tag, 0, first, spec.batch, spec.jobs);
    }
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
    // Ready again once the restored storage has taken the backlog below the watermark.
    let mut ready_after = 0;
    let ready_by = Instant::now() + Duration::from_secs(30);
    while Instant::now() < ready_by {
        ready_after = http(port, "GET", "/readyz", &[], b"")
            .map(|r| r.status)
            .unwrap_or(0);
        if ready_after == 200 {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
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
        && over_budget <= 0.0
        && recovered.is_some()
        && ready_after == 200;
    Ok(Verdict::new(
        pass,
        format!(
            "budget {:.0} MiB, storage down: {accepted_before} events accepted ({:.1} MB spooled), then 503 Retry-After: {} (saying why: {says_why}), /readyz {}, refusing again: {still} ({:.0} bytes over the budget at most); storage back: 200 again after {}, /readyz {ready_after}; {}; exit {code:?}",
            mib(budget_bytes as f64),
            spool_at_503 / 1e6,
            retry_after.as_deref().unwrap_or("MISSING"),
            if ready_503 { 503 } else { 200 },
            over_budget.max(0.0),
            recovered.map(|d| format!("{:.2} s", d.as_secs_f64())).unwrap_or_else(|| "NEVER".into()),
            check.summary()
        ),
        json!({"budget_bytes": budget_bytes, "accepted_before_503": accepted_before, "spool_bytes_at_503": spool_at_503,
               "retry_after": retry_after, "readyz_503": ready_503, "recovered_s": recovered.map(secs),
               "exit_code": code, "check": check.figures()}),
    ))
}

pub(crate) fn outage(ctx: &Ctx) -> Result<Verdict, String> {
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
    let (code, took) = s
        .collector
        .try_terminate(Duration::from_secs(90))
        .map(|(s, d)| (s.code(), d))?;
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
