//! The permissions the documentation asks for are the ones the code needs: every S3 request
//! of a collector run against moto (events, a multipart log, a log append through
//! UploadPartCopy, dashboard snapshots with the final poll's read-back, the final flush) is
//! recorded by moto's own request recorder, named as the
//! S3 API names it, and must be a row of the S3 table (docs/storage.md, "Permissions"), whose
//! IAM actions must appear in the policy lines of the Kubernetes page's Credentials
//! (docs/kubernetes.md) and the sample ServiceAccount. The GCS role must be one that can
//! overwrite (`objectUser`), everywhere it is named: the README and every page of docs/.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rhc_testkit::collector::{append_to, Collector};
use rhc_testkit::dashboard::{good_answers, Answer, DashboardStandIn, JOBS};
use rhc_testkit::services::MotoS3;

const BUCKET: &str = "rhc-permissions";
const SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";
const NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";

/// A file of the repository, by its path from the root.
fn doc(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The page with the S3 permission table (the README's "Permissions" moved there).
const PERMISSIONS_PAGE: &str = "docs/storage.md";
/// The page with the Kubernetes "Credentials" paragraph users copy their policy from.
const CREDENTIALS_PAGE: &str = "docs/kubernetes.md";

/// The README and every page of docs/: where a role could be offered.
fn all_docs() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_string(), doc("README.md"))];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut pages: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    for p in pages {
        let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
        out.push((name.clone(), doc(&name)));
    }
    out
}

/// The documented S3 table: request name → IAM actions.
fn documented_s3() -> BTreeMap<String, BTreeSet<String>> {
    let text = doc(PERMISSIONS_PAGE);
    let start = text
        .find("<!-- s3-permissions:begin -->")
        .expect("docs/storage.md has the S3 permission table");
    let end = text.find("<!-- s3-permissions:end -->").unwrap();
    let mut out = BTreeMap::new();
    for row in text[start..end].lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let request = cells[0].trim_matches('`').to_string();
        let actions = cells[2]
            .split(',')
            .map(|a| a.trim().trim_matches('`').to_string())
            .collect();
        out.insert(request, actions);
    }
    out
}

/// The S3 API name of a recorded request (path-style URL, `/bucket[/key][?query]`).
fn s3_request(method: &str, url: &str, headers: &serde_json::Value) -> String {
    let path_query = url
        .split_once("://")
        .map_or(url, |(_, r)| r.find('/').map_or("/", |i| &r[i..]));
    let (path, query) = path_query.split_once('?').unwrap_or((path_query, ""));
    let has = |q: &str| query.split('&').any(|kv| kv.split('=').next() == Some(q));
    let object = path.trim_start_matches('/').contains('/');
    let copy = headers.as_object().is_some_and(|h| {
        h.keys()
            .any(|k| k.eq_ignore_ascii_case("x-amz-copy-source"))
    });
    let name = match (method, object) {
        ("PUT", true) if has("uploadId") && copy => "UploadPartCopy",
        ("PUT", true) if has("uploadId") => "UploadPart",
        ("PUT", true) if copy => "CopyObject",
        ("PUT", true) => "PutObject",
        ("POST", true) if has("uploads") => "CreateMultipartUpload",
        ("POST", true) if has("uploadId") => "CompleteMultipartUpload",
        ("DELETE", true) if has("uploadId") => "AbortMultipartUpload",
        ("DELETE", true) => "DeleteObject",
        ("GET", true) if has("uploadId") => "ListParts",
        ("GET", true) => "GetObject",
        ("HEAD", true) => "HeadObject",
        ("GET", false) if has("uploads") => "ListMultipartUploads",
        ("GET", false) if has("versioning") => "GetBucketVersioning",
        ("GET", false) => "ListObjects",
        ("PUT", false) => "CreateBucket",
        ("DELETE", false) => "DeleteBucket",
        ("HEAD", false) => "HeadBucket",
        _ => "Unknown",
    };
    format!("{name} ({method} {path_query})")
}

fn moto_api(moto: &MotoS3, path: &str) -> Vec<u8> {
    let (status, body) = moto.request(
        if path.ends_with("download-recording") {
            "GET"
        } else {
            "POST"
        },
        path,
        b"",
    );
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    body
}

