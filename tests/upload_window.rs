//! Issue 23 through the real binary: when the node vanishes (SIGKILL, and the spool deleted
//! with the pod's emptyDir), every event acknowledged more than `--upload-window` before is
//! in the bucket, in one object per partition that grew in place; every version a reader
//! sees is whole gzip members of whole lines, a prefix of the next; a kill -9 and restart
//! with the spool kept loses and duplicates nothing; a failed growth leaves the previous
//! version whole; a partition with nothing new costs no request; 5,000 open partitions
//! drain at SIGTERM. On Azure (Azurite behind the recording proxy) objects grow by block
//! lists, sending only the new bytes, through kills, late commits, blobs replaced behind
//! our back, the block limit, blocks another writer left uncommitted, a block list listed
//! out of order and one refused for lack of read permission. On GCS (gcsemulator for the
//! JSON API behind the recording proxy, moto for the XML API) objects grow by compose,
//! sending only the new bytes, through kills, parts a killed run left, objects replaced
//! behind our back (also between our look and our compose), the component limit; without a
//! JSON API (moto alone) every version goes whole, said once.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt as _};

use rhc_testkit::collector::{read_all, Collector};
use rhc_testkit::fault_proxy::{Fault, Rule};
use rhc_testkit::fault_shim::Faults;
use rhc_testkit::moto_rig::MotoRig;
use rhc_testkit::ray_logs::local_bucket;

const SESSION: &str = "session_2026-11-22_02-06-54_202993_22498";
const NODE_B64: &str = "OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==";

/// A job id (4 bytes, base64) for job `j`.
fn job_b64(j: u32) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(j.to_be_bytes())
}

fn event(id: &str, job: u32) -> String {
    format!(
        r#"{{"eventId":"{id}","sourceType":"CORE_WORKER","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:40.945470430Z","severity":"INFO","sessionName":"{SESSION}","nodeId":"{NODE_B64}","taskLifecycleEvent":{{"taskId":"{id}","jobId":"{}","stateTransitions":[{{"state":"RUNNING","timestamp":"2026-11-22T02:06:40.945470430Z"}}]}},"message":""}}"#,
        job_b64(job)
    )
}

/// Posts `ids` spread over `jobs` jobs; panics unless every one is accepted.
fn post(c: &Collector, ids: &[String], jobs: u32) {
    let body = format!(
        "[{}]",
        ids.iter()
            .enumerate()
            .map(|(i, id)| event(id, i as u32 % jobs))
            .collect::<Vec<_>>()
            .join(",")
    );
    let r = c.post(body.as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// Decodes one version of an event object: whole gzip members (a truncated one fails) of
/// whole lines; its event ids in order.
fn version_ids(key: &str, bytes: &[u8]) -> Vec<String> {
    let mut text = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut text)
        .unwrap_or_else(|e| panic!("{key}: a version that is not whole gzip members: {e}"));
    assert!(
        text.is_empty() || text.ends_with(b"\n"),
        "{key}: a version that ends inside a line"
    );
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l)
                .unwrap_or_else(|e| panic!("{key}: a line that is not JSON: {e}"));
            v["eventId"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Event objects (key → bytes) of the session.
fn event_objects(all: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<u8>> {
    all.into_iter()
        // Not the collector's temporary files beside the objects (`.<name>.<node>.rhc-tmp`,
        // renamed into place): a listing can meet one between its write and its rename.
        .filter(|(k, _)| k.contains(&format!("/{SESSION}/")) && k.contains("_events/"))
        .filter(|(k, _)| !k.ends_with(ray_history_collector::storage::append::LOCAL_TEMP_SUFFIX))
        // Nor GCS's part objects (`.<name>.<node>.rhc-part`, composed onto the object).
        .filter(|(k, _)| !k.ends_with(ray_history_collector::storage::append::GCS_PART_SUFFIX))
        .collect()
}

/// Every version seen of every object, checked as it is read: each decodes whole and the
/// previous version's lines are a prefix of it.
#[derive(Default)]
struct Versions {
    last: Mutex<HashMap<String, Vec<String>>>,
    seen: Mutex<usize>,
}

impl Versions {
    fn check(&self, objects: BTreeMap<String, Vec<u8>>) {
        let mut last = self.last.lock().unwrap();
        for (k, v) in objects {
            let ids = version_ids(&k, &v);
            if let Some(prev) = last.get(&k) {
                assert!(
                    ids.len() >= prev.len() && ids[..prev.len()] == prev[..],
                    "{k}: a version ({} lines) whose lines do not start with the previous one's ({} lines)",
                    ids.len(),
                    prev.len()
                );
                if ids.len() > prev.len() {
                    *self.seen.lock().unwrap() += 1;
                }
            }
            last.insert(k, ids);
        }
    }
}

/// Reads the bucket every 100 ms on a thread, checking every version, until dropped.
struct Poller {
    stop: Arc<AtomicBool>,
    versions: Arc<Versions>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn start(read: impl Fn() -> BTreeMap<String, Vec<u8>> + Send + 'static) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let versions = Arc::new(Versions::default());
        let (s, v) = (stop.clone(), versions.clone());
        let thread = std::thread::spawn(move || {
            // Bounded: a test never runs longer than this.
            let end = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::SeqCst) && Instant::now() < end {
                v.check(event_objects(read()));
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Poller {
            stop,
            versions,
            thread: Some(thread),
        }
    }

    /// Stops and returns how many times a version grew while watched.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("the version checker failed");
        }
        let n = *self.versions.seen.lock().unwrap();
        n
    }
}

/// Posts batches of `per_batch` events every 100 ms for `run`, over `jobs` jobs; returns
/// each batch's ids with the time its 200 came back.
fn post_steadily(
    c: &Collector,
    tag: &str,
    run: Duration,
    per_batch: usize,
    jobs: u32,
) -> Vec<(Instant, Vec<String>)> {
    let mut acked = Vec::new();
    let start = Instant::now();
    let mut n = 0usize;
    while start.elapsed() < run {
        let ids: Vec<String> = (n..n + per_batch).map(|i| format!("{tag}-{i}")).collect();
        n += per_batch;
        post(c, &ids, jobs);
        acked.push((Instant::now(), ids));
        std::thread::sleep(Duration::from_millis(100));
    }
    acked
}

/// The node vanishes: SIGKILL, and the spool is deleted. Then every event acknowledged more
/// than `window` before must be in `objects` once, in one object per job.
fn assert_node_loss_bounded(
    c: &mut Collector,
    acked: &[(Instant, Vec<String>)],
    window: Duration,
    read: impl Fn() -> BTreeMap<String, Vec<u8>>,
    jobs: usize,
) {
    let vanished = Instant::now();
    c.vanish().unwrap();
    let objects = event_objects(read());
    let mut count: HashMap<String, u32> = HashMap::new();
    for (k, v) in &objects {
        for id in version_ids(k, v) {
            *count.entry(id).or_default() += 1;
        }
    }
    assert_eq!(
        objects.len(),
        jobs,
        "one object per partition: {:?}",
        objects.keys()
    );
    let mut due = 0;
    for (t, ids) in acked {
        if vanished.duration_since(*t) <= window {
            continue;
        }
        for id in ids {
            due += 1;
            assert_eq!(
                count.get(id),
                Some(&1),
                "{id}, acknowledged {:?} before the node vanished, is not in the bucket once",
                vanished.duration_since(*t)
            );
        }
    }
    assert!(due > 0, "no event was old enough to check");
    assert!(count.values().all(|&n| n == 1), "a duplicate line");
}

fn file_collector(tmp: &Path, extra: &[&str]) -> (Collector, std::path::PathBuf) {
    let bucket = tmp.join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let ray = tmp.join("ray");
    let mut args = vec![
        "--storage",
        bucket.to_str().unwrap(),
        "--ray-tmp-dir",
        ray.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (Collector::start(&tmp.join("spool"), &args, &[]), bucket)
}

/// file://, a 2 s window, 300 events/s over three jobs for 6 s, then the node vanishes.
#[test]
fn node_loss_on_file_bucket_loses_nothing_older_than_the_window() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = file_collector(tmp.path(), &["--upload-window", "2s"]);
    let store = local_bucket(&bucket);
    let s2 = store.clone();
    let poller = Poller::start(move || read_all(&s2));
    let acked = post_steadily(&c, "f", Duration::from_secs(6), 30, 3);
    let grew = poller.finish();
    assert!(
        grew >= 3,
        "the objects grew only {grew} times while watched"
    );
    assert_node_loss_bounded(
        &mut c,
        &acked,
        Duration::from_secs(2),
        || read_all(&store),
        3,
    );
}

/// file://, the default window (10 s): 13 s at 100 events/s, then the node vanishes.
#[test]
fn node_loss_at_the_default_window() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = file_collector(tmp.path(), &[]);
    let store = local_bucket(&bucket);
    let acked = post_steadily(&c, "d", Duration::from_secs(13), 10, 2);
    assert_node_loss_bounded(
        &mut c,
        &acked,
        Duration::from_secs(10),
        || read_all(&store),
        2,
    );
}

/// kill -9 and restart with the spool kept: nothing lost, nothing twice, the objects valid;
/// also when the object was left longer than the record says (an upload the crash cut).
#[test]
fn kill_and_restart_with_the_spool_kept_is_exact() {
    for tampered in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let (mut c, bucket) = file_collector(tmp.path(), &["--upload-window", "1s"]);
        let store = local_bucket(&bucket);
        let a: Vec<String> = (0..200).map(|i| format!("a-{i}")).collect();
        post(&c, &a, 2);
        // Published (rounds every 0.5 s), then more that may not be.
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(event_objects(read_all(&store)).len(), 2);
        let b: Vec<String> = (0..200).map(|i| format!("b-{i}")).collect();
        post(&c, &b, 2);
        c.kill9();
        if tampered {
            // An append the crash interrupted after it reached the bucket: a valid member
            // the record does not know of.
            for (k, _) in event_objects(read_all(&store)) {
                let path = bucket.join(&k);
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), Default::default());
                std::io::Write::write_all(&mut gz, format!("{}\n", event("ghost", 0)).as_bytes())
                    .unwrap();
                rhc_testkit::collector::append_to(&path, &gz.finish().unwrap());
            }
        }
        c.restart();
        let status = c.terminate(Duration::from_secs(30));
        assert!(status.success(), "{}", c.log_tail(40));
        let objects = event_objects(read_all(&store));
        assert_eq!(objects.len(), 2, "{:?}", objects.keys());
        let mut count: HashMap<String, u32> = HashMap::new();
        for (k, v) in &objects {
            for id in version_ids(k, v) {
                *count.entry(id).or_default() += 1;
            }
        }
        for id in a.iter().chain(&b) {
            assert_eq!(count.get(id), Some(&1), "{id} (tampered: {tampered})");
        }
        assert_eq!(count.len(), 400, "lines that were never acknowledged");
        let left: Vec<_> = rhc_testkit::collector::files_under(&c.spool)
            .into_iter()
            .filter(|p| !p.ends_with("LOCK") && !p.starts_with(c.spool.join("dedup")))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

const BUCKET: &str = "window";

/// moto behind the recording proxy, the bucket [`BUCKET`], no Ray session: each collector
/// gets `--storage`, `--ray-tmp-dir` and the test's flags only.
/// The refusal span these tests wait out (`RHC_TEST_CONDITION_REFUSAL_SPAN_SECS`), where what
/// they check is what happens once refusals of a condition have lasted, not how long that
/// takes (30 s in a real run: `storage::conditions::REFUSAL_SPAN`).
const SHORT_SPAN: (&str, &str) = ("RHC_TEST_CONDITION_REFUSAL_SPAN_SECS", "6");

fn s3_rig() -> Option<MotoRig> {
    MotoRig::without_session(BUCKET, "window")
}

/// moto: node loss with a 2 s window; and once nothing is new, no request at all.
#[test]
fn node_loss_on_moto_and_no_request_when_nothing_is_new() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig.collector().only(&["--upload-window", "2s"]).start();
    // Exported from the start, before any publication (review r35k D2).
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    let acked = post_steadily(&c, "m", Duration::from_secs(5), 20, 2);
    // Everything published, then three rounds with nothing new.
    std::thread::sleep(Duration::from_secs(3));
    let before = rig.proxy.seen().len();
    std::thread::sleep(Duration::from_secs(3));
    let after = rig.proxy.seen();
    assert_eq!(
        after.len(),
        before,
        "requests with nothing new: {:?}",
        &after[before..]
    );
    assert_node_loss_bounded(&mut c, &acked, Duration::from_secs(2), || rig.objects(), 2);
}

/// Every event id in the session's objects on moto, with how many times it is there.
fn id_counts(rig: &MotoRig) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (k, v) in event_objects(rig.objects()) {
        for id in version_ids(&k, &v) {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

/// Review r35j, D1: posts A (100 events, one partition) and waits until its object holds
/// them; then every growth PUT of an event object (`times` of them, or all until the rules
/// are cleared) is passed on `delay` late; posts B and waits until its PUT is at the proxy.
/// The ids posted.
fn grow_then_delay_the_next_put(
    rig: &MotoRig,
    c: &Collector,
    delay: Duration,
    times: Option<usize>,
) -> Vec<String> {
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(c, &a, 1);
    wait_for(c, Duration::from_secs(30), "A in the bucket", || {
        id_counts(rig).len() == 100
    });
    let mut rule = Rule::new(Fault::Delay(delay))
        .method("PUT")
        .target_contains(".jsonl");
    if let Some(n) = times {
        rule = rule.times(n);
    }
    let before = rig.proxy.arrived().len();
    rig.proxy.add(rule);
    let b: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    post(c, &b, 1);
    wait_for(
        c,
        Duration::from_secs(30),
        "the growth PUT of B at the proxy",
        || {
            rig.proxy.arrived()[before..]
                .iter()
                .any(|(m, t)| m == "PUT" && t.contains(".jsonl"))
        },
    );
    a.into_iter().chain(b).collect()
}

/// Waits until every request that reached the proxy was passed on and answered: the late
/// PUT landed (or was refused).
fn wait_until_the_late_put_landed(rig: &MotoRig, c: &Collector) {
    wait_for(c, Duration::from_secs(60), "the late PUT passed on", || {
        rig.proxy.seen().len() >= rig.proxy.arrived().len()
    });
}

/// Each of `ids` exactly once in the session's objects on moto, and nothing else.
fn assert_each_once(rig: &MotoRig, ids: &[String], when: &str) {
    let counts = id_counts(rig);
    let missing: Vec<&String> = ids.iter().filter(|i| !counts.contains_key(*i)).collect();
    let twice: Vec<&String> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, _)| i)
        .collect();
    assert!(
        missing.is_empty() && twice.is_empty() && counts.len() == ids.len(),
        "{when}: {} of {} acknowledged events missing (first: {:?}), {} twice",
        missing.len(),
        ids.len(),
        missing.iter().take(3).collect::<Vec<_>>(),
        twice.len()
    );
}

/// Review r35j, D1 (issue 35): a growth PUT (A+B) delivered 4 s late, after a kill -9 and a
/// restart whose seal wrote the newer version (A+B+C), is refused by the store (412: it is
/// conditional on the version it grew from) instead of replacing it: every acknowledged
/// event stays in the bucket, once, and the late PUT was answered 412. (main at 27030f5:
/// the late PUT replaced A+B+C, 100 of 300 acknowledged events lost, exit 0.)
#[test]
fn a_growth_put_delivered_late_after_a_restart_replaces_nothing() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let args = ["--upload-window", "1s"];
    let mut c = rig.collector().only(&args).start();
    let mut acked = grow_then_delay_the_next_put(&rig, &c, Duration::from_secs(4), None);
    let later: Vec<String> = (0..100).map(|i| format!("c-{i}")).collect();
    post(&c, &later, 1);
    acked.extend(later);
    c.kill9();
    rig.proxy.clear();
    let mut c = rig.collector().only(&args).start();
    wait_for(
        &c,
        Duration::from_secs(30),
        "A+B+C after the restart",
        || id_counts(&rig).len() == 300,
    );
    wait_until_the_late_put_landed(&rig, &c);
    assert_each_once(&rig, &acked, "after the late PUT landed");
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert_each_once(&rig, &acked, "after SIGTERM");
    assert!(
        rig.proxy
            .seen()
            .iter()
            .any(|r| r.method == "PUT" && r.status == 412 && r.header("if-match").is_some()),
        "no conditional PUT was refused: the late one did not meet its condition"
    );
}

/// Review r35j, D1 within one run: a growth PUT whose client gave up (request timeout, 3 s
/// here through the test-only RHC_TEST_REQUEST_TIMEOUT_SECS) reaches the store 6 s late,
/// after the retry and the next growth landed: refused (412), nothing lost. (main at
/// 27030f5: it replaced A+B+C with A+B, and with nothing new the seal sent nothing: 100 of
/// 300 lost, exit 0.)
#[test]
fn a_growth_put_that_timed_out_and_lands_late_replaces_nothing() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s"])
        .env(&[("RHC_TEST_REQUEST_TIMEOUT_SECS", "3")])
        .start();
    let mut acked = grow_then_delay_the_next_put(&rig, &c, Duration::from_secs(6), Some(1));
    wait_for(&c, Duration::from_secs(30), "A+B (its retry)", || {
        id_counts(&rig).len() == 200
    });
    let later: Vec<String> = (0..100).map(|i| format!("c-{i}")).collect();
    post(&c, &later, 1);
    acked.extend(later);
    wait_for(&c, Duration::from_secs(30), "A+B+C", || {
        id_counts(&rig).len() == 300
    });
    wait_until_the_late_put_landed(&rig, &c);
    assert_each_once(&rig, &acked, "after the late PUT landed");
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert_each_once(&rig, &acked, "after SIGTERM");
}

/// A store that answers conditional writes with 501 NotImplemented (some S3-compatible
/// stores; here the proxy, for every request carrying `If-Match` or `If-None-Match`): the
/// growth goes on unconditionally, as before conditions existed, with one warning and
/// `rhc_event_conditional_writes` at 0; every acknowledged event is in the bucket, once.
#[test]
fn a_store_refusing_conditional_writes_gets_them_unconditionally() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    for header in ["if-match", "if-none-match"] {
        rig.proxy.add(
            Rule::new(Fault::Status(501, "NotImplemented".into()))
                .method("PUT")
                .with_header(header),
        );
    }
    let mut c = rig.collector().only(&["--upload-window", "1s"]).start();
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    wait_for(&c, Duration::from_secs(30), "A in the bucket", || {
        id_counts(&rig).len() == 100
    });
    let b: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    post(&c, &b, 1);
    wait_for(&c, Duration::from_secs(30), "A+B in the bucket", || {
        id_counts(&rig).len() == 200
    });
    // One write met the refusal (object_store tries a 5xx again a few times), the rest went
    // without a condition.
    let refused = rig.proxy.seen().iter().filter(|r| r.status == 501).count();
    assert!(
        (1..=4).contains(&refused),
        "{refused} conditional writes refused: the condition was not tried, or not dropped"
    );
    assert_eq!(c.metric("rhc_event_conditional_writes"), 0.0);
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    let warnings = c
        .log_text()
        .matches("does not take conditional writes")
        .count();
    assert_eq!(warnings, 1, "{}", c.log_tail(30));
    let acked: Vec<String> = a.into_iter().chain(b).collect();
    assert_each_once(&rig, &acked, "after SIGTERM");
}

