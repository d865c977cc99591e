//! The collector's Google Cloud Storage path, for real requests: `object_store`'s GCS client
//! speaks GCS's XML API, which is S3-compatible, and moto serves it. The collector is pointed
//! at moto with `GOOGLE_BASE_URL` and a bearer token (`GOOGLE_BEARER_TOKEN`; moto answers 500
//! to an empty one), exactly as a user would configure `gs://`.
//!
//! What this covers: our GCS wiring (URL, builder, credentials from the environment) and every
//! request the collector and `inspect` make (single PUTs, multipart uploads, listings with
//! delimiters, ranged and whole GETs) against a server that answers them like S3 does. What
//! it does not cover: GCS-only behaviour (OAuth token exchange, GCS's own error bodies and
//! retry hints, its consistency model); `tests/gcs_config.rs` checks the configuration against
//! fake-gcs-server, which does not implement the XML upload API.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::Value;

use rhc_testkit::collector::{decode, history_server_accepts, Collector};
use rhc_testkit::services::MotoS3;

const CAMEL: &str = include_str!("data/posts-camel.jsonl");
const SNAKE: &str = include_str!("data/posts-snake.jsonl");
/// Without '-': object_store's GCS client percent-encodes every '-' of the path, bucket
/// included (`ray%2Dhistory`), and moto routes on the raw bucket segment (GCS decodes it).
const BUCKET: &str = "rayhistory";
const SESSION: &str = "session_2026-11-22_02-06-36_260774_21819";
const NODE: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";

fn gcs_env(s3: &MotoS3) -> Vec<(&'static str, String)> {
    vec![
        ("GOOGLE_BASE_URL", s3.endpoint.clone()),
        ("GOOGLE_BEARER_TOKEN", "test-token".into()),
    ]
}

fn event_ids(capture: &str) -> BTreeSet<String> {
    capture
        .lines()
        .filter(|l| !l.trim().is_empty())
        .flat_map(|body| serde_json::from_str::<Vec<&RawValue>>(body).unwrap())
        .map(|e| {
            let v: Value = serde_json::from_str(e.get()).unwrap();
            v.get("eventId")
                .or_else(|| v.get("event_id"))
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn events_logs_and_inspect_through_gs_urls() {
    let Some(s3) = MotoS3::start() else { return };
    s3.create_bucket(BUCKET);
    let tmp = tempfile::tempdir().unwrap();
    // A session with a small raylet log and a worker log of three 5 MiB parts.
    let ray = tmp.path().join("ray");
    let logs = ray.join(SESSION).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::os::unix::fs::symlink(SESSION, ray.join("session_latest")).unwrap();
    std::fs::write(logs.join("raylet.out"), b"[raylet] started\n").unwrap();
    let worker = format!("worker-{}-01000000-4242.out", "ab".repeat(28));
    let big: Vec<u8> = (0..(12u32 << 20) / 32)
        .flat_map(|i| format!("line {i:09} of a worker log..\n").into_bytes())
        .collect();
    std::fs::write(logs.join(&worker), &big).unwrap();

    let env = gcs_env(&s3);
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            &format!("gs://{BUCKET}"),
            "--ray-tmp-dir",
            ray.to_str().unwrap(),
            "--node-id",
            NODE,
            "--upload-part-bytes",
            "5MiB",
            "--enable-export-events",
            "false",
        ],
        &env_refs,
    );
    for capture in [CAMEL, SNAKE] {
        for body in capture.lines().filter(|l| !l.trim().is_empty()) {
            let r = c.post(body.as_bytes());
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        }
    }
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status}:\n{}", c.log_text());

    // Events: every one once, in objects the history server accepts, camelCase keys only.
    let keys = s3.list_keys(BUCKET, "");
    let mut ids = BTreeSet::new();
    let mut lines = 0;
    for key in keys
        .iter()
        .filter(|k| k.contains("/node_events/") || k.contains("/job_events/"))
    {
        let name = key.rsplit('/').next().unwrap();
        assert!(history_server_accepts(name), "{key}");
        assert!(key.ends_with(".jsonl.gz"), "{key}");
        let head = s3.head_object(BUCKET, key);
        assert_eq!(head.status, 200, "HEAD {key}");
        assert_eq!(
            head.header("content-encoding"),
            None,
            "{key}: a Content-Encoding header would make Go's client unzip it first"
        );
        let text = decode(key, &s3.get_object(BUCKET, key).unwrap());
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_slice(line).unwrap();
            let id = v["eventId"]
                .as_str()
                .unwrap_or_else(|| panic!("{key}: a stored event without camelCase eventId: {v}"));
            assert!(v.get("event_id").is_none(), "{key}: snake_case kept: {v}");
            ids.insert(id.to_string());
            lines += 1;
        }
    }
    let mut expected = event_ids(CAMEL);
    expected.extend(event_ids(SNAKE));
    assert_eq!(ids, expected);
    assert_eq!(lines, expected.len());
    assert!(
        keys.iter()
            .any(|k| k == &format!("cluster-metadata/raycluster/default_local/{SESSION}")),
        "no session marker in {keys:?}"
    );

    // Logs: byte for byte, the big one as a multipart upload of three parts.
    let prefix = format!("cluster-history/raycluster/default/local/{SESSION}/{NODE}/logs");
    let worker_key = format!("{prefix}/{worker}");
    assert_eq!(
        s3.get_object(BUCKET, &worker_key).as_deref(),
        Some(&big[..])
    );
    let etag = s3.head_object(BUCKET, &worker_key);
    assert!(
        etag.header("etag")
            .is_some_and(|e| e.trim_matches('"').ends_with("-3")),
        "{worker_key} was not a 3-part multipart upload: {:?}",
        etag.headers
    );
    assert_eq!(
        s3.get_object(BUCKET, &format!("{prefix}/raylet.out"))
            .as_deref(),
        Some(&b"[raylet] started\n"[..])
    );

    // inspect reads it back through gs://.
    let inspect = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
        cmd.arg("inspect").arg(format!("gs://{BUCKET}")).args(args);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "inspect {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(inspect(&[]).contains(SESSION));
    let report: Value = serde_json::from_str(&inspect(&["--session", SESSION, "--json"])).unwrap();
    let camel_session_events = event_ids(CAMEL).len() as u64;
    assert_eq!(
        report["events"]["total"].as_u64(),
        Some(camel_session_events),
        "{}",
        report["events"]
    );
    assert_eq!(report["problems"]["unreadable_objects"], 0, "{report}");
    assert_eq!(report["problems"]["bad_lines"], 0, "{report}");
}
