//! What one request may cost, through the real binary: floods of tiny bad elements, the
//! quarantine's caps, the disk budget, the deduplication window, values JSON readers
//! refuse, every `Content-Encoding` header, bodies declared and never sent, bodies that stop
//! arriving, garbage bodies that decode to megabytes, clients that never read their answers,
//! heads that never end, connections filling every place; and how inputs Ray never sends are
//! read (the decisions in docs/bucket-layout.md, "Inputs Ray never sends").

use std::io::{Read as _, Write as _};
use std::time::Duration;

use serde_json::Value;

use rhc_testkit::collector::{decode, read_all, Collector};

/// The per-body quarantine cap (events::http::MAX_QUARANTINED_PER_BODY).
const CAP: u64 = 1000;
/// The per-body cap of quarantine record bytes (events::http::MAX_QUARANTINED_BYTES_PER_BODY).
const CAP_BYTES: u64 = 64 << 10;
/// What a record adds to its element, at least (`{"reason":…,"detail":…,"received_at":…,"event":…}`).
const RECORD_FRAME: u64 = 72;

fn event(id: &str) -> String {
    format!(
        r#"{{"eventId":"{id}","eventType":"TASK_DEFINITION_EVENT","sessionName":"session_h","timestamp":"2026-11-22T02:00:00Z","taskDefinitionEvent":{{"jobId":"AQAAAA=="}}}}"#
    )
}

fn json(r: &rhc_testkit::http::HttpResponse) -> Value {
    serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&r.body)))
}

/// Peak resident memory of the collector (VmHWM), in MiB.
fn peak_mib(c: &Collector) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", c.pid())).unwrap();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

fn spool_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            total += spool_bytes(&p);
        } else {
            total += e.metadata().map(|m| m.len()).unwrap_or(0);
        }
    }
    total
}

/// [`spool_bytes`] once it has not changed for half a second (at most 20 s).
fn settled_spool_bytes(dir: &std::path::Path) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = spool_bytes(dir);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = spool_bytes(dir);
        if now == last || std::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn start(tmp: &tempfile::TempDir, extra: &[&str]) -> Collector {
    let bucket = tmp.path().join("bucket");
    let mut args = vec![
        "--storage",
        bucket.to_str().unwrap(),
        "--enable-log-collector",
        "false",
    ];
    args.extend_from_slice(extra);
    Collector::start(&tmp.path().join("spool"), &args, &[])
}

/// [`start`] with `--max-gzip-ratio 0`: for the gzip bodies, far beyond what their size as
/// sent may decode to by default, that test what lies behind that bound (the body budget,
/// quarantine's caps, the runtime's workers), as with a client allowed to send them. The
/// bound itself: `gzip_bodies_decoding_past_a_hundred_times_their_size_get_413`.
fn start_any_ratio(tmp: &tempfile::TempDir, extra: &[&str]) -> Collector {
    let mut args = vec!["--max-gzip-ratio", "0"];
    args.extend_from_slice(extra);
    start(tmp, &args)
}

/// A body of millions of tiny bad elements costs about its own size in memory, at most a
/// thousand quarantine records (and 64 KiB of them) on disk, and the rest is counted and
/// said in the answer.
#[test]
fn floods_of_tiny_bad_elements_cost_their_body_not_their_count() {
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &["--rotation-interval", "1h"]);
    for (name, element) in [("zeros", "0"), ("empty objects", "{}")] {
        let n = 20_000_000usize / (element.len() + 1);
        let mut body = Vec::with_capacity(n * (element.len() + 1) + 2);
        body.push(b'[');
        for i in 0..n {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(element.as_bytes());
        }
        body.push(b']');
        let before = spool_bytes(&c.spool);
        // 10 million elements take a debug build several seconds to scan (8 s at a load of
        // 7 on two cores), past the kit's 10 s read timeout beside other tests: this test
        // is about what they cost, not how fast they go.
        let r = rhc_testkit::http::try_http_request_within(
            "POST",
            &c.url("/v1/events"),
            &[("Content-Type", "application/json")],
            &body,
            Duration::from_secs(90),
        )
        .expect("POST /v1/events");
        assert_eq!(
            r.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = json(&r);
        // Each distinct bad element is kept once (these are all the same element), and
        // each is answered as quarantined.
        let kept = v["quarantined"].as_u64().unwrap();
        assert!(
            (1..=CAP).contains(&kept) && kept * (RECORD_FRAME + element.len() as u64) <= CAP_BYTES,
            "{name}: {v}"
        );
        assert_eq!(v["duplicates"], 0, "{name}: {v}");
        assert_eq!(
            v["quarantine_dropped"].as_u64(),
            Some(n as u64 - kept),
            "{name}: {v}"
        );
        let grown = spool_bytes(&c.spool) - before;
        assert!(grown < 64 << 10, "{name}: the spool grew by {grown} bytes");
        let peak = peak_mib(&c);
        assert!(
            peak < 120.0,
            "{name}: {peak:.0} MiB peak for a {} MiB body",
            body.len() >> 20
        );
    }
    assert!(c.metric("rhc_events_quarantine_dropped_total") >= 2.0 * (6_000_000.0 - CAP as f64));
}

