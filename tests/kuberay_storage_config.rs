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
