//! Load generator: replays Ray-shaped events against a collector (or any HTTP sink) and
//! reports throughput and acknowledgement latency.
//!
//! Each client is a thread with one keep-alive connection, sending one batch at a time like
//! Ray's publisher. Event templates are the real Ray 2.60 shapes in tests/data, with event
//! ids, task ids, job ids and timestamps varied per event so deduplication and routing do
//! real work. Event ids include a per-run id (`--run-id`, random by default), so runs
//! against the same collector are not dropped as duplicates of each other.
//!
//! With `--rate`, each client sends on a fixed schedule (rate / concurrency events per
//! second); a client that falls behind sends back to back. `p99_ms` is the service time of
//! a request (write to last byte of the answer); `p99_sched_ms` counts from when the
//! request was due, so it includes the time spent waiting behind slow answers (no
//! coordinated omission).
//!
//! With `--pid`, the process is sampled every 100 ms: resident memory (peak, start, end, and
//! the kernel's own high-water mark `VmHWM`), CPU time and open fds. With `--metrics-url`,
//! the collector's `rhc_spool_bytes` is sampled every second.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use clap::Parser;
use rhc_testkit::http::{try_http_request, Conn};

const TEMPLATES: &str = include_str!("../../../tests/data/posts-camel.jsonl");
/// The same Ray 2.60 capture with protobuf's field names, as Ray sends it with
/// `RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME=1`.
const TEMPLATES_SNAKE: &str = include_str!("../../../tests/data/posts-snake.jsonl");

/// Which key style the events are sent in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Keys {
    /// protobuf's JSON names (`eventId`), Ray's default.
    Camel,
    /// protobuf's field names (`event_id`).
    Snake,
}

impl Keys {
    fn templates(self) -> &'static str {
        match self {
            Keys::Camel => TEMPLATES,
            Keys::Snake => TEMPLATES_SNAKE,
        }
    }

    /// The names of the fields the generator varies: event id, timestamp, session, job, task.
    fn names(self) -> [&'static str; 5] {
        match self {
            Keys::Camel => ["eventId", "timestamp", "sessionName", "jobId", "taskId"],
            Keys::Snake => ["event_id", "timestamp", "session_name", "job_id", "task_id"],
        }
    }
}

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
    /// How long to measure, in seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before measuring starts (requests then are not counted).
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
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
    /// Mixed into every event id so that runs do not collide (default: random).
    #[arg(long)]
    run_id: Option<String>,
    /// Sample this process's memory, CPU and fds while the load runs.
    #[arg(long)]
    pid: Option<u32>,
    /// Sample `rhc_spool_bytes` from this URL (e.g. http://127.0.0.1:8084/metrics) every second.
    #[arg(long)]
    metrics_url: Option<String>,
    /// Include per-second series (acknowledged events, RSS, spool bytes) in the JSON.
    #[arg(long)]
    timeline: bool,
    /// Key style of the events sent.
    #[arg(long, value_enum, default_value_t = Keys::Camel)]
    keys: Keys,
    /// A label echoed in the JSON output.
    #[arg(long, default_value = "")]
    label: String,
}

struct Template {
    /// The event with `@ID@`, `@JOB@`, `@TS@` placeholders.
    parts: Vec<String>,
}

