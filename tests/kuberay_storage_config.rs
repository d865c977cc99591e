//! KubeRay's `STORAGE_BACKEND_CONFIG_PATH` through the real binary against moto: the JSON
//! file's bucket and endpoint are the ones used, over `S3_BUCKET` and `S3_ENDPOINT` of the
//! environment (which point elsewhere), as KubeRay's collector reads them.

use std::time::{Duration, Instant};

use rhc_testkit::collector::Collector;
use rhc_testkit::services::MotoS3;

const SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";

#[test]
fn the_json_storage_config_names_the_bucket_and_endpoint() {
    let Some(moto) = MotoS3::start() else {
        return;
    };
    moto.create_bucket("from-json");
    moto.create_bucket("from-env");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("storage.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"s3Bucket":"from-json","s3Endpoint":"{}","s3Region":"us-east-1","s3DisableSSL":"true","s3ForcePathStyle":"true"}}"#,
            moto.endpoint
        ),
    )
    .unwrap();
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &["--role", "head", "--rotation-interval", "1s"],
        &[
            ("STORAGE_BACKEND", "s3"),
            ("STORAGE_BACKEND_CONFIG_PATH", config.to_str().unwrap()),
            // What the file replaces: a bucket and an endpoint that must not be used.
            ("S3_BUCKET", "from-env"),
            ("S3_ENDPOINT", "http://127.0.0.1:9"),
            ("AWS_ACCESS_KEY_ID", MotoS3::ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", MotoS3::SECRET_ACCESS_KEY),
            ("AWS_REGION", MotoS3::REGION),
        ],
    );
    let body = format!(
        r#"[{{"eventId":"AQ==","eventType":"NODE_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:57:00Z","sessionName":"{SESSION}","nodeId":"LRhLjMfmquJWNqG/Eurap0rtLwA3XhECIrFHCA==","nodeLifecycleEvent":{{}}}}]"#
    );
    assert_eq!(c.post(body.as_bytes()).status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    let prefix = format!("cluster-history/raycluster/default/local/{SESSION}/");
    loop {
        let keys = moto.list_keys("from-json", &prefix);
        if keys.iter().any(|k| k.contains("/node_events/")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no event object in the bucket of the JSON file; keys {keys:?}\n{}",
            c.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(c.terminate(Duration::from_secs(30)).success());
    assert!(moto.list_keys("from-env", "").is_empty());
}

/// Records the `Authorization` header of every request and answers 500, so the collector
/// keeps retrying.
fn recording_s3() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut len = 0usize;
                    let mut line = String::new();
                    let mut any = false;
                    while reader.read_line(&mut line).unwrap_or(0) > 0 {
                        any = true;
                        let l = line.trim_end().to_string();
                        line.clear();
                        if l.is_empty() {
                            break;
                        }
                        let lower = l.to_ascii_lowercase();
                        if lower.starts_with("authorization:") {
                            log.lock().unwrap().push(l.clone());
                        }
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    if !any {
                        return;
                    }
                    let mut body = vec![0u8; len];
                    if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
                        return;
                    }
                    let answer = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n";
                    if conn.write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, seen)
}

#[test]
fn the_json_storage_config_region_wins_over_aws_region() {
    let (endpoint, seen) = recording_s3();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("storage.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"s3Bucket":"bkt","s3Endpoint":"{endpoint}","s3Region":"eu-central-1","s3DisableSSL":"true"}}"#
        ),
    )
    .unwrap();
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &["--role", "head", "--rotation-interval", "1s"],
        &[
            ("STORAGE_BACKEND", "s3"),
            ("STORAGE_BACKEND_CONFIG_PATH", config.to_str().unwrap()),
            // What the IRSA webhook injects into every container.
            ("AWS_REGION", "us-west-2"),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    );
    let body = format!(
        r#"[{{"eventId":"AQ==","eventType":"NODE_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:57:00Z","sessionName":"{SESSION}","nodeId":"LRhLjMfmquJWNqG/Eurap0rtLwA3XhECIrFHCA==","nodeLifecycleEvent":{{}}}}]"#
    );
    assert_eq!(c.post(body.as_bytes()).status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no request reached the endpoint of the JSON file\n{}",
            c.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The store refuses everything: nothing to wait for.
    c.kill9();
    let auth = seen.lock().unwrap().clone();
    assert!(
        auth.iter().all(|a| a.contains("/eu-central-1/s3/")),
        "requests not signed for the file's s3Region: {auth:#?}"
    );
}