#[test]
fn every_s3_request_of_a_run_is_in_the_documented_permission_table() {
    let Some(moto) = MotoS3::start() else {
        return;
    };
    moto.create_bucket(BUCKET);
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let logs = ray.join(SESSION).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(
        logs.join("raylet.out"),
        format!("[..] (raylet) main.cc:711: Setting node ID node_id={NODE}\n"),
    )
    .unwrap();
    // Larger than one part: a multipart upload, then appends (UploadPartCopy).
    let big = logs.join("worker-big.out");
    std::fs::write(&big, vec![b'x'; 6 << 20]).unwrap();
    std::os::unix::fs::symlink(ray.join(SESSION), ray.join("session_latest")).unwrap();
    moto_api(&moto, "/moto-api/recorder/reset-recording");
    moto_api(&moto, "/moto-api/recorder/start-recording");

    // A dashboard whose job starts after the live poll: the final poll reads the datasets
    // snapshot's key back (GetObject) before storing it.
    let dash = DashboardStandIn::start().unwrap();
    dash.set(JOBS, Answer::json("[]"));
    let address = dash.address();
    let storage = format!("s3://{BUCKET}/root");
    let mut env: Vec<(&str, &str)> = moto.collector_env().to_vec();
    env.push(("RAY_TMP_ROOT", ray.to_str().unwrap()));
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            &storage,
            "--role",
            "head",
            "--upload-part-bytes",
            "5MiB",
            "--log-upload-interval",
            "1s",
            "--rotation-interval",
            "1s",
            "--dashboard-address",
            &address,
        ],
        &env,
    );
    let body = format!(
        r#"[{{"eventId":"AQ==","eventType":"NODE_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:57:00Z","sessionName":"{SESSION}","nodeId":"LRhLjMfmquJWNqG/Eurap0rtLwA3XhECIrFHCA==","nodeLifecycleEvent":{{}}}}]"#
    );
    assert_eq!(c.post(body.as_bytes()).status, 200);
    // Let the big file go up whole, then grow it: the next rounds append.
    let appended = |c: &Collector| c.metric_labeled("rhc_log_uploads_total", "kind=\"append\"");
    let whole_deadline = Instant::now() + Duration::from_secs(30);
    while c.metric("rhc_log_files_uploaded_total") < 2.0 {
        assert!(Instant::now() < whole_deadline, "{}", c.log_tail(30));
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while appended(&c) < 1.0 {
        append_to(&big, b"more\n");
        assert!(Instant::now() < deadline, "no append:\n{}", c.log_tail(30));
        std::thread::sleep(Duration::from_millis(500));
    }
    dash.set(JOBS, good_answers()[JOBS].clone());
    assert!(c.terminate(Duration::from_secs(30)).success());
    moto_api(&moto, "/moto-api/recorder/stop-recording");
    let recording = moto_api(&moto, "/moto-api/recorder/download-recording");

    let documented = documented_s3();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut undocumented = Vec::new();
    for line in String::from_utf8_lossy(&recording).lines() {
        let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let method = r["method"].as_str().unwrap_or("");
        let url = r["url"].as_str().unwrap_or("");
        if url.contains("/moto-api/") {
            continue;
        }
        let request = s3_request(method, url, &r["headers"]);
        let name = request.split(' ').next().unwrap_or("").to_string();
        *seen.entry(name.clone()).or_default() += 1;
        if !documented.contains_key(&name) {
            undocumented.push(request);
        }
    }
    assert!(
        undocumented.is_empty(),
        "S3 requests missing from the permission table of {PERMISSIONS_PAGE}: {undocumented:#?}"
    );
    eprintln!("S3 requests of the run: {seen:?}");
    for needed in [
        "PutObject",
        "UploadPartCopy",
        "CompleteMultipartUpload",
        "GetObject",
    ] {
        assert!(
            seen.contains_key(needed),
            "the run made no {needed}: {seen:?}"
        );
    }

    // Every IAM action of the table is named where users copy their policy from.
    let actions: BTreeSet<String> = documented.values().flatten().cloned().collect();
    let sa = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/common/serviceaccount.yaml"
    ))
    .unwrap();
    let text = doc(CREDENTIALS_PAGE);
    let credentials = text
        .lines()
        .skip_while(|l| !l.starts_with("- **Credentials.**"))
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    for a in &actions {
        assert!(
            sa.contains(a.as_str()),
            "deploy/common/serviceaccount.yaml lacks {a}"
        );
        assert!(
            credentials.contains(a.as_str()),
            "{CREDENTIALS_PAGE}'s Credentials lacks {a}: {credentials}"
        );
    }
}

#[test]
fn the_gcs_role_can_overwrite() {
    let sa = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/common/serviceaccount.yaml"
    ))
    .unwrap();
    // Where the role is given: the ServiceAccount, the Permissions and the Credentials.
    for (what, t) in [
        ("serviceaccount.yaml".to_string(), sa.clone()),
        (PERMISSIONS_PAGE.to_string(), doc(PERMISSIONS_PAGE)),
        (CREDENTIALS_PAGE.to_string(), doc(CREDENTIALS_PAGE)),
    ] {
        assert!(
            t.contains("roles/storage.objectUser"),
            "{what} names objectUser"
        );
    }
    // Nowhere is objectCreator offered instead.
    let mut texts = vec![("serviceaccount.yaml".to_string(), sa)];
    texts.extend(all_docs());
    for (what, t) in &texts {
        for (i, line) in t.lines().enumerate() {
            assert!(
                !line.contains("objectCreator") || line.to_lowercase().contains("not"),
                "{what}:{}: objectCreator offered as the role: {line}",
                i + 1
            );
        }
    }
}
