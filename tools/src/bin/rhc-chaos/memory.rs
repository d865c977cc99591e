//! The memory probe: hostile bodies, each sent by four clients at once, must not cost more
//! memory or disk than their bytes. Peak RSS stays within 256 MiB (the memory limit the Helm
//! chart sets) and the spool grows by at most twice the bytes received.
//!
//! Then the same for what the head's dashboard poller reads: a dashboard stand-in answers the
//! job list, the placement groups and Serve's applications with bodies near the 64 MiB cap
//! (`[0,0,…]`, the costliest JSON per byte to hold as values), polled every second; the same
//! peak RSS verdict covers both.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rhc_testkit::dashboard::{Answer, DashboardStandIn, JOBS, PLACEMENT_GROUPS, SERVE};
use serde_json::json;

use crate::{http, mib, secs, Ctx, RssMonitor, Verdict};

/// Session the dashboard phase polls under (the poller needs an active session).
const SESSION: &str = "session_2026-11-22_02-06-54_202993_1";
/// Polls of the large answers the dashboard phase waits for.
const DASHBOARD_POLLS: usize = 3;

/// The chart's memory limit.
const RSS_LIMIT: u64 = 256 << 20;
/// Clients sending each body at once.
const CLIENTS: usize = 4;

/// `[e,e,e,…]` of about `bytes` bytes.
fn repeated(element: &str, bytes: usize) -> Vec<u8> {
    let n = (bytes / (element.len() + 1)).max(1);
    let mut body = Vec::with_capacity(n * (element.len() + 1) + 2);
    body.push(b'[');
    for i in 0..n {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(element.as_bytes());
    }
    body.push(b']');
    body
}

/// `[0,1,2,…]` of about `bytes` bytes: every element distinct.
fn distinct_integers(bytes: usize) -> Vec<u8> {
    let mut body = b"[".to_vec();
    let mut i = 0u64;
    while body.len() + 12 < bytes {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(i.to_string().as_bytes());
        i += 1;
    }
    body.push(b']');
    body
}

pub(crate) fn memory(ctx: &Ctx) -> Result<Verdict, String> {
    // The smoke subset (debug binaries in CI) scales everything down by four.
    let limit: usize = ctx.pick(16 << 20, 64 << 20);
    let limit_flag = limit.to_string();
    let dash = DashboardStandIn::start()?;
    let dash_address = dash.address();
    let mut s = ctx.setup(
        "memory",
        false,
        &[
            "--rotation-interval",
            "1h",
            "--max-body-bytes",
            &limit_flag,
            "--role",
            "head",
            "--dashboard-address",
            &dash_address,
            "--endpoint-poll-interval",
            "1s",
        ],
    )?;
    let port = s.collector.port;
    let rss = RssMonitor::start(s.collector.pid());
    let mb = |n: usize| ctx.pick(n / 4, n) * 1_000_000;
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("zeros", repeated("0", mb(60))),
        ("empty objects", repeated("{}", mb(60))),
        ("distinct integers", distinct_integers(mb(58))),
        ("zeros at the limit", repeated("0", limit - 16)),
    ];
    let written_before = s.collector.metric("rhc_spool_written_bytes_total");
    let mut received = 0u64;
    let mut lines = Vec::new();
    let mut all_ok = true;
    for (name, body) in bodies {
        let body = Arc::new(body);
        let t = Instant::now();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let body = body.clone();
                thread::spawn(move || {
                    // Like Ray: a refused body is sent again, until it is taken.
                    let deadline = Instant::now() + Duration::from_secs(120);
                    let mut refused = 0;
                    while Instant::now() < deadline {
                        match http(
                            port,
                            "POST",
                            "/v1/events",
                            &[("Content-Type", "application/json")],
                            &body,
                        ) {
                            Ok(r) if r.status == 200 => return (200, refused),
                            Ok(r) if r.status == 503 => refused += 1,
                            Ok(r) => return (r.status, refused),
                            Err(_) => refused += 1,
                        }
                        thread::sleep(Duration::from_millis(200));
                    }
                    (0, refused)
                })
            })
            .collect();
        let results: Vec<(u16, u32)> = clients
            .into_iter()
            .map(|c| c.join().unwrap_or((0, 0)))
            .collect();
        let ok = results.iter().all(|(st, _)| *st == 200);
        all_ok &= ok;
        received += body.len() as u64 * CLIENTS as u64;
        lines.push(format!(
            "{name} {:.0} MB x{CLIENTS}: {} in {:.1} s ({} refused first)",
            body.len() as f64 / 1e6,
            if ok {
                "all 200".to_string()
            } else {
                format!("{results:?}")
            },
            secs(t.elapsed()),
            results.iter().map(|(_, r)| r).sum::<u32>()
        ));
    }
    let (dash_ok, dash_line) = dashboard_phase(ctx, &s.collector.spool, &dash)?;
    all_ok &= dash_ok;
    lines.push(dash_line);
    let peak = rss.peak();
    drop(rss);
    let written = s.collector.metric("rhc_spool_written_bytes_total") - written_before;
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(st, d)| (st.code(), d))?;
    let pass = all_ok && peak <= RSS_LIMIT && written <= 2.0 * received as f64 && code == Some(0);
    Ok(Verdict::new(
        pass,
        format!(
            "peak RSS {:.0} MiB (limit {}), spool written {:.1} MB for {:.0} MB received (at most 2x); {}; exit {code:?}",
            mib(peak as f64),
            RSS_LIMIT >> 20,
            written / 1e6,
            received as f64 / 1e6,
            lines.join("; ")
        ),
        json!({"peak_rss_mib": mib(peak as f64), "spool_written_bytes": written, "received_bytes": received}),
    ))
}