/// Distinct bad elements: at most the cap is stored per body, and storing never takes the
/// spool past its budget: a request that would is refused with 503.
#[test]
fn quarantine_is_capped_per_body_and_never_passes_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let c = start(
        &tmp,
        &["--rotation-interval", "1h", "--max-spool-bytes", "4MiB"],
    );
    // 5,000 distinct integers: at most 1,000 records (and 64 KiB of them) kept, the rest
    // counted.
    let body = format!(
        "[{}]",
        (0..5000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let before = spool_bytes(&c.spool);
    let v = json(&c.post(body.as_bytes()));
    let kept = v["quarantined"].as_u64().unwrap();
    assert!((500..=CAP).contains(&kept), "{v}");
    assert_eq!(v["quarantine_dropped"].as_u64(), Some(5000 - kept), "{v}");
    assert!(spool_bytes(&c.spool) - before <= CAP_BYTES + 4096);
    // Large distinct bad elements keep 64 KiB of records; large events are stored whole:
    // a body whose events would pass the 4 MiB budget is refused whole; nothing of it is
    // written.
    let big = format!(
        "[{}]",
        (0..900)
            .map(|i| {
                event(&format!("big{i:06}")).replacen(
                    "\"jobId\"",
                    &format!("\"pad\":\"{}\",\"jobId\"", "x".repeat(8000)),
                    1,
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    );
    // What the first request left to write or upload in the background is done once the
    // spool stops changing (a fixed second was not enough at a load of 20: an upload then
    // emptied the spool during the check).
    let before = settled_spool_bytes(&c.spool);
    let r = c.post(big.as_bytes());
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.header("retry-after").is_some());
    assert!(
        String::from_utf8_lossy(&r.body).contains("budget"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    // Only an upload in the background can change the spool now, and it only shrinks it.
    let after = spool_bytes(&c.spool);
    assert!(
        after <= before,
        "a refused request wrote something: {before} bytes before, {after} after"
    );
    assert!(spool_bytes(&c.spool) <= 4 << 20);
    // Real events still fit.
    let ok = c.post(format!("[{}]", event("QQ==")).as_bytes());
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
}

/// Bad elements do not take the places of real event ids in the deduplication window: after
/// thousands of them, Ray's resend of real events is still recognised.
#[test]
fn quarantined_elements_do_not_evict_event_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &["--dedup-window", "100"]);
    let batch = format!(
        "[{}]",
        (0..10)
            .map(|i| event(&format!("ev{i}")))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert_eq!(json(&c.post(batch.as_bytes()))["accepted"], 10);
    for round in 0..5 {
        let bad = format!(
            "[{}]",
            (0..500)
                .map(|i| format!("{}", round * 1000 + i))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(json(&c.post(bad.as_bytes()))["quarantined"], 500);
    }
    let again = json(&c.post(batch.as_bytes()));
    assert_eq!(
        (again["accepted"].as_u64(), again["duplicates"].as_u64()),
        (Some(0), Some(10)),
        "Ray's resend was stored twice: {again}"
    );
}

/// A number beyond a double makes Go's reader (the history server) and serde_json refuse the
/// whole event: it is quarantined with its reason. A lone surrogate escape is read as U+FFFD
/// by Go's reader: it is stored, and `inspect` reads it the same way.
#[test]
fn values_json_readers_refuse_are_quarantined_and_the_ones_they_read_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start(&tmp, &[]);
    let huge = event("SA==").replace(r#""jobId":"AQAAAA==""#, r#""jobId":"AQAAAA==","x":1e400"#);
    let surrogate = event("SQ==").replace(
        r#""jobId":"AQAAAA==""#,
        r#""jobId":"AQAAAA==","x":"\ud800""#,
    );
    let v = json(&c.post(format!("[{huge},{surrogate}]").as_bytes()));
    assert_eq!(
        (v["accepted"].as_u64(), v["quarantined"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert!(c.terminate(Duration::from_secs(30)).success());
    let bucket = tmp.path().join("bucket");
    let store: std::sync::Arc<dyn object_store::ObjectStore> = std::sync::Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(&bucket).unwrap(),
    );
    let objects = read_all(&store);
    let quarantine: String = objects
        .iter()
        .filter(|(k, _)| k.starts_with("collector-quarantine/"))
        .map(|(k, b)| String::from_utf8(decode(k, b)).unwrap())
        .collect();
    assert!(quarantine.contains("number_out_of_range"), "{quarantine}");
    let out = std::process::Command::new(&c.bin)
        .args([
            "inspect",
            bucket.to_str().unwrap(),
            "--session",
            "session_h",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["events"]["total"], 1, "{report}");
    assert_eq!(report["problems"]["bad_lines"], 0, "{report}");
}

/// Every Content-Encoding header is read, lists included; identity is no coding; anything
/// else is refused with 415 before the body is read.
#[test]
fn every_content_encoding_header_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let body = format!("[{}]", event("Sg=="));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(body.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let mut gz2 = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz2.write_all(&gz).unwrap();
    let gz2 = gz2.finish().unwrap();
    for (headers, payload, status) in [
        (vec!["identity"], body.as_bytes(), 200),
        (vec!["identity", "gzip"], &gz[..], 200),
        (vec!["identity, gzip"], &gz[..], 200),
        (vec!["gzip", "gzip"], &gz2[..], 200),
        (vec!["gzip, br"], &gz[..], 415),
        (vec!["gzip", "deflate"], &gz[..], 415),
        (vec!["compress"], body.as_bytes(), 415),
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|v| ("Content-Encoding", *v)).collect();
        let r = c.post_with(payload, &h);
        assert_eq!(
            r.status,
            status,
            "{headers:?}: {}",
            String::from_utf8_lossy(&r.body)
        );
        if status == 415 {
            let msg = String::from_utf8_lossy(&r.body);
            assert!(msg.contains("not supported"), "{msg}");
        }
    }
}

/// A body that is declared but not sent holds no memory budget: one chunked request that
/// sends only its head and one declaring 32 MiB that sends nothing (together the whole
/// budget of the default `--max-body-bytes` before) do not delay Ray's next batch, which
/// must be answered within Ray's 3 s timeout.
#[test]
fn declared_but_unsent_bodies_do_not_starve_small_requests() {
    use std::net::TcpStream;
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let heads = [
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 33554432\r\n\r\n",
    ];
    let mut attackers: Vec<TcpStream> = heads
        .iter()
        .map(|h| {
            let mut s = TcpStream::connect(("127.0.0.1", c.port)).unwrap();
            s.write_all(h.as_bytes()).unwrap();
            s
        })
        .collect();
    // Let the collector read both heads and start waiting for their bodies.
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..3 {
        let t = std::time::Instant::now();
        let r = c.post(format!("[{}]", event(&format!("unsent-{i}"))).as_bytes());
        let took = t.elapsed();
        assert_eq!(
            (r.status, json(&r)["accepted"].as_u64()),
            (200, Some(1)),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(took < Duration::from_secs(3), "answered after {took:?}");
    }
    // The attackers' requests are still waiting, not refused: they simply hold nothing.
    for s in &mut attackers {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        let pending =
            matches!(s.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        assert!(pending, "an unsent body was answered already");
    }
}

/// 256 connections that each ask for `/healthz` now and then and reconnect fill every place;
/// a new connection still gets in at once (a probe's answer closes its connection, and an
/// idle one gives way): Ray's POST and the kubelet's probe are answered within 3 s, and
/// Ray's connection, once it has posted, outlives the probes that keep reconnecting.
#[test]
fn busy_probe_connections_lock_out_neither_ray_nor_the_probe() {
    use rhc_testkit::http::Conn;
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let authority = format!("127.0.0.1:{}", c.port);
    let open = || Conn::open(&authority, Duration::from_secs(5)).unwrap();
    let mut probes: Vec<Conn> = (0..256).map(|_| open()).collect();
    for p in &mut probes {
        assert_eq!(p.request("GET", "/healthz", &[], b"").unwrap().status, 200);
    }
    let mut ray = open();
    let t = std::time::Instant::now();
    let r = ray
        .request(
            "POST",
            "/v1/events",
            &[("Content-Type", "application/json")],
            format!("[{}]", event("busy-1")).as_bytes(),
        )
        .expect("Ray's POST at the connection cap");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let t = std::time::Instant::now();
    let health = c.get("/healthz").expect("/healthz at the connection cap");
    assert_eq!(health.status, 200);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // The probes' next round: those that were closed reconnect, each taking the place of
    // another idle probe connection, never Ray's.
    let mut reconnected = 0;
    for p in &mut probes {
        match p.request("GET", "/healthz", &[], b"") {
            Ok(r) => assert_eq!(r.status, 200),
            Err(_) => {
                *p = open();
                assert_eq!(p.request("GET", "/healthz", &[], b"").unwrap().status, 200);
                reconnected += 1;
            }
        }
    }
    assert!(
        reconnected >= 2,
        "{reconnected} probe connections were closed"
    );
    let r = ray
        .request(
            "POST",
            "/v1/events",
            &[("Content-Type", "application/json")],
            format!("[{}]", event("busy-2")).as_bytes(),
        )
        .expect("Ray's connection was kept");
    assert_eq!(r.status, 200);
}

/// A bad element repeated in a body, or resent, is answered as quarantined (and kept once),
/// not as a duplicate: duplicates are recently accepted event ids only, and the four counts
/// of an answer add up to the elements of the body.
#[test]
fn repeated_bad_elements_are_quarantined_not_duplicates() {
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let counts = |body: &str| {
        let v = json(&c.post(body.as_bytes()));
        (
            v["accepted"].as_u64().unwrap(),
            v["duplicates"].as_u64().unwrap(),
            v["quarantined"].as_u64().unwrap(),
            v["quarantine_dropped"].as_u64().unwrap(),
        )
    };
    assert_eq!(counts("[1,1]"), (0, 0, 2, 0));
    assert_eq!(counts("[1,1]"), (0, 0, 2, 0));
    let good = event("rep-1");
    assert_eq!(counts(&format!("[{good},{good},1,2]")), (1, 1, 2, 0));
    assert_eq!(counts(&format!("[{good},2]")), (0, 1, 1, 0));
    assert_eq!(c.metric("rhc_events_duplicate_total"), 2.0);
    assert_eq!(
        c.metric_labeled("rhc_events_quarantined_total", "reason=\"not_an_object\""),
        7.0
    );
}

/// Every event line in the bucket, by object key, after the collector has stopped.
fn stored_lines(tmp: &tempfile::TempDir, c: &mut Collector) -> Vec<(String, String)> {
    assert!(c.terminate(Duration::from_secs(30)).success());
    let store: std::sync::Arc<dyn object_store::ObjectStore> = std::sync::Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(tmp.path().join("bucket")).unwrap(),
    );
    let mut lines = Vec::new();
    for (k, b) in read_all(&store) {
        if k.contains("/node_events/") || k.contains("/job_events/") {
            let text = String::from_utf8(decode(&k, &b)).unwrap();
            lines.extend(text.lines().map(|l| (k.clone(), l.to_string())));
        }
    }
    lines
}

/// Decision (docs/bucket-layout.md, "Inputs Ray never sends"): routing keys are matched exactly, as
/// protobuf's JSON parser matches field names; a key that differs only in case is another
/// field, kept as sent and not read.
#[test]
fn keys_that_differ_only_in_case_are_other_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start(&tmp, &[]);
    let only_other_case =
        r#"{"eventId":"Y2FzZTE=","SessionName":"session_b","timestamp":"2026-11-22T02:00:00Z"}"#;
    let both = r#"{"eventId":"Y2FzZTI=","sessionName":"session_a","SessionName":"session_b","timestamp":"2026-11-22T02:00:00Z"}"#;
    let v = json(&c.post(format!("[{only_other_case},{both}]").as_bytes()));
    assert_eq!(
        (v["accepted"].as_u64(), v["quarantined"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(
        c.metric_labeled(
            "rhc_events_quarantined_total",
            "reason=\"missing_session_name\""
        ),
        1.0
    );
    let lines = stored_lines(&tmp, &mut c);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].0.contains("/session_a/"), "{lines:?}");
    assert_eq!(lines[0].1, both);
}

/// Decision: an event id is deduplicated by its text as sent. Ray resends a batch byte for
/// byte, so each resend is recognised; ids that differ only in base64 padding or alphabet
/// (which Ray's printer never produces) are different events to the collector.
#[test]
fn event_ids_are_deduplicated_by_their_text_as_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start(&tmp, &[]);
    let counts = |ids: &[&str]| {
        let body = format!(
            "[{}]",
            ids.iter().map(|i| event(i)).collect::<Vec<_>>().join(",")
        );
        let v = json(&c.post(body.as_bytes()));
        (
            v["accepted"].as_u64().unwrap(),
            v["duplicates"].as_u64().unwrap(),
        )
    };
    assert_eq!(counts(&["AQI=", "+/8="]), (2, 0));
    // The same bytes in other spellings: stored again.
    assert_eq!(counts(&["AQI", "-_8=", "-_8"]), (3, 0));
    // The spellings as sent before: duplicates.
    assert_eq!(counts(&["AQI=", "+/8=", "AQI", "-_8=", "-_8"]), (0, 5));
    let lines = stored_lines(&tmp, &mut c);
    assert_eq!(lines.len(), 5, "{lines:?}");
}

/// Decision: only an event whose own keys are snake_case is converted; a camelCase event
/// is stored byte for byte, snake_case keys nested in it included (the payload's `job_id`
/// still routes it, as protobuf would read it).
#[test]
fn snake_case_keys_inside_a_camel_case_event_are_kept_as_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start(&tmp, &[]);
    let mixed = r#"{"eventId":"bWl4ZWQ=","eventType":"TASK_DEFINITION_EVENT","sessionName":"session_h","timestamp":"2026-11-22T02:00:00Z","taskDefinitionEvent":{"job_id":"AQAAAA==","task_name":"f","required_resources":{"CPU":1}}}"#;
    let v = json(&c.post(format!("[{mixed}]").as_bytes()));
    assert_eq!(v["accepted"], 1, "{v}");
    assert_eq!(c.metric("rhc_events_renamed_total"), 0.0);
    let lines = stored_lines(&tmp, &mut c);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].0.contains("/job_events/01000000/"), "{lines:?}");
    assert_eq!(lines[0].1, mixed);
}

/// Sends a chunked `POST /v1/events` of `size` bytes (`[` and spaces, in 64 KiB chunks, as
/// hyper hands them over) and then nothing more: the body stays incomplete.
fn stalled_chunked_body(port: u16, size: usize) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    let mut data = vec![b' '; size];
    data[0] = b'[';
    // A write error is the collector closing the connection: the test's assertions say
    // whether that was right.
    for part in data.chunks(64 << 10) {
        let chunk = [format!("{:x}\r\n", part.len()).as_bytes(), part, b"\r\n"].concat();
        if s.write_all(&chunk).is_err() {
            break;
        }
    }
    s
}

/// One valid event padded to about `size` bytes with a field the history server skips.
fn padded_event(id: &str, size: usize) -> String {
    format!(
        r#"[{{"eventId":"{id}","eventType":"TASK_DEFINITION_EVENT","sessionName":"session_h","timestamp":"2026-11-22T02:00:00Z","taskDefinitionEvent":{{"jobId":"AQAAAA==","padding":"{}"}}}}]"#,
        "x".repeat(size)
    )
}

/// Stalled bodies hold the bytes they sent, not the capacity of the buffers that hold them,
/// and no stalled body holds a right the others wait for: twelve chunked bodies of 4 MiB + 1
/// byte and one of 8 MiB + 1 byte that then stop sending (57 MiB of the 96 MiB budget) delay
/// neither Ray's next batch nor a valid 9 MB one; both are answered within Ray's 3 s.
#[test]
fn stalled_bodies_hold_only_the_bytes_they_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let mut stalled: Vec<_> = (0..12)
        .map(|_| stalled_chunked_body(c.port, (4 << 20) + 1))
        .collect();
    stalled.push(stalled_chunked_body(c.port, (8 << 20) + 1));
    // Let the collector read every byte sent.
    std::thread::sleep(Duration::from_millis(1500));
    for (name, body) in [
        ("Ray's batch", format!("[{}]", event("stalled-small"))),
        ("a 9 MB batch", padded_event("stalled-large", 9_000_000)),
    ] {
        let t = std::time::Instant::now();
        let r = c.post(body.as_bytes());
        let took = t.elapsed();
        assert_eq!(
            (r.status, json(&r)["accepted"].as_u64()),
            (200, Some(1)),
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(
            took < Duration::from_secs(3),
            "{name}: answered after {took:?}"
        );
    }
    // The stalled bodies are still waiting, not refused.
    for s in &mut stalled {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        let pending =
            matches!(s.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        assert!(pending, "a stalled body was answered already");
    }
}

/// A gzip body gets 413 only when its real compressed and decoded sizes together exceed the
/// body budget (96 MiB with the defaults): 32.1 MiB stored as gzip (64.2 MiB together, but
/// buffers whose capacity doubled to 64 MiB) is stored. (The boundary itself, 96 MiB
/// fitting and 97 MiB not, is pinned by the budget's unit tests.)
#[test]
fn a_gzip_body_is_refused_only_for_its_real_sizes() {
    use flate2::{write::GzEncoder, Compression};
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let stored_gzip = |mib: f64| {
        let body = padded_event("gzip-real-size", (mib * f64::from(1 << 20)) as usize);
        let mut enc = GzEncoder::new(Vec::new(), Compression::none());
        enc.write_all(body.as_bytes()).unwrap();
        enc.finish().unwrap()
    };
    let r = c.post_with(&stored_gzip(32.1), &[("Content-Encoding", "gzip")]);
    assert_eq!(
        (r.status, json(&r)["accepted"].as_u64()),
        (200, Some(1)),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
}

/// The reviewer's lockout: 256 keep-alive connections each post a 2-byte body 2 s after its
/// head, with the next head pipelined behind it (so no request is ever 3 s old), and 16 more
/// hold the reserved places with a head and no body, reconnecting when closed. New
/// connections for `/healthz` and for Ray's batch, each tried once, are answered within
/// Ray's 3 s: a body still incomplete after its grace is the least useful thing open, on a
/// reserved place too, and a newcomer that finds every body still within its grace waits for
/// one to fall behind rather than being closed.
#[test]
fn stalling_bodies_and_held_reserved_places_lock_out_neither_ray_nor_the_probe() {
    use rhc_testkit::http::try_http_request;
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const HEAD: &[u8] = b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n";
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let port = c.port;
    let stop = Arc::new(AtomicBool::new(false));
    let sleep_unless_stopped = |stop: &AtomicBool, d: Duration| {
        let until = std::time::Instant::now() + d;
        while std::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let spawn = |holder: bool| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                    sleep_unless_stopped(&stop, Duration::from_millis(50));
                    continue;
                };
                if s.write_all(HEAD).is_err() {
                    continue;
                }
                if holder {
                    // Wait to be answered or closed, then come back.
                    s.set_read_timeout(Some(Duration::from_millis(200)))
                        .unwrap();
                    let mut buf = [0u8; 4096];
                    while !stop.load(Ordering::Relaxed) {
                        match s.read(&mut buf) {
                            Ok(0) => break,
                            Ok(_) => break,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                            Err(_) => break,
                        }
                    }
                    sleep_unless_stopped(&stop, Duration::from_millis(50));
                } else {
                    loop {
                        sleep_unless_stopped(&stop, Duration::from_secs(2));
                        if stop.load(Ordering::Relaxed)
                            || s.write_all(&[b"[]", HEAD].concat()).is_err()
                        {
                            break;
                        }
                    }
                }
            }
        })
    };
    let mut threads: Vec<_> = (0..256).map(|_| spawn(false)).collect();
    std::thread::sleep(Duration::from_secs(1));
    threads.extend((0..16).map(|_| spawn(true)));
    std::thread::sleep(Duration::from_millis(500));
    let ray = format!("[{}]", event("lockout"));
    let mut failures = Vec::new();
    // One fresh connection each, tried once: a connection closed without an answer (which
    // the client sees as a reset) is a failure, as it is for the kubelet's probe. Right after
    // the stallers' shared 2 s boundary every place holds a fresh head whose body is not late
    // yet; a newcomer then waits for a place rather than being closed (issue 39: refused in
    // about 1 of 6 runs before, when each was closed at once).
    let once = |method: &str, path: &str, body: &[u8]| {
        let t = std::time::Instant::now();
        let r = try_http_request(
            method,
            &c.url(path),
            &[("Content-Type", "application/json")],
            body,
        );
        (r, t.elapsed())
    };
    for round in 0..8 {
        match once("GET", "/healthz", b"") {
            (Ok(r), took) if r.status == 200 && took < Duration::from_secs(3) => {}
            (other, took) => failures.push(format!(
                "round {round}: /healthz {:?} after {took:?}",
                other.map(|r| r.status)
            )),
        }
        match once("POST", "/v1/events", ray.as_bytes()) {
            (Ok(r), took) if r.status == 200 && took < Duration::from_secs(3) => {}
            (other, took) => failures.push(format!(
                "round {round}: Ray's POST {:?} after {took:?}",
                other.map(|r| r.status)
            )),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(c.metric_labeled("rhc_connections_evicted_total", "reason=\"stalled_body\"") >= 1.0);
}

/// Issue 39, the stallers' boundary made deterministic: every place, the 16 reserved ones
/// too, holds a fresh request head whose body is not late yet, so at that instant nothing can
/// give way. A new connection (Ray's batch) then waits for a place and gets the first one
/// that can give way (a body falling behind its pace, a quarter of a second later), rather
/// than being closed at once: before, it was reset within a millisecond, every round.
#[test]
fn a_new_connection_waits_for_a_place_when_none_can_give_way_yet() {
    use rhc_testkit::http::try_http_request;
    use std::net::TcpStream;
    const HEAD: &[u8] = b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n";
    /// The regular places and the reserved ones (events::http::connections).
    const PLACES: usize = 256 + 16;
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let ray = format!("[{}]", event("waiting-room"));
    let mut failures = Vec::new();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], c.port));
    // A connection whose SYN the listener's full accept queue (128) dropped is tried again
    // after 20 ms rather than the kernel's 1 s, so that every head is sent well within the
    // bodies' grace.
    let connect = || {
        (0..50)
            .find_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(20)).ok())
            .expect("a connection within 50 tries")
    };
    for round in 0..3 {
        let filling = std::time::Instant::now();
        let fillers: Vec<TcpStream> = (0..PLACES)
            .map(|_| {
                let mut s = connect();
                s.write_all(HEAD).unwrap();
                s
            })
            .collect();
        let filled = filling.elapsed();
        let t = std::time::Instant::now();
        match try_http_request(
            "POST",
            &c.url("/v1/events"),
            &[("Content-Type", "application/json")],
            ray.as_bytes(),
        ) {
            Ok(r) if r.status == 200 => {}
            other => failures.push(format!(
                "round {round}: Ray's POST {:?} after {:?} (the places filled in {filled:?})",
                other.map(|r| r.status),
                t.elapsed()
            )),
        }
        // The fillers go; their places are free again before the next round.
        drop(fillers);
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!(
        "{} new connections waited for a place, {} were closed",
        c.metric("rhc_connections_waited_total"),
        c.metric("rhc_connections_refused_total")
    );
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(c.metric("rhc_connections_refused_total"), 0.0);
}