fn load_templates(session: &str, keys: Keys) -> Vec<Template> {
    let [event_id, timestamp, session_name, job_id, task_id] = keys.names();
    let mut out = Vec::new();
    for line in keys.templates().lines().filter(|l| !l.trim().is_empty()) {
        let arr: Vec<serde_json::Value> = serde_json::from_str(line).unwrap_or_default();
        for mut ev in arr {
            let Some(obj) = ev.as_object_mut() else {
                continue;
            };
            obj.insert(event_id.into(), "@ID@".into());
            obj.insert(timestamp.into(), "@TS@".into());
            obj.insert(session_name.into(), session.into());
            for (_, v) in obj.iter_mut() {
                if let Some(p) = v.as_object_mut() {
                    if p.get(job_id)
                        .and_then(|j| j.as_str())
                        .is_some_and(|j| !j.is_empty())
                    {
                        p.insert(job_id.into(), "@JOB@".into());
                    }
                    if p.contains_key(task_id) {
                        p.insert(task_id.into(), "@ID@".into());
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
    let (y, m, day) = ray_history_collector::util::time::civil_from_days(secs.div_euclid(86400));
    let rem = secs.rem_euclid(86400);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// FNV-1a, to turn the run id into 4 bytes of every event id.
fn fnv32(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Where a varying field sits in a prepared body.
#[derive(Clone, Copy)]
enum Field {
    Id,
    Job,
    Timestamp,
}

/// A batch body laid out once, whose event ids, job ids and timestamps are rewritten in
/// place for every request.
///
/// Every varying field has a fixed width (base64 of 16 and 4 bytes, RFC 3339 with 9
/// fractional digits), so a request costs a few bytes per event instead of copying the
/// whole body out of its templates: on a 2-core machine the generator's CPU is taken from
/// the collector it measures.
struct BodyBuilder {
    body: Vec<u8>,
    /// (offset, field, event index in the batch)
    patches: Vec<(usize, Field, usize)>,
    events: usize,
}

const ID_WIDTH: usize = 24;
const JOB_WIDTH: usize = 8;
const TS_WIDTH: usize = 30;

impl BodyBuilder {
    fn new(templates: &[Template], batch: usize) -> BodyBuilder {
        let mut body = Vec::with_capacity(batch * 1000);
        let mut patches = Vec::new();
        body.push(b'[');
        for i in 0..batch {
            if i > 0 {
                body.push(b',');
            }
            let t = &templates[i % templates.len()];
            for p in &t.parts {
                let (field, width) = match p.as_str() {
                    "@ID@" => (Field::Id, ID_WIDTH),
                    "@JOB@" => (Field::Job, JOB_WIDTH),
                    "@TS@" => (Field::Timestamp, TS_WIDTH),
                    other => {
                        body.extend_from_slice(other.as_bytes());
                        continue;
                    }
                };
                patches.push((body.len(), field, i));
                body.resize(body.len() + width, b'A');
            }
        }
        body.push(b']');
        BodyBuilder {
            body,
            patches,
            events: batch,
        }
    }

    /// The next body: fresh ids (from `seq`), job ids and the current time.
    fn next(&mut self, seq: &mut u64, id_prefix: [u8; 8], jobs: u32) -> &[u8] {
        let b64 = base64::engine::general_purpose::STANDARD;
        let ts = rfc3339(std::time::SystemTime::now());
        let first = *seq + 1;
        *seq += self.events as u64;
        let (mut id, mut job) = ([0u8; ID_WIDTH], [0u8; JOB_WIDTH]);
        let mut encoded_for = usize::MAX;
        for &(at, field, i) in &self.patches {
            if encoded_for != i {
                encoded_for = i;
                let n = first + i as u64;
                let mut idb = [0u8; 16];
                idb[..8].copy_from_slice(&id_prefix);
                idb[8..].copy_from_slice(&n.to_le_bytes());
                let _ = b64.encode_slice(idb, &mut id);
                let _ = b64.encode_slice(
                    (1 + (n % jobs.max(1) as u64) as u32).to_le_bytes(),
                    &mut job,
                );
            }
            let value: &[u8] = match field {
                Field::Id => &id,
                Field::Job => &job,
                Field::Timestamp => ts.as_bytes(),
            };
            self.body[at..at + value.len()].copy_from_slice(value);
        }
        &self.body
    }
}

#[derive(Default)]
struct Stats {
    latencies_us: Vec<u64>,
    sched_latencies_us: Vec<u64>,
    events: u64,
    /// Events acknowledged with 2xx over the whole run, warm-up included.
    acked_total: u64,
    bytes: u64,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
}

/// Posts one body on the kept-alive connection `conn` (opened when `None`, dropped when the
/// server closes it); the answer's status.
fn post(
    conn: &mut Option<Conn>,
    addr: &str,
    path: &str,
    body: &[u8],
    gzip: bool,
) -> std::io::Result<u16> {
    if conn.is_none() {
        *conn = Some(Conn::open(addr, Duration::from_secs(30))?);
    }
    let Some(c) = conn.as_mut() else {
        unreachable!()
    };
    let mut headers = vec![("Content-Type", "application/json")];
    if gzip {
        headers.push(("Content-Encoding", "gzip"));
    }
    let r = c.request("POST", path, &headers, body)?;
    if r.closes() {
        *conn = None;
    }
    Ok(r.status)
}

/// One sample of a process: resident bytes, CPU ticks (user + system), open fds.
#[derive(Debug, Clone, Copy, Default)]
struct ProcSample {
    rss_kib: u64,
    hwm_kib: u64,
    cpu_ticks: u64,
    fds: u64,
}

fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 after the name.
    let cpu_ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    Some(ProcSample {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        cpu_ticks,
        fds,
    })
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// A metric's value (summed over label sets) from a Prometheus text endpoint.
fn scrape(url: &str, name: &str) -> Option<f64> {
    let r = try_http_request("GET", url, &[], b"").ok()?;
    let text = String::from_utf8_lossy(&r.body);
    let mut sum = None;
    for l in text.lines() {
        if l.starts_with(name) && l[name.len()..].starts_with([' ', '{']) {
            if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                *sum.get_or_insert(0.0) += v;
            }
        }
    }
    sum
}

#[derive(Default)]
struct Monitor {
    rss_peak_kib: u64,
    fds_peak: u64,
    first: Option<ProcSample>,
    last: Option<ProcSample>,
    /// (seconds since measuring started, RSS KiB)
    rss_series: Vec<(f64, u64)>,
    /// (seconds since measuring started, spool bytes)
    spool_series: Vec<(f64, f64)>,
}

fn main() {
    let args = Args::parse();
    let rest = args.url.strip_prefix("http://").unwrap_or(&args.url);
    let (addr, path) = match rest.find('/') {
        Some(i) => (rest[..i].to_string(), rest[i..].to_string()),
        None => (rest.to_string(), "/".to_string()),
    };
    let run_id = args.run_id.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        format!("{}-{}", t.as_nanos(), std::process::id())
    });
    let run_hash = fnv32(&run_id);
    let templates = Arc::new(load_templates(&args.session, args.keys));
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(args.warmup <= 0.0));
    let total_seconds = args.warmup.max(0.0) + args.duration;
    let slots = total_seconds.ceil() as usize + 2;
    let per_second: Arc<Vec<AtomicU64>> = Arc::new((0..slots).map(|_| AtomicU64::new(0)).collect());
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
        let (measuring, per_second) = (measuring.clone(), per_second.clone());
        let (batch, jobs, gzip) = (args.batch, args.jobs, args.gzip);
        let concurrency = args.concurrency.max(1);
        let mut id_prefix = [0u8; 8];
        id_prefix[..4].copy_from_slice(&run_hash.to_le_bytes());
        id_prefix[4..].copy_from_slice(&(client as u32).to_le_bytes());
        handles.push(std::thread::spawn(move || {
            let mut st = Stats::default();
            let mut conn = None;
            let mut seq = 0u64;
            let mut builder = BodyBuilder::new(&templates, batch);
            // Events scheduled so far, for the pacing; counts refused batches too, so a
            // refusal does not make the client burst afterwards.
            // Clients start a fraction of a period apart, so a paced load is spread evenly.
            let mut scheduled = 0u64;
            let phase = batch as f64 * client as f64 / concurrency as f64;
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let mut due = Instant::now();
                if per_client_rate > 0.0 {
                    due =
                        t0 + Duration::from_secs_f64((scheduled as f64 + phase) / per_client_rate);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                scheduled += batch as u64;
                let plain = builder.next(&mut seq, id_prefix, jobs);
                let gzipped;
                let body: &[u8] = if gzip {
                    let mut e =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    let _ = e.write_all(plain);
                    gzipped = e.finish().unwrap_or_default();
                    &gzipped
                } else {
                    plain
                };
                let t = Instant::now();
                let result = post(&mut conn, &addr, &path, body, gzip);
                let done = Instant::now();
                let counted = measuring.load(Ordering::Relaxed);
                match result {
                    Ok(s) if (200..300).contains(&s) => {
                        st.acked_total += batch as u64;
                        let sec = started.elapsed().as_secs() as usize;
                        if let Some(slot) = per_second.get(sec) {
                            slot.fetch_add(batch as u64, Ordering::Relaxed);
                        }
                        if counted {
                            st.latencies_us.push((done - t).as_micros() as u64);
                            st.sched_latencies_us
                                .push(done.saturating_duration_since(due).as_micros() as u64);
                            st.events += batch as u64;
                            st.bytes += body.len() as u64;
                            *st.statuses.entry(s).or_default() += 1;
                        }
                    }
                    Ok(s) => {
                        if counted {
                            *st.statuses.entry(s).or_default() += 1;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(_) => {
                        if counted {
                            st.errors += 1;
                        }
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
    // The sampler: process every 100 ms, spool metric every second.
    let monitor = Arc::new(Mutex::new(Monitor::default()));
    let sampler = {
        let (stop, monitor, measuring) = (stop.clone(), monitor.clone(), measuring.clone());
        let (pid, metrics_url) = (args.pid, args.metrics_url.clone());
        std::thread::spawn(move || {
            let mut tick = 0u64;
            let mut measure_start: Option<Instant> = None;
            while !stop.load(Ordering::Relaxed) {
                if measuring.load(Ordering::Relaxed) {
                    let since = *measure_start.get_or_insert_with(Instant::now);
                    let t = since.elapsed().as_secs_f64();
                    if let Some(s) = pid.and_then(proc_sample) {
                        if let Ok(mut m) = monitor.lock() {
                            m.rss_peak_kib = m.rss_peak_kib.max(s.rss_kib);
                            m.fds_peak = m.fds_peak.max(s.fds);
                            m.first.get_or_insert(s);
                            m.last = Some(s);
                            if tick.is_multiple_of(10) {
                                m.rss_series.push((t, s.rss_kib));
                            }
                        }
                    }
                    if tick.is_multiple_of(10) {
                        if let Some(v) = metrics_url
                            .as_deref()
                            .and_then(|u| scrape(u, "rhc_spool_bytes"))
                        {
                            if let Ok(mut m) = monitor.lock() {
                                m.spool_series.push((t, v));
                            }
                        }
                    }
                    tick += 1;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    if args.warmup > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.warmup));
        measuring.store(true, Ordering::Relaxed);
    }
    let written_start = args
        .metrics_url
        .as_deref()
        .and_then(|u| scrape(u, "rhc_spool_written_bytes_total"));
    let measure_started = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(args.duration));
    let elapsed = measure_started.elapsed().as_secs_f64();
    // The last sample is taken at the end of the measured window.
    let end_sample = args.pid.and_then(proc_sample);
    let end_spool = args
        .metrics_url
        .as_deref()
        .and_then(|u| scrape(u, "rhc_spool_bytes"));
    let written_end = args
        .metrics_url
        .as_deref()
        .and_then(|u| scrape(u, "rhc_spool_written_bytes_total"));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let _ = sampler.join();
    let stats = all
        .lock()
        .map(|mut a| std::mem::take(&mut *a))
        .unwrap_or_default();
    let mut lat: Vec<u64> = stats
        .iter()
        .flat_map(|s| s.latencies_us.iter().copied())
        .collect();
    lat.sort_unstable();
    let mut sched: Vec<u64> = stats
        .iter()
        .flat_map(|s| s.sched_latencies_us.iter().copied())
        .collect();
    sched.sort_unstable();
    let pct = |v: &[u64], p: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
    };
    let events: u64 = stats.iter().map(|s| s.events).sum();
    let acked_total: u64 = stats.iter().map(|s| s.acked_total).sum();
    let bytes: u64 = stats.iter().map(|s| s.bytes).sum();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for s in &stats {
        for (k, v) in &s.statuses {
            *statuses.entry(*k).or_default() += v;
        }
    }
    let non_2xx: u64 = statuses
        .iter()
        .filter(|(k, _)| !(200..300).contains(*k))
        .map(|(_, v)| v)
        .sum();
    let errors: u64 = stats.iter().map(|s| s.errors).sum();
    let eps = events as f64 / elapsed;
    let mbps = bytes as f64 / elapsed / 1e6;
    let max_ms = lat.last().map(|m| *m as f64 / 1000.0).unwrap_or(0.0);
    let mon = monitor
        .lock()
        .map(|mut m| std::mem::take(&mut *m))
        .unwrap_or_default();
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut proc_json = serde_json::Map::new();
    if let (Some(first), Some(last)) = (mon.first, end_sample.or(mon.last)) {
        let cpu = (last.cpu_ticks.saturating_sub(first.cpu_ticks)) as f64
            / clock_ticks_per_second()
            / elapsed;
        proc_json.insert("rss_start_mib".into(), mib(first.rss_kib).into());
        proc_json.insert(
            "rss_peak_mib".into(),
            mib(mon.rss_peak_kib.max(last.rss_kib)).into(),
        );
        proc_json.insert("rss_end_mib".into(), mib(last.rss_kib).into());
        proc_json.insert("rss_hwm_mib".into(), mib(last.hwm_kib).into());
        proc_json.insert("cpu_cores".into(), cpu.into());
        proc_json.insert("fds_peak".into(), mon.fds_peak.max(last.fds).into());
    }
    if !mon.spool_series.is_empty() || end_spool.is_some() {
        let vals: Vec<f64> = mon
            .spool_series
            .iter()
            .map(|(_, v)| *v)
            .chain(end_spool)
            .collect();
        proc_json.insert("spool_start_bytes".into(), vals[0].into());
        proc_json.insert(
            "spool_max_bytes".into(),
            vals.iter().cloned().fold(0.0, f64::max).into(),
        );
        proc_json.insert(
            "spool_end_bytes".into(),
            vals.last().copied().unwrap_or(0.0).into(),
        );
    }
    if let (Some(a), Some(b)) = (written_start, written_end) {
        // Bytes the spool made durable (fdatasync'd) per second in the measured window.
        proc_json.insert(
            "spool_written_mb_per_s".into(),
            ((b - a) / elapsed / 1e6).into(),
        );
    }
    if args.json {
        let mut j = serde_json::json!({
            "label": args.label,
            "events_per_s": eps, "mb_per_s": mbps, "requests": lat.len(),
            "p50_ms": pct(&lat, 0.5), "p90_ms": pct(&lat, 0.9), "p99_ms": pct(&lat, 0.99),
            "p999_ms": pct(&lat, 0.999), "max_ms": max_ms,
            "p50_sched_ms": pct(&sched, 0.5), "p99_sched_ms": pct(&sched, 0.99),
            "non_2xx": non_2xx, "errors": errors, "seconds": elapsed, "acked_total": acked_total,
            "statuses": statuses.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
            "batch": args.batch, "concurrency": args.concurrency, "rate": args.rate,
            "gzip": args.gzip, "jobs": args.jobs, "run_id": run_id,
        });
        if let Some(o) = j.as_object_mut() {
            o.extend(proc_json);
            if args.timeline {
                let w = args.warmup.max(0.0).floor() as usize;
                let series: Vec<u64> = per_second
                    .iter()
                    .skip(w)
                    .take(args.duration.ceil() as usize)
                    .map(|a| a.load(Ordering::Relaxed))
                    .collect();
                o.insert("events_per_second_series".into(), series.into());
                o.insert(
                    "rss_mib_series".into(),
                    mon.rss_series
                        .iter()
                        .map(|(t, k)| serde_json::json!([t, mib(*k)]))
                        .collect::<Vec<_>>()
                        .into(),
                );
                o.insert(
                    "spool_bytes_series".into(),
                    mon.spool_series
                        .iter()
                        .map(|(t, v)| serde_json::json!([t, v]))
                        .collect::<Vec<_>>()
                        .into(),
                );
            }
        }
        println!("{j}");
    } else {
        let mut line = format!(
            "{eps:.0} events/s  {mbps:.1} MB/s  requests {}  ack p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  non-2xx {non_2xx}  errors {errors}",
            lat.len(),
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            max_ms,
        );
        if args.rate > 0 {
            line.push_str(&format!("  p99 from schedule {:.2} ms", pct(&sched, 0.99)));
        }
        for (k, v) in &proc_json {
            line.push_str(&format!("  {k} {}", fmt_num(v)));
        }
        println!("{line}");
    }
}

fn fmt_num(v: &serde_json::Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() != 0.0 => format!("{f:.1}"),
        Some(f) => format!("{f:.0}"),
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_bodies_are_valid_json_with_fresh_ids_jobs_and_times() {
        for keys in [Keys::Camel, Keys::Snake] {
            let [event_id, timestamp, session_name, job_id, _] = keys.names();
            let templates = load_templates("session_x", keys);
            let mut builder = BodyBuilder::new(&templates, 250);
            let mut seq = 0;
            let mut ids = std::collections::HashSet::new();
            let mut jobs = std::collections::HashSet::new();
            for round in 0..3 {
                let body = builder.next(&mut seq, *b"runid-01", 3).to_vec();
                let events: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
                assert_eq!(events.len(), 250);
                for ev in &events {
                    assert!(ids.insert(ev[event_id].as_str().unwrap().to_string()));
                    let ts = ev[timestamp].as_str().unwrap();
                    assert_eq!(ts.len(), TS_WIDTH);
                    assert!(ts.ends_with('Z') && !ts.contains('A'), "{ts}");
                    assert_eq!(ev[session_name], "session_x");
                    for payload in ev.as_object().unwrap().values().filter(|v| v.is_object()) {
                        if let Some(j) = payload.get(job_id).and_then(|j| j.as_str()) {
                            if !j.is_empty() {
                                jobs.insert(j.to_string());
                            }
                        }
                    }
                }
                assert_eq!(seq, 250 * (round + 1));
            }
            assert_eq!(ids.len(), 750, "{keys:?}");
            assert_eq!(jobs.len(), 3, "{keys:?}: {jobs:?}");
        }
    }
}
