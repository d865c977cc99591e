//! Load generator: replays Ray-shaped events against a collector (or any HTTP sink) and
//! reports throughput and acknowledgement latency.
//!
//! Each client is a thread with one keep-alive connection, sending one batch at a time like
//! Ray's publisher. Event templates are the real Ray 2.60 shapes in tests/data, with event
//! ids, task ids, job ids and timestamps varied per event so deduplication and routing do
//! real work.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use clap::Parser;

const TEMPLATES: &str = include_str!("../../tests/data/posts-camel.jsonl");

/// Replays Ray events against an HTTP endpoint and measures it.
#[derive(Parser, Debug)]
#[command(name = "rhc-loadgen")]
struct Args {
    /// Target, e.g. http://127.0.0.1:8084/v1/events
    #[arg(long, default_value = "http://127.0.0.1:8084/v1/events")]
    url: String,
    /// Events per request.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Concurrent clients (connections).
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Target rate in events per second over all clients (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Number of distinct job ids.
    #[arg(long, default_value_t = 4)]
    jobs: u32,
    /// Gzip request bodies.
    #[arg(long)]
    gzip: bool,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
    /// Session name to put in the events.
    #[arg(long, default_value = "session_2026-11-22_00-00-00_000000_1")]
    session: String,
}

struct Template {
    /// The event with `@ID@`, `@JOB@`, `@TS@` placeholders.
    parts: Vec<String>,
}

fn load_templates(session: &str) -> Vec<Template> {
    let mut out = Vec::new();
    for line in TEMPLATES.lines().filter(|l| !l.trim().is_empty()) {
        let arr: Vec<serde_json::Value> = serde_json::from_str(line).unwrap_or_default();
        for mut ev in arr {
            let Some(obj) = ev.as_object_mut() else {
                continue;
            };
            obj.insert("eventId".into(), "@ID@".into());
            obj.insert("timestamp".into(), "@TS@".into());
            obj.insert("sessionName".into(), session.into());
            for (_, v) in obj.iter_mut() {
                if let Some(p) = v.as_object_mut() {
                    if p.get("jobId")
                        .and_then(|j| j.as_str())
                        .is_some_and(|j| !j.is_empty())
                    {
                        p.insert("jobId".into(), "@JOB@".into());
                    }
                    if p.contains_key("taskId") {
                        p.insert("taskId".into(), "@ID@".into());
                    }
                }
            }
            let text = ev.to_string();
            let mut parts = Vec::new();
            let mut rest = text.as_str();
            while let Some(i) = rest.find('@') {
                parts.push(rest[..i].to_string());
                let end = rest[i + 1..]
                    .find('@')
                    .map(|e| i + 1 + e)
                    .unwrap_or(rest.len() - 1);
                parts.push(rest[i..=end].to_string());
                rest = &rest[end + 1..];
            }
            parts.push(rest.to_string());
            out.push(Template { parts });
        }
    }
    out
}

fn rfc3339(now: std::time::SystemTime) -> String {
    let d = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, m, day) = ray_history_collector::layout::civil_from_days(secs.div_euclid(86400));
    let rem = secs.rem_euclid(86400);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

fn build_body(
    templates: &[Template],
    batch: usize,
    seq: &mut u64,
    client: usize,
    jobs: u32,
) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let ts = rfc3339(std::time::SystemTime::now());
    let mut body = Vec::with_capacity(batch * 1000);
    body.push(b'[');
    for i in 0..batch {
        if i > 0 {
            body.push(b',');
        }
        *seq += 1;
        let t = &templates[(*seq as usize) % templates.len()];
        let mut idb = [0u8; 16];
        idb[..8].copy_from_slice(&(client as u64).to_le_bytes());
        idb[8..].copy_from_slice(&seq.to_le_bytes());
        let id = b64.encode(idb);
        let job = b64.encode((1 + (*seq % jobs.max(1) as u64) as u32).to_le_bytes());
        for p in &t.parts {
            match p.as_str() {
                "@ID@" => body.extend_from_slice(id.as_bytes()),
                "@JOB@" => body.extend_from_slice(job.as_bytes()),
                "@TS@" => body.extend_from_slice(ts.as_bytes()),
                other => body.extend_from_slice(other.as_bytes()),
            }
        }
    }
    body.push(b']');
    body
}

struct Stats {
    latencies_us: Vec<u64>,
    events: u64,
    bytes: u64,
    non_2xx: u64,
    errors: u64,
}

