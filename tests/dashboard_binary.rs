//! The head's dashboard snapshots through the real binary, against testkit's dashboard
//! stand-in (a real HTTP server on 127.0.0.1) and a `file://` bucket: what the final poll at
//! SIGTERM may store when the dashboard is going down (after a restart too), that the poller
//! runs without the log shipper, that an answer that completed is not asked again after a
//! hanging poll, that a dashboard coming up after the collector gets its one-shot
//! snapshots taken within seconds, and (moto behind testkit's fault proxy) that the final poll
//! on S3 without `s3:ListBucket` (a GET of a missing key answers 403) still stores, while a
//! read-back answering 500 keeps what is stored. The spool's record of stored snapshots is
//! written ahead of each upload (a final poll cut at the deadline or a kill -9 leaves it
//! covering the bucket), put back when the store refuses the upload, and belongs to one
//! storage and cluster; the final poll waits for an upload still in flight, so it cannot
//! land after the final answer. An upload of unknown outcome (cut after it left, or answered
//! 504 by a gateway after the store took it) leaves the record uncertain: the final poll
//! reads the bucket instead (review r41g D1, D2).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rhc_testkit::collector::Collector;
use rhc_testkit::dashboard::{
    good_answers, Answer, DashboardStandIn, DATASETS, JOBS, META, PLACEMENT_GROUPS, SERVE, TIMEZONE,
};
use rhc_testkit::fault_proxy::{Fault, FaultProxy, Rule};
use rhc_testkit::services::MotoS3;

const SESSION: &str = "session_2026-11-22_02-06-54_202993_1";
const CLUSTER: &str = "dash";
const EXTRA: &str = "/api/train/v2/runs/v1";
const EXTRA_GOOD: &str = r#"{"result": true, "msg": "", "data": {"runs": [{"id": "run-1"}]}}"#;

fn ray_session(tmp: &Path) -> PathBuf {
    let ray = tmp.join("ray");
    std::fs::create_dir_all(ray.join(SESSION).join("logs")).unwrap();
    let latest = ray.join("session_latest");
    if std::fs::symlink_metadata(&latest).is_err() {
        std::os::unix::fs::symlink(ray.join(SESSION), latest).unwrap();
    }
    ray
}

/// A placement-group answer listing `n` groups.
fn pgs(n: usize) -> String {
    let groups: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"placement_group_id": "{i:02x}", "state": "CREATED"}}"#))
        .collect();
    format!(
        r#"{{"result": true, "msg": "", "data": {{"result": {{"total": {n}, "result": [{}]}}}}}}"#,
        groups.join(", ")
    )
}

fn unavailable() -> Answer {
    Answer {
        status: 503,
        content_type: "text/plain",
        body: b"503: Service Unavailable".to_vec(),
    }
}

/// The key of `uri`'s snapshot under the bucket's root.
fn snapshot_key(uri: &str) -> String {
    let name = ray_history_collector::contract::endpoints::endpoint_object_name(uri);
    format!("cluster-history/raycluster/default/{CLUSTER}/{SESSION}/fetched_endpoints/{name}")
}

/// The snapshot file of `uri` in the bucket, if stored.
fn snapshot(bucket: &Path, uri: &str) -> Option<Vec<u8>> {
    std::fs::read(bucket.join(snapshot_key(uri))).ok()
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
    head_at(tmp, &dash.address(), bucket, log_collector, more)
}

/// [`head_with`] for a dashboard at `address`, which may not be listening yet.
fn head_at(
    tmp: &Path,
    address: &str,
    bucket: &Path,
    log_collector: bool,
    more: &[&str],
) -> Collector {
    std::fs::create_dir_all(bucket).unwrap();
    head_on(
        tmp,
        address,
        bucket.to_str().unwrap(),
        log_collector,
        more,
        &[],
    )
}

/// [`head_at`] storing into `storage` (a path or URL), with more environment.
fn head_on(
    tmp: &Path,
    address: &str,
    storage: &str,
    log_collector: bool,
    more: &[&str],
    env: &[(&str, &str)],
) -> Collector {
    let ray = ray_session(tmp);
    let args = [
        "--storage",
        storage,
        "--cluster-name",
        CLUSTER,
        "--role",
        "head",
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
        "--dashboard-address",
        address,
        "--endpoint-poll-interval",
        "1h",
        "--enable-log-collector",
        if log_collector { "true" } else { "false" },
        "--enable-export-events",
        "false",
    ];
    // `more` may set its own poll interval.
    let own_interval = more.contains(&"--endpoint-poll-interval");
    let args: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| !(own_interval && (*a == "--endpoint-poll-interval" || *a == "1h")))
        .chain(more.iter().copied())
        .collect();
    let env: Vec<(&str, &str)> = [("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", EXTRA)]
        .into_iter()
        .chain(env.iter().copied())
        .collect();
    Collector::start(&tmp.join("spool"), &args, &env)
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
    // Asked again by the quick retries of a failed one-shot endpoint, and by the final poll.
    assert!(
        dash.count(META) >= 2,
        "the one-shot endpoint was asked again"
    );
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