/// Review r35k D2: a store or gateway that answers every write carrying `If-Match` or
/// `If-None-Match` (PUT, and a completion) with `status` / `code` instead of 501: the
/// refused write is sent once more without its condition, lands, and from then on writes go
/// unconditionally: every acknowledged event is in the bucket, once, with one warning
/// naming the answer and `rhc_event_conditional_writes` 1 at start and 0 after. (main at
/// 6db458e: the growth failed and was retried forever, no event reached the bucket.)
fn conditions_answered_with(status: u16, code: &str) {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    for method in ["PUT", "POST"] {
        for header in ["if-match", "if-none-match"] {
            rig.proxy.add(
                Rule::new(Fault::Status(status, code.into()))
                    .method(method)
                    .with_header(header),
            );
        }
    }
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s"])
        .env(&[SHORT_SPAN])
        .start();
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    let a: Vec<String> = (0..10).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    let mut acked = a.clone();
    let b: Vec<String> = (0..10).map(|i| format!("b-{i}")).collect();
    post(&c, &b, 1);
    acked.extend(b);
    // Refused with the condition for the span (`REFUSAL_SPAN`, shortened here: one 400 / 403,
    // or a burst, may be the requests' own, reviews r35p D1 and r35q Q1), the write is then
    // sent once without it, lands, and conditions are turned off.
    wait_for(&c, Duration::from_secs(90), "A+B in the bucket", || {
        id_counts(&rig).len() == 20
    });
    let seen = rig.proxy.seen();
    let refused = seen.iter().filter(|r| r.status == status).count();
    assert!(refused >= 3, "{refused} writes answered {status}");
    // Every write that carried a condition was refused: none carried one after the switch,
    // and none went without its condition before the refusals had lasted.
    let conditional = seen
        .iter()
        .filter(|r| r.header("if-match").is_some() || r.header("if-none-match").is_some())
        .count();
    assert_eq!(
        conditional, refused,
        "conditional writes after the fallback"
    );
    let c_ids: Vec<String> = (0..10).map(|i| format!("c-{i}")).collect();
    post(&c, &c_ids, 1);
    acked.extend(c_ids);
    wait_for(&c, Duration::from_secs(30), "A+B+C in the bucket", || {
        id_counts(&rig).len() == 30
    });
    assert_eq!(
        rig.proxy
            .seen()
            .iter()
            .filter(|r| r.status == status)
            .count(),
        refused,
        "a write after the switch was refused"
    );
    assert_eq!(c.metric("rhc_event_conditional_writes"), 0.0);
    let status_now = c.terminate(Duration::from_secs(60));
    assert!(
        status_now.success(),
        "exit {status_now:?}: {}",
        c.log_tail(30)
    );
    let log = c.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("does not take conditional writes"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", c.log_tail(30));
    assert!(
        warnings[0].contains(&status.to_string()) && warnings[0].contains(code),
        "the warning does not name {status} {code}: {}",
        warnings[0]
    );
    assert_each_once(&rig, &acked, "after SIGTERM");
}

#[test]
fn a_store_answering_conditions_with_400_gets_writes_unconditionally() {
    conditions_answered_with(400, "InvalidArgument");
}

#[test]
fn a_store_answering_conditions_with_403_gets_writes_unconditionally() {
    conditions_answered_with(403, "AccessDenied");
}

/// Review r35p D1: ONE passing 403 to a conditional PUT, against a store that takes
/// conditions (moto checks them), turned conditions off for the run, and a growth PUT that
/// timed out and was delivered late then replaced a newer version: 100 of 300 acknowledged
/// events lost. Its twin without the condition lands, conditions stay on, the late PUT gets
/// 412.
#[test]
fn one_passing_403_to_a_conditional_write_keeps_conditions_on() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("PUT")
            .with_header("if-none-match")
            .times(1),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s"])
        .env(&[("RHC_TEST_REQUEST_TIMEOUT_SECS", "3")])
        .start();
    let mut acked = grow_then_delay_the_next_put(&rig, &c, Duration::from_secs(6), Some(1));
    assert_eq!(
        rig.proxy.seen().iter().filter(|r| r.status == 403).count(),
        1,
        "the refusal was not met"
    );
    wait_for(&c, Duration::from_secs(30), "A+B (its retry)", || {
        id_counts(&rig).len() == 200
    });
    let later: Vec<String> = (0..100).map(|i| format!("c-{i}")).collect();
    post(&c, &later, 1);
    acked.extend(later);
    wait_for(&c, Duration::from_secs(30), "A+B+C", || {
        id_counts(&rig).len() == 300
    });
    wait_until_the_late_put_landed(&rig, &c);
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert!(
        !c.log_text().contains("does not take conditional writes"),
        "conditions turned off: {}",
        c.log_tail(30)
    );
    assert_each_once(&rig, &acked, "after SIGTERM");
}

/// Review r35q Q1: one 1.5 s window of 403s to conditional writes met three partitions'
/// growths at once; counted as three refusals in a row, it turned conditions off, and a
/// growth PUT delivered 6 s late then replaced a newer version (100 of 1,200 events lost).
/// Refusals count only once they have lasted `REFUSAL_SPAN`.
#[test]
fn a_short_burst_of_403s_over_many_partitions_keeps_conditions_on() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s"])
        .env(&[("RHC_TEST_REQUEST_TIMEOUT_SECS", "3")])
        .start();
    let batch = |c: &Collector, tag: &str| -> Vec<String> {
        let ids: Vec<String> = (0..300).map(|i| format!("{tag}-{i}")).collect();
        post(c, &ids, 3);
        ids
    };
    let mut acked = batch(&c, "a");
    wait_for(&c, Duration::from_secs(30), "A", || {
        id_counts(&rig).len() == 300
    });
    std::thread::sleep(Duration::from_millis(700));
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("PUT")
            .with_header("if-match")
            .for_time(Duration::from_millis(1500)),
    );
    acked.extend(batch(&c, "b"));
    wait_for(&c, Duration::from_secs(30), "A+B", || {
        id_counts(&rig).len() == 600
    });
    std::thread::sleep(Duration::from_millis(1600));
    assert!(
        rig.proxy.seen().iter().filter(|r| r.status == 403).count() >= 2,
        "the burst met fewer than two writes"
    );
    let before = rig.proxy.arrived().len();
    rig.proxy.add(
        Rule::new(Fault::Delay(Duration::from_secs(6)))
            .method("PUT")
            .target_contains(".jsonl")
            .times(1),
    );
    acked.extend(batch(&c, "c"));
    wait_for(&c, Duration::from_secs(30), "a delayed PUT", || {
        rig.proxy.arrived()[before..]
            .iter()
            .any(|(m, t)| m == "PUT" && t.contains(".jsonl"))
    });
    wait_for(&c, Duration::from_secs(30), "A+B+C", || {
        id_counts(&rig).len() == 900
    });
    acked.extend(batch(&c, "d"));
    wait_for(&c, Duration::from_secs(30), "A+B+C+D", || {
        id_counts(&rig).len() == 1200
    });
    wait_until_the_late_put_landed(&rig, &c);
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert_each_once(&rig, &acked, "after SIGTERM");
}

/// A Ray session with two worker logs of 6 MiB under the rig's `--ray-tmp-dir`, so the log
/// lane grows their objects by appends (a server-side copy plus the new part, completed
/// with `If-Match`); the logs. None without moto.
fn log_rig() -> Option<(MotoRig, Vec<std::path::PathBuf>)> {
    let rig = s3_rig()?;
    const LOG_NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
    const LOG_SESSION: &str = "session_2026-11-22_02-56-13_816177_24314";
    let root = rig.tmp.path().join("ray");
    let logs = root.join(LOG_SESSION).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(
        logs.join("raylet.out"),
        format!("[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={LOG_NODE}\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink(root.join(LOG_SESSION), root.join("session_latest")).unwrap();
    let mut body = Vec::new();
    let mut i = 0u64;
    while body.len() < (6 << 20) {
        body.extend_from_slice(format!("{i:012} the worker says something\n").as_bytes());
        i += 1;
    }
    let files: Vec<_> = (1..=2)
        .map(|w| logs.join(format!("worker-aa-01000000-{w}.out")))
        .collect();
    for f in &files {
        std::fs::write(f, &body).unwrap();
    }
    Some((rig, files))
}

/// Appends about 100 kB of lines to each of `logs`.
fn grow_logs(logs: &[std::path::PathBuf]) {
    let more = "the worker says something more\n".repeat(3300);
    for log in logs {
        rhc_testkit::collector::append_to(log, more.as_bytes());
    }
}

/// Conditional completions (`POST` with `If-Match`) the store answered 200.
fn conditional_completions_landed(rig: &MotoRig) -> usize {
    rig.proxy
        .seen()
        .iter()
        .filter(|r| r.method == "POST" && r.header("if-match").is_some() && r.status == 200)
        .count()
}

/// Review r41s D2: two PASSING 403s to conditional completions 31 s apart (one, then two),
/// each refused completion landing with its condition when tried again half a window
/// later, and no PUT between: main at a75a988 did not let a landed completion end the
/// refusals (moto ignores the header there), counted them as refusals lasting 30 s, sent the
/// third without its condition, turned conditions off, and a growth PUT delivered late then
/// replaced a newer version (r41s: 100 of 300 acknowledged events lost). A refused write
/// landing with its condition ends the refusals: conditions stay on, the late PUT gets 412,
/// every event is there once. The completions are those of one partition's object past
/// 5 MiB (grown by a copy of the object plus the new part, completed with `If-Match`).
#[test]
fn passing_403s_to_completions_whose_retries_land_keep_conditions_on() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--upload-part-bytes", "5MiB"])
        .env(&[("RHC_TEST_REQUEST_TIMEOUT_SECS", "3")])
        .start();
    let url = c.url("/v1/events");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut acked: Vec<String> = Vec::new();
    let mut batches = 0usize;
    let mut grow_big = |acked: &mut Vec<String>, n: usize| {
        let tag = format!("big{batches}");
        batches += 1;
        assert!(post_body(&url, &padded_body(&tag, n, 3000, &mut seed)));
        acked.extend((0..n).map(|i| format!("{tag}-{i}")));
    };
    // 2,000 events of 6 KB of random hex: an object of about 6.5 MB, grown by appends from
    // then on (and, when one fails, written whole as a multipart upload, over one 5 MiB
    // part: its completion carries the condition too, so no PUT lands between).
    for _ in 0..4 {
        grow_big(&mut acked, 500);
    }
    wait_for(
        &c,
        Duration::from_secs(60),
        "a conditional completion",
        || {
            grow_big(&mut acked, 2);
            std::thread::sleep(Duration::from_millis(500));
            conditional_completions_landed(&rig) >= 1
        },
    );
    let hiccup = |n: usize| {
        rig.proxy.add(
            Rule::new(Fault::Status(403, "AccessDenied".into()))
                .method("POST")
                .with_header("if-match")
                .times(n),
        )
    };
    let refusals = || rig.proxy.seen().iter().filter(|r| r.status == 403).count();
    hiccup(1);
    for _ in 0..31 {
        grow_big(&mut acked, 2);
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(refusals(), 1, "the first hiccup was not met");
    hiccup(2);
    wait_for(&c, Duration::from_secs(10), "the second hiccup met", || {
        grow_big(&mut acked, 2);
        std::thread::sleep(Duration::from_millis(500));
        refusals() == 3
    });
    let since = rig.proxy.seen().len();
    wait_for(&c, Duration::from_secs(10), "a completion after it", || {
        grow_big(&mut acked, 2);
        std::thread::sleep(Duration::from_millis(500));
        rig.proxy.seen()[since..]
            .iter()
            .any(|r| r.method == "POST" && r.target.contains("uploadId") && r.status == 200)
    });
    let big = acked.len();
    wait_for(&c, Duration::from_secs(30), "the big partition", || {
        id_counts(&rig).len() == big
    });
    // What turning them off costs: a growth PUT of another partition delivered late
    // (review r35j D1).
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    acked.extend(a);
    wait_for(&c, Duration::from_secs(30), "A", || {
        id_counts(&rig).len() == big + 100
    });
    std::thread::sleep(Duration::from_millis(700));
    let before = rig.proxy.arrived().len();
    rig.proxy.add(
        Rule::new(Fault::Delay(Duration::from_secs(6)))
            .method("PUT")
            .target_contains(".jsonl")
            .times(1),
    );
    let b: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    post(&c, &b, 1);
    acked.extend(b);
    wait_for(
        &c,
        Duration::from_secs(30),
        "the growth PUT of B at the proxy",
        || {
            rig.proxy.arrived()[before..]
                .iter()
                .any(|(m, t)| m == "PUT" && t.contains(".jsonl"))
        },
    );
    wait_for(&c, Duration::from_secs(30), "A+B", || {
        id_counts(&rig).len() == big + 200
    });
    let later: Vec<String> = (0..100).map(|i| format!("c-{i}")).collect();
    post(&c, &later, 1);
    acked.extend(later);
    wait_for(&c, Duration::from_secs(30), "A+B+C", || {
        id_counts(&rig).len() == big + 300
    });
    wait_until_the_late_put_landed(&rig, &c);
    assert_each_once(&rig, &acked, "after the late PUT landed");
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert!(
        !c.log_text().contains("does not take conditional writes"),
        "conditions turned off: {}",
        c.log_tail(30)
    );
    assert_each_once(&rig, &acked, "after SIGTERM");
}

/// Review r41s D2 with a long `--upload-window` (80 s: a refused growth is tried again 40 s
/// later), where refusals are only seen when writes happen: a passing 403 to an event
/// object's first PUT, then 31 s later, before that PUT is tried again, a passing 403 to
/// each of two logs' conditional completions (1 s interval; a log whose append was refused
/// then goes whole). Three refusals over 31 s, but no write refused for 30 s: conditions
/// stay on (main at a75a988 turned them off). The refused PUT lands when tried again; every
/// event there once.
#[test]
fn refusals_of_different_writes_far_apart_do_not_add_up() {
    let Some((rig, logs)) = log_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("PUT")
            .target_contains(".jsonl")
            .with_header("if-none-match")
            .times(1),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "80s", "--log-upload-interval", "1s"])
        .start();
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    let refusals = || rig.proxy.seen().iter().filter(|r| r.status == 403).count();
    wait_for(&c, Duration::from_secs(30), "the event PUT refused", || {
        refusals() == 1
    });
    let refused_at = Instant::now();
    wait_for(&c, Duration::from_secs(25), "both logs appended", || {
        grow_logs(&logs);
        std::thread::sleep(Duration::from_millis(400));
        conditional_completions_landed(&rig) >= 2
    });
    while refused_at.elapsed() < Duration::from_secs(31) {
        grow_logs(&logs);
        std::thread::sleep(Duration::from_secs(1));
    }
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("POST")
            .with_header("if-match")
            .times(2),
    );
    wait_for(&c, Duration::from_secs(6), "the second hiccup met", || {
        grow_logs(&logs);
        std::thread::sleep(Duration::from_millis(500));
        refusals() == 3
    });
    grow_logs(&logs);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        refused_at.elapsed() < Duration::from_secs(40) && id_counts(&rig).is_empty(),
        "the refused event PUT was tried again before the second hiccup"
    );
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    wait_for(
        &c,
        Duration::from_secs(30),
        "A (the PUT tried again)",
        || id_counts(&rig).len() == 100,
    );
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert!(
        !c.log_text().contains("does not take conditional writes"),
        "conditions turned off: {}",
        c.log_tail(30)
    );
    assert_each_once(&rig, &a, "after SIGTERM");
}

/// Review r41s D3: a store refusing every conditional PUT with 400 `InvalidArgument`, and
/// SIGTERM 1 s after start: main at a75a988 waited for 30 s of refusals, the 25 s deadline
/// ended first: exit 3, no event in the bucket, the spool left for a next start (gone with a
/// pod's emptyDir). At shutdown, with no conditional write landed in the run, the refused
/// write is sent once without its condition at once: it lands, conditions go off (one
/// WARN), every event is in the bucket once, exit 0 well within the deadline.
#[test]
fn a_shutdown_does_not_wait_for_a_store_refusing_conditions() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    for header in ["if-match", "if-none-match"] {
        rig.proxy.add(
            Rule::new(Fault::Status(400, "InvalidArgument".into()))
                .method("PUT")
                .with_header(header),
        );
    }
    let mut c = rig.collector().only(&["--upload-window", "1s"]).start();
    let a: Vec<String> = (0..300).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 3);
    std::thread::sleep(Duration::from_secs(1));
    let (status, took) = c
        .try_terminate(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        status.success(),
        "exit {status:?} after {took:?}: {}",
        c.log_tail(30)
    );
    assert!(took < Duration::from_secs(20), "the shutdown took {took:?}");
    let left: Vec<_> = rhc_testkit::collector::files_under(&c.spool)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/events/"))
        .collect();
    assert!(left.is_empty(), "left in the spool: {left:?}");
    assert_eq!(
        c.log_text()
            .matches("does not take conditional writes")
            .count(),
        1,
        "{}",
        c.log_tail(30)
    );
    assert_each_once(&rig, &a, "after SIGTERM");
}

/// The other side of D3: at shutdown a store refusing every write (403 with or without a
/// condition) has the write sent once without its condition at once, refused too: the
/// refusal is the write's own, conditions stay on (no WARN), the events stay in the spool
/// for the next start (exit 3 at the deadline).
#[test]
fn a_shutdown_keeps_conditions_on_when_the_write_without_them_is_refused_too() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("PUT")
            .target_contains(".jsonl"),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--shutdown-timeout", "4s"])
        .start();
    let a: Vec<String> = (0..20).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    std::thread::sleep(Duration::from_secs(1));
    let (status, _) = c
        .try_terminate(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.code(), Some(3), "{}", c.log_tail(30));
    let unconditional_refused = rig
        .proxy
        .seen()
        .iter()
        .filter(|r| {
            r.status == 403 && r.header("if-none-match").is_none() && r.header("if-match").is_none()
        })
        .count();
    assert!(
        unconditional_refused >= 1,
        "no write was sent without its condition at shutdown"
    );
    assert!(
        !c.log_text().contains("does not take conditional writes"),
        "conditions turned off: {}",
        c.log_tail(30)
    );
    assert!(id_counts(&rig).is_empty());
}

