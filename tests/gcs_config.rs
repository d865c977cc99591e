//! The collector configured for Google Cloud Storage the way a user would,
//! pointed at fake-gcs-server.
//!
//! fake-gcs-server 1.54 does not implement the XML upload API that
//! `object_store`'s GCS client uses (`PUT /<bucket>/<object>` answers 400
//! "invalid uploadType"), so no upload can succeed here: these tests cover the
//! configuration and the connectivity, not the GCS upload path.

use std::time::{Duration, Instant};

use rhc_testkit::collector::Collector;
use rhc_testkit::http::http_request;
use rhc_testkit::services::FakeGcs;

const CAMEL: &str = include_str!("data/posts-camel.jsonl");

/// A service account key as object_store reads it from
/// `GOOGLE_SERVICE_ACCOUNT_KEY`: `gcs_base_url` sends every request to
/// `endpoint`, `disable_oauth` skips token requests; the key fields must be
/// present but are never used.
fn service_account_key(endpoint: &str) -> String {
    serde_json::json!({
        "gcs_base_url": endpoint,
        "disable_oauth": true,
        "private_key": "unused",
        "private_key_id": "unused",
        "client_email": "unused@example.invalid",
    })
    .to_string()
}

/// Names of the objects in `bucket`, through fake-gcs-server's JSON API.
fn bucket_names(gcs: &FakeGcs, bucket: &str) -> Vec<String> {
    let url = format!("{}/storage/v1/b/{bucket}/o", gcs.endpoint);
    let (status, body) = http_request("GET", &url, &[], b"");
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "GET {url}: {text}");
    let list: serde_json::Value =
        serde_json::from_slice(&body).unwrap_or_else(|e| panic!("GET {url}: {e}: {text}"));
    list.get("items")
        .and_then(|items| items.as_array())
        .map(|items| {
            items
                .iter()
                .map(|o| o["name"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The value of `name{...label...}` on the collector's `/metrics`, 0 when absent.
fn labelled_metric(c: &Collector, name: &str, label: &str) -> f64 {
    let Ok(r) = c.get("/metrics") else {
        return 0.0;
    };
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Undoes %XX escapes (object_store escapes every `-`, `_` and `/` of a key).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The collector's log without ANSI colour codes (tracing colours its fields).
fn plain_log(c: &Collector) -> String {
    let text = c.log_text();
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(ch) = chars.next() {
        if ch == '\x1b' {
            // CSI: ESC [ parameters final-byte (0x40..=0x7e).
            for next in chars.by_ref() {
                if ('@'..='~').contains(&next) && next != '[' {
                    break;
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// Runs the collector with `args` and `env` (plus the GCS credentials pointing
/// at `gcs`) and checks that it accepts the configuration, takes an event,
/// tries to upload it to fake-gcs-server (and fails: no XML upload there),
/// leaves the bucket empty, and exits with 3 ("left on disk") on SIGTERM.
/// `storage` is how the collector's startup log names the location, and
/// `key_prefix` the start of the object keys it tries to write.
fn check_collector_against_fake_gcs(
    gcs: &FakeGcs,
    bucket: &str,
    args: &[&str],
    env: &[(&str, &str)],
    storage: &str,
    key_prefix: &str,
) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let key = service_account_key(&gcs.endpoint);
    let mut all_env = vec![
        ("GOOGLE_SERVICE_ACCOUNT_KEY", key.as_str()),
        // object_store's GCS builder allows http by default; say so anyway.
        ("GOOGLE_ALLOW_HTTP", "true"),
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("no_proxy", "127.0.0.1,localhost"),
    ];
    all_env.extend_from_slice(env);
    let mut all_args = vec![
        "--cluster-name",
        "gcs-config",
        "--rotation-interval",
        "1s",
        "--shutdown-timeout",
        "2s",
    ];
    all_args.extend_from_slice(args);

    // Starting at all (/healthz answers) means the configuration was accepted.
    let mut c = Collector::start(&tmp.path().join("spool"), &all_args, &all_env);
    let log = plain_log(&c);
    assert!(log.contains("collector ready"), "{log}");
    assert!(
        log.contains(&format!("storage={storage} ")),
        "the collector does not name {storage} as its storage:\n{log}"
    );

    let line = CAMEL.lines().next().expect("a line in posts-camel.jsonl");
    let r = c.post(line.as_bytes());
    assert_eq!(
        r.status,
        200,
        "POST: {}\n{}",
        String::from_utf8_lossy(&r.body),
        plain_log(&c)
    );

    // The session marker is uploaded at once, the event segment once it is
    // sealed (after 1 s); both fail at fake-gcs-server and are retried.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let attempts = c.metric("rhc_upload_attempts_total");
        let failures = c.metric("rhc_upload_failures_total");
        let event_failures = labelled_metric(&c, "rhc_upload_failures_total", "kind=\"events\"");
        if attempts > 0.0 && failures > 0.0 && event_failures > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no failed upload of the event segment after 10 s (attempts {attempts}, \
             failures {failures}, of events {event_failures}):\n{}",
            plain_log(&c)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The attempts reached fake-gcs-server (its URL, and its answer to a PUT),
    // not Google or anything else, and wrote under the configured bucket and root.
    let log = plain_log(&c);
    let put = format!("Error performing PUT {}/", gcs.endpoint);
    let targets: Vec<String> = log
        .match_indices(&put)
        .map(|(i, _)| {
            let rest = &log[i + put.len()..];
            percent_decode(rest.split_whitespace().next().unwrap_or_default())
        })
        .collect();
    assert!(
        !targets.is_empty(),
        "the collector's log shows no PUT to {}:\n{log}",
        gcs.endpoint
    );
    let expected = format!("{bucket}/{key_prefix}");
    for t in &targets {
        assert!(
            t.starts_with(&expected),
            "PUT of {t}, expected {expected}...:\n{log}"
        );
    }
    // fake-gcs-server's own access log has those PUTs, each answered 400.
    let server_log = gcs.log();
    let server_puts: Vec<(String, String)> = server_log
        .lines()
        .filter_map(|l| {
            let mut words = l[l.find("PUT /")? + 4..].split_whitespace();
            let path = percent_decode(words.next()?);
            let status = words.nth(1)?.to_string();
            path.starts_with(&format!("/{bucket}/"))
                .then_some((path, status))
        })
        .collect();
    assert!(
        !server_puts.is_empty(),
        "fake-gcs-server's log shows no PUT into {bucket}:\n{server_log}"
    );
    for (path, status) in &server_puts {
        assert!(
            path.starts_with(&format!("/{expected}")) && status == "400",
            "fake-gcs-server got PUT {path} answered {status}, expected /{expected}... \
             answered 400:\n{server_log}"
        );
    }
    assert!(
        log.contains("invalid uploadType"),
        "the collector's log does not show fake-gcs-server's answer to an XML upload:\n{log}"
    );
    assert!(
        !log.contains("googleapis.com"),
        "the collector talked to Google:\n{log}"
    );

    let names = bucket_names(gcs, bucket);
    assert!(names.is_empty(), "objects in {bucket}: {names:?}");

    let started = Instant::now();
    let status = c.terminate(Duration::from_secs(6));
    assert_eq!(
        status.code(),
        Some(3),
        "exit after SIGTERM ({:?}):\n{}",
        started.elapsed(),
        plain_log(&c)
    );
    let log = plain_log(&c);
    assert!(log.contains("left on disk"), "{log}");
    assert!(bucket_names(gcs, bucket).is_empty());
}

/// KubeRay's variables: `STORAGE_BACKEND=gcs` and `GCS_BUCKET`, credentials
/// from `GOOGLE_SERVICE_ACCOUNT_KEY`. Also `--storage gs://<bucket>/root` with
/// the same credentials. fake-gcs-server 1.54 does not implement the XML upload
/// API object_store uses, so the GCS upload path cannot be exercised here; this
/// test covers configuration and connectivity (every upload is expected to
/// fail, and the bucket to stay empty).
#[test]
fn gcs_configuration_reaches_fake_gcs() {
    let Some(gcs) = FakeGcs::start() else {
        return;
    };

    gcs.create_bucket("kuberay-env");
    check_collector_against_fake_gcs(
        &gcs,
        "kuberay-env",
        &[],
        &[("STORAGE_BACKEND", "gcs"), ("GCS_BUCKET", "kuberay-env")],
        "gs://kuberay-env",
        "",
    );

    gcs.create_bucket("storage-url");
    check_collector_against_fake_gcs(
        &gcs,
        "storage-url",
        &["--storage", "gs://storage-url/root"],
        &[],
        "gs://storage-url/root",
        "root/",
    );
}