/// Issue 41.3: after a restart the process has stored nothing, yet the final poll's rule
/// ("never a shorter list than the stored snapshot") holds against the bucket. Run 1 stores 3
/// placement groups, 2 Serve applications and an additional endpoint's list of 2, and stops
/// cleanly; run 2 starts while the dashboard answers 503 for them, and at SIGTERM the
/// dashboard lists fewer: every stored snapshot stays, and each refusal is logged. The spool's
/// record of run 1's snapshots is made corrupt in between, so run 2 compares with the bucket.
#[test]
fn after_a_restart_the_final_poll_keeps_the_longer_stored_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let dash = DashboardStandIn::start().unwrap();
    let pgs = r#"{"result": true, "msg": "", "data": {"result": {"total": 3, "result": [{"placement_group_id": "aa", "state": "CREATED"}, {"placement_group_id": "bb", "state": "CREATED"}, {"placement_group_id": "cc", "state": "CREATED"}]}}}"#;
    let serve = r#"{"proxy_location": "EveryNode", "applications": {"app1": {"status": "RUNNING"}, "app2": {"status": "RUNNING"}}}"#;
    let runs = r#"[{"id": "run-1"}, {"id": "run-2"}]"#;
    dash.set(PLACEMENT_GROUPS, Answer::json(pgs));
    dash.set(SERVE, Answer::json(serve));
    dash.set(EXTRA, Answer::json(runs));
    let mut c = head(tmp.path(), &dash, &bucket, false);
    let stored =
        |uri: &str| snapshot(&bucket, uri).map(|b| String::from_utf8_lossy(&b).into_owned());
    wait(&c, "run 1's snapshots", Duration::from_secs(20), || {
        stored(PLACEMENT_GROUPS).as_deref() == Some(pgs)
            && stored(SERVE).as_deref() == Some(serve)
            && stored(EXTRA).as_deref() == Some(runs)
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    let run1_log = c.log_text().len();

    // Run 2: the dashboard answers 503 while it starts.
    let unavailable = Answer {
        status: 503,
        content_type: "text/plain",
        body: b"503: Service Unavailable".to_vec(),
    };
    for uri in [PLACEMENT_GROUPS, SERVE, EXTRA] {
        dash.set(uri, unavailable.clone());
    }
    // The spool's record of run 1's snapshots is corrupt: run 2 starts anyway (a WARN) and
    // the final poll reads the bucket back instead.
    let record = tmp.path().join("spool").join("dashboard-snapshots.json");
    assert!(record.exists(), "run 1 recorded its snapshots");
    std::fs::write(&record, b"{\"session\": [").unwrap();
    let asked = dash.count(PLACEMENT_GROUPS);
    c.restart();
    wait(&c, "run 2's first poll", Duration::from_secs(20), || {
        dash.count(PLACEMENT_GROUPS) > asked && dash.count(EXTRA) > asked
    });
    // Then, just before SIGTERM, it lists less.
    dash.set(
        PLACEMENT_GROUPS,
        Answer::json(
            r#"{"result": true, "msg": "", "data": {"result": {"total": 0, "result": []}}}"#,
        ),
    );
    dash.set(
        SERVE,
        Answer::json(
            r#"{"proxy_location": "EveryNode", "applications": {"app1": {"status": "RUNNING"}}}"#,
        ),
    );
    dash.set(EXTRA, Answer::json("[]"));
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(stored(PLACEMENT_GROUPS).as_deref(), Some(pgs), "{log}");
    assert_eq!(stored(SERVE).as_deref(), Some(serve), "{log}");
    assert_eq!(stored(EXTRA).as_deref(), Some(runs), "{log}");
    let run2 = &log[run1_log..];
    assert!(
        run2.contains("the record of stored dashboard snapshots is ignored"),
        "{run2}"
    );
    for uri in [PLACEMENT_GROUPS, SERVE, EXTRA] {
        assert!(
            run2.lines()
                .any(|l| l.contains("dashboard answer not stored")
                    && l.contains(uri)
                    && l.contains("shorter list than the stored snapshot")),
            "no refusal logged for {uri}:\n{run2}"
        );
    }
}

/// Issue 37: on a fresh pod the collector starts before Ray's dashboard. Nothing listens at
/// the dashboard's address until 3 s after the collector is ready; the one-shot snapshots
/// (cluster metadata, time zone) are stored within seconds of it coming up, though the poll
/// interval is an hour.
#[test]
fn one_shot_snapshots_are_taken_soon_after_a_late_dashboard_comes_up() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let port = rhc_testkit::services::free_port();
    let address = format!("http://127.0.0.1:{port}");
    let mut c = head_at(tmp.path(), &address, &bucket, false, &[]);
    std::thread::sleep(Duration::from_secs(3));
    let dash = DashboardStandIn::start_on(port).unwrap();
    let up = Instant::now();
    // Retried after 1, 2, 4, 8 s: one try that misses the moment it came up (a loaded
    // machine) puts the next 8 s later, still seconds against the hour's interval.
    wait(
        &c,
        "the one-shot snapshots",
        Duration::from_secs(20),
        || snapshot(&bucket, META).is_some() && snapshot(&bucket, TIMEZONE).is_some(),
    );
    eprintln!(
        "one-shot snapshots stored {:?} after the dashboard came up",
        up.elapsed()
    );
    // Only the one-shot endpoints were asked again: the periodic ones wait for their tick.
    assert_eq!(dash.count(PLACEMENT_GROUPS), 0, "{:?}", dash.requests());
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    assert_eq!(
        snapshot(&bucket, META),
        Some(good_answers()[META].body.clone())
    );
}

