//! Issue 23 through the real binary: when the node vanishes (SIGKILL, and the spool deleted
//! with the pod's emptyDir), every event acknowledged more than `--upload-window` before is
//! in the bucket, in one object per partition that grew in place; every version a reader
//! sees is whole gzip members of whole lines, a prefix of the next; a kill -9 and restart
//! with the spool kept loses and duplicates nothing; a failed growth leaves the previous
//! version whole; a partition with nothing new costs no request; 5,000 open partitions
//! drain at SIGTERM.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

use rhc_testkit::collector::{read_all, Collector};
use rhc_testkit::fault_proxy::{Fault, FaultProxy, Rule};
use rhc_testkit::fault_shim::Faults;
use rhc_testkit::services::MotoS3;

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
        .filter(|(k, _)| k.contains(&format!("/{SESSION}/")) && k.contains("_events/"))
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

fn local_store(dir: &Path) -> Arc<dyn ObjectStore> {
    std::fs::create_dir_all(dir).unwrap();
    Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap())
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
    c.kill9();
    std::fs::remove_dir_all(&c.spool).unwrap();
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
    let store = local_store(&bucket);
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
    let store = local_store(&bucket);
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
        let store = local_store(&bucket);
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
            .filter(|p| !p.ends_with("LOCK"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

/// moto behind the recording proxy.
struct S3Rig {
    s3: MotoS3,
    proxy: FaultProxy,
    tmp: tempfile::TempDir,
}

const BUCKET: &str = "window";

impl S3Rig {
    fn new() -> Option<S3Rig> {
        let s3 = MotoS3::start()?;
        s3.create_bucket(BUCKET);
        let proxy = FaultProxy::start(&format!("127.0.0.1:{}", s3.port)).unwrap();
        Some(S3Rig {
            s3,
            proxy,
            tmp: tempfile::tempdir().unwrap(),
        })
    }

    fn start(&self, extra: &[&str]) -> Collector {
        let storage = format!("s3://{BUCKET}");
        let ray = self.tmp.path().join("ray");
        let mut args = vec![
            "--storage",
            &storage,
            "--ray-tmp-dir",
            ray.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let url = self.proxy.url();
        let env = [
            ("AWS_ENDPOINT", url.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", MotoS3::ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", MotoS3::SECRET_ACCESS_KEY),
            ("AWS_REGION", MotoS3::REGION),
        ];
        Collector::start(&self.tmp.path().join("spool"), &args, &env)
    }

    /// Every object of the session, read straight from moto (not through the proxy).
    fn read(s3: &MotoS3) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        for k in s3.list_keys(BUCKET, "") {
            if let Some(b) = s3.get_object(BUCKET, &k) {
                out.insert(k, b);
            }
        }
        out
    }
}

/// moto: node loss with a 2 s window; and once nothing is new, no request at all.
#[test]
fn node_loss_on_moto_and_no_request_when_nothing_is_new() {
    let Some(rig) = S3Rig::new() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig.start(&["--upload-window", "2s"]);
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
    assert_node_loss_bounded(
        &mut c,
        &acked,
        Duration::from_secs(2),
        || S3Rig::read(&rig.s3),
        2,
    );
}

/// moto: a growth that fails (every PUT refused for 3 s) leaves the previous version whole,
/// and the next round after it brings the object up to date.
#[test]
fn a_failed_growth_leaves_the_previous_version_whole() {
    let Some(rig) = S3Rig::new() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig.start(&["--upload-window", "1s"]);
    let a: Vec<String> = (0..100).map(|i| format!("a-{i}")).collect();
    post(&c, &a, 1);
    let end = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let o = event_objects(S3Rig::read(&rig.s3));
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
        let now = S3Rig::read(&rig.s3);
        let v = now.get(&first.0).expect("the object vanished");
        assert_eq!(v, &first.1, "the object changed while every PUT failed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let faulted = rig.proxy.seen().iter().filter(|r| r.faulted).count();
    assert!(faulted > 0, "no growth was attempted during the fault");
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let o = event_objects(S3Rig::read(&rig.s3));
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

/// moto: 5,000 open partitions with new events at SIGTERM drain before the default 25 s
/// shutdown deadline (exit 0, every object there), and no upload is logged as panicked. The
/// issue's 20 s is a figure of the release binary (`RHC_DRAIN_LIMIT_SECS=20` with
/// `RHC_COLLECTOR_BIN=target/release/ray-history-collector`); this debug build on a shared
/// CI machine is held to the deadline itself.
#[test]
fn five_thousand_open_partitions_drain_at_sigterm() {
    let Some(rig) = S3Rig::new() else {
        eprintln!("SKIPPED: moto is not installed (scripts/install-test-deps.sh)");
        return;
    };
    let mut c = rig.start(&["--max-open-segments", "1024"]);
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
        .try_terminate(Duration::from_secs(40))
        .unwrap_or_else(|e| panic!("{e}"));
    let log = c.log_text();
    assert!(!log.contains("panicked"), "{}", c.log_tail(40));
    assert!(status.success(), "{}", c.log_tail(40));
    let limit = std::env::var("RHC_DRAIN_LIMIT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    println!("5,000 partitions drained at SIGTERM in {took:?} (limit {limit} s)");
    assert!(
        took <= Duration::from_secs(limit),
        "the drain took {took:?}"
    );
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
    event_objects(read_all(&local_store(bucket)))
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