/// One real snake_case event of Ray 2.60, as sent.
fn snake_event() -> String {
    let line = include_str!("data/posts-snake.jsonl")
        .lines()
        .next()
        .unwrap();
    let arr: Vec<Box<serde_json::value::RawValue>> = serde_json::from_str(line).unwrap();
    arr[0].get().to_string()
}

fn double_gzip(body: &[u8]) -> Vec<u8> {
    use flate2::{write::GzEncoder, Compression};
    let mut once = GzEncoder::new(Vec::new(), Compression::best());
    once.write_all(body).unwrap();
    let mut twice = GzEncoder::new(Vec::new(), Compression::best());
    twice.write_all(&once.finish().unwrap()).unwrap();
    twice.finish().unwrap()
}

/// The camelCase form of a body's snake_case events is charged to the body budget, and the
/// stored body is that form alone (no copy of body and form together): a double-gzipped
/// body of 11 MiB of snake_case events plus one bad element (which made the collector copy
/// body and form into a third buffer) costs its body and its charged form, no more. (With
/// the default `--max-body-bytes` a 64 MiB such body, which could never fit the budget
/// beside its form, gets 413; a debug build decodes it too slowly for this test.) A body
/// mixing snake_case, camelCase and bad elements stores each event once, converted or as
/// sent.
#[test]
fn a_snake_case_body_and_its_camel_case_form_stay_within_the_body_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start_any_ratio(&tmp, &["--max-body-bytes", "12MiB"]);
    let snake = snake_event();
    let camel = event("mixed-camel");
    let v = json(&c.post(format!("[{snake},{camel},1]").as_bytes()));
    assert_eq!(
        (v["accepted"].as_u64(), v["quarantined"].as_u64()),
        (Some(2), Some(1)),
        "{v}"
    );
    let base = peak_mib(&c);
    let mib = 11;
    let n = (mib << 20) / (snake.len() + 1);
    let mut body = String::with_capacity(n * (snake.len() + 1) + 4);
    body.push('[');
    for _ in 0..n {
        body.push_str(&snake);
        body.push(',');
    }
    body.push_str("1]");
    let r = c.post_with(
        &double_gzip(body.as_bytes()),
        &[("Content-Encoding", "gzip, gzip")],
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = json(&r);
    assert_eq!(v["quarantined"].as_u64(), Some(1), "{v}");
    assert_eq!(
        v["accepted"].as_u64().unwrap() + v["duplicates"].as_u64().unwrap(),
        n as u64,
        "{v}"
    );
    // The body and the room charged for its camelCase form (an eighth more), and a few MiB
    // for the rest of the request (the index of its events, the gzip layers).
    let peak = peak_mib(&c);
    let charged = mib as f64 * (1.0 + 1.125);
    assert!(
        peak - base < charged + 6.0,
        "{peak:.0} MiB peak from {base:.0} MiB for {mib} MiB"
    );
    let lines = stored_lines(&tmp, &mut c);
    assert!(lines
        .iter()
        .any(|(_, l)| l.contains("\"eventId\":\"rup5tK5umt+6blkVjBp7x6cNhvaU6EEYyXxnYg==\"")));
    assert!(lines.iter().all(|(_, l)| !l.contains("\"event_id\"")));
    assert!(
        lines.iter().any(|(_, l)| *l == camel),
        "the camelCase event was not kept as sent"
    );
}