/// Issue 41 (review): on S3 with the documented permissions (no `s3:ListBucket`) the GET of a
/// snapshot key never written answers 403 AccessDenied, not 404. moto sits behind testkit's
/// fault proxy, which answers every GET under `fetched_endpoints/` with 403. Run 1: a job
/// starts within the last poll interval, so its datasets are first seen by the final poll at
/// SIGTERM, which must store them (before the fix the failed read-back kept them out). Run 2
/// (a restart, same spool): the dashboard answers 503 while it starts and lists fewer
/// placement groups at SIGTERM; the spool's record of what run 1 stored keeps the longer list
/// without a read of the bucket.
#[test]
fn on_s3_without_list_bucket_the_final_poll_stores_what_it_has_not_seen_stored() {
    let Some(s3) = MotoS3::start() else { return };
    let bucket = "dash403";
    s3.create_bucket(bucket);
    let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port)).unwrap();
    proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".to_string()))
            .method("GET")
            .target_contains("fetched_endpoints"),
    );
    let url = proxy.url();
    let env: Vec<(&str, &str)> = s3
        .collector_env()
        .into_iter()
        .map(|(k, v)| (k, if k == "AWS_ENDPOINT" { url.as_str() } else { v }))
        .collect();
    let stored = |uri: &str| {
        s3.get_object(bucket, &snapshot_key(uri))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    // GETs of snapshot keys containing `part` (the proxy sees keys percent-encoded).
    let gets = |part: &str| {
        proxy
            .seen()
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.target.contains("fetched_endpoints")
                    && r.target.contains(part)
            })
            .count()
    };

    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(EXTRA, Answer::json(EXTRA_GOOD));
    dash.set(JOBS, Answer::json("[]"));
    let good = good_answers();
    let storage = format!("s3://{bucket}");
    let mut c = head_on(tmp.path(), &dash.address(), &storage, false, &[], &env);
    wait(
        &c,
        "run 1's live snapshots",
        Duration::from_secs(30),
        || stored(PLACEMENT_GROUPS).is_some() && stored(SERVE).is_some(),
    );
    // A job starts after the live poll.
    dash.set(JOBS, good[JOBS].clone());
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert!(
        gets("datasets__02000000") >= 1,
        "the 403 path was not taken:\n{log}"
    );
    assert_eq!(
        stored(DATASETS).as_deref(),
        Some(String::from_utf8_lossy(&good[DATASETS].body).as_ref()),
        "the final poll dropped the new job's datasets:\n{log}"
    );
    let run1_log = log.len();

    // Run 2: the dashboard answers 503 while it starts, then lists one placement group less.
    let unavailable = Answer {
        status: 503,
        content_type: "text/plain",
        body: b"503: Service Unavailable".to_vec(),
    };
    dash.set(PLACEMENT_GROUPS, unavailable);
    let asked = dash.count(PLACEMENT_GROUPS);
    let pg_gets = gets("placement_groups");
    c.restart();
    wait(&c, "run 2's first poll", Duration::from_secs(30), || {
        dash.count(PLACEMENT_GROUPS) > asked
    });
    let one = r#"{"result": true, "msg": "", "data": {"result": {"total": 1, "result": [{"placement_group_id": "aa", "state": "CREATED"}]}}}"#;
    dash.set(PLACEMENT_GROUPS, Answer::json(one));
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS).as_deref(),
        Some(String::from_utf8_lossy(&good[PLACEMENT_GROUPS].body).as_ref()),
        "{log}"
    );
    assert_eq!(
        gets("placement_groups"),
        pg_gets,
        "the record answered without a read of the bucket"
    );
    assert!(
        log[run1_log..]
            .lines()
            .any(|l| l.contains("dashboard answer not stored")
                && l.contains(PLACEMENT_GROUPS)
                && l.contains("shorter list than the stored snapshot")),
        "no refusal logged:\n{}",
        &log[run1_log..]
    );
}