/// Review r35p D3: `file://` writes no condition (one process renames each version into
/// place), and the gauge says so.
#[test]
fn a_file_bucket_reports_no_conditional_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, _bucket) = file_collector(tmp.path(), &["--upload-window", "1s"]);
    assert_eq!(c.metric("rhc_event_conditional_writes"), 0.0);
    c.terminate(Duration::from_secs(30));
}

/// Review r35k D2, the other side: a store that refuses every write (403 AccessDenied,
/// with or without a condition: the credentials may not write) does not turn conditions
/// off: the growth fails and is retried, no warning, the gauge stays 1; once writes are
/// allowed, every event lands, written conditionally.
#[test]
fn a_store_refusing_every_write_keeps_conditions_on() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("PUT")
            .target_contains(".jsonl"),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s"])
        .env(&[SHORT_SPAN])
        .start();
    let a: Vec<String> = (0..20).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    // Refused with the condition for `REFUSAL_SPAN` (shortened here), then once without it:
    // refused too, so the refusals are the writes' own.
    wait_for(
        &c,
        Duration::from_secs(75),
        "the write refused without its condition",
        || {
            let seen = rig.proxy.seen();
            let refused = |h: &str| {
                seen.iter()
                    .filter(|r| r.status == 403 && r.header(h).is_some())
                    .count()
            };
            refused("if-none-match") >= 3
                && seen
                    .iter()
                    .filter(|r| {
                        r.status == 403
                            && r.header("if-none-match").is_none()
                            && r.header("if-match").is_none()
                    })
                    .count()
                    >= 1
        },
    );
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    assert!(id_counts(&rig).is_empty());
    rig.proxy.clear();
    wait_for(&c, Duration::from_secs(30), "A in the bucket", || {
        id_counts(&rig).len() == 20
    });
    assert_eq!(c.metric("rhc_event_conditional_writes"), 1.0);
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert_eq!(
        c.log_text()
            .matches("does not take conditional writes")
            .count(),
        0,
        "{}",
        c.log_tail(30)
    );
    assert_each_once(&rig, &a, "after SIGTERM");
}

/// moto: a growth that fails (every PUT refused for 3 s) leaves the previous version whole,
/// and the next round after it brings the object up to date.
#[test]
fn a_failed_growth_leaves_the_previous_version_whole() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig.collector().only(&["--upload-window", "1s"]).start();
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    let end = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let o = event_objects(rig.objects());
        if let Some((k, v)) = o.into_iter().next() {
            if version_ids(&k, &v).len() == 100 {
                break (k, v);
            }
        }
        assert!(Instant::now() < end, "the first version never came");
        std::thread::sleep(Duration::from_millis(100));
    };
    rig.proxy.add(
        Rule::new(Fault::Status(500, "InternalError".into()))
            .method("PUT")
            .for_time(Duration::from_secs(3)),
    );
    let b: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    post(&c, &b, 1);
    let fault_end = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < fault_end {
        let now = rig.objects();
        let v = now.get(&first.0).expect("the object vanished");
        assert_eq!(v, &first.1, "the object changed while every PUT failed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let faulted = rig.proxy.seen().iter().filter(|r| r.faulted).count();
    assert!(faulted > 0, "no growth was attempted during the fault");
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let o = event_objects(rig.objects());
        let ids = version_ids(&first.0, &o[&first.0]);
        if ids.len() == 200 {
            assert_eq!(&ids[..100], &a[..]);
            break;
        }
        assert!(
            Instant::now() < end,
            "the object never grew after the fault"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(40));
}

/// moto: 5,000 open partitions with new events at SIGTERM all drain within the shutdown
/// deadline (exit 0, every object there, one each), and no upload is logged as panicked.
///
/// How fast is a figure, not a pass mark here: on the shared two-core CI machine moto alone
/// takes about 160 PUT/s (BENCHMARKS.md, "SIGTERM with many partitions"), so a debug build
/// beside other tests cannot show the issue's 20 s, and a timed assertion would only measure
/// the machine's load. The deadline is therefore 120 s and the time is printed; the bar is
/// asserted when asked for (`RHC_DRAIN_LIMIT_SECS=20` with
/// `RHC_COLLECTOR_BIN=target/release/ray-history-collector`), and measured by
/// `rhc-chaos --only sigterm-partitions --partitions 5000`.
#[test]
fn five_thousand_open_partitions_drain_at_sigterm() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig
        .collector()
        .only(&["--max-open-segments", "1024", "--shutdown-timeout", "120s"])
        .start();
    const JOBS: u32 = 5000;
    for chunk in 0..JOBS / 500 {
        let body = format!(
            "[{}]",
            (0..500)
                .map(|j| event(&format!("p-{chunk}-{j}"), chunk * 500 + j))
                .collect::<Vec<_>>()
                .join(",")
        );
        let r = c.post(body.as_bytes());
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let (status, took) = c
        .try_terminate(Duration::from_secs(150))
        .unwrap_or_else(|e| panic!("{e}"));
    let log = c.log_text();
    assert!(!log.contains("panicked"), "{}", c.log_tail(40));
    assert!(status.success(), "{}", c.log_tail(40));
    println!("5,000 partitions drained at SIGTERM in {took:?}");
    if let Some(limit) = std::env::var("RHC_DRAIN_LIMIT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        assert!(
            took <= Duration::from_secs(limit),
            "the drain took {took:?}, over RHC_DRAIN_LIMIT_SECS={limit}"
        );
    }
    let store = rig.s3.store(BUCKET);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys: Vec<String> = rt.block_on(async {
        use futures::TryStreamExt;
        let metas: Vec<_> = store.list(None).try_collect().await.unwrap();
        metas.into_iter().map(|m| m.location.to_string()).collect()
    });
    let events = keys.iter().filter(|k| k.contains("/job_events/")).count();
    assert_eq!(events, JOBS as usize);
}

/// A body of `n` events of job 1 whose messages are `pad` random bytes as hex (gzip halves
/// them at best), ids `<tag>-<i>`.
fn padded_body(tag: &str, n: usize, pad: usize, seed: &mut u64) -> Vec<u8> {
    let mut lines = Vec::with_capacity(n);
    for i in 0..n {
        let mut msg = String::with_capacity(2 * pad);
        for _ in 0..pad {
            // xorshift64: random enough that the object stays large.
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            msg.push_str(&format!("{:02x}", *seed as u8));
        }
        let e = event(&format!("{tag}-{i}"), 1)
            .replace(r#""message":"""#, &format!(r#""message":"{msg}""#));
        lines.push(e);
    }
    format!("[{}]", lines.join(",")).into_bytes()
}

fn post_body(url: &str, body: &[u8]) -> bool {
    rhc_testkit::http::try_http_request("POST", url, &[("Content-Type", "application/json")], body)
        .is_ok_and(|r| r.status == 200)
}

/// The one event object under `bucket` (a file the history server reads), when there is one.
fn the_event_object(bucket: &Path) -> Option<std::path::PathBuf> {
    rhc_testkit::collector::files_under(bucket)
        .into_iter()
        .find(|p| {
            p.to_string_lossy().contains("/job_events/")
                && rhc_testkit::collector::history_server_accepts(&p.to_string_lossy())
        })
}

/// Byte offsets at which a gzip member of `data` ends (and 0).
fn member_ends(data: &[u8]) -> std::collections::BTreeSet<u64> {
    let mut ends = std::collections::BTreeSet::from([0u64]);
    let mut pos = 0usize;
    while pos < data.len() {
        let mut d = flate2::bufread::GzDecoder::new(&data[pos..]);
        std::io::copy(&mut d, &mut std::io::sink()).expect("a whole member");
        let rest = d.into_inner().len();
        pos = data.len() - rest;
        ends.insert(pos as u64);
    }
    ends
}

/// file://, gzip, --upload-window 1s, one partition growing by ~3 MB of events a post: a
/// reader that looks at the object as fast as it can sees only whole versions (every size
/// it sees ends a gzip member of the final object, every version it reads decodes whole,
/// lines whole), never an append in progress.
#[test]
fn a_file_bucket_reader_never_sees_a_torn_version() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = file_collector(tmp.path(), &["--upload-window", "1s"]);
    let url = c.url("/v1/events");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    assert!(post_body(&url, &padded_body("r0", 4000, 400, &mut seed)));
    let end = Instant::now() + Duration::from_secs(15);
    let obj = loop {
        if let Some(p) = the_event_object(&bucket) {
            break p;
        }
        assert!(Instant::now() < end, "no event object within 15 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (s, o) = (stop.clone(), obj.clone());
    let reader = std::thread::spawn(move || {
        let mut sizes = std::collections::BTreeSet::new();
        let (mut last, mut reads) = (0u64, 0usize);
        let end = Instant::now() + Duration::from_secs(60);
        while !s.load(Ordering::SeqCst) && Instant::now() < end {
            let Ok(m) = std::fs::metadata(&o) else {
                continue;
            };
            sizes.insert(m.len());
            if m.len() != last {
                // A new size: read that version and decode it.
                let bytes = std::fs::read(&o).unwrap();
                version_ids("the object", &bytes);
                last = bytes.len() as u64;
                sizes.insert(last);
                reads += 1;
            }
        }
        (sizes, reads)
    });
    for k in 1..=6 {
        assert!(post_body(
            &url,
            &padded_body(&format!("r{k}"), 4000, 400, &mut seed)
        ));
        std::thread::sleep(Duration::from_millis(1200));
    }
    stop.store(true, Ordering::SeqCst);
    let (sizes, reads) = reader.join().expect("a version that is not whole");
    let final_bytes = std::fs::read(&obj).unwrap();
    let ends = member_ends(&final_bytes);
    let torn: Vec<_> = sizes.iter().filter(|s| !ends.contains(s)).collect();
    assert!(
        torn.is_empty(),
        "{} of {} sizes seen are not at a member boundary: {:?}",
        torn.len(),
        sizes.len(),
        &torn[..torn.len().min(5)]
    );
    assert!(reads >= 4, "only {reads} versions read");
    assert_eq!(version_ids("the object", &final_bytes).len(), 7 * 4000);
    assert!(c.terminate(Duration::from_secs(60)).success());
}

/// file://, gzip, --upload-window 1s: the node is killed while its object grows (and its
/// spool deleted), several times; the object left is whole every time, and at most one
/// temporary is beside it, which the history server does not take for an object.
#[test]
fn a_node_killed_while_its_file_object_grows_leaves_it_whole() {
    for round in 0..4 {
        let tmp = tempfile::tempdir().unwrap();
        let (mut c, bucket) = file_collector(tmp.path(), &["--upload-window", "1s"]);
        let url = c.url("/v1/events");
        let mut seed = 0x2545_f491_4f6c_dd1du64 + round;
        assert!(post_body(&url, &padded_body("k0", 4000, 400, &mut seed)));
        let end = Instant::now() + Duration::from_secs(15);
        let obj = loop {
            if let Some(p) = the_event_object(&bucket) {
                break p;
            }
            assert!(Instant::now() < end, "no event object within 15 s");
            std::thread::sleep(Duration::from_millis(50));
        };
        std::thread::sleep(Duration::from_millis(1500));
        let s0 = std::fs::metadata(&obj).unwrap().len();
        let bodies: Vec<Vec<u8>> = (1..=3)
            .map(|k| padded_body(&format!("k{k}"), 4000, 400, &mut seed))
            .collect();
        let poster = std::thread::spawn(move || {
            for b in bodies {
                if !post_body(&url, &b) {
                    return;
                }
            }
        });
        // Kill as soon as the object starts to change.
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end && std::fs::metadata(&obj).map(|m| m.len()).unwrap_or(s0) == s0 {
        }
        c.kill9();
        let _ = poster.join();
        std::fs::remove_dir_all(&c.spool).unwrap();
        let bytes = std::fs::read(&obj).unwrap();
        let ids = version_ids(&format!("round {round}"), &bytes);
        assert!(ids.len() >= 4000, "round {round}: {} events", ids.len());
        let beside: Vec<_> = std::fs::read_dir(obj.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(beside.len() <= 2, "round {round}: {beside:?}");
        for name in &beside {
            if obj.file_name().unwrap().to_string_lossy() != *name {
                assert!(
                    !rhc_testkit::collector::history_server_accepts(name),
                    "{name}"
                );
            }
        }
    }
}

/// Every event id in the session's event objects on the file:// bucket (temporaries skipped).
fn ids_in_file_bucket(bucket: &Path) -> std::collections::BTreeSet<String> {
    event_objects(read_all(&local_bucket(bucket)))
        .iter()
        .filter(|(k, _)| !k.ends_with(".rhc-tmp"))
        .flat_map(|(k, v)| version_ids(k, v))
        .collect()
}

/// One passing failure to create a segment's shadow (ENOSPC, once) must not stop its object
/// growing until the seal: the publication is tried again half a window later (the second
/// review found the segment given up until rotation, every event of it lost with the node).
#[test]
fn a_passing_spool_write_failure_only_delays_the_growth() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    faults.arm("open", 28, 1, "/growth/e.");
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--ray-tmp-dir",
            tmp.path().join("ray").to_str().unwrap(),
            "--upload-window",
            "1s",
        ],
        &faults.env(),
    );
    let mut acked = Vec::new();
    for r in 0..12 {
        let ids: Vec<String> = (0..10).map(|i| format!("o{r}-{i}")).collect();
        post(&c, &ids, 1);
        acked.extend(ids);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(!faults.armed("open"), "the failure was never injected");
    // Well past the window (1 s): everything acknowledged must be there.
    std::thread::sleep(Duration::from_secs(4));
    c.kill9();
    std::fs::remove_dir_all(tmp.path().join("spool")).unwrap();
    let have = ids_in_file_bucket(&bucket);
    let missing = acked.iter().filter(|id| !have.contains(*id)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} acknowledged events not in the bucket after the node vanished\n{}",
        acked.len(),
        c.log_tail(30)
    );
}

/// Issue 35 review, item 1: one transient error opening an open segment to read it (EIO, or
/// EMFILE with `--compression none`) must only delay its publication by half a window, not
/// stop it until the seal (rotation here: 120 s); main at 40d3d47 took it for a damaged file.
#[test]
fn a_passing_error_reading_a_segment_only_delays_the_growth() {
    for (errno, compression) in [(5, "gzip"), (24, "none")] {
        let tmp = tempfile::tempdir().unwrap();
        let faults = Faults::build(tmp.path());
        let spool = tmp.path().join("spool");
        let (mut c, bucket) = {
            let bucket = tmp.path().join("bucket");
            std::fs::create_dir_all(&bucket).unwrap();
            let ray = tmp.path().join("ray");
            let args = [
                "--storage",
                bucket.to_str().unwrap(),
                "--ray-tmp-dir",
                ray.to_str().unwrap(),
                "--upload-window",
                "2s",
                "--rotation-interval",
                "120s",
                "--compression",
                compression,
            ];
            (Collector::start(&spool, &args, &faults.env()), bucket)
        };
        // Either compression (a `.jsonl` is plain here), temporaries skipped.
        let in_bucket = || -> std::collections::BTreeSet<String> {
            event_objects(read_all(&local_bucket(&bucket)))
                .iter()
                .filter(|(k, _)| !k.ends_with(".rhc-tmp"))
                .flat_map(|(k, v)| object_ids(k, v))
                .collect()
        };
        let first: Vec<String> = (0..50).map(|i| format!("a{i}")).collect();
        post(&c, &first, 1);
        wait_for(&c, Duration::from_secs(15), "the first batch", || {
            first.iter().all(|id| in_bucket().contains(id))
        });
        faults.arm("openr", errno, 1, &format!("{}/events/", spool.display()));
        let second: Vec<String> = (0..50).map(|i| format!("b{i}")).collect();
        post(&c, &second, 1);
        // Half a window later it is tried again: well within 10 s (the seal is at 120 s).
        wait_for(
            &c,
            Duration::from_secs(10),
            "the second batch after one failed read",
            || second.iter().all(|id| in_bucket().contains(id)),
        );
        assert!(
            !faults.armed("openr"),
            "errno {errno}: the failure was never injected"
        );
        c.kill9();
    }
}

/// A restart with another `--compression` writes the object under its new key before the
/// one published under the old key goes: when the new one cannot be written (every create
/// in the bucket fails), the old one stays and holds every acknowledged event (the second
/// review found it deleted first, and the events gone with the node).
#[test]
fn a_compression_switch_keeps_the_old_object_until_the_new_one_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    let (mut c, bucket) = file_collector(tmp.path(), &["--upload-window", "1s"]);
    let acked: Vec<String> = (0..20).map(|i| format!("a{i}")).collect();
    post(&c, &acked, 1);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ids_in_file_bucket(&bucket).len(), 20, "{}", c.log_tail(30));
    c.kill9();
    faults.arm("open", 28, 100_000, &format!("{}/", bucket.display()));
    let mut c2 = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--ray-tmp-dir",
            tmp.path().join("ray").to_str().unwrap(),
            "--upload-window",
            "1s",
            "--compression",
            "none",
        ],
        &faults.env(),
    );
    std::thread::sleep(Duration::from_secs(4));
    c2.kill9();
    std::fs::remove_dir_all(tmp.path().join("spool")).unwrap();
    let have = ids_in_file_bucket(&bucket);
    assert_eq!(
        acked.iter().filter(|id| have.contains(*id)).count(),
        20,
        "acknowledged events lost when --compression changed\n{}",
        c2.log_tail(30)
    );
}

/// Bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    rhc_testkit::collector::files_under(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// A burst that fills `--max-spool-bytes` before anything is published, then publication
/// writes the compressed copies of the open segments (`spool/growth/`): the spool on disk
/// stays within the budget, because their room was reserved when the events were admitted
/// (the second review found 1.27x the budget with poorly compressible events).
#[test]
fn growth_copies_stay_within_the_spool_budget() {
    const BUDGET: u64 = 4 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let budget = BUDGET.to_string();
    let (mut c, _bucket) = file_collector(
        tmp.path(),
        &["--upload-window", "4s", "--max-spool-bytes", &budget],
    );
    let url = c.url("/v1/events");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut accepted = 0;
    for r in 0..2000 {
        if !post_body(&url, &padded_body(&format!("b{r}"), 100, 200, &mut seed)) {
            break;
        }
        accepted += 1;
    }
    assert!(accepted > 0, "nothing accepted");
    // Half a window and more: the publisher has written the copies.
    std::thread::sleep(Duration::from_secs(3));
    let on_disk = disk_bytes(&tmp.path().join("spool"));
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    println!("{accepted} bodies accepted; spool on disk {on_disk} bytes, budget {BUDGET}");
    assert!(
        on_disk <= BUDGET,
        "the spool holds {on_disk} bytes on disk, over its budget of {BUDGET}"
    );
}