/// One real POST body of Ray 2.60 of Ray's usual size (23 events, 18 KB).
fn ray_body() -> &'static str {
    include_str!("data/posts-camel.jsonl")
        .lines()
        .nth(2)
        .unwrap()
}

/// Issue 39, item 5: two clients declare 64 MiB bodies, send 63 MiB and 33 MiB (the whole
/// 96 MiB body budget) as fast as they can, then nothing. Ray's next batches, on fresh
/// connections, are still answered 200 within Ray's 3 s: a body that stopped arriving gives
/// its room to one that waits for it (before, Ray got 503 after 10 s until the 30 s body
/// timeout freed the room), and the two stalled clients are told so with 408. Ray's
/// batches pass through the small bodies' reserve at once; a 2 MB batch, too large for it,
/// waits for the room the stalled bodies hold, and gets it.
#[test]
fn bodies_that_stopped_arriving_give_their_room_to_ray() {
    use rhc_testkit::hostile::{stalled_body, tries};
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let mut hogs = vec![
        stalled_body(c.port, 64 << 20, 63 << 20).unwrap(),
        stalled_body(c.port, 64 << 20, 33 << 20).unwrap(),
    ];
    // The collector reads what is left in the sockets' buffers.
    std::thread::sleep(Duration::from_secs(1));
    let ray = tries(
        3,
        Duration::from_millis(500),
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        ray_body().as_bytes(),
    );
    assert_eq!(ray.ok, 3, "{:#?}", ray.failures);
    let large = tries(
        1,
        Duration::ZERO,
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        padded_event("stopped-large", 2_000_000).as_bytes(),
    );
    assert_eq!(large.ok, 1, "{:#?}", large.failures);
    for h in &mut hogs {
        h.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = Vec::new();
        let _ = h.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 408") && answer.contains("stalled"),
            "{answer}"
        );
    }
    assert!(c.metric("rhc_stalled_bodies_cut_total") >= 2.0);
}

/// A gzip body of `members` members, the first decoding to `first` and each of the others
/// to `member` (gzip members concatenated decode as one body).
fn gzip_members(first: &[u8], member: &[u8], members: usize) -> Vec<u8> {
    use flate2::{write::GzEncoder, Compression};
    let gz = |b: &[u8]| {
        let mut e = GzEncoder::new(Vec::new(), Compression::best());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    };
    let mut body = gz(first);
    let rest = gz(member);
    for _ in 1..members {
        body.extend_from_slice(&rest);
    }
    body
}