/// Issue 41.3, review r41b D1: the final poll uploads a longer list (5 placement groups) and
/// is then cut at `--shutdown-timeout` by an endpoint that hangs. Before the fix the spool's
/// record was written when the poll ended, so it kept saying 3; after a restart (same session)
/// whose final poll sees 3, the stored 5 were replaced by 3. The record is now written ahead
/// of each upload.
#[test]
fn a_final_poll_cut_at_the_deadline_leaves_its_uploads_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = head_with(
        tmp.path(),
        &dash,
        &bucket,
        false,
        &["--shutdown-timeout", "5s"],
    );
    let stored =
        |uri: &str| snapshot(&bucket, uri).map(|b| String::from_utf8_lossy(&b).into_owned());
    wait(&c, "run 1's live poll", Duration::from_secs(20), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3)) && dash.count(JOBS) >= 1
    });
    // The cluster grows; Serve hangs past the shutdown deadline in the final poll.
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    dash.set_slow(SERVE, Duration::from_secs(60));
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    assert_eq!(stored(PLACEMENT_GROUPS), Some(pgs(5)), "{}", c.log_text());
    let run1_log = c.log_text().len();

    // Run 2, same session and spool: 503 while it starts, 3 listed at SIGTERM.
    dash.set_slow(SERVE, Duration::ZERO);
    dash.set(PLACEMENT_GROUPS, unavailable());
    let asked = dash.count(PLACEMENT_GROUPS);
    c.restart();
    wait(&c, "run 2's first poll", Duration::from_secs(20), || {
        dash.count(PLACEMENT_GROUPS) > asked
    });
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(5)),
        "a shorter list replaced the stored one:\n{}",
        &log[run1_log..]
    );
}

/// Review r41b D2: kill -9 after a snapshot's upload and before the end of its poll (another
/// endpoint hangs): the record written ahead already covers the upload, so after the restart
/// the final poll keeps the 5 stored placement groups against a list of 3.
#[test]
fn a_kill_after_an_upload_leaves_it_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = head_with(
        tmp.path(),
        &dash,
        &bucket,
        false,
        &["--endpoint-poll-interval", "3s"],
    );
    let stored =
        |uri: &str| snapshot(&bucket, uri).map(|b| String::from_utf8_lossy(&b).into_owned());
    wait(&c, "the first poll", Duration::from_secs(20), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3)) && dash.count(JOBS) >= 1
    });
    // Let the first poll end (its record saved), then the next one hangs on Serve.
    std::thread::sleep(Duration::from_millis(500));
    dash.set_slow(SERVE, Duration::from_secs(60));
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    wait(
        &c,
        "the second poll's upload",
        Duration::from_secs(20),
        || stored(PLACEMENT_GROUPS) == Some(pgs(5)),
    );
    c.kill9();

    dash.set_slow(SERVE, Duration::ZERO);
    dash.set(PLACEMENT_GROUPS, unavailable());
    let asked = dash.count(PLACEMENT_GROUPS);
    c.restart();
    wait(&c, "run 2's first poll", Duration::from_secs(20), || {
        dash.count(PLACEMENT_GROUPS) > asked
    });
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(5)),
        "a shorter list replaced the stored one:\n{log}"
    );
}

/// Review r41b D3: the spool's record belongs to one storage and cluster. Run 1 stores 3
/// placement groups; run 2 (same spool and session) stores into another bucket, and its final
/// poll's 2 placement groups are stored there: nothing was stored in that bucket, so nothing
/// is shorter. Before the fix run 1's record refused them.
#[test]
fn a_record_of_another_storage_does_not_hold_back_a_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let other = tmp.path().join("bucket2");
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = head(tmp.path(), &dash, &bucket, false);
    wait(&c, "run 1's snapshot", Duration::from_secs(20), || {
        snapshot(&bucket, PLACEMENT_GROUPS).is_some() && dash.count(JOBS) >= 1
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());

    dash.set(PLACEMENT_GROUPS, unavailable());
    let asked = dash.count(PLACEMENT_GROUPS);
    let mut c = head(tmp.path(), &dash, &other, false);
    wait(&c, "run 2's first poll", Duration::from_secs(20), || {
        dash.count(PLACEMENT_GROUPS) > asked
    });
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(2)));
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        snapshot(&other, PLACEMENT_GROUPS).map(|b| String::from_utf8_lossy(&b).into_owned()),
        Some(pgs(2)),
        "the other bucket got no snapshot:\n{log}"
    );
    assert_eq!(
        snapshot(&bucket, PLACEMENT_GROUPS).map(|b| String::from_utf8_lossy(&b).into_owned()),
        Some(pgs(3))
    );
}

