//! The chart's alert rules (`charts/ray-history-collector/files/alerts.yaml`, the file its
//! PrometheusRule is made of): their promtool unit tests, and the uploads-failing alert in a
//! real Prometheus scraping a real collector whose S3 (moto) goes away and comes back.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rhc_testkit::collector::Collector;
use rhc_testkit::prometheus::Prometheus;
use rhc_testkit::repo_root;
use rhc_testkit::services::{free_port, run_with_timeout, tool, MotoS3};

const CAMEL: &str = include_str!("data/posts-camel.jsonl");
const ALERT: &str = "RayHistoryUploadsFailing";

fn alerts_file() -> PathBuf {
    repo_root().join("charts/ray-history-collector/files/alerts.yaml")
}

#[test]
fn promtool_unit_tests_of_the_alert_rules_pass() {
    let Some(promtool) = tool("RHC_PROMTOOL") else {
        eprintln!("skipping: RHC_PROMTOOL is not set (Debian's prometheus package; run ./scripts/test.sh)");
        return;
    };
    let out = run_with_timeout(
        Command::new(&promtool).current_dir(repo_root()).args([
            "test",
            "rules",
            "tests/alerts/alerts_test.yaml",
        ]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success() && out.stdout.contains("SUCCESS"),
        "promtool test rules failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
}

/// The rule file with `for:` of `alert` set to `for_`; the rest byte for byte as the chart has it.
fn with_for(rules: &str, alert: &str, for_: &str) -> String {
    let start = rules
        .find(&format!("- alert: {alert}\n"))
        .unwrap_or_else(|| panic!("{alert} is not in alerts.yaml"));
    let at = start
        + rules[start..]
            .find("\n        for: ")
            .unwrap_or_else(|| panic!("{alert} has no `for:`"))
        + 1;
    let end = at + rules[at..].find('\n').expect("a line end");
    format!("{}        for: {for_}{}", &rules[..at], &rules[end..])
}

/// Polls `f` every 500 ms until it returns `Some`, or panics after `limit` with `what` and
/// the last observation.
fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Result<Option<T>, String>) -> T {
    let deadline = Instant::now() + limit;
    let mut last = String::new();
    loop {
        match f() {
            Ok(Some(v)) => return v,
            Ok(None) => {}
            Err(e) => last = e,
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?} ({last})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn uploads_failing_fires_in_prometheus_while_s3_is_down_and_resolves_when_it_drains() {
    let Some(mut moto) = MotoS3::start() else {
        return;
    };
    let rules = std::fs::read_to_string(alerts_file()).expect("alerts.yaml");
    let short = with_for(&rules, ALERT, "5s");
    assert_ne!(short, rules, "the `for:` override changed nothing");
    let metrics_port = free_port();
    let Some(prometheus) = Prometheus::start(&[format!("127.0.0.1:{metrics_port}")], &short) else {
        return;
    };
    let bucket = "alerts";
    moto.create_bucket(bucket);
    let dir = tempfile::tempdir().unwrap();
    let storage = format!("s3://{bucket}");
    let listen = format!("127.0.0.1:{metrics_port}");
    let mut env: Vec<(&str, &str)> = moto.collector_env().to_vec();
    env.push(("RAY_CLUSTER_NAME", "alerts"));
    let collector = Collector::start(
        &dir.path().join("spool"),
        &[
            "--storage",
            &storage,
            "--role",
            "worker",
            "--rotation-interval",
            "1s",
            "--metrics-listen",
            &listen,
        ],
        &env,
    );
    wait_for(
        Duration::from_secs(20),
        "Prometheus scrapes the collector",
        || {
            Ok(prometheus
                .target_health()?
                .iter()
                .any(|h| h == "up")
                .then_some(()))
        },
    );
    assert_eq!(
        prometheus.rule_state(ALERT).unwrap().as_deref(),
        Some("inactive")
    );

    // S3 goes away; events arrive and cannot be uploaded.
    moto.stop();
    let outage = Instant::now();
    for body in CAMEL.lines().take(3) {
        let r = collector.post(body.as_bytes());
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let fired = wait_for(Duration::from_secs(40), "the alert fires", || {
        let alerts = prometheus.alerts()?;
        let mine = alerts.iter().find(|a| a.name == ALERT);
        Ok(mine.filter(|a| a.state == "firing").cloned())
    });
    let fired_after = outage.elapsed();
    assert_eq!(fired.labels["severity"], "critical", "{:?}", fired.labels);
    assert!(
        collector.metric("rhc_upload_failures_total") > 0.0,
        "the collector counted no failed upload"
    );
    assert!(
        fired_after >= Duration::from_secs(5),
        "fired {fired_after:?} after the outage began, before its `for:` of 5 s"
    );

    // S3 returns: the spool drains and the alert goes back to inactive.
    moto.restart();
    wait_for(Duration::from_secs(60), "the spool drains", || {
        let files = collector.metric("rhc_spool_segments");
        let ok = collector.metric("rhc_upload_duration_seconds_count");
        Ok((files == 0.0 && ok > 0.0).then_some(()))
    });
    wait_for(
        Duration::from_secs(20),
        "the alert is inactive again",
        || {
            let listed = prometheus.alerts()?.into_iter().any(|a| a.name == ALERT);
            let state = prometheus.rule_state(ALERT)?;
            Ok((!listed && state.as_deref() == Some("inactive")).then_some(()))
        },
    );
    assert!(
        !moto.list_keys(bucket, "").is_empty(),
        "nothing reached the bucket after the outage"
    );
    eprintln!(
        "alert firing {:.1} s after the outage began; inactive again {:.1} s after it",
        fired_after.as_secs_f64(),
        outage.elapsed().as_secs_f64()
    );
}
