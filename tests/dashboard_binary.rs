//! The head's dashboard snapshots through the real binary, against testkit's dashboard
//! stand-in (a real HTTP server on 127.0.0.1) and a `file://` bucket: what the final poll at
//! SIGTERM may store when the dashboard is going down, that the poller runs without the log
//! shipper, and that an answer that completed is not asked again after a hanging poll.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rhc_testkit::collector::Collector;
use rhc_testkit::dashboard::{
    good_answers, Answer, DashboardStandIn, DATASETS, JOBS, META, PLACEMENT_GROUPS, SERVE, TIMEZONE,
};

const SESSION: &str = "session_2026-11-22_02-06-54_202993_1";
const CLUSTER: &str = "dash";
const EXTRA: &str = "/api/train/v2/runs/v1";
const EXTRA_GOOD: &str = r#"{"result": true, "msg": "", "data": {"runs": [{"id": "run-1"}]}}"#;

fn ray_session(tmp: &Path) -> PathBuf {
    let ray = tmp.join("ray");
    std::fs::create_dir_all(ray.join(SESSION).join("logs")).unwrap();
    std::os::unix::fs::symlink(ray.join(SESSION), ray.join("session_latest")).unwrap();
    ray
}

/// The snapshot file of `uri` in the bucket, if stored.
fn snapshot(bucket: &Path, uri: &str) -> Option<Vec<u8>> {
    let name = ray_history_collector::contract::endpoints::endpoint_object_name(uri);
    let path = bucket
        .join("cluster-history/raycluster/default")
        .join(CLUSTER)
        .join(SESSION)
        .join("fetched_endpoints")
        .join(name);
    std::fs::read(path).ok()
}

fn wait(c: &Collector, what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < limit,
            "timed out waiting for {what}:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A head collector polling `dash` once at start (then hourly), storing into `bucket`.
fn head(tmp: &Path, dash: &DashboardStandIn, bucket: &Path, log_collector: bool) -> Collector {
    head_with(tmp, dash, bucket, log_collector, &[])
}

/// [`head`] with more flags.
fn head_with(
    tmp: &Path,
    dash: &DashboardStandIn,
    bucket: &Path,
    log_collector: bool,
    more: &[&str],
) -> Collector {
    let ray = ray_session(tmp);
    std::fs::create_dir_all(bucket).unwrap();
    let address = dash.address();
    let args = [
        "--storage",
        bucket.to_str().unwrap(),
        "--cluster-name",
        CLUSTER,
        "--role",
        "head",
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--dashboard-address",
        &address,
        "--endpoint-poll-interval",
        "1h",
        "--enable-log-collector",
        if log_collector { "true" } else { "false" },
        "--enable-export-events",
        "false",
    ];
    let args: Vec<&str> = args.iter().chain(more).copied().collect();
    Collector::start(
        &tmp.join("spool"),
        &args,
        &[("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", EXTRA)],
    )
}

/// Point 2: a one-shot endpoint is not captured from a failure answer, and the final poll at
/// SIGTERM, facing a dashboard going down, replaces no good snapshot with a worse one.
#[test]
fn a_dashboard_going_down_does_not_spoil_the_snapshots() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let dash = DashboardStandIn::start().unwrap();
    dash.set(EXTRA, Answer::json(EXTRA_GOOD));
    // The session starts while the GCS is not up yet: the one-shot endpoints answer badly.
    dash.set(
        META,
        Answer::json(r#"{"result": false, "msg": "GCS unavailable", "data": {}}"#),
    );
    dash.set(
        TIMEZONE,
        Answer {
            status: 200,
            content_type: "text/html",
            body: b"<html>starting</html>".to_vec(),
        },
    );
    let mut c = head(tmp.path(), &dash, &bucket, true);
    wait(
        &c,
        "the first poll's snapshots",
        Duration::from_secs(20),
        || {
            [SERVE, PLACEMENT_GROUPS, DATASETS, EXTRA]
                .iter()
                .all(|u| snapshot(&bucket, u).is_some())
        },
    );
    assert_eq!(snapshot(&bucket, META), None, "a failure answer was stored");
    assert_eq!(snapshot(&bucket, TIMEZONE), None, "an HTML page was stored");
    assert!(
        c.metric_labeled(
            "rhc_dashboard_answers_refused_total",
            "reason=\"result_false\""
        ) >= 1.0,
        "refusals are counted"
    );

    // The GCS came up; then the cluster is deleted and every periodic answer goes bad.
    let good = good_answers();
    dash.go_down();
    dash.set(META, good[META].clone());
    dash.set(TIMEZONE, good[TIMEZONE].clone());
    dash.set(
        EXTRA,
        Answer {
            status: 200,
            content_type: "text/html",
            body: b"<html><body>502 Bad Gateway</body></html>".to_vec(),
        },
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());

    assert_eq!(dash.count(SERVE), 2, "the final poll asked again");
    assert_eq!(dash.count(META), 2, "the one-shot endpoint was asked again");
    for (uri, want) in [
        (META, good[META].body.clone()),
        (TIMEZONE, good[TIMEZONE].body.clone()),
        (SERVE, good[SERVE].body.clone()),
        (PLACEMENT_GROUPS, good[PLACEMENT_GROUPS].body.clone()),
        (DATASETS, good[DATASETS].body.clone()),
        (EXTRA, EXTRA_GOOD.as_bytes().to_vec()),
    ] {
        assert_eq!(
            snapshot(&bucket, uri).map(|b| String::from_utf8_lossy(&b).into_owned()),
            Some(String::from_utf8_lossy(&want).into_owned()),
            "{uri}"
        );
    }
}

/// Point 3: the head's poller runs with the log shipper switched off.
#[test]
fn the_poller_runs_without_the_log_shipper() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let dash = DashboardStandIn::start().unwrap();
    dash.set(EXTRA, Answer::json(EXTRA_GOOD));
    let mut c = head(tmp.path(), &dash, &bucket, false);
    wait(&c, "the snapshots", Duration::from_secs(20), || {
        [META, TIMEZONE, SERVE, PLACEMENT_GROUPS, DATASETS, EXTRA]
            .iter()
            .all(|u| snapshot(&bucket, u).is_some())
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    assert_eq!(
        snapshot(&bucket, PLACEMENT_GROUPS),
        Some(good_answers()[PLACEMENT_GROUPS].body.clone())
    );
    // No log shipping: nothing under logs/.
    let logs = bucket
        .join("cluster-history/raycluster/default")
        .join(CLUSTER)
        .join(SESSION);
    let under_logs = rhc_testkit::collector::files_under(&logs)
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "logs"))
        .count();
    assert_eq!(under_logs, 0);
}