/// Review r41b D4: no record of what is stored (an upgrade, a damaged record) and S3 answers
/// 500 to the read-back GET (moto behind testkit's fault proxy). A failure other than 403/404
/// says nothing about what is stored: the 3 stored placement groups stay against an empty
/// list, with a WARN, where before the fix the empty list replaced them.
#[test]
fn a_read_back_answering_500_keeps_the_stored_snapshot() {
    let Some(s3) = MotoS3::start() else { return };
    let bucket = "dash500";
    s3.create_bucket(bucket);
    let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port)).unwrap();
    let url = proxy.url();
    let env: Vec<(&str, &str)> = s3
        .collector_env()
        .into_iter()
        .map(|(k, v)| (k, if k == "AWS_ENDPOINT" { url.as_str() } else { v }))
        .collect();
    let stored = |uri: &str| {
        s3.get_object(bucket, &snapshot_key(uri))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let storage = format!("s3://{bucket}");
    let mut c = head_on(tmp.path(), &dash.address(), &storage, false, &[], &env);
    wait(&c, "run 1's snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3)) && dash.count(JOBS) >= 1
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    let run1_log = c.log_text().len();
    // No record: run 2's final poll must read the bucket back.
    std::fs::remove_file(tmp.path().join("spool").join("dashboard-snapshots.json")).unwrap();

    dash.set(PLACEMENT_GROUPS, unavailable());
    let asked = dash.count(PLACEMENT_GROUPS);
    c.restart();
    wait(&c, "run 2's first poll", Duration::from_secs(30), || {
        dash.count(PLACEMENT_GROUPS) > asked
    });
    proxy.add(
        Rule::new(Fault::Status(500, "InternalError".to_string()))
            .method("GET")
            .target_contains("fetched_endpoints"),
    );
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(0)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    proxy.clear();
    let gets = proxy
        .seen()
        .iter()
        .filter(|r| r.method == "GET" && r.target.contains("placement_groups"))
        .count();
    assert!(gets >= 1, "the read-back was not asked:\n{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(3)),
        "a failed read-back let an empty list replace the stored one:\n{}",
        &log[run1_log..]
    );
    assert!(
        log[run1_log..]
            .lines()
            .any(|l| l.contains("could not be read back") && l.contains("WARN")),
        "no WARN:\n{}",
        &log[run1_log..]
    );
}

/// Review r41d D1: a live poll's upload still in flight at SIGTERM (the store takes it and
/// answers late) is abandoned, so this process's "last stored" stays the shorter list; the
/// record, written ahead, says the longer one may be in the bucket. The final poll must hold
/// its answer against the record too: before, 3 was stored, then 5 landed, then the final
/// poll's 4 replaced it.
#[test]
fn an_upload_abandoned_at_sigterm_still_holds_the_final_poll_back() {
    let Some(s3) = MotoS3::start() else { return };
    let bucket = "dashflight";
    s3.create_bucket(bucket);
    let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port)).unwrap();
    let url = proxy.url();
    let env: Vec<(&str, &str)> = s3
        .collector_env()
        .into_iter()
        .map(|(k, v)| (k, if k == "AWS_ENDPOINT" { url.as_str() } else { v }))
        .collect();
    let stored = |uri: &str| {
        s3.get_object(bucket, &snapshot_key(uri))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let storage = format!("s3://{bucket}");
    let mut c = head_on(
        tmp.path(),
        &dash.address(),
        &storage,
        false,
        &["--endpoint-poll-interval", "2s"],
        &env,
    );
    wait(&c, "the first snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3))
    });
    // Every later upload of a snapshot reaches the store 4 s late.
    let delay = Duration::from_secs(4);
    proxy.add(
        Rule::new(Fault::Delay(delay))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    let record = tmp.path().join("spool").join("dashboard-snapshots.json");
    wait(
        &c,
        "the record of 5 groups",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(&record)
                .is_ok_and(|r| r.contains(r#"limit=10000":{"list_len":5"#))
        },
    );
    // The upload of 5 is on its way; the dashboard going down lists 4.
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(4)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    // Whatever the delayed requests do after the exit, let them land.
    std::thread::sleep(delay + Duration::from_secs(1));
    proxy.clear();
    assert_ne!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(4)),
        "the final poll replaced a longer list that may be stored:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("placement_groups") && l.contains("shorter list")),
        "the final answer was not refused:\n{log}"
    );
}

