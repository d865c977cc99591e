//! The read-only listener (`--metrics-listen`) through the real binary: probes and metrics
//! answer there, events are refused there (before any byte of them is stored), and the
//! events listener keeps accepting them. In a pod the chart binds the events listener to
//! 127.0.0.1 and this one to the pod IP; here both are on 127.0.0.1, on different ports.

use rhc_testkit::collector::Collector;
use rhc_testkit::http::try_http_request;
use rhc_testkit::services::free_port;

const CAMEL: &str = include_str!("data/posts-camel.jsonl");

fn first_body() -> &'static str {
    CAMEL
        .lines()
        .next()
        .expect("a POST body in posts-camel.jsonl")
}

#[test]
fn events_are_refused_on_the_read_only_listener_and_accepted_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = dir.path().join("bucket");
    let ro_port = free_port();
    let ro = format!("127.0.0.1:{ro_port}");
    let storage = format!("file://{}", bucket.display());
    let c = Collector::start(
        &dir.path().join("spool"),
        &[
            "--storage",
            &storage,
            "--role",
            "worker",
            "--metrics-listen",
            &ro,
        ],
        &[],
    );
    let url = |path: &str| format!("http://{ro}{path}");
    let json = [("Content-Type", "application/json")];

    // Events on the read-only listener: refused, with a body that says where they go.
    for path in ["/v1/events", "/events"] {
        let r = try_http_request("POST", &url(path), &json, first_body().as_bytes()).unwrap();
        let text = String::from_utf8_lossy(&r.body).to_string();
        assert_eq!(
            r.status, 404,
            "POST {path} on the read-only listener: {text}"
        );
        assert!(
            text.contains("read-only listener") && text.contains("--listen"),
            "{text}"
        );
    }
    // Nothing else writes either.
    for (method, path) in [
        ("PUT", "/v1/events"),
        ("POST", "/metrics"),
        ("DELETE", "/healthz"),
    ] {
        let r = try_http_request(method, &url(path), &[], b"x").unwrap();
        assert!(
            r.status == 404 || r.status == 405,
            "{method} {path}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    assert_eq!(c.metric("rhc_events_accepted_total"), 0.0);
    assert_eq!(
        c.metric("rhc_spool_written_bytes_total"),
        0.0,
        "nothing was spooled"
    );

    // Probes and metrics answer there (GET and HEAD).
    for path in ["/healthz", "/readyz", "/metrics"] {
        let r = try_http_request("GET", &url(path), &[], b"").unwrap();
        assert_eq!(
            r.status,
            200,
            "GET {path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let r = try_http_request("HEAD", &url(path), &[], b"").unwrap();
        assert_eq!(r.status, 200, "HEAD {path}");
    }
    let metrics = try_http_request("GET", &url("/metrics"), &[], b"").unwrap();
    let metrics = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(metrics.contains("rhc_spool_bytes"), "{metrics}");

    // The events listener (loopback) accepts them.
    let r = c.post(first_body().as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let accepted = c.metric("rhc_events_accepted_total");
    assert!(accepted > 0.0, "accepted {accepted}");
    assert!(c.metric("rhc_spool_written_bytes_total") > 0.0);
    // The same counter, read through the read-only listener.
    let metrics = try_http_request("GET", &url("/metrics"), &[], b"").unwrap();
    let line = String::from_utf8_lossy(&metrics.body)
        .lines()
        .find(|l| l.starts_with("rhc_events_accepted_total "))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        line.ends_with(&format!(" {accepted}")),
        "{line:?} vs {accepted}"
    );
}

#[test]
fn without_the_flag_everything_is_served_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let storage = format!("file://{}", dir.path().join("bucket").display());
    let c = Collector::start(
        &dir.path().join("spool"),
        &["--storage", &storage, "--role", "worker"],
        &[],
    );
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(c.get(path).unwrap().status, 200, "GET {path}");
    }
    assert_eq!(c.post(first_body().as_bytes()).status, 200);
}

#[test]
fn the_read_only_listener_needs_a_port_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(rhc_testkit::collector::collector_bin())
        .args([
            "--listen",
            "127.0.0.1:18084",
            "--metrics-listen",
            "0.0.0.0:18084",
            "--spool-dir",
        ])
        .arg(dir.path().join("spool"))
        .arg("--storage")
        .arg(dir.path().join("bucket"))
        .env_remove("RHC_LISTEN")
        .env_remove("RHC_METRICS_LISTEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--metrics-listen"), "{stderr}");
    assert!(!dir.path().join("spool").exists(), "nothing was created");
}
