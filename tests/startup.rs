//! Configuration is checked before anything starts: a bad flag or variable (dashboard and
//! auth variables included) exits 2 with one line naming it and its value, and nothing was
//! bound, created or spawned.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

/// Runs the collector with `env` set, listening on a port this test holds (so a collector that
/// tried to bind before checking its settings would fail differently, with exit 1), and with a
/// spool dir that must not be created.
fn start_with(env: &[(&str, &str)], extra_args: &[&str]) -> (Output, bool) {
    let held = TcpListener::bind("127.0.0.1:0").expect("bind a port to hold");
    let addr = held.local_addr().expect("local addr");
    let dir = tempfile::tempdir().expect("temp dir");
    let spool = dir.path().join("spool");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.arg("--listen")
        .arg(addr.to_string())
        .arg("--spool-dir")
        .arg(&spool)
        .arg("--storage")
        .arg(dir.path().join("bucket"))
        .arg("--ray-tmp-dir")
        .arg(dir.path().join("ray"))
        .args(extra_args)
        .stdin(Stdio::null());
    for k in [
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
        "RAY_COLLECTOR_ADDITIONAL_ENDPOINTS",
        "RAY_DASHBOARD_ADDRESS",
        "FQ_RAY_IP",
        "POD_IP",
        "STORAGE_BACKEND",
        "STORAGE_BACKEND_CONFIG_PATH",
        "RHC_STORAGE",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the collector");
    drop(held);
    (out, spool.exists())
}

/// Environment, extra flags, and what the one-line message must contain.
type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str);

#[test]
fn bad_dashboard_and_auth_variables_exit_2_before_anything_starts() {
    let cases: &[Case] = &[
        (
            &[("RAY_AUTH_TOKEN", "secret\u{7f}token")],
            &[],
            "RAY_AUTH_TOKEN",
        ),
        (
            &[("RAY_AUTH_TOKEN_PATH", "/nonexistent/ray/token")],
            &[],
            "RAY_AUTH_TOKEN_PATH=/nonexistent/ray/token",
        ),
        (
            &[("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", "/api/ok,api/no-slash")],
            &[],
            "RAY_COLLECTOR_ADDITIONAL_ENDPOINTS entry \"api/no-slash\"",
        ),
        (
            &[("RAY_DASHBOARD_ADDRESS", "http://h:8265/?x=1")],
            &[],
            "http://h:8265/?x=1",
        ),
        (&[("POD_IP", "not-an-ip")], &[], "POD_IP"),
        (
            &[("FQ_RAY_IP", "head-svc"), ("RAY_DASHBOARD_PORT", "port")],
            &[],
            "head-svc:port",
        ),
        (&[], &["--max-spool-bytes", "12x"], "--max-spool-bytes"),
        // A tuning value typed as a flag is refused; the same from KubeRay's variable is not
        // (below).
        (
            &[],
            &["--endpoint-poll-interval", "0s"],
            "--endpoint-poll-interval",
        ),
    ];
    for (env, args, needle) in cases {
        let (out, spool_created) = start_with(env, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{env:?} {args:?}: expected exit 2, got {:?}; stderr: {stderr}",
            out.status
        );
        assert!(
            stderr.contains(needle),
            "{env:?}: the message must name {needle:?}: {stderr}"
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{env:?}: one line: {stderr}"
        );
        assert!(!spool_created, "{env:?}: the spool dir was created");
    }
}

#[test]
fn a_kuberay_storage_config_file_that_cannot_be_honoured_exits_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write the config file");
        p.to_str().expect("utf-8 path").to_string()
    };
    let oss = file(
        "oss.json",
        r#"{"ossBucket":"b","ossRegion":"r","ossEndpoint":"e"}"#,
    );
    let typo = file("typo.json", r#"{"s3Bucket":"b","s3Endpoit":"http://x"}"#);
    let number = file("number.json", r#"{"s3Bucket":7}"#);
    let list = file("list.json", r#"["s3Bucket"]"#);
    let missing = dir.path().join("missing.json");
    let missing = missing.to_str().expect("utf-8 path").to_string();
    let cases: Vec<(String, &str)> = vec![
        (oss, "Aliyun OSS is not supported"),
        (typo, "unknown field \"s3Endpoit\""),
        (number, "\"s3Bucket\" must be a string"),
        (list, "not a JSON object"),
        (missing.clone(), &missing),
    ];
    for (path, needle) in &cases {
        let env = [
            ("STORAGE_BACKEND", "s3"),
            ("STORAGE_BACKEND_CONFIG_PATH", path.as_str()),
        ];
        let (out, spool_created) = start_with(&env, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path}: {stderr}");
        assert!(
            stderr.contains("STORAGE_BACKEND_CONFIG_PATH") && stderr.contains(needle),
            "{path}: the message must name the variable and {needle:?}: {stderr}"
        );
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{path}: one line: {stderr}"
        );
        assert!(!spool_created, "{path}: the spool dir was created");
    }
}

#[test]
fn tuning_variables_with_bad_values_warn_and_use_the_default() {
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = format!("file://{}", dir.path().join("bucket").display());
    let mut c = rhc_testkit::collector::Collector::start(
        &dir.path().join("spool"),
        &["--storage", &storage, "--role", "worker"],
        &[
            ("RAY_COLLECTOR_POLL_INTERVAL", "0"),
            ("RAY_COLLECTOR_EVENT_MAX_DISK_MB", "lots"),
            ("RAY_COLLECTOR_EVENT_ROTATION_INTERVAL", "soon"),
            ("RHC_UPLOAD_CONCURRENCY", "0"),
        ],
    );
    let log = c.log_text();
    for (var, value, default) in [
        ("RAY_COLLECTOR_POLL_INTERVAL", "0", "30s"),
        ("RAY_COLLECTOR_EVENT_MAX_DISK_MB", "lots", "1GiB"),
        ("RAY_COLLECTOR_EVENT_ROTATION_INTERVAL", "soon", "5m"),
        ("RHC_UPLOAD_CONCURRENCY", "0", "2"),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(var) && l.contains("WARN"))
            .unwrap_or_else(|| panic!("no warning naming {var}:\n{log}"));
        assert!(
            line.contains(value) && line.contains(default) && !line.contains("--"),
            "{var}: the warning names the variable, its value and the default: {line}"
        );
    }
    assert!(c.terminate(std::time::Duration::from_secs(30)).success());
}