/// moto behind testkit's fault proxy, and the collector's environment pointing at the proxy.
struct S3BehindProxy {
    s3: MotoS3,
    proxy: FaultProxy,
    bucket: &'static str,
    env: Vec<(String, String)>,
}

impl S3BehindProxy {
    /// `None` when moto is not installed.
    fn start(bucket: &'static str) -> Option<S3BehindProxy> {
        let s3 = MotoS3::start()?;
        s3.create_bucket(bucket);
        let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port)).unwrap();
        let url = proxy.url();
        let env = s3
            .collector_env()
            .into_iter()
            .map(|(k, v)| {
                let v = if k == "AWS_ENDPOINT" { url.as_str() } else { v };
                (k.to_string(), v.to_string())
            })
            .collect();
        Some(S3BehindProxy {
            s3,
            proxy,
            bucket,
            env,
        })
    }

    /// A head collector storing into the bucket (see [`head_on`]).
    fn head(&self, tmp: &Path, dash: &DashboardStandIn, more: &[&str]) -> Collector {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let storage = format!("s3://{}", self.bucket);
        head_on(tmp, &dash.address(), &storage, false, more, &env)
    }

    /// The stored snapshot of `uri`.
    fn stored(&self, uri: &str) -> Option<String> {
        self.s3
            .get_object(self.bucket, &snapshot_key(uri))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }
}

/// PUTs of the placement groups' snapshot the proxy has answered with `status`.
fn refused_pg_puts(proxy: &FaultProxy, status: u16) -> usize {
    proxy
        .seen()
        .iter()
        .filter(|r| {
            r.method == "PUT"
                && r.target.contains("placement_groups")
                && r.faulted
                && r.status == status
        })
        .count()
}

/// Review r41e D1: an upload the store refused (S3 answering 403 AccessDenied to the PUT)
/// left the spool's record saying 5 placement groups while the bucket held 3; the final poll
/// then refused a good answer of 4 against it, and the bucket kept 3. Run 1 stores 3 and
/// stops; run 2 (same spool and session) sees 5, whose upload is refused; at SIGTERM the
/// dashboard lists 4. Each upload now settles the record: a refusal puts the entry back to
/// 3, and the 4 are stored.
#[test]
fn an_upload_the_store_refused_does_not_hold_back_the_final_answer() {
    let Some(s3) = S3BehindProxy::start("dashrefused") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = s3.head(tmp.path(), &dash, &[]);
    wait(&c, "run 1's snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3)) && dash.count(JOBS) >= 1
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_text());
    let run1_log = c.log_text().len();

    // Run 2: the cluster grew to 5, and the bucket refuses the upload.
    proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".to_string()))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    c.restart();
    wait(&c, "the refused upload", Duration::from_secs(30), || {
        refused_pg_puts(proxy, 403) >= 1
    });
    // The bucket takes uploads again; the dashboard going down lists 4.
    proxy.clear();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(4)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(4)),
        "a refused upload held back a longer final answer:\n{}",
        &log[run1_log..]
    );
}

/// Review r41e D2: nothing is stored for the placement groups (S3 answers 500 to every PUT
/// of their snapshot, after object_store's retries), yet the refused upload of 2 left the
/// spool's record saying 2, and the final poll refused its answer of 1 against it: the
/// bucket ended with no snapshot at all. A refused upload now leaves no entry behind.
#[test]
fn a_final_answer_is_stored_when_nothing_is_stored_yet() {
    let Some(s3) = S3BehindProxy::start("dashnothing") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    proxy.add(
        Rule::new(Fault::Status(500, "InternalError".to_string()))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(2)));
    let mut c = s3.head(tmp.path(), &dash, &[]);
    // object_store retries a 500 twice: the upload has failed after the third.
    wait(&c, "the refused upload", Duration::from_secs(30), || {
        refused_pg_puts(proxy, 500) >= 3 && stored(SERVE).is_some()
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stored(PLACEMENT_GROUPS), None);
    proxy.clear();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(1)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(1)),
        "the final answer was refused while nothing was stored:\n{log}"
    );
}

/// Review r41e D3: a live poll's upload of 5 placement groups reaches the store late (the
/// proxy holds it 4 s) and is abandoned at SIGTERM; the final poll's better answer of 6 went
/// up at once and the late 5 then replaced it. The final poll now waits for the upload in
/// flight (it runs as a task of its own) before uploading its own answer, which lands last.
#[test]
fn an_upload_landing_late_does_not_replace_the_final_answer() {
    let Some(s3) = S3BehindProxy::start("dashlate") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = s3.head(tmp.path(), &dash, &["--endpoint-poll-interval", "2s"]);
    wait(&c, "the first snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3))
    });
    let delay = Duration::from_secs(4);
    proxy.add(
        Rule::new(Fault::Delay(delay))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    let pg_puts = || {
        proxy
            .arrived()
            .iter()
            .filter(|(m, t)| m == "PUT" && t.contains("placement_groups"))
            .count()
    };
    let before = pg_puts();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    wait(
        &c,
        "the upload of 5 at the store",
        Duration::from_secs(30),
        || pg_puts() > before,
    );
    // Held by the proxy; the final poll's own upload is not delayed, and its answer is
    // better.
    proxy.clear();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(6)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    // Whatever the held request does after the exit, let it land.
    std::thread::sleep(delay + Duration::from_secs(1));
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(6)),
        "an earlier upload landed after the final answer:\n{log}"
    );
}