/// Issue 39, item 7: 16 distinct gzip bodies of about 66 KB, each decoding to 64 MiB that is
/// not JSON. Each is answered 400 with the reason, and quarantine keeps at most 64 KiB of
/// each (before: every one decoded whole, 1 GiB of spool from 1 MB sent, and Ray's next
/// batch got 503 over the high watermark); their records say what was cut and how large the
/// body was.
#[test]
fn garbage_bodies_keep_a_bounded_form_in_quarantine() {
    const MIB64: usize = 64 << 20;
    const KEPT: u64 = 64 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start_any_ratio(&tmp, &["--rotation-interval", "1h"]);
    let filler = vec![b'#'; 1 << 20];
    let before = spool_bytes(&c.spool);
    let mut sent = 0;
    for i in 0..16 {
        let mut first = format!("garbage {i:07}\n").into_bytes();
        first.resize(1 << 20, b'#');
        let body = gzip_members(&first, &filler, 64);
        sent += body.len();
        let r = c.post_with(&body, &[("Content-Encoding", "gzip")]);
        assert_eq!(
            r.status,
            400,
            "body {i}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let error = json(&r)["error"].as_str().unwrap_or_default().to_string();
        assert!(error.contains("at byte 0"), "body {i}: {error}");
    }
    let grown = spool_bytes(&c.spool) - before;
    assert!(
        grown < 2 << 20,
        "16 garbage bodies ({sent} bytes sent) took {grown} bytes of the spool"
    );
    assert_eq!(c.get("/readyz").unwrap().status, 200);
    let ok = c.post(ray_body().as_bytes());
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    assert!(c.terminate(Duration::from_secs(30)).success());
    let store: std::sync::Arc<dyn object_store::ObjectStore> = std::sync::Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(tmp.path().join("bucket")).unwrap(),
    );
    let objects = read_all(&store);
    let records: Vec<Value> = objects
        .iter()
        .filter(|(k, _)| k.starts_with("collector-quarantine/") && k.contains("/quarantine-"))
        .flat_map(|(k, b)| {
            String::from_utf8(decode(k, b))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .filter(|r| r["reason"] == "invalid_body")
        .collect();
    assert_eq!(records.len(), 16, "{records:#?}");
    let mut firsts = std::collections::BTreeSet::new();
    for r in &records {
        assert_eq!(r["body_bytes"].as_u64(), Some(MIB64 as u64), "{r}");
        assert!(r["received_bytes"].as_u64().unwrap() < 100_000, "{r}");
        assert!(r["detail"].as_str().unwrap().contains("at byte 0"), "{r}");
        let kept_bytes = r["kept_bytes"].as_u64().unwrap();
        assert!(kept_bytes <= KEPT, "{r}");
        let object = objects
            .iter()
            .find(|(k, _)| k.ends_with(r["body_object"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("no kept body for {r}"))
            .1;
        assert_eq!(object.len() as u64, kept_bytes, "{r}");
        // What was kept reads back to the start of the body, whatever its form.
        let start = match r["kept"].as_str() {
            Some("prefix") => object.clone(),
            Some("as_received") => {
                assert_eq!(r["content_encoding"], "gzip", "{r}");
                let mut d = flate2::read::MultiGzDecoder::new(&object[..]);
                let mut head = vec![0u8; 16];
                d.read_exact(&mut head).unwrap();
                head
            }
            other => panic!("kept {other:?}: {r}"),
        };
        firsts.insert(String::from_utf8_lossy(&start[..16]).to_string());
    }
    assert_eq!(firsts.len(), 16, "{firsts:?}");
}

/// Issue 39, item 8: 250 connections each send 400 KB of a request head that never ends.
/// hyper buffers at most 32 KiB of a head (a longer one gets 431), so they cost the
/// collector a few MiB, not the 100 MB that hyper's default buffer let them hold; Ray's
/// POST with 16 KiB of headers still passes.
#[test]
fn unfinished_request_heads_are_bounded() {
    use rhc_testkit::hostile::unfinished_head;
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let base = peak_mib(&c);
    let heads: Vec<_> = (0..250)
        .map(|_| unfinished_head(c.port, 400_000).unwrap())
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let peak = peak_mib(&c);
    assert!(
        peak - base < 30.0,
        "250 unfinished heads of 400 KB: {peak:.0} MiB peak from {base:.0} MiB"
    );
    drop(heads);
    let big_header = "x".repeat(16 << 10);
    let r = c.post_with(ray_body().as_bytes(), &[("X-Large", &big_header)]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let too_large = "x".repeat(40 << 10);
    let r = rhc_testkit::http::try_http_request(
        "GET",
        &c.url("/healthz"),
        &[("X-Too-Large", &too_large)],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 431);
}

/// Issue 39, item 6, on the events listener: clients open 100 connections a second, each
/// with a 1 KiB receive window, pipeline 20 `GET /metrics` and never read. Each such
/// connection gets one answer (a pipelined request waits until the answers before it are
/// read) and is cut after 500 ms, or sooner at the cap, so it neither holds a place nor
/// costs a dozen renders of `/metrics`. Ray's batches and `/healthz`, each on a fresh
/// connection, get 200 within 3 s in at least 39 of 40 tries.
///
/// Before (f6212bd): every pipelined request was answered until the buffers were full (all
/// 20, in hyper's 408 KiB), connections that never read gave way as idle ones and then held
/// their socket for the whole 3 s grace; the release build locked Ray out (11 of 40). The
/// first fix (92ffff2) cut them, but still answered a dozen requests on each: 100
/// connections a second took a debug build's CPU and Ray got 9 to 34 of 40. The count of
/// answers per connection tells both apart from this build whatever the machine's load;
/// the tries are what Ray sees (bench/never_reading.py compares release builds).
#[test]
fn clients_that_never_read_lock_out_neither_ray_nor_the_probe() {
    use rhc_testkit::hostile::{tries, NeverReading};
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let addr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    let attack = NeverReading::start(
        addr,
        ATTACK_PER_SECOND,
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        20,
        2000,
    );
    std::thread::sleep(Duration::from_secs(3));
    let probe = {
        let url = c.url("/healthz");
        std::thread::spawn(move || {
            tries(40, Duration::from_millis(300), 200, "GET", &url, &[], b"")
        })
    };
    let ray = tries(
        40,
        Duration::from_millis(300),
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        ray_body().as_bytes(),
    );
    let probe = probe.join().unwrap();
    let opened = attack.opened();
    drop(attack);
    assert!(
        opened > ATTACK_PER_SECOND as usize * 5,
        "the attack opened only {opened} connections"
    );
    // One answer per connection: every answer but an event post closes it (review r39d:
    // the send-queue check alone let an ordinary receive window take dozens).
    let answers = c.metric_labeled("rhc_http_requests_total", "path=\"/metrics\"");
    eprintln!(
        "{opened} connections that never read, {answers} answers to /metrics; Ray {} of 40, /healthz {} of 40",
        ray.ok, probe.ok
    );
    assert!(
        answers <= opened as f64,
        "{answers} answers to /metrics for {opened} connections that never read"
    );
    assert!(ray.ok >= 39, "Ray: {} of 40: {:#?}", ray.ok, ray.failures);
    assert!(
        probe.ok >= 39,
        "/healthz: {} of 40: {:#?}",
        probe.ok,
        probe.failures
    );
}

/// New connections a second of the clients that never read (issue 39 reproduced it at 150
/// with a release build; a debug build on a shared 2-core machine serves fewer).
const ATTACK_PER_SECOND: u32 = 100;

/// A gzip body (concatenated members) of a JSON array of `n` distinct strings of `len`
/// bytes each: 66 KB on the wire for 1,000 strings of 60 KB. `tag` makes the strings of one
/// body differ from another's.
fn gzip_of_large_strings(tag: usize, n: usize, len: usize) -> Vec<u8> {
    use flate2::{write::GzEncoder, Compression};
    let gz = |b: &[u8]| {
        let mut e = GzEncoder::new(Vec::new(), Compression::best());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    };
    let filler = "x".repeat(len);
    let middle = gz(format!("{filler}\",").as_bytes());
    let last = gz(format!("{filler}\"]").as_bytes());
    let mut body = gz(b"[");
    for i in 0..n {
        body.extend_from_slice(&gz(format!("\"{tag:04}-{i:06}-").as_bytes()));
        body.extend_from_slice(if i + 1 == n { &last } else { &middle });
    }
    body
}

/// Issue 39, review r39b D3 and D5: gzip bodies of 66 KB, each a JSON array of 1,000
/// distinct strings of 60 KB, are answered 200 and keep at most 64 KiB of quarantine records
/// each (before: the 1,000 records whole, 57 MiB of spool per request), and the request's
/// records are not built beside the body (before: VmHWM rose by 170 MiB for one of them).
#[test]
fn large_bad_elements_keep_a_bounded_quarantine() {
    const KEPT: u64 = 64 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let c = start_any_ratio(&tmp, &["--rotation-interval", "1h"]);
    let base = peak_mib(&c);
    let before = spool_bytes(&c.spool);
    let bodies = 4;
    for tag in 0..bodies {
        let body = gzip_of_large_strings(tag, 1000, 60_000);
        assert!(body.len() < 200_000, "{}", body.len());
        let r = c.post_with(&body, &[("Content-Encoding", "gzip")]);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = json(&r);
        let kept = v["quarantined"].as_u64().unwrap();
        assert_eq!(
            kept + v["quarantine_dropped"].as_u64().unwrap(),
            1000,
            "{v}"
        );
        assert!(kept >= 1 && kept * 60_000 <= KEPT, "{v}");
    }
    let grown = spool_bytes(&c.spool) - before;
    assert!(
        grown <= bodies as u64 * KEPT + (64 << 10),
        "{bodies} bodies of large bad elements took {grown} bytes of the spool"
    );
    // The decoded body (57 MiB) is held in the body budget; its records are not copied
    // beside it.
    let peak = peak_mib(&c);
    assert!(
        peak - base < 57.0 + 30.0,
        "{peak:.0} MiB peak from {base:.0} MiB for bodies of 57 MiB"
    );
    assert!(c.metric_labeled("rhc_events_quarantine_dropped_total", "not_an_object") >= 3000.0);
    assert_eq!(c.get("/readyz").unwrap().status, 200);
}

/// Issue 39, review r39b D4: tiny distinct invalid bodies are charged what keeping them
/// costs the spool (a file of its own, 4 KiB of the budget, and its record), so once the
/// burst is spent they keep at most the documented 16 KiB a second (before: 10 bodies a
/// second whatever their size, 150 MiB an hour of budget against "about 60 MiB an hour").
#[test]
fn tiny_invalid_bodies_are_kept_within_the_byte_rate() {
    const RATE: f64 = (16 << 10) as f64;
    const FILE: f64 = 4096.0;
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &["--rotation-interval", "1h"]);
    let kept = |c: &Collector| {
        c.metric("rhc_invalid_bodies_total") - c.metric("rhc_invalid_bodies_not_kept_total")
    };
    // Spend the burst of bytes with large distinct garbage bodies (64 KiB kept of each).
    for i in 0..70 {
        let mut body = format!("garbage {i:07}").into_bytes();
        body.resize(70_000, b'#');
        assert_eq!(c.post(&body).status, 400);
    }
    let from = kept(&c);
    let started = std::time::Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(10) {
        let r = c.post(format!("tiny {sent}").as_bytes());
        assert_eq!(r.status, 400);
        sent += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    let tiny_kept = kept(&c) - from;
    // What was left of the burst (less than one large body and its costs) and the rate.
    let allowed = RATE * secs + 80_000.0;
    assert!(
        tiny_kept * FILE <= allowed,
        "{tiny_kept} of {sent} tiny bodies kept in {secs:.1} s: {} bytes of the spool's budget, over {allowed:.0}",
        tiny_kept * FILE
    );
    assert!(tiny_kept >= 1.0, "no tiny body kept at all");
}

/// A gzip body of about 65 KB that decodes to 64 MiB of garbage; `n` makes it distinct.
fn gzip_bomb(n: u64) -> Vec<u8> {
    let mut first = format!("bomb {n:09}\n").into_bytes();
    first.resize(1 << 20, b'#');
    gzip_members(&first, &vec![b'#'; 1 << 20], 64)
}

/// Issue 39, review r39b D1: four clients send gzip bombs (65 KB each, 64 MiB decoded) over
/// and over; together they fill the 96 MiB body budget and wait for more room. Ray's batches
/// still get 200 within its 3 s: the waiting body holding the most room gives way with 503
/// when a smaller one waits (before: Ray waited the 10 s budget wait behind them and got 503,
/// 0 of 4 within 3 s).
#[test]
fn gzip_bombs_waiting_for_room_do_not_hold_ray() {
    use rhc_testkit::hostile::{tries, Posters};
    let tmp = tempfile::tempdir().unwrap();
    let c = start_any_ratio(&tmp, &[]);
    let bombs = Posters::start(
        c.port,
        4,
        &[("Content-Encoding", "gzip")],
        std::sync::Arc::new(gzip_bomb),
    );
    std::thread::sleep(Duration::from_secs(2));
    let ray = tries(
        4,
        Duration::from_secs(1),
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        ray_body().as_bytes(),
    );
    let answers = bombs.finish();
    assert_eq!(ray.ok, 4, "{:#?}\nbombs: {answers:?}", ray.failures);
    assert!(
        answers.keys().any(|a| a.contains("503")),
        "no bomb gave way: {answers:?}"
    );
}

/// Issue 39, review r39b D2: two gzip bodies of 24 KB, each `[0,0,0,…]` of 24 MiB, are
/// parsed off the runtime's workers: while they are, Ray's batches and `/healthz` are
/// answered within 3 s (before: both workers were held for tens of seconds, Ray got 200
/// within 3 s in 5 of 10 tries).
#[test]
fn bodies_of_tiny_elements_do_not_hold_the_runtime() {
    use rhc_testkit::hostile::{tries, Posters};
    let tmp = tempfile::tempdir().unwrap();
    let c = start_any_ratio(&tmp, &["--rotation-interval", "1h"]);
    // `[0,0,…,0]`: 24 MiB.
    let mut zeros = vec![b'0'; (24 << 20) + 1];
    for i in (2..zeros.len() - 1).step_by(2) {
        zeros[i] = b',';
    }
    zeros[0] = b'[';
    let last = zeros.len() - 1;
    zeros[last] = b']';
    let body = gzip_members(&zeros, b"", 1);
    drop(zeros);
    let body = std::sync::Arc::new(body);
    let parsers = Posters::start(
        c.port,
        2,
        &[("Content-Encoding", "gzip")],
        std::sync::Arc::new(move |_| body.to_vec()),
    );
    std::thread::sleep(Duration::from_secs(2));
    let ray = tries(
        5,
        Duration::from_secs(1),
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        ray_body().as_bytes(),
    );
    let health = tries(
        5,
        Duration::from_millis(500),
        200,
        "GET",
        &c.url("/healthz"),
        &[],
        b"",
    );
    // The bodies of zeros were decoded and went to be parsed while Ray was tried.
    let decoded = c.metric("rhc_ingest_bytes_total");
    drop(parsers);
    assert_eq!(ray.ok, 5, "{:#?}", ray.failures);
    assert_eq!(health.ok, 5, "{:#?}", health.failures);
    assert!(decoded >= (24 << 20) as f64, "{decoded} bytes decoded");
}

/// Issue 39, review r39h D1: a flood of connections that send nothing, 400 a second, locks
/// out neither Ray nor the probe: a connection with no request head gives way to a newcomer
/// however young, the oldest first, and a real client sends its head within milliseconds
/// (before: one could give way only after 2 s, so places freed at about 128 a second and the
/// rest of the newcomers, Ray's and the probe's among them, were closed at once: Ray 13 of
/// 38 within 3 s at 500 a second).
#[test]
fn connections_that_send_nothing_lock_out_neither_ray_nor_the_probe() {
    use rhc_testkit::hostile::{tries, Silent};
    const PER_SECOND: u32 = 400;
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let addr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    let flood = Silent::start(addr, PER_SECOND, 2000);
    std::thread::sleep(Duration::from_secs(3));
    let probe = {
        let url = c.url("/healthz");
        std::thread::spawn(move || {
            tries(12, Duration::from_millis(500), 200, "GET", &url, &[], b"")
        })
    };
    let ray = tries(
        12,
        Duration::from_millis(500),
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        ray_body().as_bytes(),
    );
    let probe = probe.join().unwrap();
    let opened = flood.opened();
    drop(flood);
    let evicted = c.metric_labeled("rhc_connections_evicted_total", "reason=\"no_request\"");
    eprintln!(
        "{opened} silent connections, {evicted} gave way; Ray {} of 12, /healthz {} of 12",
        ray.ok, probe.ok
    );
    // The flood outran what places freed at 2 s each could take (256 / 2 s).
    assert!(
        opened > 200 * 9,
        "the flood opened only {opened} connections"
    );
    assert!(ray.ok >= 11, "Ray: {} of 12: {:#?}", ray.ok, ray.failures);
    assert!(
        probe.ok >= 11,
        "/healthz: {} of 12: {:#?}",
        probe.ok,
        probe.failures
    );
}

/// A gzip body (concatenated members) of `[0,0,…,0]` whose decoded and compressed bytes
/// together come to about `total`.
fn zeros_gzip(total: usize) -> Vec<u8> {
    use flate2::{write::GzEncoder, Compression};
    let gz = |b: &[u8]| {
        let mut e = GzEncoder::new(Vec::new(), Compression::best());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    };
    const PAIRS: usize = 512 << 10;
    let member = gz(",0".repeat(PAIRS).as_bytes());
    let (head, end) = (gz(b"[0"), gz(b"]"));
    let build = |raw_guess: usize| {
        let pairs = (total - raw_guess - 3) / 2;
        let mut body = head.clone();
        for _ in 0..pairs / PAIRS {
            body.extend_from_slice(&member);
        }
        body.extend_from_slice(&gz(",0".repeat(pairs % PAIRS).as_bytes()));
        body.extend_from_slice(&end);
        body
    };
    let first = build(total / 1000);
    build(first.len())
}

/// Issue 39, review r39h D2: two gzip bodies of about 50 KB, each `[0,0,…]` of 48 MiB, hold
/// the whole 96 MiB body budget while they are parsed, for seconds, neither behind their
/// pace nor waiting for room, and their clients send them again at once. Ray's batches are
/// still answered 200 within its 3 s: they take room from the reserve only small bodies may
/// use (before: Ray waited for room until one of them was done, and got 503 after 10 s).
#[test]
fn bodies_slow_to_parse_leave_room_for_ray() {
    use rhc_testkit::hostile::{tries, Posters};
    let tmp = tempfile::tempdir().unwrap();
    let c = start_any_ratio(&tmp, &["--rotation-interval", "1h"]);
    // Two of them (decoded and compressed, as they are charged) leave less than 64 KiB of
    // the 96 MiB budget: 49,140 KiB each.
    let body = std::sync::Arc::new(zeros_gzip(49_140 << 10));
    assert!(body.len() < 100_000, "{}", body.len());
    let parsers = Posters::start(
        c.port,
        2,
        &[("Content-Encoding", "gzip")],
        std::sync::Arc::new(move |_| body.to_vec()),
    );
    // Both decoded and being parsed.
    let started = std::time::Instant::now();
    while c.metric("rhc_ingest_bytes_total") < ((2 * 47) << 20) as f64 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the bodies of zeros were not decoded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ray = tries(
        6,
        Duration::from_secs(1),
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        ray_body().as_bytes(),
    );
    let answers = parsers.finish();
    eprintln!("Ray {} of 6; the parsers' answers: {answers:?}", ray.ok);
    assert_eq!(ray.ok, 6, "{:#?}", ray.failures);
}

/// Issue 39, review r39h D3: 16 clients loop gzip bombs of 25 KB that decode to 24 MiB of
/// garbage each. The collector's peak memory stays within the body budget (96 MiB, and the
/// 4 MiB of small bodies) and the 30 MiB the rest of the HTTP side may take: a decoded body
/// is one buffer of its exact length (before: buffers grown by doubling, copied at each step
/// and left resident in the allocator, and hundreds of threads, took VmHWM up by 287 MiB,
/// past the chart's 256Mi limit).
#[test]
fn gzip_bombs_stay_within_the_memory_budget() {
    use rhc_testkit::hostile::Posters;
    let tmp = tempfile::tempdir().unwrap();
    let c = start_any_ratio(&tmp, &["--rotation-interval", "1h"]);
    let base = peak_mib(&c);
    let rest = std::sync::Arc::new(gzip_members(&vec![b'#'; 1 << 20], b"", 1));
    let bombs = Posters::start(
        c.port,
        16,
        &[("Content-Encoding", "gzip")],
        std::sync::Arc::new(move |n| {
            let mut first = format!("bomb {n:09}\n").into_bytes();
            first.resize(1024, b'#');
            let mut body = gzip_members(&first, b"", 1);
            for _ in 0..24 {
                body.extend_from_slice(&rest);
            }
            body
        }),
    );
    std::thread::sleep(Duration::from_secs(15));
    let answers = bombs.finish();
    let peak = peak_mib(&c);
    eprintln!("VmHWM {base:.0} -> {peak:.0} MiB; the bombs' answers: {answers:?}");
    let decoded = c.metric("rhc_ingest_bytes_total");
    assert!(
        decoded >= ((4 * 24) << 20) as f64,
        "{decoded} bytes decoded"
    );
    assert!(
        peak - base <= 96.0 + 4.0 + 30.0,
        "VmHWM {base:.0} -> {peak:.0} MiB under gzip bombs"
    );
    assert_eq!(c.get("/healthz").unwrap().status, 200);
}

/// Issue 39, review r39k D1: a gzip body that decodes to more than 100 times its size as sent
/// (past its first MiB) is refused with 413 as soon as its decoding passes that, and neither
/// stored nor parsed (before: 8 KB decoding to 8 MiB of `[0,0,…]` was decoded twice and
/// parsed, 200). Ray's own batches, which gzip shrinks 4 to 10 times, pass.
#[test]
fn gzip_bodies_decoding_past_a_hundred_times_their_size_get_413() {
    use flate2::{write::GzEncoder, Compression};
    let tmp = tempfile::tempdir().unwrap();
    let c = start(&tmp, &[]);
    let bomb = zeros_gzip(8 << 20);
    assert!(bomb.len() < 80_000, "{}", bomb.len());
    let r = c.post_with(&bomb, &[("Content-Encoding", "gzip")]);
    let text = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status, 413, "{text}");
    assert!(text.contains("--max-gzip-ratio"), "{text}");
    assert_eq!(c.metric("rhc_gzip_bodies_refused_total"), 1.0);
    assert_eq!(c.metric("rhc_ingest_bytes_total"), 0.0);
    // Ray 2.60's captured posts, at gzip's best.
    let posts = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/posts-camel.jsonl"),
    )
    .unwrap();
    for post in posts.lines().filter(|l| !l.trim().is_empty()) {
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(post.as_bytes()).unwrap();
        let r = c.post_with(&enc.finish().unwrap(), &[("Content-Encoding", "gzip")]);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
}

/// Issue 39, review r39k D1: 300 connections at once, then 40 a second, each sending a gzip
/// bomb (50 KB decoding to 48 MiB of `[0,0,…]`) and never reading the answer, hold every
/// place. Ray's batches and `/healthz` on both listeners are still answered within 3 s: a
/// bomb is refused once it decodes past 100 times its size, at most two bodies are decoded
/// at once (the rest wait without a thread: the runtime's workers keep their CPU), and a
/// body waiting its turn gives its place to a new connection (before: Ray and `/healthz` got
/// no answer within 3 s for the whole attack).
#[test]
fn gzip_bombs_on_every_place_lock_out_neither_ray_nor_the_probes() {
    use rhc_testkit::hostile::{tries, Silent};
    let tmp = tempfile::tempdir().unwrap();
    let ro = rhc_testkit::services::free_port();
    let ro_addr = format!("127.0.0.1:{ro}");
    let c = start(&tmp, &["--metrics-listen", &ro_addr]);
    let bomb = zeros_gzip(48 << 20);
    let mut request = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
        bomb.len()
    )
    .into_bytes();
    request.extend_from_slice(&bomb);
    let addr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    let bombs = Silent::sending(addr, 40, 400, 300, request);
    std::thread::sleep(Duration::from_secs(1));
    let probes = [c.url("/healthz"), format!("http://{ro_addr}/healthz")].map(|url| {
        std::thread::spawn(move || tries(6, Duration::from_secs(1), 200, "GET", &url, &[], b""))
    });
    let ray = tries(
        6,
        Duration::from_secs(1),
        200,
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        ray_body().as_bytes(),
    );
    let [ev, ro] = probes.map(|p| p.join().unwrap());
    let thrown = bombs.opened();
    drop(bombs);
    eprintln!(
        "{thrown} bombs; Ray {} of 6, /healthz {} and {} of 6",
        ray.ok, ev.ok, ro.ok
    );
    assert!(thrown >= 300, "only {thrown} bombs thrown");
    assert!(ray.ok >= 5, "Ray: {:#?}", ray.failures);
    assert!(ev.ok >= 5, "/healthz: {:#?}", ev.failures);
    assert!(ro.ok >= 5, "read-only /healthz: {:#?}", ro.failures);
}

/// A gzip body of about 650 KB whose decoding is refused only at its end: `[` and 2.6 MB of
/// random whitespace (which gzip shrinks only about four times), then 64 MiB of spaces, so it
/// is answered 413 once 64 MiB are decoded, the most any body may decode to with the
/// defaults. What it costs the collector is a whole decoding pass, as the largest body under
/// `--max-gzip-ratio` does, and then nothing: nothing parsed, stored or quarantined (a body
/// under the ratio is parsed too, which in a debug build takes tens of MiB a second of CPU
/// from everything else, Ray's batches then slow for that and not for their turn). `n`
/// makes it distinct.
fn large_gzip_decoded_to_the_bound(n: u64) -> Vec<u8> {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut first = b"[".to_vec();
    first.extend((0..2_600_000).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b" \t\r\n"[(x % 4) as usize]
    }));
    let mut body = gzip_members(&first, b"", 1);
    body.extend_from_slice(&gzip_members(
        &vec![b' '; 1 << 20],
        &vec![b' '; 1 << 20],
        64,
    ));
    body
}

/// Review r39m D1: 120 clients loop gzip bodies of 650 KB that each take a decoding turn
/// for a whole pass of 64 MiB (sent at about 6 MiB/s, on pace), so that bodies always queue
/// for the two turns any body may take. Ray's 20 small gzip batches (a few KiB) beside them
/// are each answered 200 within Ray's 3 s, none is closed without an answer, and all their
/// events are stored: a gzip body of at most 64 KiB has a decoding turn of its own (before:
/// each batch waited behind every large body queued before it, 4 to 12 s, 20 of 20 past
/// 3 s). Bodies just under the ratio that are parsed too (`[` and 20 MiB of whitespace) also
/// held Ray's batches past 3 s before (2.3 to 5.4 s, waiting twice, once per pass), but in
/// a debug build their parsing takes the CPU from everything, so Ray's batches are then as
/// slow with a turn of their own: what is measured here is the turn alone.
#[test]
fn small_gzip_batches_are_not_stuck_behind_large_decodes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start(&tmp, &["--rotation-interval", "1h"]);
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new((0..4).map(large_gzip_decoded_to_the_bound).collect());
    // Refused for --max-body-bytes, not for the ratio: 100 times what is sent is more.
    assert!(bodies[0].len() * 100 > 64 << 20, "{}", bodies[0].len());
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(
        std::collections::BTreeMap::<String, usize>::new(),
    ));
    let port = c.port;
    let attackers: Vec<_> = (0..120)
        .map(|i| {
            let (stop, answers, bodies) = (stop.clone(), answers.clone(), bodies.clone());
            std::thread::spawn(move || {
                let mut n = i;
                while !stop.load(Ordering::Relaxed) {
                    let body = &bodies[n % bodies.len()];
                    n += 1;
                    let answer = (|| -> std::io::Result<String> {
                        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
                        s.set_read_timeout(Some(Duration::from_secs(20)))?;
                        write!(
                            s,
                            "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
                            body.len()
                        )?;
                        // About 6 MiB/s: slow, but on pace (1 MiB/s).
                        for chunk in body.chunks(64 << 10) {
                            s.write_all(chunk)?;
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        let mut first = String::new();
                        std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut first)?;
                        Ok(first.trim().to_string())
                    })()
                    .unwrap_or_else(|e| format!("error: {e}"));
                    *answers.lock().unwrap().entry(answer).or_default() += 1;
                }
            })
        })
        .collect();
    // The large bodies queue for their turns.
    std::thread::sleep(Duration::from_secs(3));
    let slow = ray_batches_in_time(&c, "fair", 20);
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    eprintln!("the large bodies' answers: {answers:?}");
    assert!(slow.is_empty(), "{slow:#?}\nlarge bodies: {answers:?}");
    assert!(
        answers.values().sum::<usize>() >= 20,
        "the large bodies were not sent: {answers:?}"
    );
    let lines = stored_lines(&tmp, &mut c);
    for i in 0..20 {
        for j in 0..10 {
            let id = format!("\"eventId\":\"fair-{i}-{j}\"");
            assert!(
                lines.iter().any(|(_, l)| l.contains(&id)),
                "event fair-{i}-{j} was not stored"
            );
        }
    }
}