fn post(
    conn: &mut Option<BufReader<TcpStream>>,
    addr: &str,
    path: &str,
    body: &[u8],
    gzip: bool,
) -> std::io::Result<u16> {
    if conn.is_none() {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        *conn = Some(BufReader::new(s));
    }
    let Some(r) = conn.as_mut() else {
        unreachable!()
    };
    let enc = if gzip {
        "Content-Encoding: gzip\r\n"
    } else {
        ""
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{enc}Content-Length: {}\r\n\r\n",
        body.len()
    );
    let s = r.get_mut();
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    let mut close = false;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let lower = l.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
    }
    let mut sink = vec![0u8; len];
    r.read_exact(&mut sink)?;
    if close {
        *conn = None;
    }
    Ok(status)
}

fn main() {
    let args = Args::parse();
    let rest = args.url.strip_prefix("http://").unwrap_or(&args.url);
    let (addr, path) = match rest.find('/') {
        Some(i) => (rest[..i].to_string(), rest[i..].to_string()),
        None => (rest.to_string(), "/".to_string()),
    };
    let templates = Arc::new(load_templates(&args.session));
    let stop = Arc::new(AtomicBool::new(false));
    let sent_events = Arc::new(AtomicU64::new(0));
    let all = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let per_client_rate = args.rate as f64 / args.concurrency.max(1) as f64;
    let mut handles = Vec::new();
    for client in 0..args.concurrency {
        let (templates, stop, all, addr, path) = (
            templates.clone(),
            stop.clone(),
            all.clone(),
            addr.clone(),
            path.clone(),
        );
        let (batch, jobs, gzip) = (args.batch, args.jobs, args.gzip);
        let sent_events = sent_events.clone();
        handles.push(std::thread::spawn(move || {
            let mut st = Stats {
                latencies_us: Vec::new(),
                events: 0,
                bytes: 0,
                non_2xx: 0,
                errors: 0,
            };
            let mut conn = None;
            let mut seq = 0u64;
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if per_client_rate > 0.0 {
                    let due = Duration::from_secs_f64(st.events as f64 / per_client_rate);
                    if let Some(wait) = due.checked_sub(t0.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                let mut body = build_body(&templates, batch, &mut seq, client, jobs);
                if gzip {
                    let mut e =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    let _ = e.write_all(&body);
                    body = e.finish().unwrap_or_default();
                }
                let t = Instant::now();
                match post(&mut conn, &addr, &path, &body, gzip) {
                    Ok(s) if (200..300).contains(&s) => {
                        st.latencies_us.push(t.elapsed().as_micros() as u64);
                        st.events += batch as u64;
                        st.bytes += body.len() as u64;
                        sent_events.fetch_add(batch as u64, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        st.non_2xx += 1;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(_) => {
                        st.errors += 1;
                        conn = None;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            if let Ok(mut a) = all.lock() {
                a.push(st);
            }
        }));
    }
    std::thread::sleep(Duration::from_secs_f64(args.duration));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = all
        .lock()
        .map(|mut a| std::mem::take(&mut *a))
        .unwrap_or_default();
    let mut lat: Vec<u64> = stats
        .iter()
        .flat_map(|s| s.latencies_us.iter().copied())
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        lat[((lat.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
    };
    let events: u64 = stats.iter().map(|s| s.events).sum();
    let bytes: u64 = stats.iter().map(|s| s.bytes).sum();
    let non_2xx: u64 = stats.iter().map(|s| s.non_2xx).sum();
    let errors: u64 = stats.iter().map(|s| s.errors).sum();
    let eps = events as f64 / elapsed;
    let mbps = bytes as f64 / elapsed / 1e6;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "events_per_s": eps, "mb_per_s": mbps, "requests": lat.len(),
                "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": lat.last().map(|m| *m as f64 / 1000.0).unwrap_or(0.0),
                "non_2xx": non_2xx, "errors": errors, "seconds": elapsed,
                "batch": args.batch, "concurrency": args.concurrency, "rate": args.rate, "gzip": args.gzip, "jobs": args.jobs,
            })
        );
    } else {
        println!(
            "{eps:.0} events/s  {mbps:.1} MB/s  requests {}  ack p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  non-2xx {non_2xx}  errors {errors}",
            lat.len(),
            pct(0.5),
            pct(0.99),
            lat.last().map(|m| *m as f64 / 1000.0).unwrap_or(0.0)
        );
    }
}