/// Bytes the spool's budget counts as stored, read from the disk: segments, quarantine
/// files and kept bodies, and the compressed copies of open segments (`growth/*.gz`).
fn stored_on_disk(spool: &Path) -> u64 {
    let copies: u64 = rhc_testkit::collector::files_under(&spool.join("growth"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "gz"))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    disk_bytes(&spool.join("events")) + disk_bytes(&spool.join("quarantine")) + copies
}

/// The one growth record and the shadow beside it: (object length the record says, the
/// shadow's length).
fn growth_lengths(spool: &Path) -> (u64, u64) {
    let files = rhc_testkit::collector::files_under(&spool.join("growth"));
    let rec = files
        .iter()
        .find(|p| p.to_string_lossy().ends_with(".jsonl.rec"))
        .unwrap_or_else(|| panic!("no growth record in {files:?}"));
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(rec).unwrap()).unwrap();
    let shadow = rec.with_extension("gz");
    (
        record["object_len"].as_u64().unwrap(),
        std::fs::metadata(&shadow).unwrap().len(),
    )
}

/// Waits up to `limit` for `done`, panicking with `what` and the log otherwise.
fn wait_for(c: &Collector, limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < end,
            "{what} within {limit:?}\n{}",
            c.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 35, item 1: the disk fills up half way through writing a growth copy (the fault
/// shim: half a gzip member written, then ENOSPC, once, as on a tmpfs with 150 KiB free).
/// The copy is cut back to its record's length at once; `rhc_spool_bytes` equals what is on
/// disk after the failure, after the segment's state was dropped and loaded again from the
/// shadow's length (and the retry published everything), and after the upload (0, where
/// f6212bd read 2^64 minus the failed bytes and answered 503 for good); pushed events and
/// `/readyz` get 200 at the end.
#[test]
fn a_full_disk_while_writing_a_growth_copy_never_wedges_ingest() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let spool = tmp.path().join("spool");
    let mut c = Collector::start(
        &spool,
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--ray-tmp-dir",
            tmp.path().join("ray").to_str().unwrap(),
            "--upload-window",
            "4s",
            "--rotation-interval",
            "15s",
        ],
        &faults.env(),
    );
    let url = c.url("/v1/events");
    let mut seed = 0x0123_4567_89ab_cdefu64;
    assert!(post_body(&url, &padded_body("a", 200, 100, &mut seed)));
    wait_for(&c, Duration::from_secs(15), "the first version", || {
        the_event_object(&bucket)
            .is_some_and(|p| version_ids("first", &std::fs::read(p).unwrap()).len() == 200)
    });
    let (object_len, shadow_len) = growth_lengths(&spool);
    assert_eq!(object_len, shadow_len);
    // The next write to a shadow (`growth/e.<segment>.jsonl.gz`) runs out of room half way.
    faults.arm("write", 28, 1, ".jsonl.gz$");
    assert!(post_body(&url, &padded_body("b", 2000, 400, &mut seed)));
    wait_for(&c, Duration::from_secs(10), "the injected ENOSPC", || {
        faults
            .log()
            .iter()
            .any(|(call, path, ok)| call == "write" && path.contains("/growth/") && !ok)
    });
    // Well before the retry, half a window (2 s) after the failed round began.
    std::thread::sleep(Duration::from_millis(300));
    let (object_len, shadow_len) = growth_lengths(&spool);
    assert_eq!(
        shadow_len, object_len,
        "the failed copy write was not cut back to its record's length"
    );
    let on_disk = stored_on_disk(&spool);
    assert_eq!(
        c.metric("rhc_spool_bytes") as u64,
        on_disk,
        "after the failure"
    );
    // The retry publishes everything.
    wait_for(&c, Duration::from_secs(20), "the retry", || {
        the_event_object(&bucket)
            .is_some_and(|p| version_ids("retried", &std::fs::read(p).unwrap()).len() == 2200)
    });
    // A second without a publication drops the state; a few more events make the next round
    // load it again from the shadow's length.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(post_body(&url, &padded_body("c", 10, 100, &mut seed)));
    wait_for(
        &c,
        Duration::from_secs(20),
        "the round after the reload",
        || {
            the_event_object(&bucket)
                .is_some_and(|p| version_ids("reloaded", &std::fs::read(p).unwrap()).len() == 2210)
        },
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        c.metric("rhc_spool_bytes") as u64,
        stored_on_disk(&spool),
        "after the reload"
    );
    // The rotation seals and uploads the segment: nothing is left, nothing counted.
    wait_for(&c, Duration::from_secs(40), "the upload", || {
        rhc_testkit::collector::files_under(&spool.join("events")).is_empty()
    });
    std::thread::sleep(Duration::from_millis(500));
    let left = c.metric("rhc_spool_bytes");
    assert_eq!(left, 0.0, "rhc_spool_bytes after the upload of everything");
    assert_eq!(stored_on_disk(&spool), 0);
    assert_eq!(c.metric("rhc_spool_accounting_errors_total"), 0.0);
    let r = c.post(format!("[{}]", event("after", 1)).as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(c.get("/readyz").unwrap().status, 200);
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    assert_eq!(ids_in_file_bucket(&bucket).len(), 2211);
}

/// Event ids of one object, plain or gzip by its key, each once per line.
fn object_ids(key: &str, bytes: &[u8]) -> Vec<String> {
    rhc_testkit::collector::decode(key, bytes)
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            v["eventId"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Every event object of the session must be under the key of the compression its segment
/// was first published with (`ext`: a restart with another `--compression` keeps it), one per
/// partition, and hold each of `ids` once.
fn assert_one_object_per_partition(objects: &BTreeMap<String, Vec<u8>>, ids: &[String], ext: &str) {
    let keys: Vec<&String> = objects.keys().collect();
    assert_eq!(objects.len(), 2, "objects: {keys:?}");
    assert!(
        keys.iter().all(|k| k.ends_with(ext)),
        "an object not under the key its segment was first published with ({ext}): {keys:?}"
    );
    let mut count: HashMap<String, u32> = HashMap::new();
    for (k, v) in objects {
        for id in object_ids(k, v) {
            *count.entry(id).or_default() += 1;
        }
    }
    let twice = count.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "{twice} events stored twice");
    for id in ids {
        assert_eq!(count.get(id), Some(&1), "{id}");
    }
}

/// Delete requests (DeleteObjects) the store was sent.
fn delete_requests(rig: &MotoRig) -> usize {
    rig.proxy
        .seen()
        .iter()
        .filter(|r| r.method == "POST" && r.target.contains(DELETE_OBJECTS))
        .count()
}

/// What object_store sends to delete an S3 object: `POST /<bucket>?delete` (DeleteObjects).
const DELETE_OBJECTS: &str = "?delete";

/// Run 1 of the compression switch: 2,000 events in 2 partitions, grown with gzip, kill -9.
fn grow_with_gzip_then_kill(rig: &MotoRig) -> Vec<String> {
    let mut c = rig.collector().only(&["--upload-window", "1s"]).start();
    let ids: Vec<String> = (0..2000).map(|i| format!("z-{i}")).collect();
    for chunk in ids.chunks(500) {
        post(&c, chunk, 2);
    }
    wait_for(
        &c,
        Duration::from_secs(20),
        "2,000 events in 2 .gz objects",
        || {
            let o = event_objects(rig.objects());
            o.len() == 2
                && o.keys().all(|k| k.ends_with(".jsonl.gz"))
                && o.iter().map(|(k, v)| object_ids(k, v).len()).sum::<usize>() == 2000
        },
    );
    c.kill9();
    ids
}

/// The review r35h, item G: the S3 permissions docs/storage.md documents have no
/// `s3:DeleteObject`, so the store refuses every delete (DeleteObjects answered 403
/// AccessDenied). Objects grown with gzip, kill -9, restart with `--compression none`: each
/// segment already published keeps its key and compression (`.jsonl.gz`), so nothing needs
/// deleting: no delete is sent, the segments leave the spool, SIGTERM exits 0, and the
/// bucket holds one object per partition, every line once (main at c6fb7f8: the refused
/// delete retried forever, the segments kept in the spool, SIGTERM exit 3, lines twice).
#[test]
fn a_compression_switch_without_delete_permission_keeps_each_segments_key() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("POST")
            .target_contains(DELETE_OBJECTS),
    );
    let ids = grow_with_gzip_then_kill(&rig);
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--compression", "none"])
        .start();
    let spool = rig.tmp.path().join("spool");
    wait_for(&c, Duration::from_secs(60), "the segments uploaded", || {
        rhc_testkit::collector::files_under(&spool.join("events")).is_empty()
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    assert_eq!(delete_requests(&rig), 0, "a delete was sent");
    assert_one_object_per_partition(&event_objects(rig.objects()), &ids, ".jsonl.gz");
}

/// Issue 35, item 2, and r35h item G: a restart with `--compression none` killed (-9) while
/// it uploads the segments published with gzip, then a start with gzip again: one object
/// per partition under its first key, every line once, and no delete ever sent.
#[test]
fn a_compression_switch_killed_then_switched_back_keeps_one_object() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let ids = grow_with_gzip_then_kill(&rig);
    // The uploads of the switched run are held, so the kill comes in the middle of them.
    rig.proxy.add(
        Rule::new(Fault::Hold(Duration::from_secs(60)))
            .method("PUT")
            .target_contains(".jsonl"),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--compression", "none"])
        .start();
    std::thread::sleep(Duration::from_secs(3));
    c.kill9();
    rig.proxy.clear();
    let mut c = rig.collector().only(&["--upload-window", "1s"]).start();
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    assert_eq!(delete_requests(&rig), 0, "a delete was sent");
    assert_one_object_per_partition(&event_objects(rig.objects()), &ids, ".jsonl.gz");
}

/// Issue 35, item 4: a store outage (every request answered 500) with a 16 MiB budget and
/// Ray's kind of traffic (batches of 300 events every 100 ms over 3 jobs): the first 503
/// comes only once the spool really holds close to the high watermark (90 %, 15,099,494
/// bytes): at least 85 % of the budget on disk (f6212bd: 46 %, as the raw bytes not yet
/// published were counted again for copies a tenth their size).
#[test]
fn a_store_outage_fills_the_spool_to_its_high_watermark_before_503() {
    const BUDGET: u64 = 16 << 20;
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy
        .add(Rule::new(Fault::Status(500, "InternalError".into())));
    let budget = BUDGET.to_string();
    let c = rig
        .collector()
        .only(&["--max-spool-bytes", &budget])
        .start();
    let spool = rig.tmp.path().join("spool");
    let end = Instant::now() + Duration::from_secs(90);
    let mut n = 0usize;
    let refused = loop {
        assert!(Instant::now() < end, "never refused:\n{}", c.log_tail(30));
        let ids: Vec<String> = (n..n + 300).map(|i| format!("o-{i}")).collect();
        let body = format!(
            "[{}]",
            ids.iter()
                .enumerate()
                .map(|(i, id)| event(id, i as u32 % 3))
                .collect::<Vec<_>>()
                .join(",")
        );
        let r = c.post(body.as_bytes());
        if r.status != 200 {
            break r;
        }
        n += 300;
        std::thread::sleep(Duration::from_millis(100));
    };
    let on_disk = stored_on_disk(&spool);
    let said = String::from_utf8_lossy(&refused.body).into_owned();
    println!(
        "first refusal after {n} events: {} {said:?}; on disk {on_disk} bytes of {BUDGET} ({:.1} %)",
        refused.status,
        on_disk as f64 * 100.0 / BUDGET as f64
    );
    assert_eq!(refused.status, 503, "{said}");
    assert!(said.contains("high watermark"), "{said}");
    assert!(
        on_disk >= BUDGET / 100 * 85,
        "503 with {on_disk} bytes on disk, below 85 % of {BUDGET}"
    );
    assert!(
        on_disk <= BUDGET / 10 * 9,
        "{on_disk} bytes on disk, over the high watermark"
    );
}

/// moto: a store that answers an event object's growth copies (`UploadPartCopy`) 35 s late
/// still takes every new event, and SIGTERM leaves every acknowledged event in the bucket
/// (exit 0). The log lane's 30 s cut on unanswered copies is not the event publisher's:
/// its copies wait as long as object_store's own request timeout (120 s).
#[test]
fn event_growth_copies_answered_35_s_late_still_publish() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig
        .collector()
        .only(&[
            "--upload-window",
            "2s",
            "--enable-log-collector",
            "false",
            "--shutdown-timeout",
            "150s",
        ])
        .start();
    let url = c.url("/v1/events");
    // Over S3's 5 MiB minimum part once compressed, so the next growth copies it.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut acked: Vec<String> = Vec::new();
    for b in 0..4 {
        let tag = format!("big{b}");
        assert!(
            post_body(&url, &padded_body(&tag, 100, 16_000, &mut seed)),
            "a batch was refused"
        );
        acked.extend((0..100).map(|i| format!("{tag}-{i}")));
    }
    let in_bucket = |ids: &[String]| {
        let objects = event_objects(rig.objects());
        let have: std::collections::BTreeSet<String> = objects
            .iter()
            .flat_map(|(k, v)| version_ids(k, v))
            .collect();
        ids.iter().all(|id| have.contains(id))
    };
    let end = Instant::now() + Duration::from_secs(60);
    while !in_bucket(&acked) {
        assert!(Instant::now() < end, "the first events never landed");
        std::thread::sleep(Duration::from_millis(500));
    }
    let sizes: Vec<(String, usize)> = event_objects(rig.objects())
        .into_iter()
        .map(|(k, v)| (k, v.len()))
        .collect();
    eprintln!("event objects before the slow copies: {sizes:?}");
    rig.proxy
        .add(Rule::new(Fault::Delay(Duration::from_secs(35))).with_header("x-amz-copy-source"));
    // Job 1, as the big ones: the same object grows.
    assert!(
        post_body(&url, &padded_body("late", 20, 10, &mut seed)),
        "the late batch was refused"
    );
    let small: Vec<String> = (0..20).map(|i| format!("late-{i}")).collect();
    acked.extend(small.iter().cloned());
    let end = Instant::now() + Duration::from_secs(100);
    while !in_bucket(&small) {
        assert!(
            Instant::now() < end,
            "events posted while copies are answered 35 s late never landed: {}",
            c.log_tail(30)
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        rig.proxy.seen().iter().any(|r| r.is_copy()),
        "the growth made no copy: the test did not test the slow copy"
    );
    // Review r35j, D1 on the append path: every completion is conditional on the version it
    // grows from (moto does not check `If-Match` on a completion, so the header is what can
    // be checked here), so a late one cannot replace a newer version.
    let completions: Vec<_> = rig
        .proxy
        .seen()
        .into_iter()
        .filter(|r| r.method == "POST" && r.target.contains("uploadId="))
        .collect();
    assert!(!completions.is_empty(), "no multipart upload was completed");
    for r in &completions {
        assert!(
            r.header("if-match").is_some() || r.header("if-none-match") == Some("*"),
            "an unconditional completion: {} {:?}",
            r.target,
            r.headers
        );
    }
    let status = c.terminate(Duration::from_secs(180));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(40));
    assert!(
        in_bucket(&acked),
        "acknowledged events missing after SIGTERM"
    );
}

/// A body of `n` events of `job` with ids `{tag}-{i}` and a message: `pad` zeros when
/// `seed` is `None` (compresses to almost nothing), else `pad` random bytes in hex.
fn job_body(tag: &str, job: u32, n: usize, pad: usize, mut seed: Option<&mut u64>) -> Vec<u8> {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let msg = match seed.as_deref_mut() {
                None => "0".repeat(pad),
                Some(s) => (0..pad)
                    .map(|_| {
                        *s ^= *s << 13;
                        *s ^= *s >> 7;
                        *s ^= *s << 17;
                        format!("{:02x}", *s as u8)
                    })
                    .collect(),
            };
            event(&format!("{tag}-{i}"), job)
                .replace(r#""message":"""#, &format!(r#""message":"{msg}""#))
        })
        .collect();
    format!("[{}]", lines.join(",")).into_bytes()
}