/// Point 5: one endpoint hangs; the answers that came meanwhile are recorded at once, so the
/// final poll at SIGTERM does not ask the one-shot endpoints again.
#[test]
fn answers_of_a_poll_left_hanging_are_not_asked_again() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let dash = DashboardStandIn::start().unwrap();
    dash.set(EXTRA, Answer::json(EXTRA_GOOD));
    dash.set_slow(PLACEMENT_GROUPS, Duration::from_secs(60));
    let mut c = head(tmp.path(), &dash, &bucket, true);
    wait(&c, "the other snapshots", Duration::from_secs(20), || {
        [META, TIMEZONE, SERVE, EXTRA]
            .iter()
            .all(|u| snapshot(&bucket, u).is_some())
            && dash.count(JOBS) == 1
    });
    // SIGTERM while the placement groups still hang (the request timeout is 10 s); the final
    // poll finds the dashboard quick again.
    dash.set_slow(PLACEMENT_GROUPS, Duration::ZERO);
    let started = Instant::now();
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert_eq!(dash.count(META), 1, "{:?}", dash.requests());
    assert_eq!(dash.count(TIMEZONE), 1, "{:?}", dash.requests());
    assert_eq!(dash.count(PLACEMENT_GROUPS), 2);
    assert_eq!(
        snapshot(&bucket, PLACEMENT_GROUPS),
        Some(good_answers()[PLACEMENT_GROUPS].body.clone())
    );
}

/// One endpoint hangs (`/timezone`, longer than the request timeout): the jobs' datasets are
/// asked as soon as the job list arrives, in the live poll and in the final poll at SIGTERM,
/// whose datasets snapshot is stored within a shutdown deadline shorter than the hang.
#[test]
fn a_hanging_endpoint_does_not_hold_back_the_datasets() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let dash = DashboardStandIn::start().unwrap();
    dash.set(EXTRA, Answer::json(EXTRA_GOOD));
    dash.set_slow(TIMEZONE, Duration::from_secs(60));
    let mut c = head_with(
        tmp.path(),
        &dash,
        &bucket,
        false,
        &["--shutdown-timeout", "8s"],
    );
    wait(&c, "the job list", Duration::from_secs(20), || {
        dash.count(JOBS) == 1
    });
    let listed = Instant::now();
    wait(
        &c,
        "the live poll's datasets snapshot",
        Duration::from_secs(5),
        || snapshot(&bucket, DATASETS).is_some(),
    );
    assert!(listed.elapsed() < Duration::from_secs(5));
    // The job's datasets change; SIGTERM while /timezone still hangs, and it hangs again in
    // the final poll.
    let later =
        r#"{"datasets": [{"dataset": "dataset_1_0", "job_id": "02000000", "state": "FINISHED"}]}"#;
    dash.set(DATASETS, Answer::json(later));
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    assert_eq!(dash.count(DATASETS), 2, "{:?}", dash.requests());
    assert_eq!(
        snapshot(&bucket, DATASETS).map(|b| String::from_utf8_lossy(&b).into_owned()),
        Some(later.to_string())
    );
}
