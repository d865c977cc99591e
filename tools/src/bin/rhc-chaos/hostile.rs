//! Scenarios about hostile or broken clients: slowloris and slow bodies, oversized bodies,
//! a storm of malformed bodies, bodies declared and never sent or stalled part way, and
//! keep-alive connections filling every place (with probes, or with late bodies).

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self};
use std::time::{Duration, Instant};

use crate::load::{
    batch_body, count_status, event_json, resend, ClientLog, Ledger, Load, LoadSpec, ACKED, PENDING,
};
use crate::verify::verify;
use crate::{connect, http, mib, open_fds, secs, Ctx, RssMonitor, Verdict};
use rhc_testkit::collector::rss_bytes;
use rhc_testkit::http::{read_response, Conn};
use serde_json::json;

pub(crate) fn slowloris(ctx: &Ctx) -> Result<Verdict, String> {
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
            if closed.is_none() && tick.is_multiple_of(10) {
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
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
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
pub(crate) fn latency_gaps(logs: &[ClientLog]) -> Vec<u32> {
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
pub(crate) fn send_and_read(
    port: u16,
    head: String,
    body: Arc<Vec<u8>>,
    chunked: bool,
) -> (u16, Duration) {
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
    let status = read_response(&mut r, "POST").map(|r| r.status).unwrap_or(0);
    let took = t.elapsed();
    let _ = r.get_ref().shutdown(Shutdown::Both);
    let _ = writer.join();
    (status, took)
}

pub(crate) fn oversized(ctx: &Ctx) -> Result<Verdict, String> {
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
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
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
pub(crate) fn malformed_body(i: u64) -> (Vec<u8>, Option<&'static str>) {
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

pub(crate) fn malformed(ctx: &Ctx) -> Result<Verdict, String> {
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
                        conn = connect(port, Duration::from_secs(30)).ok();
                    }
                    let st = match conn
                        .as_mut()
                        .map(|c| c.request("POST", "/v1/events", &headers, &body))
                    {
                        Some(Ok(r)) => {
                            if r.closes() {
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
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(120))
        .map(|(s, d)| (s.code(), d))?;
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

/// Ray's publisher gives up on a request after this long and resends it.
const RAY_TIMEOUT: Duration = Duration::from_secs(3);

/// One request on a new connection that waits at most [`RAY_TIMEOUT`] for its answer: the
/// status (0 for none) and the time taken.
fn within_ray_timeout(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Duration) {
    let t = Instant::now();
    let status = Conn::open(&format!("127.0.0.1:{port}"), RAY_TIMEOUT)
        .and_then(|mut c| c.request(method, path, &[("Content-Type", "application/json")], body))
        .map(|r| r.status)
        .unwrap_or(0);
    (status, t.elapsed())
}

/// Whether every answer was 200 within [`RAY_TIMEOUT`], and the slowest one in seconds.
fn all_in_time(answers: &[(u16, Duration)]) -> (bool, f64) {
    let ok = answers.iter().all(|(s, d)| *s == 200 && *d < RAY_TIMEOUT);
    let slowest = answers
        .iter()
        .map(|(_, d)| d.as_secs_f64())
        .fold(0.0, f64::max);
    (ok, slowest)
}

/// Sends a chunked `POST /v1/events` head and `size` bytes of body (`[` and spaces, in
/// 64 KiB chunks), then nothing more; a write error (the collector closing) ends it early.
fn stalled_chunked_body(port: u16, size: usize) -> Result<TcpStream, String> {
    let mut st = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    st.write_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut data = vec![b' '; size];
    data[0] = b'[';
    for part in data.chunks(64 << 10) {
        let chunk = [format!("{:x}\r\n", part.len()).as_bytes(), part, b"\r\n"].concat();
        if st.write_all(&chunk).is_err() {
            break;
        }
    }
    Ok(st)
}

/// Requests that declare a body and send none (a chunked head, `Content-Length: 32 MiB`)
/// held the whole body budget before, and so did bodies that send part of themselves and
/// stall (twelve of 4 MiB + 1 byte: their buffers' doubled capacity was charged) or one of
/// 8 MiB + 1 byte (it held the single right to grow past 8 MiB, for 30 s): Ray's batch
/// must still get 200 within 3 s, a valid 9 MB batch too, and `/healthz` answer, however
/// many of them are open.
pub(crate) fn unsent_bodies(ctx: &Ctx) -> Result<Verdict, String> {
    let mut s = ctx.setup("unsent-bodies", false, &[])?;
    let port = s.collector.port;
    let mut ledger = Ledger::default();
    let rounds = ctx.pick(2, 5);
    let per_kind = ctx.pick(1, 4);
    let heads = [
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_string(),
        format!("POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", 32u64 << 20),
    ];
    let mut holders: Vec<TcpStream> = Vec::new();
    let mut batches = Vec::new();
    let mut probes = Vec::new();
    // Stalled partial bodies: 56 MiB of the 96 MiB budget, held for the whole scenario.
    let stalled_sizes: Vec<usize> = std::iter::repeat_n((4 << 20) + 1, 12)
        .chain([(8 << 20) + 1])
        .collect();
    for size in &stalled_sizes {
        holders.push(stalled_chunked_body(port, *size)?);
    }
    // Let the collector read every byte sent.
    thread::sleep(Duration::from_millis(1500));
    const LARGE_EVENTS: usize = 9_000;
    let large_first = 1_000_000;
    let large = within_ray_timeout(
        port,
        "POST",
        "/v1/events",
        &batch_body("unsent", 0, large_first, LARGE_EVENTS, 2),
    );
    ledger.mark(
        "unsent",
        0,
        large_first,
        LARGE_EVENTS,
        if large.0 == 200 { ACKED } else { PENDING },
    );
    for round in 0..rounds {
        for head in &heads {
            for _ in 0..per_kind {
                let mut st =
                    TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
                st.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
                holders.push(st);
            }
        }
        // Let the collector read the heads and wait for their bodies.
        thread::sleep(Duration::from_millis(300));
        let first = round as u64 * 100;
        let answer = within_ray_timeout(
            port,
            "POST",
            "/v1/events",
            &batch_body("unsent", 0, first, 100, 2),
        );
        ledger.mark(
            "unsent",
            0,
            first,
            100,
            if answer.0 == 200 { ACKED } else { PENDING },
        );
        batches.push(answer);
        probes.push(within_ray_timeout(port, "GET", "/healthz", b""));
        thread::sleep(Duration::from_millis(200));
    }
    let held = holders.len();
    drop(holders);
    let alive = s.collector.alive();
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let (batches_ok, batch_slowest) = all_in_time(&batches);
    let (probes_ok, probe_slowest) = all_in_time(&probes);
    let large_ok = large.0 == 200 && large.1 < RAY_TIMEOUT;
    let pass = batches_ok && probes_ok && large_ok && alive && code == Some(0) && check.ok();
    Ok(Verdict::new(
        pass,
        format!(
            "{rounds} rounds, up to {held} connections declaring a body (chunked, 32 MiB) and sending none or sending part of it and stalling (12 x 4 MiB + 1, 8 MiB + 1): a 9 MB batch {} in {:.2} s; Ray's batch {:?}, slowest {batch_slowest:.2} s; /healthz {:?}, slowest {probe_slowest:.2} s (all must be 200 within 3 s); {}; exit {code:?}",
            large.0,
            large.1.as_secs_f64(),
            batches.iter().map(|a| a.0).collect::<Vec<_>>(),
            probes.iter().map(|a| a.0).collect::<Vec<_>>(),
            check.summary()
        ),
        json!({"rounds": rounds, "holders": held, "stalled_partial_bodies": stalled_sizes.len(),
               "large_batch_status": large.0, "large_batch_s": large.1.as_secs_f64(),
               "batch_statuses": batches.iter().map(|a| a.0).collect::<Vec<_>>(), "batch_slowest_s": batch_slowest,
               "probe_statuses": probes.iter().map(|a| a.0).collect::<Vec<_>>(), "probe_slowest_s": probe_slowest,
               "exit_code": code, "check": check.figures()}),
    ))
}

/// Ray's batches (one a second on its own keep-alive connection) and the kubelet's probe
/// (a new connection every 2 s), as answered while an attack runs.
#[derive(Default)]
struct RayAndProbe {
    batches: Vec<(u16, Duration)>,
    probes: Vec<(u16, Duration)>,
    ray_reconnects: u32,
    /// Batches sent so far: the next one's first event.
    sent: u64,
}

impl RayAndProbe {
    /// Sends Ray's batches and the probes for `run_for`, marking the batches in `ledger`.
    fn run(&mut self, port: u16, run_for: Duration, ledger: &mut Ledger) {
        let mut ray: Option<Conn> = None;
        let started = Instant::now();
        while started.elapsed() < run_for {
            let tick = Instant::now();
            let k = self.sent;
            let first = k * 50;
            let body = batch_body("busy", 0, first, 50, 2);
            // A pooled client does not reuse a connection the server has closed (an idle
            // one may be closed to make room).
            if ray.as_mut().is_some_and(|c| c.closed_by_peer()) {
                ray = None;
            }
            if ray.is_none() {
                self.ray_reconnects += 1;
                ray = connect(port, RAY_TIMEOUT).ok();
            }
            let t = Instant::now();
            let status = match ray.as_mut().map(|c| {
                c.request(
                    "POST",
                    "/v1/events",
                    &[("Content-Type", "application/json")],
                    &body,
                )
            }) {
                Some(Ok(r)) => {
                    if r.closes() {
                        ray = None;
                    }
                    r.status
                }
                _ => {
                    ray = None;
                    0
                }
            };
            self.batches.push((status, t.elapsed()));
            ledger.mark(
                "busy",
                0,
                first,
                50,
                if status == 200 { ACKED } else { PENDING },
            );
            if k.is_multiple_of(2) {
                self.probes
                    .push(within_ray_timeout(port, "GET", "/healthz", b""));
            }
            self.sent += 1;
            thread::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed()));
        }
    }
}

/// The reviewer's lockout, on loopback until `stop` is set (and never past 120 s): 256
/// keep-alive connections each posting a 2-byte body 2 s after its head, with the next head
/// pipelined behind it (so no request is ever 3 s old), and 16 more holding the reserved
/// places with a head and no body, reconnecting when closed. Returns once all are under way
/// (1.5 s), with the attackers' threads, each giving its bytes sent and its reconnects.
fn stalling_bodies_attack(port: u16, stop: Arc<AtomicBool>) -> Vec<thread::JoinHandle<(u64, u64)>> {
    const HEAD: &[u8] = b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n";
    // Bounded: the scenario stops them, and they stop themselves past any sane length.
    let limit = Instant::now() + Duration::from_secs(120);
    let spawn = |holder: bool| {
        let stop = stop.clone();
        thread::spawn(move || {
            let (mut sent, mut reconnects) = (0u64, 0u64);
            let going = || !stop.load(Ordering::Relaxed) && Instant::now() < limit;
            let pause = |d: Duration| {
                let until = Instant::now() + d;
                while Instant::now() < until && going() {
                    thread::sleep(Duration::from_millis(50));
                }
            };
            while going() {
                let Ok(mut st) = TcpStream::connect(("127.0.0.1", port)) else {
                    pause(Duration::from_millis(50));
                    continue;
                };
                reconnects += 1;
                if st.write_all(HEAD).is_err() {
                    continue;
                }
                sent += HEAD.len() as u64;
                if holder {
                    // Wait to be answered or closed, then come back.
                    let _ = st.set_read_timeout(Some(Duration::from_millis(200)));
                    let mut buf = [0u8; 4096];
                    while going() {
                        match st.read(&mut buf) {
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) => {}
                            _ => break,
                        }
                    }
                    pause(Duration::from_millis(50));
                } else {
                    loop {
                        pause(Duration::from_secs(2));
                        if !going() || st.write_all(&[b"[]", HEAD].concat()).is_err() {
                            break;
                        }
                        sent += HEAD.len() as u64 + 2;
                    }
                }
            }
            (sent, reconnects.saturating_sub(1))
        })
    };
    let mut threads: Vec<_> = (0..256).map(|_| spawn(false)).collect();
    thread::sleep(Duration::from_secs(1));
    threads.extend((0..16).map(|_| spawn(true)));
    thread::sleep(Duration::from_millis(500));
    threads
}

/// 256 keep-alive connections each asking for `/healthz` every 5 s (about 51 requests a
/// second) fill every place; then 256 keep-alive connections keep every place busy with
/// bodies that arrive 2 s after their heads, the next head pipelined behind, and 16 more
/// hold the reserved places with heads and no bodies ([`stalling_bodies_attack`]). Through
/// both, Ray's batches (one a second on its own keep-alive connection) must still get 200
/// within 3 s, and the kubelet's probe (a new connection every 2 s) answer within 3 s.
pub(crate) fn busy_probes(ctx: &Ctx) -> Result<Verdict, String> {
    const FLOOD: usize = 256;
    const EVERY: Duration = Duration::from_secs(5);
    let mut s = ctx.setup("busy-probes", false, &[])?;
    let port = s.collector.port;
    let run_for = Duration::from_secs(ctx.pick(6, 30));
    let stop = Arc::new(AtomicBool::new(false));
    let filled = Arc::new(AtomicBool::new(false));
    let flood = {
        let (stop, filled) = (stop.clone(), filled.clone());
        thread::spawn(move || {
            let open = || connect(port, RAY_TIMEOUT).ok();
            let mut conns: Vec<Option<Conn>> = (0..FLOOD).map(|_| open()).collect();
            let started = Instant::now();
            let (mut sent, mut reconnects, mut failed) = (0u64, 0u64, 0u64);
            // Bounded: the scenario stops it, and it stops itself past any sane length.
            'rounds: for round in 0..100u32 {
                for (i, c) in conns.iter_mut().enumerate() {
                    // All at once first, so every place holds a connection that was served;
                    // then spread over the 5 s.
                    if round > 0 {
                        let due = started + EVERY * round + EVERY.mul_f64(i as f64 / FLOOD as f64);
                        while Instant::now() < due {
                            if stop.load(Ordering::Relaxed) {
                                break 'rounds;
                            }
                            thread::sleep(Duration::from_millis(5).min(due - Instant::now()));
                        }
                    }
                    let mut answered = c
                        .as_mut()
                        .and_then(|c| c.request("GET", "/healthz", &[], b"").ok())
                        .is_some_and(|r| r.status == 200);
                    if !answered {
                        // Closed to make room: come back, as an attacker would.
                        reconnects += 1;
                        *c = open();
                        answered = c
                            .as_mut()
                            .and_then(|c| c.request("GET", "/healthz", &[], b"").ok())
                            .is_some_and(|r| r.status == 200);
                    }
                    sent += 1;
                    failed += u64::from(!answered);
                }
                filled.store(true, Ordering::Relaxed);
            }
            (sent, reconnects, failed)
        })
    };
    let wait_fill = Instant::now();
    while !filled.load(Ordering::Relaxed) && wait_fill.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_millis(20));
    }
    let mut ledger = Ledger::default();
    let mut ray = RayAndProbe::default();
    ray.run(port, run_for, &mut ledger);
    stop.store(true, Ordering::Relaxed);
    let (flood_sent, flood_reconnects, flood_failed) = flood
        .join()
        .map_err(|_| "the flood thread panicked".to_string())?;
    let flood_phase = (ray.batches.len(), ray.probes.len());
    // The second attack, with Ray and the probe going on.
    let stop = Arc::new(AtomicBool::new(false));
    let attackers = stalling_bodies_attack(port, stop.clone());
    ray.run(port, run_for, &mut ledger);
    stop.store(true, Ordering::Relaxed);
    let (mut stall_bytes, mut stall_reconnects) = (0u64, 0u64);
    for t in attackers {
        let (b, r) = t
            .join()
            .map_err(|_| "an attacker thread panicked".to_string())?;
        stall_bytes += b;
        stall_reconnects += r;
    }
    let stalled_evicted = s
        .collector
        .metric_labeled("rhc_connections_evicted_total", "reason=\"stalled_body\"")
        .max(0.0) as u64;
    let RayAndProbe {
        batches,
        probes,
        ray_reconnects,
        ..
    } = ray;
    let evicted = s.collector.metric("rhc_connections_evicted_total").max(0.0) as u64;
    let alive = s.collector.alive();
    let (code, _) = s
        .collector
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
    let store = ctx.storage.store(&s.bucket)?;
    let check = verify(&store, &ledger);
    let (batches_ok, batch_slowest) = all_in_time(&batches);
    let (probes_ok, probe_slowest) = all_in_time(&probes);
    let pass = batches_ok && probes_ok && alive && code == Some(0) && check.ok();
    let bad = |v: &[(u16, Duration)]| {
        v.iter()
            .filter(|(s, d)| *s != 200 || *d >= RAY_TIMEOUT)
            .count()
    };
    Ok(Verdict::new(
        pass,
        format!(
            "{FLOOD} keep-alive connections asking for /healthz every 5 s ({flood_sent} requests, {flood_reconnects} reconnects after being closed, {flood_failed} unanswered) for {:.0} s, then 256 keep-alive connections with bodies 2 s late and pipelined heads and 16 holding the reserved places ({stall_bytes} bytes, {stall_reconnects} reconnects, {stalled_evicted} cut for a stalled body) as long: Ray's batches {} sent, {} not 200 within 3 s, slowest {batch_slowest:.2} s, {ray_reconnects} connection(s); /healthz {} sent, {} not 200 within 3 s, slowest {probe_slowest:.2} s; {evicted} connections made room; {}; exit {code:?}",
            run_for.as_secs_f64(),
            batches.len(),
            bad(&batches),
            probes.len(),
            bad(&probes),
            check.summary()
        ),
        json!({"flood_connections": FLOOD, "flood_requests": flood_sent, "flood_reconnects": flood_reconnects,
               "flood_unanswered": flood_failed, "batches": batches.len(), "batches_late_or_failed": bad(&batches),
               "batch_slowest_s": batch_slowest, "ray_connections": ray_reconnects, "probes": probes.len(),
               "probes_late_or_failed": bad(&probes), "probe_slowest_s": probe_slowest, "evicted": evicted,
               "flood_phase_batches": flood_phase.0, "flood_phase_probes": flood_phase.1,
               "stall_attack_bytes": stall_bytes, "stall_attack_reconnects": stall_reconnects,
               "stalled_body_evictions": stalled_evicted,
               "exit_code": code, "check": check.figures()}),
    ))
}