/// The bound of the final poll's wait for an upload in flight: the live poll's upload of 5
/// placement groups is held 12 s by the proxy, SIGTERM comes with `--shutdown-timeout 8s`
/// (so the wait is a quarter of that, 2 s). The final poll does not wait past it, does not
/// store its answer of 6 (it could land before the 5 and be replaced), says so, and the
/// collector ends within its deadline; the 5 land later.
#[test]
fn the_final_poll_waits_for_an_upload_in_flight_only_so_long() {
    let Some(s3) = S3BehindProxy::start("dashwait") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = s3.head(
        tmp.path(),
        &dash,
        &["--endpoint-poll-interval", "2s", "--shutdown-timeout", "8s"],
    );
    wait(&c, "the first snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3))
    });
    let delay = Duration::from_secs(12);
    proxy.add(
        Rule::new(Fault::Delay(delay))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    let pg_puts = || {
        proxy
            .arrived()
            .iter()
            .filter(|(m, t)| m == "PUT" && t.contains("placement_groups"))
            .count()
    };
    let before = pg_puts();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    wait(
        &c,
        "the upload of 5 at the store",
        Duration::from_secs(30),
        || pg_puts() > before,
    );
    let arrived = Instant::now();
    proxy.clear();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(6)));
    let started = Instant::now();
    let status = c.terminate(Duration::from_secs(60));
    let took = started.elapsed();
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert!(
        took < Duration::from_secs(8),
        "shutdown took {took:?}:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("placement_groups") && l.contains("still in flight")),
        "the final answer's fate is not said:\n{log}"
    );
    // The held upload lands after the exit: the 5, not a 6 it would have replaced.
    std::thread::sleep(
        (arrived + delay + Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    );
    assert_eq!(stored(PLACEMENT_GROUPS), Some(pgs(5)), "{log}");
    assert_eq!(
        proxy
            .seen()
            .iter()
            .filter(|r| r.method == "PUT" && r.target.contains("placement_groups"))
            .count(),
        before + 1,
        "the final poll uploaded its answer anyway:\n{log}"
    );
}

/// PUTs of the placement groups' snapshot the proxy cut (read whole, never passed on, the
/// connection closed without an answer).
fn cut_pg_puts(proxy: &FaultProxy) -> usize {
    proxy
        .seen()
        .iter()
        .filter(|r| {
            r.method == "PUT" && r.target.contains("placement_groups") && r.faulted && r.status == 0
        })
        .count()
}

/// Review r41g D1: the upload of 2 placement groups is cut after the request left (the proxy
/// reads it, never passes it on, closes the connection: every attempt), so nothing is stored
/// for them; the spool's record kept claiming 2 and the final poll refused its answer of 1
/// against it, leaving no snapshot at all. An entry left by an upload of unknown outcome is
/// now uncertain, and the final poll reads the bucket for it: nothing there, the 1 is stored.
#[test]
fn an_upload_cut_without_an_answer_does_not_hold_back_the_final_answer() {
    let Some(s3) = S3BehindProxy::start("dashcut") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    proxy.add(
        Rule::new(Fault::Drop)
            .method("PUT")
            .target_contains("placement_groups"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(2)));
    let mut c = s3.head(tmp.path(), &dash, &[]);
    // object_store retries a cut request: the upload has failed after the third attempt.
    wait(&c, "the cut upload", Duration::from_secs(60), || {
        cut_pg_puts(proxy) >= 3 && stored(SERVE).is_some()
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stored(PLACEMENT_GROUPS), None);
    // The store is fine again; the dashboard going down lists 1.
    proxy.clear();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(1)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(1)),
        "an upload that stored nothing held back the final answer:\n{log}"
    );
    assert!(
        !log.contains("kept=true"),
        "a refusal claimed a stored snapshot:\n{log}"
    );
}