/// Issue 35 review, item 2: the compression ratio changes (compressible lines first, so the
/// copy reserve learns its floor, then random ones): with a healthy store every acknowledged
/// event must reach the bucket within a few windows, not at the rotation (120 s). Main at
/// 40d3d47 cut each copy back when the budget refused it part way and tried again, the
/// same way, until the rotation.
#[test]
fn a_shift_in_the_compression_ratio_never_holds_events_back_until_rotation() {
    const BUDGET: u64 = 16 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let budget = BUDGET.to_string();
    let (mut c, bucket) = file_collector(
        tmp.path(),
        &[
            "--upload-window",
            "2s",
            "--rotation-interval",
            "120s",
            "--max-segment-bytes",
            "2MiB",
            "--max-spool-bytes",
            &budget,
        ],
    );
    let url = c.url("/v1/events");
    // Phase 1: 12 MiB of lines that compress to almost nothing (sealed at 2 MiB and
    // uploaded as they go).
    let mut sent = 0usize;
    let mut r = 0;
    let started = Instant::now();
    while sent < 12 << 20 && started.elapsed() < Duration::from_secs(60) {
        let b = job_body(&format!("z{r}"), 1, 100, 4000, None);
        if post_body(&url, &b) {
            sent += b.len();
            r += 1;
        } else {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    assert!(sent >= 12 << 20, "phase 1 not accepted in time");
    wait_for(&c, Duration::from_secs(30), "phase 1 uploaded", || {
        c.metric("rhc_spool_bytes") < (5 << 19) as f64
    });
    // Phase 2: random lines over 8 jobs until the first refusal.
    // Made first, so they arrive faster than copies are written.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let bodies: Vec<(String, Vec<u8>)> = (0..(BUDGET as usize / 100_000 + 20))
        .map(|r| {
            let tag = format!("r{r}");
            let b = job_body(&tag, 10 + r as u32 % 12, 100, 500, Some(&mut seed));
            (tag, b)
        })
        .collect();
    let mut acked: Vec<String> = Vec::new();
    for (tag, b) in &bodies {
        if !post_body(&url, b) {
            break;
        }
        acked.extend((0..100).map(|i| format!("{tag}-{i}")));
    }
    println!("phase 2: {} events acknowledged", acked.len());
    assert!(!acked.is_empty(), "nothing of phase 2 accepted");
    let missing = |c: &Collector| {
        let have = ids_in_file_bucket(&bucket);
        let _ = c;
        acked.iter().filter(|id| !have.contains(*id)).count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while missing(&c) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let left = missing(&c);
    assert_eq!(
        left,
        0,
        "{left} of {} acknowledged events not in the bucket 20 s after the last (window 2 s, rotation 120 s)\n{}",
        acked.len(),
        c.log_tail(20)
    );
    assert_eq!(c.metric("rhc_spool_accounting_errors_total"), 0.0);
    c.kill9();
}

/// Issue 35 review, item 3: as the switch above, and the spool's disk is full for the
/// record's small write (ENOSPC creating `growth/*.tmp`) for 3 s while the store refuses
/// deletes: the segments keep the key their record names (main at 40d3d47 removed the
/// record, dropped the state, uploaded the segment whole under the new key and forgot the
/// `.jsonl.gz` objects: every line twice, exit 0).
#[test]
fn a_compression_switch_whose_record_cannot_be_written_keeps_one_object() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let ids = grow_with_gzip_then_kill(&rig);
    let faults = Faults::build(rig.tmp.path());
    faults.arm("open", 28, 100_000, ".jsonl.tmp$");
    rig.proxy.add(
        Rule::new(Fault::Status(500, "InternalError".into()))
            .method("POST")
            .target_contains(DELETE_OBJECTS)
            .for_time(Duration::from_secs(8)),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--compression", "none"])
        .env(&faults.env())
        .start();
    std::thread::sleep(Duration::from_secs(3));
    faults.disarm("open");
    let spool = rig.tmp.path().join("spool");
    wait_for(&c, Duration::from_secs(60), "the segments uploaded", || {
        rhc_testkit::collector::files_under(&spool.join("events")).is_empty()
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    assert_eq!(delete_requests(&rig), 0, "a delete was sent");
    assert_one_object_per_partition(&event_objects(rig.objects()), &ids, ".jsonl.gz");
}

/// Review r35i, rule G: the spool's disk is full for growth files (every write under
/// `spool/growth/` fails ENOSPC), so the segments' records cannot be written and the seal
/// uploads them whole under gzip's key with no record on disk; kill -9 once those PUTs have
/// landed (their answers held), restart with `--compression none`. Each segment must keep
/// the key its object is under (found by one HEAD at the start): one `.jsonl.gz` object per
/// partition, every line once (main at 90808fc uploaded them again under `.jsonl`: every
/// line twice).
#[test]
fn an_unrecorded_whole_upload_killed_then_a_compression_switch_keeps_one_object() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let faults = Faults::build(rig.tmp.path());
    faults.arm("write", 28, 100_000, "/growth/");
    faults.arm("writev", 28, 100_000, "/growth/");
    rig.proxy.add(
        Rule::new(Fault::HoldAnswer(Duration::from_secs(60)))
            .method("PUT")
            .target_contains(".jsonl"),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--compression", "gzip"])
        .env(&faults.env())
        .start();
    let ids: Vec<String> = (0..300).map(|i| format!("u-{i}")).collect();
    post(&c, &ids, 2);
    let landed = || {
        rig.proxy
            .seen()
            .iter()
            .filter(|r| r.method == "PUT" && r.faulted && r.status == 200)
            .count()
    };
    wait_for(
        &c,
        Duration::from_secs(30),
        "2 whole uploads landed",
        || landed() >= 2,
    );
    c.kill9();
    let spool = rig.tmp.path().join("spool");
    let growth = if spool.join("growth").is_dir() {
        rhc_testkit::collector::files_under(&spool.join("growth"))
    } else {
        Vec::new()
    };
    assert!(
        growth
            .iter()
            .all(|p| !p.to_string_lossy().ends_with(".rec")),
        "a record was written: the disk was not full for it: {growth:?}"
    );
    assert!(
        !rhc_testkit::collector::files_under(&spool.join("events")).is_empty(),
        "the segments left the spool before the kill"
    );
    faults.disarm("write");
    faults.disarm("writev");
    rig.proxy.clear();
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--compression", "none"])
        .start();
    wait_for(&c, Duration::from_secs(60), "the segments uploaded", || {
        rhc_testkit::collector::files_under(&spool.join("events")).is_empty()
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    assert_one_object_per_partition(&event_objects(rig.objects()), &ids, ".jsonl.gz");
}

/// Blocks allocated to every file under `dir` but its `skip` subdirectory (the ids journal,
/// which the budget does not cover), bytes.
fn allocated_bytes(dir: &Path, skip: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    rhc_testkit::collector::files_under(dir)
        .iter()
        .filter(|p| !p.starts_with(dir.join(skip)))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Issue 35 review, item 4: many partitions with a small budget, healthy store: every file
/// the spool keeps (segments, and the shadows and records of their growth) counts a block,
/// so the blocks allocated under the spool stay within `--max-spool-bytes` (main at 40d3d47:
/// 2.3 times the budget, 1,600 growth files uncounted).
#[test]
fn many_partitions_keep_the_spool_within_its_budget_on_disk() {
    const BUDGET: u64 = 4 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let budget = BUDGET.to_string();
    let (mut c, _bucket) = file_collector(
        tmp.path(),
        &[
            "--upload-window",
            "1s",
            "--rotation-interval",
            "10m",
            "--max-spool-bytes",
            &budget,
            "--dedup-window",
            "1000",
        ],
    );
    let spool = tmp.path().join("spool");
    let mut worst = 0u64;
    let mut accepted = 0;
    for r in 0..60u32 {
        let ids: Vec<String> = (0..20).map(|i| format!("p{r}-{i}")).collect();
        let body = format!(
            "[{}]",
            ids.iter()
                .enumerate()
                .map(|(i, id)| event(id, r * 20 + i as u32))
                .collect::<Vec<_>>()
                .join(",")
        );
        if c.post(body.as_bytes()).status == 200 {
            accepted += 20;
        }
        if r % 10 == 9 {
            // Publications run: shadows and records appear.
            std::thread::sleep(Duration::from_millis(1500));
        }
        worst = worst.max(allocated_bytes(&spool, "dedup"));
    }
    std::thread::sleep(Duration::from_secs(3));
    worst = worst.max(allocated_bytes(&spool, "dedup"));
    println!("{accepted} partitions accepted; at most {worst} bytes allocated, budget {BUDGET}");
    assert!(accepted > 0, "nothing accepted");
    assert!(
        worst <= BUDGET,
        "the spool took {worst} bytes of disk, over its budget of {BUDGET} ({accepted} partitions accepted)\n{}",
        c.log_tail(20)
    );
    assert_eq!(c.metric("rhc_spool_accounting_errors_total"), 0.0);
    c.kill9();
}

/// Issue 35 review, item 6: a fresh start (no ratio measured, so the copy reserve is the
/// raw size) and one batch of about 68 % of `--max-spool-bytes`: an empty spool takes it
/// (main at 40d3d47 answered 503 on every retry).
#[test]
fn an_empty_spool_takes_a_batch_that_fits_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = file_collector(
        tmp.path(),
        &["--upload-window", "2s", "--max-spool-bytes", "8MiB"],
    );
    let big = job_body("big", 1, 3000, 1500, None);
    assert!(big.len() as u64 > (8 << 20) / 2, "{}", big.len());
    let r = c.post(&big);
    assert_eq!(
        r.status,
        200,
        "a batch of {} bytes on an empty spool of 8 MiB: {}",
        big.len(),
        String::from_utf8_lossy(&r.body)
    );
    wait_for(
        &c,
        Duration::from_secs(20),
        "the batch in the bucket",
        || ids_in_file_bucket(&bucket).len() == 3000,
    );
    c.kill9();
}

/// One run of review r35e's D1: a collector with `--compression from` (S3 behind moto) is
/// killed (-9, the fault shim) at the `nth` creation of a growth record's temporary file of
/// its first partition's first publication, then restarted with `--compression to`. The
/// bucket must end with one object (the new compression's) holding every event once.
fn first_publication_kill_then_switch(from: &str, to: &str, nth: u32) {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let faults = Faults::build(rig.tmp.path());
    faults.arm("open", -9, nth, ".jsonl.tmp$");
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--compression", from])
        .env(&faults.env())
        .start();
    let ids: Vec<String> = (0..1000).map(|i| format!("f-{i}")).collect();
    let body = format!(
        "[{}]",
        ids.iter()
            .map(|id| event(id, 1))
            .collect::<Vec<_>>()
            .join(",")
    );
    // The kill may come before the answer (the events are durable then, not acknowledged).
    let answered = rhc_testkit::http::try_http_request(
        "POST",
        &c.url("/v1/events"),
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .is_ok_and(|r| r.status == 200);
    let killed = c.wait_exit(Duration::from_secs(15)).is_ok();
    c.kill9();
    let before: Vec<String> = event_objects(rig.objects()).into_keys().collect();
    println!("{from} -> {to}, kill at record file {nth} (killed: {killed}, answered: {answered}); bucket before the restart: {before:?}");
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--compression", to])
        .start();
    let spool = rig.tmp.path().join("spool");
    wait_for(&c, Duration::from_secs(30), "the segment uploaded", || {
        rhc_testkit::collector::files_under(&spool.join("events")).is_empty()
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    let objects = event_objects(rig.objects());
    let keys: Vec<&String> = objects.keys().collect();
    assert_eq!(objects.len(), 1, "one object per partition: {keys:?}");
    // A segment whose record names a key keeps it (and its compression) across the switch.
    if let Some(first) = before.first() {
        assert_eq!(
            keys[0], first,
            "the key of the first publication was not kept"
        );
    }
    let mut count: HashMap<String, u32> = HashMap::new();
    for (k, v) in &objects {
        for id in object_ids(k, v) {
            *count.entry(id).or_default() += 1;
        }
    }
    let twice = count.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "{twice} events stored twice: {keys:?}");
    assert_eq!(count.len(), ids.len(), "every durable event once");
}

/// Review r35e, D1: a kill -9 between a segment's first publication (its object PUT) and its
/// first record, then a restart with the other `--compression`: main at c573aaf left both
/// objects (`.jsonl.gz` and `.jsonl`), every line twice, and exited 0, as nothing named the
/// key of that first PUT. Now a record naming the key is written (and fsync'd) before any
/// PUT under it: killed at that record (1st: nothing published) or at the one after the PUT
/// (2nd), the restart keeps the key the record names (r35h: no delete needed).
#[test]
fn a_kill_after_a_first_publication_then_a_compression_switch_keeps_one_object() {
    first_publication_kill_then_switch("gzip", "none", 1);
    first_publication_kill_then_switch("gzip", "none", 2);
    first_publication_kill_then_switch("none", "gzip", 1);
}

/// Posts one small event (job 2) until it is taken and `/readyz` says ready, for at most
/// `limit`; the time it took, or the last answers when it never was.
fn taken_again_within(c: &Collector, tag: &str, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let mut n = 0;
    loop {
        let r = c.post(format!("[{}]", event(&format!("{tag}-{n}"), 2)).as_bytes());
        n += 1;
        let ready = c.get("/readyz").map(|r| r.status).unwrap_or(0);
        if r.status == 200 && ready == 200 {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= limit {
            return Err(format!(
                "still {} ({}) and /readyz {ready} after {limit:?}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Review r35e, D2 (A): a healthy store, an empty spool of 8 MiB takes one batch of over
/// 90 % of it and publishes it within the window: the spool must free within a few windows
/// (the segment, already in the bucket, sealed), not at its rotation. Main at c573aaf
/// answered every request 503 "uploads are behind" (and `/readyz` 503) for 300.9 s, until
/// the rotation, with every event in the bucket.
#[test]
fn a_big_batch_already_in_the_bucket_frees_the_spool_within_the_window() {
    const BUDGET: u64 = 8 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let budget = BUDGET.to_string();
    let (mut c, bucket) = file_collector(
        tmp.path(),
        &[
            "--upload-window",
            "1s",
            "--rotation-interval",
            "10m",
            "--max-spool-bytes",
            &budget,
        ],
    );
    let big = job_body("big", 1, 4000, 1500, None);
    let share = big.len() as f64 / BUDGET as f64;
    assert!(share > 0.9 && share < 1.0, "{} bytes", big.len());
    let r = c.post(&big);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    wait_for(
        &c,
        Duration::from_secs(20),
        "the batch in the bucket",
        || ids_in_file_bucket(&bucket).len() == 4000,
    );
    let took = taken_again_within(&c, "small", Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tail(20)));
    println!(
        "a batch of {:.1} % of the budget in the bucket; requests taken again {took:?} later",
        share * 100.0
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    assert!(ids_in_file_bucket(&bucket).len() > 4000);
}

/// Review r35e, D2 (B): a healthy store, a 4 MiB budget and many small partitions (each open
/// one costs its segment, its copy and its record, about 12 KiB): `rhc_spool_segments`
/// counts segments (main at c573aaf: 3 per published partition, its copy and record too),
/// and once the spool reaches its high watermark with every event in the bucket, requests
/// are taken again within a few windows, not at the rotation (main: 503 "uploads are
/// behind" until the rotation).
#[test]
fn many_published_partitions_free_the_spool_within_the_window() {
    const BUDGET: u64 = 4 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let budget = BUDGET.to_string();
    let (mut c, bucket) = file_collector(
        tmp.path(),
        &[
            "--upload-window",
            "1s",
            "--rotation-interval",
            "10m",
            "--max-spool-bytes",
            &budget,
            "--dedup-window",
            "1000",
        ],
    );
    let spool = tmp.path().join("spool");
    let post_partitions = |r: u32| {
        let ids: Vec<String> = (0..20).map(|i| format!("p{r}-{i}")).collect();
        let body = format!(
            "[{}]",
            ids.iter()
                .enumerate()
                .map(|(i, id)| event(id, 100 + r * 20 + i as u32))
                .collect::<Vec<_>>()
                .join(",")
        );
        c.post(body.as_bytes())
    };
    // 100 partitions, well within the budget, all published (their copies and records made).
    for r in 0..5 {
        assert_eq!(post_partitions(r).status, 200);
    }
    wait_for(
        &c,
        Duration::from_secs(20),
        "100 partitions published",
        || {
            ids_in_file_bucket(&bucket).len() == 100
                && rhc_testkit::collector::files_under(&spool.join("growth")).len() >= 200
        },
    );
    let segments = rhc_testkit::collector::files_under(&spool.join("events")).len();
    assert_eq!(segments, 100);
    let mut wrong = Vec::new();
    let gauge = c.metric("rhc_spool_segments") as usize;
    if gauge != segments {
        wrong.push(format!(
            "rhc_spool_segments {gauge} with {segments} open segments (and their growth files)"
        ));
    }
    // Until the spool is at its high watermark (about 300 partitions), or 600 partitions.
    let mut accepted = 100;
    for r in 5..30 {
        let a = post_partitions(r);
        if a.status != 200 {
            println!(
                "refused after {accepted} partitions: {}",
                String::from_utf8_lossy(&a.body)
            );
            break;
        }
        accepted += 20;
    }
    wait_for(
        &c,
        Duration::from_secs(30),
        "every event in the bucket",
        || ids_in_file_bucket(&bucket).len() == accepted,
    );
    match taken_again_within(&c, "small", Duration::from_secs(15)) {
        Ok(took) => println!("{accepted} partitions in the bucket; requests taken {took:?} later"),
        Err(e) => wrong.push(format!("{accepted} partitions in the bucket: {e}")),
    }
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", c.log_tail(20));
    assert_eq!(c.metric("rhc_spool_accounting_errors_total"), 0.0);
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
}

/// The review r35h, item D: the spool's disk is full for the compressed copies (every write
/// to a shadow `growth/*.jsonl.gz` fails with ENOSPC, as when Ray's logs fill the emptyDir
/// they share) while the store is healthy. The acknowledged events must still reach the
/// bucket within a few windows, their segment uploaded whole (which needs no local disk),
/// and SIGTERM must end with exit 0 and nothing left (main at c6fb7f8: the copy retried
/// forever, the events out of the bucket until the rotation, whose seal then retried
/// forever too; SIGTERM exited 3 with the segment left).
#[test]
fn a_full_spool_disk_for_the_copies_still_gets_the_events_to_the_bucket() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    faults.arm("write", 28, 1_000_000, ".jsonl.gz$");
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let spool = tmp.path().join("spool");
    let mut c = Collector::start(
        &spool,
        &[
            "--storage",
            bucket.to_str().unwrap(),
            "--ray-tmp-dir",
            tmp.path().join("ray").to_str().unwrap(),
            "--upload-window",
            "1s",
            "--rotation-interval",
            "120s",
        ],
        &faults.env(),
    );
    let mut acked = Vec::new();
    for round in 0..2 {
        let ids: Vec<String> = (0..100).map(|i| format!("d{round}-{i}")).collect();
        post(&c, &ids, 1);
        acked.extend(ids.iter().cloned());
        // The rotation is 120 s away: only a whole upload gets them there this soon.
        wait_for(
            &c,
            Duration::from_secs(15),
            "acknowledged events in the bucket while the copies cannot be written",
            || {
                let have = ids_in_file_bucket(&bucket);
                ids.iter().all(|id| have.contains(id))
            },
        );
    }
    assert!(
        faults
            .log()
            .iter()
            .any(|(call, path, ok)| call == "write" && path.contains("/growth/") && !ok),
        "no write to a copy failed"
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
    assert!(
        rhc_testkit::collector::files_under(&spool.join("events")).is_empty(),
        "segments left in the spool"
    );
    let have = ids_in_file_bucket(&bucket);
    assert!(acked.iter().all(|id| have.contains(id)));
}

/// The review r35h, item E: segments sealed by size before any publication (batches over
/// `--max-segment-bytes`), uploaded whole, while the store fails long enough for the
/// uploader's retries to outlive the publisher's state (dropped every second): once the
/// store answers and everything is uploaded, the growth files the seals counted are all
/// given back, no more (main at c6fb7f8: the record made uncounted by the seal, then given
/// back by the retry: `rhc_spool_accounting_errors_total` 5 here).
#[test]
fn a_whole_upload_retried_gives_back_the_growth_files_it_counted() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig
        .collector()
        .only(&[
            "--upload-window",
            "10s",
            "--max-segment-bytes",
            "64KiB",
            "--max-spool-bytes",
            "256MiB",
        ])
        .start();
    rig.proxy.add(
        Rule::new(Fault::Status(500, "InternalError".into())).for_time(Duration::from_secs(8)),
    );
    let url = c.url("/v1/events");
    let mut seed = 0x5eed_u64;
    for n in 0..6 {
        assert!(post_body(
            &url,
            &padded_body(&format!("e{n}"), 200, 300, &mut seed)
        ));
    }
    let spool = rig.tmp.path().join("spool");
    wait_for(&c, Duration::from_secs(90), "the segments uploaded", || {
        rhc_testkit::collector::files_under(&spool.join("events")).is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.metric("rhc_spool_accounting_errors_total"),
        0.0,
        "{}",
        c.log_tail(30)
    );
    assert_eq!(c.metric("rhc_spool_segments"), 0.0);
    assert!(
        rhc_testkit::collector::files_under(&spool.join("growth")).is_empty(),
        "growth files left"
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
}

/// The review r35h, item H: a healthy store, 10 partitions with steady small traffic, and a
/// client retrying every 2 s a batch too big for the room `--max-spool-bytes` leaves (its
/// copies' reserve included), so sealing cannot make room for it: the refusals seal
/// nothing, and each small partition keeps one object (main at c6fb7f8 sealed every
/// published partition at each refusal, a new object each time: about 19 a minute each).
#[test]
fn a_refused_batch_that_sealing_cannot_help_seals_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = file_collector(
        tmp.path(),
        &["--upload-window", "2s", "--max-spool-bytes", "16MiB"],
    );
    let url = c.url("/v1/events");
    let mut seed = 0xb16_u64;
    // About 12 MiB of events that gzip halves at best: with their copies' reserve, more
    // than the 16 MiB budget beside anything.
    let big = padded_body("big", 6000, 1000, &mut seed);
    let start = Instant::now();
    let mut refused = 0;
    let mut last_big: Option<Instant> = None;
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(20) {
        let ids: Vec<String> = (0..20).map(|i| format!("h{n}-{i}")).collect();
        n += 1;
        // Jobs 2..12: the big batch is job 1.
        let body = format!(
            "[{}]",
            ids.iter()
                .enumerate()
                .map(|(i, id)| event(id, 2 + i as u32 % 10))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(c.post(body.as_bytes()).status, 200);
        if last_big.is_none_or(|t| t.elapsed() >= Duration::from_secs(2)) {
            last_big = Some(Instant::now());
            assert!(!post_body(&url, &big), "the big batch was taken");
            refused += 1;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(refused >= 8, "{refused} refusals");
    let objects: Vec<String> = rhc_testkit::collector::files_under(&bucket)
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| {
            p.contains("/job_events/")
                && rhc_testkit::collector::history_server_accepts(p)
                && !p.contains("/job_events/00000001/")
        })
        .collect();
    assert!(
        objects.len() <= 10,
        "{} objects for 10 partitions after {refused} refused batches\n{}",
        objects.len(),
        c.log_tail(10)
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(30));
}

/// Posts `n` events `<tag>-<i>` of `job`; their ids.
fn post_job(c: &Collector, tag: &str, n: usize, job: u32) -> Vec<String> {
    let body = job_body(tag, job, n, 0, None);
    let r = c.post(&body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    (0..n).map(|i| format!("{tag}-{i}")).collect()
}

/// Ids of the bucket starting with `prefix`.
fn in_bucket_with(rig: &MotoRig, prefix: &str) -> usize {
    id_counts(rig)
        .keys()
        .filter(|k| k.starts_with(prefix))
        .count()
}

/// Review r35r C1: a store that refuses the condition on completions only (400 to a
/// `CompleteMultipartUpload` carrying `If-Match` or `If-None-Match`) and takes it on PUTs:
/// main at 6731502 had every conditional PUT landing clear the completions' refusals, which
/// never lasted 30 s: the big partition (past 5 MiB, written as multipart uploads) never
/// reached the bucket and SIGTERM exited 3. Kinds of condition count on their own: the
/// completions go without theirs after 30 s, the PUTs keep theirs.
#[test]
fn a_store_refusing_only_completions_conditions_gets_them_unconditionally() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    for h in ["if-match", "if-none-match"] {
        rig.proxy.add(
            Rule::new(Fault::Status(400, "InvalidRequest".into()))
                .method("POST")
                .with_header(h),
        );
    }
    let mut c = rig
        .collector()
        .only(&["--upload-window", "2s", "--upload-part-bytes", "5MiB"])
        .env(&[SHORT_SPAN])
        .start();
    let url = c.url("/v1/events");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut big: Vec<String> = Vec::new();
    for b in 0..4 {
        let tag = format!("big{b}");
        assert!(post_body(&url, &padded_body(&tag, 500, 3000, &mut seed)));
        big.extend((0..500).map(|i| format!("{tag}-{i}")));
    }
    // The small partition keeps growing by conditional PUTs that land (on main at 6731502
    // each one cleared the completions' refusals): the big one must be in the bucket while
    // it does, the span (`REFUSAL_SPAN`, shortened here) and a few rounds after it was posted.
    let mut small: Vec<String> = Vec::new();
    let t0 = Instant::now();
    let mut i = 0;
    while in_bucket_with(&rig, "big") < big.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(75),
            "{} of {} events of the big partition in the bucket after {:?}: {}",
            in_bucket_with(&rig, "big"),
            big.len(),
            t0.elapsed(),
            c.log_tail(20)
        );
        small.extend(post_job(&c, &format!("s{i}"), 5, 2));
        i += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    let all: Vec<String> = big.iter().chain(&small).cloned().collect();
    wait_for(
        &c,
        Duration::from_secs(45),
        "every event in the bucket",
        || id_counts(&rig).len() == all.len(),
    );
    // The PUTs kept their conditions (landed with them), the completions went without.
    let kind =
        |k: &str| c.metric_labeled("rhc_conditional_writes_refused", &format!("kind=\"{k}\""));
    assert_eq!(kind("put_if_none_match"), 0.0);
    assert_eq!(kind("put_if_match"), 0.0);
    assert_eq!(
        kind("complete_if_none_match") + kind("complete_if_match"),
        2.0
    );
    assert_eq!(c.metric("rhc_event_conditional_writes"), 0.0);
    let conditional_puts = rig
        .proxy
        .seen()
        .iter()
        .filter(|r| r.method == "PUT" && r.header("if-match").is_some() && r.status == 200)
        .count();
    assert!(
        conditional_puts >= 5,
        "{conditional_puts} conditional PUTs landed"
    );
    let (status, took) = c
        .try_terminate(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        status.success(),
        "exit {status:?} after {took:?}: {}",
        c.log_tail(30)
    );
    assert_each_once(&rig, &all, "after SIGTERM");
}

/// Review r35r C2: a store that refuses `If-Match` (400, on PUTs and completions) and takes
/// `If-None-Match`: main at 6731502 had every new partition's create clear the refusals of
/// the growing partition's `If-Match` PUT, which never lasted: 10 of 500 of its events in
/// the bucket after 100 s. The `If-Match` writes go without their condition after 30 s;
/// creates keep theirs.
#[test]
fn a_store_refusing_only_if_match_gets_growth_unconditionally() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    for m in ["PUT", "POST"] {
        rig.proxy.add(
            Rule::new(Fault::Status(400, "InvalidArgument".into()))
                .method(m)
                .with_header("if-match"),
        );
    }
    let mut c = rig
        .collector()
        .only(&["--upload-window", "2s"])
        .env(&[SHORT_SPAN])
        .start();
    // New partitions keep coming (their creates land with If-None-Match: on main at 6731502
    // each one cleared the growing partition's If-Match refusals): the growth must reach the
    // bucket while they do, the span (`REFUSAL_SPAN`, shortened here) and a few rounds after
    // the refusals began.
    let mut acked: Vec<String> = Vec::new();
    let mut grown: Vec<usize> = Vec::new();
    let t0 = Instant::now();
    let mut i = 0u32;
    loop {
        acked.extend(post_job(&c, &format!("g{i}"), 10, 1));
        grown.push(10 * (i as usize + 1));
        if i.is_multiple_of(5) {
            acked.extend(post_job(&c, &format!("n{i}"), 5, 100 + i));
        }
        i += 1;
        std::thread::sleep(Duration::from_secs(2));
        // Everything of the growing partition posted 6 s ago is there, well past its first
        // write (a create, which lands).
        if i >= 10 && in_bucket_with(&rig, "g") >= grown[i as usize - 4] {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(80),
            "{} of {} events of the growing partition in the bucket after {:?}: {}",
            in_bucket_with(&rig, "g"),
            grown[i as usize - 1],
            t0.elapsed(),
            c.log_tail(20)
        );
    }
    wait_for(
        &c,
        Duration::from_secs(45),
        "every event in the bucket",
        || id_counts(&rig).len() == acked.len(),
    );
    let kind =
        |k: &str| c.metric_labeled("rhc_conditional_writes_refused", &format!("kind=\"{k}\""));
    assert_eq!(kind("put_if_none_match"), 0.0, "creates turned off");
    assert_eq!(kind("put_if_match"), 1.0);
    // Creates after the switch still carry If-None-Match: every partition's create did.
    let partitions = 2 + acked.iter().filter(|i| i.starts_with('n')).count() / 5;
    acked.extend(post_job(&c, "late", 5, 999));
    wait_for(&c, Duration::from_secs(20), "a new partition", || {
        in_bucket_with(&rig, "late") == 5
    });
    let creates = rig
        .proxy
        .seen()
        .iter()
        .filter(|r| r.method == "PUT" && r.header("if-none-match").is_some() && r.status == 200)
        .count();
    assert!(
        creates >= partitions,
        "{creates} conditional creates landed for {partitions} partitions"
    );
    let (status, took) = c
        .try_terminate(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        status.success(),
        "exit {status:?} after {took:?}: {}",
        c.log_tail(30)
    );
    assert_each_once(&rig, &acked, "after SIGTERM");
}

/// Review r35r S2, against a store that takes conditions (moto): a fresh run's first create
/// (`If-None-Match`) is in flight at SIGTERM and answered ONE 403 after it (a gateway's
/// passing refusal). Main at 6731502 sent its twin without the condition at once; held
/// 40 s by the network, the twin landed after the next run had uploaded the whole segment:
/// 100 of 200 acknowledged events lost. At shutdown one refusal has the write tried again
/// with its condition (the late one then meets the next run's object: 412).
#[test]
fn one_passing_403_at_shutdown_sends_no_twin_without_the_condition() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::DelayThenStatus(
            Duration::from_secs(3),
            403,
            "AccessDenied".into(),
        ))
        .method("PUT")
        .target_contains(".jsonl")
        .with_header("if-none-match")
        .times(1),
    );
    rig.proxy.add(
        Rule::new(Fault::Delay(Duration::from_secs(40)))
            .method("PUT")
            .target_contains(".jsonl")
            .times(1),
    );
    let args = ["--upload-window", "1s", "--shutdown-timeout", "4s"];
    let mut c = rig.collector().only(&args).start();
    let mut acked = post_job(&c, "b1", 100, 1);
    wait_for(
        &c,
        Duration::from_secs(10),
        "the first create at the proxy",
        || {
            rig.proxy
                .arrived()
                .iter()
                .any(|(m, t)| m == "PUT" && t.contains(".jsonl"))
        },
    );
    acked.extend(post_job(&c, "b2", 100, 1));
    let _ = c
        .try_terminate(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    c.restart();
    wait_for(
        &c,
        Duration::from_secs(30),
        "B1+B2 from the next run",
        || id_counts(&rig).len() == 200,
    );
    wait_for(
        &c,
        Duration::from_secs(60),
        "the held PUT passed on",
        || rig.proxy.seen().len() >= rig.proxy.arrived().len(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert_each_once(&rig, &acked, "after the held PUT landed");
}

/// Review r35r D3 (r35k D1): a run with `--storage-root-dir rootA` has its first create
/// (`If-None-Match`) held 15 s by the network and is killed; the restart with
/// `--storage-root-dir rootB` publishes the segment under rootB and deletes rootA's object;
/// then the held create lands under rootA (the key is absent again). Main at 6731502 left
/// both: 100 of 200 events stored twice across roots, nothing reported. The key deleted is
/// looked at again until no write of the killed run can land, and deleted again.
#[test]
fn a_late_create_under_the_old_root_after_a_root_switch_is_deleted_again() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::Delay(Duration::from_secs(15)))
            .method("PUT")
            .target_contains(".jsonl")
            .with_header("if-none-match")
            .times(1),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--storage-root-dir", "rootA"])
        .start();
    let a = post_job(&c, "a", 100, 1);
    wait_for(
        &c,
        Duration::from_secs(20),
        "the create at the proxy",
        || {
            rig.proxy
                .arrived()
                .iter()
                .any(|(m, t)| m == "PUT" && t.contains(".jsonl"))
        },
    );
    std::thread::sleep(Duration::from_millis(300));
    c.kill9();
    let held_at = Instant::now();
    let mut c2 = rig
        .collector()
        .only(&["--upload-window", "1s", "--storage-root-dir", "rootB"])
        .start();
    let b = post_job(&c2, "b", 100, 1);
    let acked: Vec<String> = a.iter().chain(&b).cloned().collect();
    wait_for(&c2, Duration::from_secs(40), "A+B", || {
        id_counts(&rig).len() >= 200
    });
    wait_for(
        &c2,
        Duration::from_secs(40),
        "the held create passed on",
        || rig.proxy.seen().len() >= rig.proxy.arrived().len(),
    );
    assert!(
        held_at.elapsed() >= Duration::from_secs(14),
        "the create was not held"
    );
    // Looked at every second while one key is watched.
    wait_for(&c2, Duration::from_secs(5), "each event once", || {
        id_counts(&rig).values().all(|n| *n == 1)
    });
    // It was the late create that was deleted again (not refused: the key was absent).
    assert!(
        c2.log_text().contains("deleted again"),
        "no late write deleted again: {}",
        c2.log_tail(30)
    );
    let status = c2.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c2.log_tail(30));
    assert_each_once(&rig, &acked, "after SIGTERM");
    let objects = event_objects(rig.objects());
    assert!(
        objects.keys().all(|k| k.starts_with("rootB/")),
        "objects outside rootB: {:?}",
        objects.keys().collect::<Vec<_>>()
    );
}

/// Review r35s D1: the store takes conditions (moto). A fresh run's first create
/// (If-None-Match) is refused 403 twice before the SIGTERM (retried half a window apart);
/// its third try is in flight at the SIGTERM and answered one 403 during the shutdown. At
/// shutdown a write goes without its condition only after three refusals of the shutdown's
/// own tries about 1 s apart (docs/guarantees.md); the refusals before it counted too, and
/// the twin went at once; held 40 s by the network, it landed after the next run's upload:
/// 100 of 200 events lost (c83b0c9, 2 of 2 runs). Now the twin is never sent.
#[test]
fn refusals_before_the_shutdown_do_not_send_a_twin_during_it() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let create = |fault: Fault, times: usize| {
        Rule::new(fault)
            .method("PUT")
            .target_contains(".jsonl")
            .with_header("if-none-match")
            .times(times)
    };
    rig.proxy
        .add(create(Fault::Status(403, "AccessDenied".into()), 2));
    rig.proxy.add(create(
        Fault::DelayThenStatus(Duration::from_secs(3), 403, "AccessDenied".into()),
        1,
    ));
    rig.proxy.add(
        Rule::new(Fault::Delay(Duration::from_secs(40)))
            .method("PUT")
            .target_contains(".jsonl")
            .times(1),
    );
    let mut c = rig
        .collector()
        .only(&["--upload-window", "1s", "--shutdown-timeout", "4s"])
        .start();
    let b1: Vec<String> = (0..100).map(|i| format!("b1-{i}")).collect();
    post(&c, &b1, 1);
    wait_for(
        &c,
        Duration::from_secs(20),
        "the third create at the proxy",
        || {
            rig.proxy
                .arrived()
                .iter()
                .filter(|(m, t)| m == "PUT" && t.contains(".jsonl"))
                .count()
                >= 3
        },
    );
    let b2: Vec<String> = (0..100).map(|i| format!("b2-{i}")).collect();
    post(&c, &b2, 1);
    let acked = [b1, b2].concat();
    let _ = c.try_terminate(Duration::from_secs(60)).unwrap();
    c.restart();
    wait_for(
        &c,
        Duration::from_secs(30),
        "B1+B2 from the next run",
        || id_counts(&rig).len() == acked.len(),
    );
    wait_until_the_late_put_landed(&rig, &c);
    std::thread::sleep(Duration::from_secs(3));
    let exit = c.terminate(Duration::from_secs(60));
    assert!(exit.success(), "{exit}: {}", c.log_tail(30));
    assert_each_once(&rig, &acked, "after the held PUT passed on");
}

/// Keys watched for late writes whose time is over, on S3 with the documented policy (no
/// `s3:ListBucket`): a HEAD of a missing key is answered 403, not 404. They are let go after
/// one look, not looked at every second for good (review r35s D2: three past-due keys were
/// HEADed three times a second with no end).
#[test]
fn past_due_keys_whose_head_is_refused_are_let_go() {
    let Some(rig) = s3_rig() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AccessDenied".into()))
            .method("HEAD")
            .target_contains("rootOld"),
    );
    let mut c = rig.collector().only(&["--upload-window", "1s"]).start();
    c.kill9();
    let past = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 60;
    let keys: Vec<String> = (0..3)
        .map(|i| {
            format!("rootOld/{BUCKET}/{SESSION}/node_events/p{i}/segment-000000000001.jsonl.gz")
        })
        .collect();
    let body = format!(
        "[{}]",
        keys.iter()
            .map(|k| format!(r#"{{"key":"{k}","until":{past}}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    let file = c.spool.join("stale-keys.json");
    std::fs::write(&file, &body).unwrap();
    let mut c = rig.collector().only(&["--upload-window", "1s"]).start();
    let ids: Vec<String> = (0..20).map(|i| format!("d2-{i}")).collect();
    post(&c, &ids, 1);
    wait_for(&c, Duration::from_secs(20), "the keys let go", || {
        !file.exists()
    });
    std::thread::sleep(Duration::from_secs(3));
    let looks = |m: &str| {
        rig.proxy
            .seen()
            .iter()
            .filter(|r| r.method == m && r.target.contains("rootOld"))
            .count()
    };
    let heads = looks("HEAD");
    assert!(heads <= 3, "past-due keys still looked at: {heads} HEADs");
    assert!(looks("DELETE") <= 3, "{} DELETEs", looks("DELETE"));
    c.terminate_ok(Duration::from_secs(30));
    assert_each_once(&rig, &ids, "after the exit");
}

// ------------------------------------------------------------------ Azure (Azurite)

const AZ_CONTAINER: &str = "window";

/// Azurite behind the recording proxy, the container [`AZ_CONTAINER`] made.
struct AzRig {
    az: rhc_testkit::services::Azurite,
    proxy: rhc_testkit::fault_proxy::FaultProxy,
    container: String,
    store: Arc<dyn ObjectStore>,
}

fn az_rig() -> Option<AzRig> {
    let az = rhc_testkit::services::Azurite::start()?;
    az.create_container(AZ_CONTAINER);
    let proxy =
        rhc_testkit::fault_proxy::FaultProxy::start(&format!("127.0.0.1:{}", az.port)).unwrap();
    let store = az.store(AZ_CONTAINER);
    Some(AzRig {
        az,
        proxy,
        container: AZ_CONTAINER.into(),
        store,
    })
}

impl AzRig {
    /// From now on, the container `name` (made now).
    fn use_container(&mut self, name: &str) {
        self.az.create_container(name);
        self.container = name.into();
        self.store = self.az.store(name);
    }

    /// A collector writing to the container through the proxy.
    fn collector(&self, tmp: &Path, extra: &[&str]) -> Collector {
        let ray = tmp.join("ray");
        let storage = format!("az://{}", self.container);
        let mut args = vec![
            "--storage",
            &storage,
            "--ray-tmp-dir",
            ray.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let cs = self.az.connection_string_via(&self.proxy.url());
        Collector::start(
            &tmp.join("spool"),
            &args,
            &[("AZURE_STORAGE_CONNECTION_STRING", &cs)],
        )
    }

    fn objects(&self) -> BTreeMap<String, Vec<u8>> {
        event_objects(read_all(&self.store))
    }

    /// Bytes of blob bodies sent for `key` (Put Blob and Put Block answered 2xx), and the
    /// commits of block lists to it.
    fn sent_for(&self, key: &str) -> (u64, usize) {
        let path = format!("/{}/{}/{key}", self.az.account, self.container);
        let mut bytes = 0;
        let mut commits = 0;
        for r in self.proxy.seen() {
            let (p, query) = r.target.split_once('?').unwrap_or((&r.target, ""));
            if r.method != "PUT"
                || r.status / 100 != 2
                || ray_history_collector::storage::s3::url_decode(p).as_deref()
                    != Some(path.as_bytes())
            {
                continue;
            }
            if query.contains("comp=blocklist") {
                commits += 1;
            } else {
                bytes += r
                    .header("content-length")
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        (bytes, commits)
    }
}

/// Every id of `ids` in `objects` exactly once, and nothing else.
fn assert_each_once_in(objects: &BTreeMap<String, Vec<u8>>, ids: &[String]) {
    let mut count: HashMap<String, u32> = HashMap::new();
    for (k, v) in objects {
        for id in version_ids(k, v) {
            *count.entry(id).or_default() += 1;
        }
    }
    for id in ids {
        assert_eq!(count.get(id), Some(&1), "{id}");
    }
    assert_eq!(count.len(), ids.len(), "lines that were never acknowledged");
}

/// Azure: objects grow by block lists, every version a reader sees whole gzip members and a
/// prefix of the next, and only the new bytes cross the network: the bodies sent for each
/// object add up to its final size (issue 35, item 5).
#[test]
fn azure_objects_grow_by_block_lists_sending_only_new_bytes() {
    let Some(rig) = az_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(tmp.path(), &["--upload-window", "1s"]);
    let s2 = rig.store.clone();
    let poller = Poller::start(move || read_all(&s2));
    let acked = post_steadily(&c, "z", Duration::from_secs(5), 20, 2);
    std::thread::sleep(Duration::from_secs(1));
    let grew = poller.finish();
    let appends = c.metric_labeled("rhc_event_publications_total", "how=\"append\"");
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(40));
    assert!(
        grew >= 3,
        "the objects grew only {grew} times while watched"
    );
    let objects = rig.objects();
    assert_eq!(objects.len(), 2, "{:?}", objects.keys());
    let ids: Vec<String> = acked.into_iter().flat_map(|(_, ids)| ids).collect();
    assert_each_once_in(&objects, &ids);
    for (k, v) in &objects {
        let (sent, commits) = rig.sent_for(k);
        assert!(commits >= 4, "{k}: {commits} block lists committed");
        assert_eq!(
            sent,
            v.len() as u64,
            "{k}: {sent} bytes of blob bodies sent for an object of {} bytes ({commits} commits): each version sent whole?",
            v.len()
        );
    }
    assert!(appends >= 6.0, "{appends} appends");
}

/// Azure: kill -9 mid-growth and restart with the spool kept: nothing lost, nothing twice;
/// also when another writer replaced the blobs in between (a whole Put Blob with a member
/// the record does not know of): the collector writes them whole, never appends to them.
#[test]
fn azure_kill_and_restart_and_a_blob_replaced_behind_our_back() {
    let Some(mut rig) = az_rig() else { return };
    for replaced in [false, true] {
        rig.use_container(if replaced { "replaced" } else { "killed" });
        let tmp = tempfile::tempdir().unwrap();
        let mut c = rig.collector(tmp.path(), &["--upload-window", "1s"]);
        let tag = if replaced { "r" } else { "k" };
        let a: Vec<String> = (0..200).map(|i| format!("{tag}a-{i}")).collect();
        post(&c, &a, 2);
        std::thread::sleep(Duration::from_millis(2500));
        // Not all published yet: the restart's seal grows the objects by them.
        let b: Vec<String> = (0..200).map(|i| format!("{tag}b-{i}")).collect();
        post(&c, &b, 2);
        c.kill9();
        let mine = rig.objects();
        assert_eq!(mine.len(), 2, "{:?}", mine.keys());
        if replaced {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            for (k, v) in &mine {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), Default::default());
                std::io::Write::write_all(&mut gz, format!("{}\n", event("ghost", 0)).as_bytes())
                    .unwrap();
                let mut body = v.clone();
                body.extend_from_slice(&gz.finish().unwrap());
                rt.block_on(object_store::ObjectStoreExt::put(
                    &rig.store,
                    &object_store::path::Path::from(k.as_str()),
                    body.into(),
                ))
                .unwrap();
            }
        }
        c.restart();
        let more: Vec<String> = (0..100).map(|i| format!("{tag}c-{i}")).collect();
        post(&c, &more, 2);
        std::thread::sleep(Duration::from_millis(2500));
        let status = c.terminate(Duration::from_secs(30));
        assert!(status.success(), "{}", c.log_tail(40));
        if replaced {
            let log = c.log_tail(400);
            assert!(
                log.contains("the object is not as last published; uploading it whole"),
                "the replaced blobs were not found changed:\n{log}"
            );
        }
        // The two objects grown before the kill, and the two of the new segments.
        let objects = rig.objects();
        assert_eq!(objects.len(), 4, "{:?}", objects.keys());
        assert!(mine.keys().all(|k| objects.contains_key(k)));
        let all: Vec<String> = a.iter().chain(&b).chain(&more).cloned().collect();
        assert_each_once_in(&objects, &all);
    }
}

/// Every event id in the container's objects, with how many times it is there.
fn az_id_counts(rig: &AzRig) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (k, v) in rig.objects() {
        for id in version_ids(&k, &v) {
            *counts.entry(id).or_default() += 1;
        }
    }
    counts
}

/// Azure, as review r35j D1 on S3: the commit of a growth (Put Block List of A+B) delivered
/// 4 s late, after a kill -9 and a restart whose seal committed A+B+C, is refused (412: its
/// `If-Match` names the version it grew from) instead of replacing it: every acknowledged
/// event stays, once.
#[test]
fn azure_a_commit_delivered_late_after_a_restart_replaces_nothing() {
    let Some(rig) = az_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(tmp.path(), &["--upload-window", "1s"]);
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    wait_for(&c, Duration::from_secs(30), "A in the bucket", || {
        az_id_counts(&rig).len() == 100
    });
    let before = rig.proxy.arrived().len();
    rig.proxy.add(
        Rule::new(Fault::Delay(Duration::from_secs(4)))
            .method("PUT")
            .target_contains("comp=blocklist"),
    );
    let b: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    post(&c, &b, 1);
    wait_for(
        &c,
        Duration::from_secs(30),
        "the commit of B at the proxy",
        || {
            rig.proxy.arrived()[before..]
                .iter()
                .any(|(m, t)| m == "PUT" && t.contains("comp=blocklist"))
        },
    );
    let cc: Vec<String> = (0..100).map(|i| format!("c-{i}")).collect();
    post(&c, &cc, 1);
    c.kill9();
    rig.proxy.clear();
    c.restart();
    let acked: Vec<String> = a.into_iter().chain(b).chain(cc).collect();
    wait_for(
        &c,
        Duration::from_secs(30),
        "A+B+C after the restart",
        || az_id_counts(&rig).len() == 300,
    );
    wait_for(
        &c,
        Duration::from_secs(60),
        "the late commit passed on",
        || rig.proxy.seen().len() >= rig.proxy.arrived().len(),
    );
    assert_each_once_in(&rig.objects(), &acked);
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(30));
    assert_each_once_in(&rig.objects(), &acked);
    assert!(
        rig.proxy.seen().iter().any(|r| r.method == "PUT"
            && r.status == 412
            && r.target.contains("comp=blocklist")
            && r.header("if-match").is_some()),
        "no conditional commit was refused: the late one did not meet its condition"
    );
}

/// Azure: a blob whose next block would pass the most committed blocks (Azure's 50,000; 4
/// here, RHC_TEST_AZURE_MAX_BLOCKS) is written whole as fewer blocks and grows on from
/// there: every version whole and a prefix of the next, every event once.
#[test]
fn azure_a_blob_at_the_block_limit_is_written_whole_and_grows_on() {
    let Some(rig) = az_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let storage = format!("az://{}", rig.container);
    let cs = rig.az.connection_string_via(&rig.proxy.url());
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            &storage,
            "--ray-tmp-dir",
            ray.to_str().unwrap(),
            "--upload-window",
            "1s",
        ],
        &[
            ("AZURE_STORAGE_CONNECTION_STRING", &cs),
            ("RHC_TEST_AZURE_MAX_BLOCKS", "4"),
        ],
    );
    let s2 = rig.store.clone();
    let poller = Poller::start(move || read_all(&s2));
    let acked = post_steadily(&c, "l", Duration::from_secs(4), 20, 1);
    std::thread::sleep(Duration::from_secs(1));
    let grew = poller.finish();
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(40));
    assert!(grew >= 5, "the object grew only {grew} times while watched");
    let log = c.log_tail(2000);
    assert!(
        log.contains("would pass the 4 a blob may have"),
        "never written whole at the block limit:\n{log}"
    );
    let ids: Vec<String> = acked.into_iter().flat_map(|(_, ids)| ids).collect();
    assert_each_once_in(&rig.objects(), &ids);
}

impl AzRig {
    /// Put Blob requests (a PUT of the blob without `comp=`) answered 2xx for `key` among
    /// the requests the proxy saw from the `from`-th on.
    fn put_blobs_to(&self, key: &str, from: usize) -> usize {
        let path = format!("/{}/{}/{key}", self.az.account, self.container);
        self.proxy.seen()[from..]
            .iter()
            .filter(|r| {
                let (p, query) = r.target.split_once('?').unwrap_or((&r.target, ""));
                r.method == "PUT"
                    && r.status / 100 == 2
                    && !query.contains("comp=")
                    && ray_history_collector::storage::s3::url_decode(p).as_deref()
                        == Some(path.as_bytes())
            })
            .count()
    }
}

/// Review r35a D1: Azure takes a Put Block only with an id as long as those of the blob's
/// uncommitted blocks (400 `InvalidBlobOrBlock` otherwise). A block another writer left
/// uncommitted on a growing blob with ids of another length (16 bytes here) wedged the
/// object at f35a 5dada2b: its appends and its whole upload (as blocks) both refused, the
/// events after it never stored, exit 3 at SIGTERM. The whole upload falls back on one
/// conditional Put Blob, which Azure lets discard the uncommitted blocks. A block with
/// `object_store`'s id length (an older version killed during a multipart upload of the
/// object: the upgrade path) does not clash at all: our ids are as long, and that blob keeps
/// growing by blocks.
#[test]
fn azure_a_foreign_uncommitted_block_of_another_id_length_wedges_nothing() {
    let Some(rig) = az_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--upload-window", "1s", "--shutdown-timeout", "5s"];
    let mut c = rig.collector(tmp.path(), &args);
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 2);
    wait_for(&c, Duration::from_secs(30), "A in the bucket", || {
        az_id_counts(&rig).len() == 100
    });
    let keys: Vec<String> = rig.objects().into_keys().collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    rig.az
        .stage_block(&rig.container, &keys[0], "0123456789abcdef", b"junk");
    // As an older version killed during a multipart upload of the object leaves it: one part
    // put by object_store, never completed (a client of its own, whose connections go with
    // its runtime, not left idle in the rig's).
    let writer = rig.az.store(&rig.container);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut upload = writer
                .put_multipart(&object_store::path::Path::from(keys[1].as_str()))
                .await
                .unwrap();
            upload.put_part(b"junk".to_vec().into()).await.unwrap();
        });
    drop(writer);
    let from = rig.proxy.seen().len();
    let b: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    post(&c, &b, 2);
    wait_for(&c, Duration::from_secs(30), "B in the bucket", || {
        az_id_counts(&rig).len() == 200
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(40));
    let all: Vec<String> = a.into_iter().chain(b).collect();
    assert_each_once_in(&rig.objects(), &all);
    assert!(
        rig.put_blobs_to(&keys[0], from) >= 1,
        "the blob with the foreign block was not written with a Put Blob"
    );
    assert_eq!(
        rig.put_blobs_to(&keys[1], from),
        0,
        "a block with object_store's id length clashed with ours: {}",
        c.log_tail(60)
    );
}

/// Swaps the first two `<Block>` elements of an answer (a Get Block List's): the same
/// blocks, the same length, in another order.
fn swap_first_two_blocks(answer: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(answer).into_owned();
    let spans: Vec<(usize, usize)> = text
        .match_indices("<Block>")
        .filter_map(|(i, _)| text[i..].find("</Block>").map(|e| (i, i + e + 8)))
        .take(2)
        .collect();
    match spans[..] {
        [(a0, a1), (b0, b1)] if a1 == b0 => format!(
            "{}{}{}{}",
            &text[..a0],
            &text[b0..b1],
            &text[a0..a1],
            &text[b1..]
        )
        .into_bytes(),
        _ => answer.to_vec(),
    }
}

/// Review r35a D2: a Get Block List listing the blob's own blocks in another order was
/// committed as it stood, with the new block after them: an object whose lines are out of
/// order (f35a 5dada2b). The ids' indexes must run 0, 1, 2, ... (else: written whole).
#[test]
fn azure_a_block_list_in_another_order_is_not_committed_as_it_stands() {
    let Some(rig) = az_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(tmp.path(), &["--upload-window", "1s"]);
    let mut acked: Vec<String> = Vec::new();
    for round in 0..3 {
        if round == 2 {
            // The blob now has two blocks (a first version, then an append).
            rig.proxy.add(
                Rule::new(Fault::Rewrite(swap_first_two_blocks))
                    .method("GET")
                    .target_contains("comp=blocklist")
                    .times(1),
            );
        }
        let ids: Vec<String> = (0..50).map(|i| format!("r{round}-{i}")).collect();
        post(&c, &ids, 1);
        acked.extend(ids);
        wait_for(
            &c,
            Duration::from_secs(30),
            "the round in the bucket",
            || az_id_counts(&rig).len() == acked.len(),
        );
    }
    assert!(
        rig.proxy
            .seen()
            .iter()
            .any(|r| r.method == "GET" && r.faulted && r.target.contains("comp=blocklist")),
        "no block list was reordered"
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(40));
    let objects = rig.objects();
    assert_eq!(objects.len(), 1, "{:?}", objects.keys());
    for (k, v) in &objects {
        assert_eq!(version_ids(k, v), acked, "{k}: lines out of order");
    }
}

/// Review r35a (observation): credentials that cannot read blobs (a SAS without read) have
/// every Get Block List refused 403. f35a 5dada2b asked and warned at every publication of
/// every partition, for ever, then uploaded whole. One refusal turns appends off on that
/// store for the run, said once; every version is then written whole, and nothing is lost.
#[test]
fn azure_a_block_list_refused_for_lack_of_read_turns_appends_off_once() {
    let Some(rig) = az_rig() else { return };
    rig.proxy.add(
        Rule::new(Fault::Status(403, "AuthorizationPermissionMismatch".into()))
            .method("GET")
            .target_contains("comp=blocklist"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(tmp.path(), &["--upload-window", "1s"]);
    let mut acked: Vec<String> = Vec::new();
    for round in 0..4 {
        let ids: Vec<String> = (0..40).map(|i| format!("s{round}-{i}")).collect();
        post(&c, &ids, 2);
        acked.extend(ids);
        wait_for(
            &c,
            Duration::from_secs(30),
            "the round in the bucket",
            || az_id_counts(&rig).len() == acked.len(),
        );
    }
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(40));
    assert_each_once_in(&rig.objects(), &acked);
    let asked = rig
        .proxy
        .seen()
        .iter()
        .filter(|r| r.method == "GET" && r.target.contains("comp=blocklist"))
        .count();
    // Two partitions may ask at once before the first answer.
    assert!(asked <= 2, "{asked} block lists asked for after a 403");
    let log = c.log_text();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("Get Block List"))
        .count();
    assert_eq!(warned, 1, "{log}");
    assert!(
        !log.contains("the store refused to append"),
        "a refusal warned per publication: {log}"
    );
}

// ------------------------------------------------------------------ GCS (gcsemulator + moto)

const GS_BUCKET: &str = "gcswindow";

/// One GCS host behind the recording proxy: its JSON API is gcsemulator (which honours
/// `ifGenerationMatch` on uploads, deletes and compose), its XML API moto (the session
/// marker, and anything else `object_store` writes). Event objects grown by compose are
/// gcsemulator's; a segment uploaded whole by the uploader (never published) is moto's.
struct GsRig {
    emu: rhc_testkit::services::GcsEmu,
    _moto: rhc_testkit::services::MotoS3,
    proxy: rhc_testkit::fault_proxy::FaultProxy,
    xml: Arc<dyn ObjectStore>,
}

fn gs_rig() -> Option<GsRig> {
    let emu = rhc_testkit::services::GcsEmu::start()?;
    let moto = rhc_testkit::services::MotoS3::start()?;
    moto.create_bucket(GS_BUCKET);
    let proxy = rhc_testkit::fault_proxy::FaultProxy::start_gcs(
        &format!("127.0.0.1:{}", moto.port),
        &format!("127.0.0.1:{}", emu.port),
    )
    .unwrap();
    let xml = rhc_testkit::services::moto_client(&moto.endpoint, GS_BUCKET).unwrap();
    Some(GsRig {
        emu,
        _moto: moto,
        proxy,
        xml,
    })
}

impl GsRig {
    /// A collector writing to `gs://GS_BUCKET/<root>` through the proxy.
    fn collector(&self, tmp: &Path, root: &str, extra: &[&str], env: &[(&str, &str)]) -> Collector {
        let ray = tmp.join("ray");
        let storage = format!("gs://{GS_BUCKET}/{root}");
        let mut args = vec![
            "--storage",
            &storage,
            "--ray-tmp-dir",
            ray.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let url = self.proxy.url();
        // The rig's two halves are two servers (GCS has one bucket): a version written
        // through XML while the probe of the JSON API runs would be in the other half.
        let mut all_env = vec![
            ("GOOGLE_BASE_URL", url.as_str()),
            ("GOOGLE_BEARER_TOKEN", "test-token"),
            (ray_history_collector::storage::TEST_GCS_PROBE_FIRST, "1"),
        ];
        all_env.extend_from_slice(env);
        Collector::start(&tmp.join("spool"), &args, &all_env)
    }

    /// The event objects under `root/`: gcsemulator's and moto's (never under one key in
    /// both).
    fn objects(&self, root: &str) -> BTreeMap<String, Vec<u8>> {
        let prefix = format!("{root}/");
        let json = event_objects(self.emu.objects(GS_BUCKET, &prefix));
        let xml: BTreeMap<String, Vec<u8>> = event_objects(read_all(&self.xml))
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .collect();
        for k in xml.keys() {
            assert!(!json.contains_key(k), "{k} in both halves of the bucket");
        }
        json.into_iter().chain(xml).collect()
    }

    /// Part objects in the bucket (GCS's JSON half).
    fn parts(&self) -> Vec<String> {
        self.emu
            .list(GS_BUCKET, "")
            .into_iter()
            .map(|o| o.name)
            .filter(|n| n.ends_with(ray_history_collector::storage::append::GCS_PART_SUFFIX))
            .collect()
    }

    /// Bytes of media uploads answered 2xx for `key` (whole versions) and for its part (new
    /// members; not the one test upload of 6 bytes a run makes to decide whether compose is
    /// conditional), and of XML PUTs of `key` (whole versions through object_store), and the
    /// composes onto `key` answered 2xx.
    fn sent_for(&self, key: &str) -> (u64, usize) {
        let (sizes, composes) = self.sent_sizes(key);
        (sizes.iter().sum(), composes)
    }

    /// [`GsRig::sent_for`]'s bodies one by one, in the order sent.
    fn sent_sizes(&self, key: &str) -> (Vec<u64>, usize) {
        let xml_path = format!("/{GS_BUCKET}/{key}");
        let part = ray_history_collector::storage::append::part_name(key);
        let compose = format!(
            "/storage/v1/b/{GS_BUCKET}/o/{}/compose",
            rhc_testkit::services::percent_encode(key, false)
        );
        let mut bytes = Vec::new();
        let mut composes = 0;
        for r in self.proxy.seen() {
            let len = r
                .header("content-length")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            let path = r
                .target
                .split_once('?')
                .map_or(r.target.as_str(), |(p, _)| p);
            if r.method == "PUT"
                && r.status / 100 == 2
                && ray_history_collector::storage::s3::url_decode(path).as_deref()
                    == Some(xml_path.as_bytes())
            {
                bytes.push(len);
                continue;
            }
            if r.method != "POST" || r.status / 100 != 2 {
                continue;
            }
            if r.target.starts_with(&compose) {
                composes += 1;
                continue;
            }
            if !r.target.starts_with("/upload/storage/v1/") {
                continue;
            }
            let name = r
                .target
                .split_once('?')
                .map(|(_, q)| q)
                .unwrap_or_default()
                .split('&')
                .find_map(|kv| kv.strip_prefix("name="))
                .and_then(ray_history_collector::storage::s3::url_decode)
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default();
            if name == key || (name == part && len != 6) {
                bytes.push(len);
            }
        }
        (bytes, composes)
    }
}

/// Every event id in the objects under `root/`, with how many times it is there.
fn gs_id_counts(rig: &GsRig, root: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (k, v) in rig.objects(root) {
        for id in version_ids(&k, &v) {
            *counts.entry(id).or_default() += 1;
        }
    }
    counts
}

/// GCS: objects grow by compose, every version a reader sees whole gzip members and a prefix
/// of the next, and only the new bytes cross the network: the media uploads sent for each
/// object (its first version whole, then each new member as a part) add up to its final
/// size; no part is left (issue 35, item 5). Main at c0282cf sent the whole object so far
/// at every publication.
#[test]
fn gcs_objects_grow_by_compose_sending_only_new_bytes() {
    let Some(rig) = gs_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(tmp.path(), "grow", &["--upload-window", "1s"], &[]);
    let json = rig.emu.json.clone();
    let poller = Poller::start(move || json.objects(GS_BUCKET, "grow/"));
    let acked = post_steadily(&c, "z", Duration::from_secs(5), 20, 2);
    std::thread::sleep(Duration::from_secs(1));
    let grew = poller.finish();
    let appends = c.metric_labeled("rhc_event_publications_total", "how=\"append\"");
    let wholes = c.metric_labeled("rhc_event_publications_total", "how=\"whole\"");
    eprintln!("publications before SIGTERM: {appends} appends, {wholes} whole");
    let status = c.terminate(Duration::from_secs(30));
    let objects = rig.objects("grow");
    for (k, v) in &objects {
        let (sizes, composes) = rig.sent_sizes(k);
        // What sending the object so far at every publication would have cost (main).
        let whole_each: u64 = sizes
            .iter()
            .scan(0, |so_far, n| {
                *so_far += n;
                Some(*so_far)
            })
            .sum();
        eprintln!(
            "{k}: {} bytes sent in {} uploads for an object of {} bytes ({composes} composes); the object so far at each publication would be {whole_each}",
            sizes.iter().sum::<u64>(),
            sizes.len(),
            v.len()
        );
    }
    assert!(status.success(), "{}", c.log_tail(40));
    assert!(
        grew >= 3,
        "the objects grew only {grew} times while watched"
    );
    assert_eq!(objects.len(), 2, "{:?}", objects.keys());
    let ids: Vec<String> = acked.into_iter().flat_map(|(_, ids)| ids).collect();
    assert_each_once_in(&objects, &ids);
    for (k, v) in &objects {
        let (sent, composes) = rig.sent_for(k);
        assert!(composes >= 4, "{k}: {composes} composes");
        assert_eq!(
            sent,
            v.len() as u64,
            "{k}: {sent} bytes of uploads sent for an object of {} bytes ({composes} composes): each version sent whole?",
            v.len()
        );
    }
    assert!(appends >= 6.0, "{appends} appends");
    assert_eq!(rig.parts(), Vec::<String>::new(), "parts left");
}

/// GCS: kill -9 mid-growth and restart with the spool kept: nothing lost, nothing twice, and
/// the part a killed run left (planted: one per object) deleted at the start; also when
/// another writer replaced the objects in between (a whole upload with a member the record
/// does not know of): the collector writes them whole, never composes onto them.
#[test]
fn gcs_kill_and_restart_and_an_object_replaced_behind_our_back() {
    let Some(rig) = gs_rig() else { return };
    for replaced in [false, true] {
        let root = if replaced { "replaced" } else { "killed" };
        let tmp = tempfile::tempdir().unwrap();
        let mut c = rig.collector(tmp.path(), root, &["--upload-window", "1s"], &[]);
        let tag = if replaced { "r" } else { "k" };
        let a: Vec<String> = (0..200).map(|i| format!("{tag}a-{i}")).collect();
        post(&c, &a, 2);
        std::thread::sleep(Duration::from_millis(2500));
        // Not all published yet: the restart's seal grows the objects by them.
        let b: Vec<String> = (0..200).map(|i| format!("{tag}b-{i}")).collect();
        post(&c, &b, 2);
        c.kill9();
        let mine = rig.objects(root);
        assert_eq!(mine.len(), 2, "{:?}", mine.keys());
        for (k, v) in &mine {
            // As a run killed between a part's upload and its compose leaves it.
            let part = ray_history_collector::storage::append::part_name(k);
            rig.emu.put(GS_BUCKET, &part, b"a killed run's part");
            if replaced {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), Default::default());
                std::io::Write::write_all(&mut gz, format!("{}\n", event("ghost", 0)).as_bytes())
                    .unwrap();
                let mut body = v.clone();
                body.extend_from_slice(&gz.finish().unwrap());
                rig.emu.put(GS_BUCKET, k, &body);
            }
        }
        c.restart();
        let more: Vec<String> = (0..100).map(|i| format!("{tag}c-{i}")).collect();
        post(&c, &more, 2);
        std::thread::sleep(Duration::from_millis(2500));
        let status = c.terminate(Duration::from_secs(30));
        assert!(status.success(), "{}", c.log_tail(40));
        if replaced {
            let log = c.log_tail(400);
            assert!(
                log.contains("the object is not as last published; uploading it whole"),
                "the replaced objects were not found changed:\n{log}"
            );
        }
        let objects = rig.objects(root);
        assert_eq!(objects.len(), 4, "{:?}", objects.keys());
        assert!(mine.keys().all(|k| objects.contains_key(k)));
        let all: Vec<String> = a.iter().chain(&b).chain(&more).cloned().collect();
        assert_each_once_in(&objects, &all);
        assert_eq!(rig.parts(), Vec::<String>::new(), "parts left");
    }
}

/// GCS: the object is replaced between our look at it and our compose (the compose held by
/// the network while another writer uploads a version with a member we never wrote). The
/// compose names the generation it grows from, so GCS refuses it (412) instead of composing
/// onto the other writer's version; the version is then written whole from the shadow:
/// every acknowledged event once, the other writer's line gone. fake-gcs-server composes
/// regardless (the reason this test runs against gcsemulator).
#[test]
fn gcs_a_compose_onto_an_object_replaced_meanwhile_is_refused() {
    let Some(rig) = gs_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(tmp.path(), "raced", &["--upload-window", "1s"], &[]);
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    wait_for(&c, Duration::from_secs(30), "A in the bucket", || {
        gs_id_counts(&rig, "raced").len() == 100
    });
    let before = rig.proxy.arrived().len();
    rig.proxy.add(
        Rule::new(Fault::Delay(Duration::from_secs(3)))
            .method("POST")
            .target_contains("/compose")
            .times(1),
    );
    let b: Vec<String> = (0..100).map(|i| format!("b-{i}")).collect();
    post(&c, &b, 1);
    wait_for(
        &c,
        Duration::from_secs(30),
        "the compose at the proxy",
        || {
            rig.proxy.arrived()[before..]
                .iter()
                .any(|(m, t)| m == "POST" && t.contains("/compose"))
        },
    );
    let objects = rig.objects("raced");
    assert_eq!(objects.len(), 1, "{:?}", objects.keys());
    let (key, v) = objects.into_iter().next().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), Default::default());
    std::io::Write::write_all(&mut gz, format!("{}\n", event("ghost", 0)).as_bytes()).unwrap();
    let mut body = v.clone();
    body.extend_from_slice(&gz.finish().unwrap());
    rig.emu.put(GS_BUCKET, &key, &body);
    let acked: Vec<String> = a.into_iter().chain(b).collect();
    wait_for(&c, Duration::from_secs(30), "A+B once, no ghost", || {
        let n = gs_id_counts(&rig, "raced");
        n.len() == acked.len() && !n.contains_key("ghost")
    });
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(40));
    assert_each_once_in(&rig.objects("raced"), &acked);
    assert!(
        rig.proxy
            .seen()
            .iter()
            .any(|r| r.method == "POST" && r.target.contains("/compose") && r.status == 412),
        "no compose was refused: composed onto the other writer's version?"
    );
    assert_eq!(rig.parts(), Vec::<String>::new(), "parts left");
}

/// GCS: an object whose next compose would pass the most components (GCS's 1,024; 4 here,
/// RHC_TEST_GCS_MAX_COMPONENTS) is written whole (one component again) and grows on from
/// there: every version whole and a prefix of the next, every event once.
#[test]
fn gcs_an_object_at_the_component_limit_is_written_whole_and_grows_on() {
    let Some(rig) = gs_rig() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(
        tmp.path(),
        "limit",
        &["--upload-window", "1s"],
        &[("RHC_TEST_GCS_MAX_COMPONENTS", "4")],
    );
    let json = rig.emu.json.clone();
    let poller = Poller::start(move || json.objects(GS_BUCKET, "limit/"));
    let acked = post_steadily(&c, "l", Duration::from_secs(4), 20, 1);
    std::thread::sleep(Duration::from_secs(1));
    let grew = poller.finish();
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", c.log_tail(40));
    assert!(grew >= 5, "the object grew only {grew} times while watched");
    let log = c.log_tail(2000);
    assert!(
        log.contains("another would pass the 4 an object may have"),
        "never written whole at the component limit:\n{log}"
    );
    let ids: Vec<String> = acked.into_iter().flat_map(|(_, ids)| ids).collect();
    assert_each_once_in(&rig.objects("limit"), &ids);
    assert_eq!(rig.parts(), Vec::<String>::new(), "parts left");
}

/// `gs://` on a server without GCS's JSON API (moto: the XML API only, as an S3-compatible
/// gateway would be): the first JSON request shows it, one WARN says so, and the versions
/// are written whole through `object_store` (XML), as before compose; no JSON request after
/// that; every event once. One version per object only: moto answers no
/// `x-goog-generation`, so `object_store` cannot make the next conditional PUT there (main at
/// c0282cf alike: its versions on moto never grew past the first; GCS gives the
/// generation). `tests/gcs_moto.rs` covers the same server without publications (every
/// segment sealed before its first).
#[test]
fn gcs_without_the_json_api_writes_whole_and_says_so_once() {
    let Some(moto) = rhc_testkit::services::MotoS3::start() else {
        return;
    };
    moto.create_bucket(GS_BUCKET);
    let proxy =
        rhc_testkit::fault_proxy::FaultProxy::start(&format!("127.0.0.1:{}", moto.port)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ray = tmp.path().join("ray");
    let storage = format!("gs://{GS_BUCKET}");
    let url = proxy.url();
    let mut c = Collector::start(
        &tmp.path().join("spool"),
        &[
            "--storage",
            &storage,
            "--ray-tmp-dir",
            ray.to_str().unwrap(),
            "--upload-window",
            "1s",
        ],
        &[
            ("GOOGLE_BASE_URL", url.as_str()),
            ("GOOGLE_BEARER_TOKEN", "test-token"),
        ],
    );
    let xml = rhc_testkit::services::moto_client(&moto.endpoint, GS_BUCKET).unwrap();
    let count = || {
        let mut n: HashMap<String, usize> = HashMap::new();
        for (k, v) in event_objects(read_all(&xml)) {
            for id in version_ids(&k, &v) {
                *n.entry(id).or_default() += 1;
            }
        }
        n
    };
    let acked: Vec<String> = (0..40).map(|i| format!("m-{i}")).collect();
    post(&c, &acked, 2);
    wait_for(
        &c,
        Duration::from_secs(30),
        "the events in the bucket",
        || count().len() == acked.len(),
    );
    let status = c.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit {status:?}: {}", c.log_tail(40));
    let n = count();
    assert_eq!(n.len(), acked.len());
    assert!(n.values().all(|&k| k == 1), "a duplicate line");
    let log = c.log_text();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("JSON API"))
        .count();
    assert_eq!(warned, 1, "{log}");
    let json = proxy
        .seen()
        .iter()
        .filter(|r| r.target.starts_with("/storage/v1/") || r.target.starts_with("/upload/"))
        .count();
    assert!(
        json <= 3,
        "{json} JSON requests after the JSON API was found missing"
    );
    let whole_puts = proxy
        .seen()
        .iter()
        .filter(|r| {
            let path =
                ray_history_collector::storage::s3::url_decode(&r.target).unwrap_or_default();
            r.method == "PUT"
                && r.status / 100 == 2
                && String::from_utf8_lossy(&path).contains("_events/")
        })
        .count();
    assert!(whole_puts >= 2, "{whole_puts} whole PUTs of event objects");
}

/// GCS: the JSON API hangs (held by the network) or answers 500 while the XML API works
/// (review r35h D1). Nothing waits for the probe of the JSON API: every version goes through
/// `object_store` (XML) meanwhile, so every event of 16 partitions is in the bucket within a
/// few windows, and SIGTERM exits 0 well within `--shutdown-timeout` (the probe's requests
/// are not waited for). f35h at 1b3b28b held every publication behind the probe: with the
/// JSON API hung, nothing in the bucket and exit 3 at the deadline.
#[test]
fn gcs_a_hung_or_failing_json_api_stalls_no_publication() {
    let Some(rig) = gs_rig() else { return };
    for (root, fault) in [
        ("hung", Fault::Hold(Duration::from_secs(60))),
        ("failing", Fault::Status(500, "InternalError".into())),
    ] {
        rig.proxy.clear();
        rig.proxy.forget();
        rig.proxy
            .add(Rule::new(fault).target_contains("/storage/v1/"));
        let tmp = tempfile::tempdir().unwrap();
        let mut c = rig.collector(
            tmp.path(),
            root,
            &["--upload-window", "1s", "--shutdown-timeout", "10s"],
            &[(ray_history_collector::storage::TEST_GCS_PROBE_FIRST, "0")],
        );
        let ids: Vec<String> = (0..160).map(|i| format!("{root}-{i}")).collect();
        post(&c, &ids, 16);
        wait_for(
            &c,
            Duration::from_secs(6),
            &format!("{root}: every event in the bucket"),
            || gs_id_counts(&rig, root).len() == ids.len(),
        );
        assert!(
            rig.proxy
                .arrived()
                .iter()
                .any(|(_, t)| t.contains("/storage/v1/")),
            "{root}: the JSON API was never asked"
        );
        let (status, took) = c.try_terminate(Duration::from_secs(20)).unwrap();
        assert!(
            status.success() && took < Duration::from_secs(5),
            "{root}: exit {status:?} after {took:?}:\n{}",
            c.log_tail(40)
        );
        assert_each_once_in(&rig.objects(root), &ids);
    }
    // The JSON API found usable, then hung: the shutdown's last publications are cut at the
    // deadline as those through object_store are (exit 3: not everything uploaded), never
    // waited for past it.
    rig.proxy.clear();
    let tmp = tempfile::tempdir().unwrap();
    let mut c = rig.collector(
        tmp.path(),
        "late",
        &["--upload-window", "1s", "--shutdown-timeout", "3s"],
        &[],
    );
    // (This rig's XML and JSON halves are two servers: versions written before the verdict
    // are in moto, so only the requests are looked at here.)
    let composed = || {
        rig.proxy
            .seen()
            .iter()
            .any(|r| r.target.contains("/compose") && r.status / 100 == 2)
    };
    let end = Instant::now() + Duration::from_secs(8);
    let mut n = 0;
    while !composed() {
        assert!(
            Instant::now() < end,
            "late: never grew by compose\n{}",
            c.log_tail(30)
        );
        let ids: Vec<String> = (n..n + 10).map(|i| format!("late-{i}")).collect();
        post(&c, &ids, 4);
        n += 10;
        std::thread::sleep(Duration::from_millis(500));
    }
    rig.proxy
        .add(Rule::new(Fault::Hold(Duration::from_secs(60))).target_contains("/storage/v1/"));
    let ids: Vec<String> = (n..n + 40).map(|i| format!("late-{i}")).collect();
    post(&c, &ids, 4);
    let (status, took) = c.try_terminate(Duration::from_secs(20)).unwrap();
    assert!(
        took < Duration::from_secs(5),
        "late: exit {status:?} after {took:?}:\n{}",
        c.log_tail(40)
    );
    eprintln!("late: exit {status:?} after {took:?}");
    rig.proxy.clear();
}