/// Serves answers near the dashboard's 64 MiB body cap (scaled like the rest in the smoke
/// subset) and waits for [`DASHBOARD_POLLS`] polls of them; returns whether they came and
/// the line for the verdict.
fn dashboard_phase(
    ctx: &Ctx,
    spool: &std::path::Path,
    dash: &DashboardStandIn,
) -> Result<(bool, String), String> {
    let size = ctx.pick(62_000_000 / 4, 62_000_000);
    let zeros = repeated("0", size);
    let mut pgs =
        br#"{"result": true, "msg": "", "data": {"result": {"total": 0, "result": "#.to_vec();
    pgs.extend_from_slice(&repeated("0", size - 100));
    pgs.extend_from_slice(b"}}}");
    let json = |body: Vec<u8>| Answer {
        status: 200,
        content_type: "application/json",
        body,
    };
    dash.set(JOBS, json(zeros.clone()));
    dash.set(SERVE, json(zeros));
    dash.set(PLACEMENT_GROUPS, json(pgs));
    // The collector's Ray temp dir is beside its spool; the poller starts with the session.
    let ray = spool
        .parent()
        .ok_or("the spool dir has no parent")?
        .join("ray");
    std::fs::create_dir_all(ray.join(SESSION).join("logs")).map_err(|e| e.to_string())?;
    std::os::unix::fs::symlink(ray.join(SESSION), ray.join("session_latest"))
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let deadline = t + Duration::from_secs(120);
    while dash.count(JOBS) < DASHBOARD_POLLS || dash.count(PLACEMENT_GROUPS) < DASHBOARD_POLLS {
        if Instant::now() > deadline {
            return Ok((
                false,
                format!(
                    "dashboard answers of {:.0} MB: only {} polls in {:.0} s",
                    size as f64 / 1e6,
                    dash.count(JOBS),
                    secs(t.elapsed())
                ),
            ));
        }
        thread::sleep(Duration::from_millis(100));
    }
    // The last poll's bodies are read and checked after their request is logged.
    thread::sleep(Duration::from_secs(2));
    Ok((
        true,
        format!(
            "dashboard answers of {:.0} MB (job list, placement groups, Serve) polled {DASHBOARD_POLLS} times in {:.1} s",
            size as f64 / 1e6,
            secs(t.elapsed())
        ),
    ))
}