/// Posts `n` gzip batches of 10 events (ids `<prefix>-<i>-<j>`) as Ray does, 200 ms apart:
/// what went wrong with each that was not answered 200 within Ray's 3 s.
fn ray_batches_in_time(c: &Collector, prefix: &str, n: usize) -> Vec<String> {
    let mut slow = Vec::new();
    for i in 0..n {
        let events: Vec<String> = (0..10)
            .map(|j| event(&format!("{prefix}-{i}-{j}")))
            .collect();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(format!("[{}]", events.join(",")).as_bytes())
            .unwrap();
        let batch = enc.finish().unwrap();
        let started = std::time::Instant::now();
        let r = rhc_testkit::http::try_http_request_within(
            "POST",
            &c.url("/v1/events"),
            &[
                ("Content-Type", "application/json"),
                ("Content-Encoding", "gzip"),
            ],
            &batch,
            Duration::from_secs(15),
        );
        let took = started.elapsed();
        match r {
            Ok(r) if r.status == 200 && took < rhc_testkit::hostile::RAY_TIMEOUT => {}
            Ok(r) => slow.push(format!(
                "batch {i}: {} after {took:?}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Err(e) => slow.push(format!("batch {i}: {e} after {took:?}")),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    slow
}

/// Review r39p D1: at the connection cap, queued bodies gave way the largest first, so 256
/// clients looping 65-byte double-gzip bodies (each decoding to 1000 KiB, refused 400) made
/// Ray's 1.4 KB batch the largest queued body, thrown out (503) every time: 0 of 41 batches
/// answered 200. The one queued longest gives way first.
#[test]
fn tiny_queued_bodies_at_the_cap_do_not_throw_out_rays_batches() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start(&tmp, &["--rotation-interval", "1h"]);
    let mut inner = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    inner.write_all(b"[").unwrap();
    inner.write_all(&vec![b' '; 1000 << 10]).unwrap();
    let mut outer = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    outer.write_all(&inner.finish().unwrap()).unwrap();
    let tiny = Arc::new(outer.finish().unwrap());
    assert!(tiny.len() < 200, "{}", tiny.len());
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(
        std::collections::BTreeMap::<String, usize>::new(),
    ));
    let port = c.port;
    let attackers: Vec<_> = (0..256)
        .map(|_| {
            let (stop, answers, tiny) = (stop.clone(), answers.clone(), tiny.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let answer = (|| -> std::io::Result<String> {
                        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
                        s.set_read_timeout(Some(Duration::from_secs(20)))?;
                        write!(
                            s,
                            "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip, gzip\r\nContent-Length: {}\r\n\r\n",
                            tiny.len()
                        )?;
                        s.write_all(&tiny)?;
                        let mut first = String::new();
                        std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut first)?;
                        Ok(first.trim().to_string())
                    })()
                    .unwrap_or_else(|e| format!("error: {e}"));
                    *answers.lock().unwrap().entry(answer).or_default() += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let slow = ray_batches_in_time(&c, "cap", 20);
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    eprintln!("the tiny bodies' answers: {answers:?}");
    assert!(slow.is_empty(), "{slow:#?}\ntiny bodies: {answers:?}");
    assert!(
        answers.values().sum::<usize>() >= 256,
        "the tiny bodies were not sent: {answers:?}"
    );
    let lines = stored_lines(&tmp, &mut c);
    for i in 0..20 {
        for j in 0..10 {
            let id = format!("\"eventId\":\"cap-{i}-{j}\"");
            assert!(
                lines.iter().any(|(_, l)| l.contains(&id)),
                "event cap-{i}-{j} was not stored"
            );
        }
    }
}

/// Review r39q D1: just over the cap (300 clients looping the 65-byte double-gzip body that
/// decodes to 1000 KiB of whitespace, refused 400), queued bodies decoded in the order they
/// came and given way the oldest first left Ray's batch the same odds as theirs: 1 of 32
/// answered 200, the rest 503 "gives way". Ray's publisher keeps one aiohttp connection for
/// its batches (docs/http-endpoints.md), as this client does (a new one only once the
/// collector closed it): a connection that delivered events gives way after every cheap
/// client's queued body, idle or not, and its next body has a decoding turn of its own.
#[test]
fn rays_kept_connection_is_not_locked_out_by_300_cheap_clients() {
    use rhc_testkit::http::Conn;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let mut c = start(&tmp, &["--rotation-interval", "1h"]);
    let mut inner = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    inner.write_all(b"[").unwrap();
    inner.write_all(&vec![b' '; 1000 << 10]).unwrap();
    let mut outer = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    outer.write_all(&inner.finish().unwrap()).unwrap();
    let tiny = outer.finish().unwrap();
    assert!(tiny.len() < 200, "{}", tiny.len());
    let authority = format!("127.0.0.1:{}", c.port);
    let batch = |i: usize| {
        let events: Vec<String> = (0..10).map(|j| event(&format!("kept-{i}-{j}"))).collect();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(format!("[{}]", events.join(",")).as_bytes())
            .unwrap();
        enc.finish().unwrap()
    };
    let headers = [
        ("Content-Type", "application/json"),
        ("Content-Encoding", "gzip"),
    ];
    // Ray's agent starts with the node and posts its first batch before anyone floods it.
    let mut ray = Conn::open(&authority, Duration::from_secs(15)).unwrap();
    let first = ray
        .request("POST", "/v1/events", &headers, &batch(0))
        .unwrap();
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let posters = rhc_testkit::hostile::Posters::start(
        c.port,
        300,
        &[
            ("Content-Type", "application/json"),
            ("Content-Encoding", "gzip, gzip"),
        ],
        Arc::new(move |_| tiny.clone()),
    );
    std::thread::sleep(Duration::from_secs(2));
    let (mut slow, mut reconnects, mut broken) = (Vec::new(), 0, false);
    for i in 1..=20 {
        let started = std::time::Instant::now();
        // As aiohttp does: a connection the collector closed (or that failed) is not reused.
        if broken || ray.closed_by_peer() {
            reconnects += 1;
            match Conn::open(&authority, Duration::from_secs(15)) {
                Ok(conn) => ray = conn,
                Err(e) => {
                    slow.push(format!("batch {i}: connecting: {e}"));
                    continue;
                }
            }
        }
        let r = ray.request("POST", "/v1/events", &headers, &batch(i));
        let took = started.elapsed();
        broken = true;
        match r {
            Ok(r) if r.status == 200 && took < rhc_testkit::hostile::RAY_TIMEOUT => {
                broken = r.closes();
            }
            Ok(r) => slow.push(format!(
                "batch {i}: {} after {took:?}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Err(e) => slow.push(format!("batch {i}: {e} after {took:?}")),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let answers = posters.finish();
    eprintln!("the tiny bodies' answers: {answers:?}; Ray reconnected {reconnects} times");
    assert!(slow.is_empty(), "{slow:#?}\ntiny bodies: {answers:?}");
    assert!(
        answers.values().sum::<usize>() >= 300,
        "the tiny bodies were not sent: {answers:?}"
    );
    let lines = stored_lines(&tmp, &mut c);
    for i in 0..=20 {
        for j in 0..10 {
            let id = format!("\"eventId\":\"kept-{i}-{j}\"");
            assert!(
                lines.iter().any(|(_, l)| l.contains(&id)),
                "event kept-{i}-{j} was not stored"
            );
        }
    }
}

/// The ingest token of the tests below: what both containers of a pod would share.
const INGEST_TOKEN: &str = "rhc-test-ingest-token-0123456789";

/// Review r39r D1: without a token, one accepted event made any connection "delivered",
/// and 300 clients that each posted one valid event and then looped the 65-byte double-gzip
/// body (decoding to 1000 KiB of whitespace, 400) on the same kept connection locked Ray's
/// kept connection out: 0 of 54 batches answered 200 within 3 s. With an ingest token only
/// `POST /v1/events/<token>` is Ray's: the cheap clients' posts are refused from their head
/// (403, connection closed), they never earn a rank or a decoding turn, and Ray's kept
/// connection (reconnecting when closed, as aiohttp does) gets every batch in within 3 s.
/// The token is given as `RHC_INGEST_TOKEN`, which a collector without tokens ignores: such
/// a collector starts, answers Ray's token path 404 and fails this test.
#[test]
fn with_an_ingest_token_clients_that_deliver_events_do_not_lock_out_ray() {
    use rhc_testkit::http::Conn;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--enable-log-collector",
            "false",
            "--rotation-interval",
            "1h",
        ],
        &[("RHC_INGEST_TOKEN", INGEST_TOKEN)],
    );
    let mut inner = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    inner.write_all(b"[").unwrap();
    inner.write_all(&vec![b' '; 1000 << 10]).unwrap();
    let mut outer = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    outer.write_all(&inner.finish().unwrap()).unwrap();
    let tiny = Arc::new(outer.finish().unwrap());
    assert!(tiny.len() < 200, "{}", tiny.len());
    let authority = format!("127.0.0.1:{}", c.port);
    let ray_path = format!("/v1/events/{INGEST_TOKEN}");
    let batch = |i: usize| {
        let events: Vec<String> = (0..10).map(|j| event(&format!("tok-{i}-{j}"))).collect();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(format!("[{}]", events.join(",")).as_bytes())
            .unwrap();
        enc.finish().unwrap()
    };
    let headers = [
        ("Content-Type", "application/json"),
        ("Content-Encoding", "gzip"),
    ];
    // Ray's agent starts with the node and posts its first batch before anyone floods it.
    let mut ray = Conn::open(&authority, Duration::from_secs(15)).unwrap();
    let first = ray.request("POST", &ray_path, &headers, &batch(0)).unwrap();
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    // r39r's kept.py, "delivered": each client delivers one raw event on a new connection,
    // then loops the tiny body on it while it stays open; reconnects when closed.
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(
        std::collections::BTreeMap::<String, usize>::new(),
    ));
    let cheap: Vec<_> = (0..300)
        .map(|i| {
            let (stop, answers, tiny, authority) = (
                stop.clone(),
                answers.clone(),
                tiny.clone(),
                authority.clone(),
            );
            std::thread::spawn(move || {
                let mut k = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let mut conn = match Conn::open(&authority, Duration::from_secs(20)) {
                        Ok(conn) => conn,
                        Err(e) => {
                            *answers
                                .lock()
                                .unwrap()
                                .entry(format!("connect: {:?}", e.kind()))
                                .or_default() += 1;
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                    };
                    let one = format!("[{}]", event(&format!("cheap-{i}-{k}")));
                    k += 1;
                    let mut r = conn.request(
                        "POST",
                        "/v1/events",
                        &[("Content-Type", "application/json")],
                        one.as_bytes(),
                    );
                    let mut what = "deliver";
                    loop {
                        let closes = match &r {
                            Ok(r) => {
                                *answers
                                    .lock()
                                    .unwrap()
                                    .entry(format!("{what} {}", r.status))
                                    .or_default() += 1;
                                r.closes()
                            }
                            Err(e) => {
                                *answers
                                    .lock()
                                    .unwrap()
                                    .entry(format!("{what} {:?}", e.kind()))
                                    .or_default() += 1;
                                true
                            }
                        };
                        if closes || stop.load(Ordering::Relaxed) || conn.closed_by_peer() {
                            break;
                        }
                        what = "tiny";
                        r = conn.request(
                            "POST",
                            "/v1/events",
                            &[
                                ("Content-Type", "application/json"),
                                ("Content-Encoding", "gzip, gzip"),
                            ],
                            &tiny,
                        );
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let (mut slow, mut reconnects, mut broken) = (Vec::new(), 0, false);
    for i in 1..=20 {
        let started = std::time::Instant::now();
        // As aiohttp does: a connection the collector closed (or that failed) is not reused.
        if broken || ray.closed_by_peer() {
            reconnects += 1;
            match Conn::open(&authority, Duration::from_secs(15)) {
                Ok(conn) => ray = conn,
                Err(e) => {
                    slow.push(format!("batch {i}: connecting: {e}"));
                    continue;
                }
            }
        }
        let r = ray.request("POST", &ray_path, &headers, &batch(i));
        let took = started.elapsed();
        broken = true;
        match r {
            Ok(r) if r.status == 200 && took < rhc_testkit::hostile::RAY_TIMEOUT => {
                broken = r.closes();
            }
            Ok(r) => slow.push(format!(
                "batch {i}: {} after {took:?}: {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            )),
            Err(e) => slow.push(format!("batch {i}: {e} after {took:?}")),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for t in cheap {
        t.join().unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    eprintln!("the cheap clients' answers: {answers:?}; Ray reconnected {reconnects} times");
    assert!(slow.is_empty(), "{slow:#?}\ncheap clients: {answers:?}");
    assert!(
        answers.get("deliver 403").copied().unwrap_or(0) >= 300,
        "the cheap clients did not post: {answers:?}"
    );
    assert!(
        answers
            .keys()
            .all(|k| !k.ends_with(" 200") && !k.starts_with("tiny")),
        "a post without the token was read: {answers:?}"
    );
    let lines = stored_lines(&tmp, &mut c);
    assert!(
        !lines
            .iter()
            .any(|(_, l)| l.contains("\"eventId\":\"cheap-")),
        "an event posted without the token was stored"
    );
    for i in 0..=20 {
        for j in 0..10 {
            let id = format!("\"eventId\":\"tok-{i}-{j}\"");
            assert!(
                lines.iter().any(|(_, l)| l.contains(&id)),
                "event tok-{i}-{j} was not stored"
            );
        }
    }
}

/// With `--ingest-token-file`, a post without the token or with another one is refused
/// (403, `Connection: close`) as soon as its head is read: a body declared at 64 MiB and
/// never sent is not waited for. Ray's path is served, probes as before, and the token is
/// in no log line (at debug).
#[test]
fn posts_without_the_ingest_token_are_refused_before_their_body() {
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("ingest-token");
    std::fs::write(&token_file, format!("{INGEST_TOKEN}\n")).unwrap();
    let mut c = start(&tmp, &["--ingest-token-file", token_file.to_str().unwrap()]);
    let wrong = format!("/v1/events/{}x", &INGEST_TOKEN[..INGEST_TOKEN.len() - 1]);
    let longer = format!("/v1/events/{INGEST_TOKEN}0");
    for path in ["/v1/events", "/events", &wrong, &longer, "/v1/events/"] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", c.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let started = std::time::Instant::now();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n[",
            64 << 20
        )
        .unwrap();
        // The whole answer, then the end of the stream: nothing waits for the body.
        let mut answer = Vec::new();
        let read = s.read_to_end(&mut answer);
        let took = started.elapsed();
        let answer = String::from_utf8_lossy(&answer);
        assert!(read.is_ok(), "{path}: {read:?} after {took:?}: {answer}");
        assert!(took < Duration::from_secs(2), "{path}: {took:?}");
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
        assert!(answer.contains("ingest token"), "{answer}");
        assert!(!answer.contains(&INGEST_TOKEN[4..]), "{answer}");
    }
    let ok = c.post_with(
        format!("[{}]", event("with-token")).as_bytes(),
        &[("Content-Type", "application/json")],
    );
    assert_eq!(ok.status, 403, "the bare path is refused");
    let r = rhc_testkit::http::try_http_request(
        "POST",
        &c.url(&format!("/v1/events/{INGEST_TOKEN}")),
        &[("Content-Type", "application/json")],
        format!("[{}]", event("with-token")).as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(json(&r)["accepted"], 1);
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(c.get(probe).unwrap().status, 200, "{probe}");
    }
    let refused = c.metric_labeled("rhc_http_requests_total", "status=\"403\"");
    assert!(refused >= 6.0, "{refused}");
    let lines = stored_lines(&tmp, &mut c);
    assert!(lines
        .iter()
        .any(|(_, l)| l.contains("\"eventId\":\"with-token\"")));
    let log = c.log_text();
    assert!(!log.contains(&INGEST_TOKEN[4..]), "the token is in the log");
}