/// Review r41g D2: a gateway in front of the store answers 504 after the store took the PUT
/// of 5 placement groups (the bucket holds 5); the poller counted it as refused, put its
/// record back to the 3 stored before, and the final poll replaced the 5 with its answer of
/// 4. A 5xx proves no refusal: the upload counts as of unknown outcome, the final poll reads
/// the bucket back, finds 5 and keeps them.
#[test]
fn a_gateway_504_after_the_store_took_the_upload_keeps_the_longer_list() {
    let Some(s3) = S3BehindProxy::start("dashgateway") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = s3.head(tmp.path(), &dash, &["--endpoint-poll-interval", "2s"]);
    wait(&c, "the first snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3))
    });
    // Kept to the end: every PUT of the placement groups reaches the store, then 504.
    proxy.add(
        Rule::new(Fault::PassThenStatus(504, "GatewayTimeout".to_string()))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    wait(
        &c,
        "5 stored, answered 504",
        Duration::from_secs(60),
        || stored(PLACEMENT_GROUPS) == Some(pgs(5)) && refused_pg_puts(proxy, 504) >= 3,
    );
    // Let the failed upload settle (object_store's last retry answered).
    std::thread::sleep(Duration::from_millis(1500));
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(4)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(5)),
        "the final poll replaced a longer stored list after a gateway's 504:\n{log}"
    );
}

/// Review r41i D3: the PUT of 5 placement groups reaches the store, a gateway answers 502,
/// and object_store's retry is refused (403): only the last attempt's error is seen, and it
/// counted as a refusal, putting the record back to the 3 stored before as certain; the
/// final poll then replaced the stored 5 with its answer of 4. An upload that was retried
/// may have landed on an earlier attempt: its entry stays uncertain, the final poll reads
/// the bucket, finds 5 and keeps them.
#[test]
fn a_5xx_then_a_refused_retry_keeps_the_longer_list() {
    let Some(s3) = S3BehindProxy::start("dashretried") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let mut c = s3.head(tmp.path(), &dash, &["--endpoint-poll-interval", "2s"]);
    wait(&c, "the first snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(3))
    });
    // The first PUT reaches the store and is answered 502; every later one is refused.
    proxy.add(
        Rule::new(Fault::PassThenStatus(502, "BadGateway".to_string()))
            .method("PUT")
            .target_contains("placement_groups")
            .times(1),
    );
    proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".to_string()))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    wait(
        &c,
        "5 stored, answered 502, retry refused",
        Duration::from_secs(60),
        || {
            stored(PLACEMENT_GROUPS) == Some(pgs(5))
                && refused_pg_puts(proxy, 502) >= 1
                && refused_pg_puts(proxy, 403) >= 1
        },
    );
    // No more uploads of them until the final poll, whose upload the store takes.
    dash.set(PLACEMENT_GROUPS, unavailable());
    std::thread::sleep(Duration::from_millis(2500));
    proxy.clear();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(4)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(5)),
        "the final poll replaced a longer stored list after a 502 and a refused retry:\n{log}"
    );
}

/// Review r41i D4: a kill -9 while the upload of a shorter list (2 placement groups over
/// the stored 5) is in flight, after the store took it: the record was written ahead only
/// for an entry that grows, so it kept 5 as certain, and after the restart the final poll
/// refused an answer of 3 against it (the bucket holds 2). A shrinking upload writes an
/// uncertain entry ahead too: the final poll reads the bucket, finds 2 and stores the 3.
#[test]
fn a_kill_during_a_shrinking_upload_does_not_hold_back_a_longer_final_answer() {
    let Some(s3) = S3BehindProxy::start("dashshrink") else {
        return;
    };
    let (stored, proxy) = (|uri: &str| s3.stored(uri), &s3.proxy);
    let tmp = tempfile::tempdir().unwrap();
    let dash = DashboardStandIn::start().unwrap();
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(5)));
    let mut c = s3.head(tmp.path(), &dash, &["--endpoint-poll-interval", "2s"]);
    wait(&c, "the first snapshot", Duration::from_secs(30), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(5))
    });
    std::thread::sleep(Duration::from_millis(500));
    proxy.add(
        Rule::new(Fault::HoldAnswer(Duration::from_secs(120)))
            .method("PUT")
            .target_contains("placement_groups"),
    );
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(2)));
    wait(&c, "2 stored, answer held", Duration::from_secs(60), || {
        stored(PLACEMENT_GROUPS) == Some(pgs(2))
    });
    c.kill9();
    proxy.clear();
    dash.set(PLACEMENT_GROUPS, unavailable());
    let asked = dash.count(PLACEMENT_GROUPS);
    c.restart();
    wait(&c, "run 2's first poll", Duration::from_secs(30), || {
        dash.count(PLACEMENT_GROUPS) > asked
    });
    dash.set(PLACEMENT_GROUPS, Answer::json(&pgs(3)));
    let status = c.terminate(Duration::from_secs(60));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    assert_eq!(
        stored(PLACEMENT_GROUPS),
        Some(pgs(3)),
        "the final poll refused a longer answer against a record longer than the bucket:\n{log}"
    );
}
