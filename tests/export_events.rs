//! Ray's file-based export events through the real binary: tailed, routed by job, kept
//! exactly once across a torn line, a rotation, a kill -9 and a restart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

use rhc_testkit::collector::{append_to as append, decode, history_server_accepts, Collector};
use rhc_testkit::fault_shim::Faults;
use rhc_testkit::ray_logs::{bucket_objects, LocalRig};

/// errno of a full volume, injected by the fault shim.
const ENOSPC: i32 = 28;
const NODE: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
const SESSION: &str = "session_2026-11-22_02-08-16_569038_24326";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/export_events");

/// The tests that need ext4 to hand a freed inode to the next file they create run alone
/// (a write lock), the others beside each other (a read lock): a file another test of this
/// binary creates at that moment could take the freed inode.
static FILES: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    FILES.write().unwrap_or_else(|e| e.into_inner())
}

fn beside_others() -> std::sync::RwLockReadGuard<'static, ()> {
    FILES.read().unwrap_or_else(|e| e.into_inner())
}

fn export_dir(ray: &Path) -> PathBuf {
    ray.join(SESSION).join("logs").join("export_events")
}

/// One test's world ([`LocalRig`]): a Ray temp root whose session's `raylet.out` names
/// [`NODE`], with `session_latest` pointing at it and its `logs/export_events/` made; its
/// collectors tail the export events into the `file://` bucket (logs off, 1 s rotations).
fn work() -> LocalRig {
    exporting(LocalRig::new())
}

/// [`work`] in `dir`.
fn work_at(dir: &Path) -> LocalRig {
    exporting(LocalRig::at(dir))
}

fn exporting(w: LocalRig) -> LocalRig {
    let logs = w.ray.session(SESSION, NODE, true);
    std::fs::create_dir_all(logs.join("export_events")).unwrap();
    w.defaults(&[
        "--cluster-name",
        "exp",
        "--enable-log-collector",
        "false",
        "--rotation-interval",
        "1s",
    ])
}

/// The partition a line must land in, computed from the fixture itself.
fn expected_group(v: &Value, run_jobs: &HashMap<String, String>) -> String {
    let d = &v["event_data"];
    let hex = |b64: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    if let Some(j) = d["job_id"].as_str().filter(|j| !j.is_empty()) {
        return hex(j);
    }
    if v["source_type"] == "EXPORT_TRAIN_RUN_ATTEMPT" {
        if let Some(j) = d["run_id"].as_str().and_then(|r| run_jobs.get(r)) {
            return j.clone();
        }
    }
    "node".into()
}

fn wait_metric(c: &Collector, name: &str, at_least: f64) {
    wait_metric_within(c, name, at_least, Duration::from_secs(20));
}

fn wait_metric_within(c: &Collector, name: &str, at_least: f64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while c.metric(name) < at_least {
        assert!(
            Instant::now() < deadline,
            "{name} stayed below {at_least}:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn export_events_are_tailed_by_job_exactly_once() {
    let _files = beside_others();
    let w = work();
    let ray = &w.ray.root;
    let dir = export_dir(ray);
    // All fixture lines; the Train file is written in two steps around a crash.
    let mut lines: Vec<String> = Vec::new();
    for name in [
        "event_EXPORT_DRIVER_JOB.log",
        "event_EXPORT_NODE.log",
        "event_EXPORT_ACTOR.log",
    ] {
        let text = std::fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap();
        std::fs::write(dir.join(name), &text).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    let train =
        std::fs::read_to_string(Path::new(FIXTURES).join("event_EXPORT_TRAIN_STATE.log")).unwrap();
    let train: Vec<&str> = train.lines().collect();
    let train_path = dir.join("event_EXPORT_TRAIN_STATE.log");
    for l in &train[..4] {
        append(&train_path, format!("{l}\n").as_bytes());
    }
    // A torn last line: half of the fifth event, not yet terminated.
    let (half1, half2) = train[4].split_at(train[4].len() / 2);
    append(&train_path, half1.as_bytes());
    // And a line that is not JSON.
    append(&dir.join("event_EXPORT_ACTOR.log"), b"this is not json\n");

    let bucket = &w.bucket;
    let mut c = w.start(&[], &[]);
    let first = (lines.len() + 4) as f64;
    wait_metric(&c, "rhc_events_accepted_total", first);
    wait_metric(&c, "rhc_events_quarantined_total", 1.0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        c.metric("rhc_events_accepted_total"),
        first,
        "the torn line was read early"
    );
    c.kill9();

    // While the collector is down: the torn line is completed, more lines, then Ray rotates.
    append(&train_path, format!("{half2}\n").as_bytes());
    append(&train_path, format!("{}\n", train[5]).as_bytes());
    std::fs::rename(&train_path, dir.join("event_EXPORT_TRAIN_STATE.log.1")).unwrap();
    for l in &train[6..] {
        append(&train_path, format!("{l}\n").as_bytes());
    }
    lines.extend(train.iter().map(|s| s.to_string()));
    c.restart();
    c.terminate_ok(Duration::from_secs(30));

    let objects = bucket_objects(bucket);
    let prefix = format!("cluster-history/raycluster/default/exp/{SESSION}/{NODE}/export_events/");
    let mut seen: HashMap<String, (String, usize)> = HashMap::new();
    for (k, v) in objects.iter().filter(|(k, _)| k.starts_with(&prefix)) {
        let rest = &k[prefix.len()..];
        let (group, file) = rest.split_once('/').unwrap();
        assert!(history_server_accepts(file), "{k}");
        assert!(file.starts_with(NODE) && file.ends_with(".jsonl.gz"), "{k}");
        for line in decode(k, v)
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
        {
            let text = String::from_utf8(line.to_vec()).unwrap();
            let e = seen.entry(text).or_insert((group.to_string(), 0));
            e.1 += 1;
        }
    }
    let mut run_jobs = HashMap::new();
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap();
        if v["source_type"] == "EXPORT_TRAIN_RUN" {
            let j = expected_group(&v, &HashMap::new());
            run_jobs.insert(v["event_data"]["id"].as_str().unwrap().to_string(), j);
        }
    }
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap();
        let (group, n) = seen
            .get(l)
            .unwrap_or_else(|| panic!("missing line: {}", &l[..80]));
        assert_eq!(*n, 1, "stored {n} times: {}", &l[..80]);
        assert_eq!(*group, expected_group(&v, &run_jobs), "{}", &l[..80]);
    }
    assert_eq!(seen.len(), lines.len(), "unexpected extra lines");
    // Train attempts follow their run's job.
    assert!(seen
        .iter()
        .any(|(l, (g, _))| l.contains("EXPORT_TRAIN_RUN_ATTEMPT") && g == "01000000"));
    // The non-JSON line is in quarantine with its file and offset.
    let q: Vec<Value> = objects
        .iter()
        .filter(|(k, _)| k.starts_with("collector-quarantine/"))
        .flat_map(|(k, v)| {
            decode(k, v)
                .split(|&c| c == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["reason"], "export_not_json");
    assert_eq!(q[0]["source_file"], "event_EXPORT_ACTOR.log");
    assert_eq!(q[0]["raw"], "this is not json");
    let actor_len = std::fs::read(Path::new(FIXTURES).join("event_EXPORT_ACTOR.log"))
        .unwrap()
        .len();
    assert_eq!(q[0]["source_offset"], actor_len);
}

/// The offsets file is lost (or lags the spool after a crash): lines read again are
/// recognised by their event id, which the restart reloads from the spool.
#[test]
fn lines_read_again_after_a_crash_are_not_stored_twice() {
    let _files = beside_others();
    let w = work();
    let ray = &w.ray.root;
    let dir = export_dir(ray);
    let text = std::fs::read_to_string(Path::new(FIXTURES).join("event_EXPORT_ACTOR.log")).unwrap();
    std::fs::write(dir.join("event_EXPORT_ACTOR.log"), &text).unwrap();
    let n = text.lines().count() as f64;
    let bucket = &w.bucket;
    let spool = &w.spool;
    // No cluster name, default rotations.
    let mut c = w
        .collector()
        .only(&["--enable-log-collector", "false"])
        .start();
    wait_metric(&c, "rhc_events_accepted_total", n);
    c.kill9();
    std::fs::remove_file(spool.join("export-offsets.json")).unwrap();
    c.restart();
    wait_metric(&c, "rhc_events_duplicate_total", n);
    assert_eq!(c.metric("rhc_events_accepted_total"), 0.0);
    c.terminate_ok(Duration::from_secs(30));
    let lines: usize = bucket_objects(bucket)
        .iter()
        .filter(|(k, _)| k.contains("/export_events/"))
        .map(|(k, v)| {
            decode(k, v)
                .split(|&c| c == b'\n')
                .filter(|l| !l.is_empty())
                .count()
        })
        .sum();
    assert_eq!(lines, n as usize);
}

/// The first line of `source_type` in the Train fixture.
fn train_line(source_type: &str) -> String {
    let text =
        std::fs::read_to_string(Path::new(FIXTURES).join("event_EXPORT_TRAIN_STATE.log")).unwrap();
    text.lines()
        .find(|l| serde_json::from_str::<Value>(l).unwrap()["source_type"] == source_type)
        .unwrap()
        .to_string()
}

/// Export lines stored under `export_events/<group>/`, by group.
fn stored_export_lines(bucket: &Path) -> HashMap<String, Vec<String>> {
    let prefix = format!("cluster-history/raycluster/default/exp/{SESSION}/{NODE}/export_events/");
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for (k, v) in bucket_objects(bucket)
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
    {
        let group = k[prefix.len()..].split_once('/').unwrap().0.to_string();
        for line in decode(k, v)
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
        {
            out.entry(group.clone())
                .or_default()
                .push(String::from_utf8(line.to_vec()).unwrap());
        }
    }
    out
}

/// The run is in the live run file, its attempt in a rotated attempt file: backups are read
/// first, yet the attempt is filed under the run's job, because runs are read before attempts.
#[test]
fn a_train_attempt_follows_its_run_read_in_the_same_pass() {
    let _files = beside_others();
    let w = work();
    let ray = &w.ray.root;
    let dir = export_dir(ray);
    let run = train_line("EXPORT_TRAIN_RUN");
    let attempt = train_line("EXPORT_TRAIN_RUN_ATTEMPT");
    std::fs::write(dir.join("event_EXPORT_TRAIN_RUN.log"), format!("{run}\n")).unwrap();
    std::fs::write(
        dir.join("event_EXPORT_TRAIN_RUN_ATTEMPT.log.1"),
        format!("{attempt}\n"),
    )
    .unwrap();
    let bucket = &w.bucket;
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", 2.0);
    c.terminate_ok(Duration::from_secs(30));
    let stored = stored_export_lines(bucket);
    assert_eq!(
        stored.get("01000000").map(Vec::len),
        Some(2),
        "run and attempt under the run's job: {stored:?}"
    );
    assert!(!stored.contains_key("node"), "{stored:?}");
}

/// A rotated file (both backup names Ray's writers use) that ends without a newline is never
/// completed: its last line is read as it is, stored when it is JSON and quarantined with its
/// file and offset when not. The offsets of files that are gone are dropped.
#[test]
fn a_torn_last_line_of_a_rotated_file_is_reported_and_gone_files_are_forgotten() {
    let _files = beside_others();
    let w = work();
    let ray = &w.ray.root;
    let dir = export_dir(ray);
    let actors =
        std::fs::read_to_string(Path::new(FIXTURES).join("event_EXPORT_ACTOR.log")).unwrap();
    let actors: Vec<&str> = actors.lines().collect();
    assert!(actors.len() >= 3);
    // Python's name, ending in a torn line that is not JSON.
    let py_backup = format!("{}\n{{\"event_id\": \"torn", actors[0]);
    std::fs::write(dir.join("event_EXPORT_ACTOR.log.1"), &py_backup).unwrap();
    // spdlog's name, ending in a whole event whose newline never came.
    std::fs::write(dir.join("event_EXPORT_NODE.1.log"), actors[1]).unwrap();
    std::fs::write(
        dir.join("event_EXPORT_ACTOR.log"),
        format!("{}\n", actors[2]),
    )
    .unwrap();

    let bucket = &w.bucket;
    let spool = &w.spool;
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", 3.0);
    wait_metric(&c, "rhc_events_quarantined_total", 1.0);

    // The offsets file knows the three files; once one is deleted, it forgets it.
    let offsets = || -> Value {
        serde_json::from_slice(&std::fs::read(spool.join("export-offsets.json")).unwrap()).unwrap()
    };
    let files = |v: &Value| v["files"].as_object().map(|m| m.len()).unwrap_or(0);
    assert_eq!(files(&offsets()), 3, "{}", offsets());
    std::fs::remove_file(dir.join("event_EXPORT_NODE.1.log")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while files(&offsets()) != 2 {
        assert!(Instant::now() < deadline, "not pruned: {}", offsets());
        std::thread::sleep(Duration::from_millis(100));
    }
    c.terminate_ok(Duration::from_secs(30));

    let stored: Vec<String> = stored_export_lines(bucket)
        .into_values()
        .flatten()
        .collect();
    for l in &actors[..3] {
        assert!(stored.contains(&l.to_string()), "missing {}", &l[..60]);
    }
    assert_eq!(stored.len(), 3, "{stored:?}");
    let q: Vec<Value> = bucket_objects(bucket)
        .iter()
        .filter(|(k, _)| k.starts_with("collector-quarantine/"))
        .flat_map(|(k, v)| {
            decode(k, v)
                .split(|&c| c == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0]["reason"], "export_not_json");
    assert_eq!(q[0]["source_file"], "event_EXPORT_ACTOR.log.1");
    assert_eq!(q[0]["raw"], "{\"event_id\": \"torn");
    assert_eq!(q[0]["source_offset"], actors[0].len() + 1);
}

/// Uploads are failing, so the spool only fills. A large export backlog stops at 80 % of the
/// spool's budget, below the 90 % mark where Ray's pushed events get 503: pushed events are
/// still accepted, and the backlog waits in Ray's files.
#[test]
fn an_export_backlog_leaves_room_for_pushed_events() {
    let _files = beside_others();
    // Reads of 8 MiB would stop at 24 MiB, past the 90 % mark (23.4 MiB).
    const BUDGET: u64 = 26 << 20;
    let w = work();
    let ray = &w.ray.root;
    let budget = BUDGET.to_string();
    let c = w.start(&["--max-spool-bytes", &budget], &[]);
    // The bucket becomes a file: every upload fails from now on and the spool keeps all.
    w.refuse_uploads();

    // 40 MB of export lines, more than the whole budget.
    let pad = "x".repeat(900);
    let mut backlog = String::new();
    for i in 0..40_000 {
        backlog.push_str(&format!(
            "{{\"event_id\": \"{i:018x}\", \"timestamp\": 1795313307, \"source_type\": \"EXPORT_TASK\", \"event_data\": {{\"job_id\": \"AQAAAA==\", \"pad\": \"{pad}\"}}}}\n"
        ));
    }
    std::fs::write(export_dir(ray).join("event_EXPORT_TASK.log"), &backlog).unwrap();

    // Wait until the tailer stops taking lines (the spool stops growing).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = -1.0;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = c.metric("rhc_spool_bytes");
        if now == last && now > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the spool kept growing:\n{}",
            c.log_tail(20)
        );
        last = now;
    }
    let used = c.metric("rhc_spool_bytes");
    assert!(
        used < (BUDGET / 100 * 90) as f64,
        "the tailer filled the spool to {used} of {BUDGET} bytes"
    );
    assert!(
        c.metric("rhc_events_accepted_total") < 40_000.0,
        "the whole backlog was taken"
    );
    // Ray's pushed events are still accepted.
    let body = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/posts-camel.jsonl"
    ))
    .unwrap();
    let r = c.post(body.lines().next().unwrap().as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        c.log_text().contains("export event files wait on disk"),
        "the yield is logged"
    );
}

/// `n` export lines of about 1 KB with distinct ids, all of job 01000000.
fn backlog(n: usize, tag: &str) -> String {
    let pad = "x".repeat(900);
    let mut out = String::with_capacity(n * 1024);
    for i in 0..n {
        out.push_str(&format!(
            "{{\"event_id\": \"{tag}{i:012}\", \"timestamp\": 1795313307, \"source_type\": \"EXPORT_TASK\", \"event_data\": {{\"job_id\": \"AQAAAA==\", \"pad\": \"{pad}\"}}}}\n"
        ));
    }
    out
}

/// Event ids stored under `export_events/`, with how often each is there.
fn stored_ids(bucket: &Path) -> HashMap<String, usize> {
    let mut ids = HashMap::new();
    for line in stored_export_lines(bucket).into_values().flatten() {
        let v: Value = serde_json::from_str(&line).unwrap();
        *ids.entry(v["event_id"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    ids
}

/// kill -9 as soon as two export objects are in the bucket, in the middle of a backlog
/// read with small segments (sealed and uploaded while the tailer is still reading): after
/// the restart every line is in the bucket exactly once. The offsets are saved with each
/// batch before a segment holding it can be uploaded, so what the restart reads again is
/// still in the spool and dropped by the reloaded deduplication window.
#[test]
fn a_kill9_during_an_export_pass_duplicates_nothing_in_the_bucket() {
    let _files = beside_others();
    const LINES: usize = 40_000;
    let w = work();
    let ray = &w.ray.root;
    std::fs::write(
        export_dir(ray).join("event_EXPORT_TASK.log"),
        backlog(LINES, "k"),
    )
    .unwrap();
    let bucket = &w.bucket;
    let mut c = w.start(&["--max-segment-bytes", "1MiB"], &[]);
    // Two objects: the first one's segment is then gone from the spool.
    let uploaded = || {
        bucket.is_dir()
            && rhc_testkit::collector::files_under(bucket)
                .iter()
                .filter(|p| p.to_string_lossy().contains("/export_events/"))
                .count()
                >= 2
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !uploaded() {
        assert!(
            Instant::now() < deadline,
            "nothing uploaded:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    c.kill9();
    c.restart();
    wait_metric(&c, "rhc_events_accepted_total", 1.0);
    c.terminate_ok(Duration::from_secs(60));
    let ids = stored_ids(bucket);
    let twice = ids.values().filter(|&&n| n > 1).count();
    assert_eq!(
        twice,
        0,
        "{twice} ids stored more than once:\n{}",
        c.log_text()
    );
    assert_eq!(ids.len(), LINES, "lines missing");
}

/// A regular pass over many export files is running when SIGTERM comes: reading ends within
/// the last pass's limit (5 s) of it, and the collector exits soon after.
#[test]
fn sigterm_during_a_long_export_pass_ends_reading_within_the_limit() {
    let _files = beside_others();
    const FILES: usize = 20_000;
    let w = work();
    let ray = &w.ray.root;
    let dir = export_dir(ray);
    for i in 0..FILES {
        std::fs::write(
            dir.join(format!("event_EXPORT_TASK_{i}.log")),
            format!("{{\"event_id\": \"m{i:07}\", \"timestamp\": 1795313307, \"source_type\": \"EXPORT_TASK\", \"event_data\": {{\"job_id\": \"AQAAAA==\"}}}}\n"),
        )
        .unwrap();
    }
    let bucket = &w.bucket;
    let mut c = w.start(&["--shutdown-timeout", "60s"], &[]);
    wait_metric(&c, "rhc_events_accepted_total", 1.0);
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    c.signal_term();
    let status = c.wait_exit(Duration::from_secs(60)).unwrap();
    let took = sent.elapsed();
    assert!(status.success(), "{}", c.log_text());
    assert!(
        took < Duration::from_secs(9),
        "exited {took:?} after SIGTERM:\n{}",
        c.log_tail(10)
    );
    let ids = stored_ids(bucket);
    assert!(ids.values().all(|&n| n == 1));
    // What was not read waits in Ray's files, and the log says so.
    if ids.len() < FILES {
        assert!(
            c.log_text()
                .contains("reading export event files stopped 5s after the shutdown began"),
            "{} of {FILES} read and no warning:\n{}",
            ids.len(),
            c.log_tail(10)
        );
    }
}

/// A spool budget far below the default (5 MiB): a 10 MB export backlog with failing uploads
/// stops below the 80 % mark (a batch never takes the spool past it), and Ray's pushed
/// events still get 200.
#[test]
fn a_small_spool_budget_still_leaves_room_for_pushed_events() {
    let _files = beside_others();
    const BUDGET: u64 = 5 << 20;
    let w = work();
    let ray = &w.ray.root;
    let budget = BUDGET.to_string();
    let c = w.start(&["--max-spool-bytes", &budget], &[]);
    w.refuse_uploads();
    std::fs::write(
        export_dir(ray).join("event_EXPORT_TASK.log"),
        backlog(10_000, "s"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = -1.0;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = c.metric("rhc_spool_bytes");
        if now == last && now > 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the spool kept growing");
        last = now;
    }
    let used = c.metric("rhc_spool_bytes");
    assert!(
        used <= (BUDGET / 100 * 80) as f64,
        "the tailer filled the spool to {used} of {BUDGET} bytes"
    );
    let body = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/posts-camel.jsonl"
    ))
    .unwrap();
    let r = c.post(body.lines().next().unwrap().as_bytes());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// A backlog of blank lines is read in bounded batches: every byte read counts against a
/// batch's bound of 8 MiB, so the collector never holds the whole file at once.
#[test]
fn a_file_of_blank_lines_is_read_in_bounded_batches() {
    let _files = beside_others();
    const BLANK_MIB: usize = 96;
    let w = work();
    let ray = &w.ray.root;
    let mut body = vec![b'\n'; BLANK_MIB << 20];
    body.extend_from_slice(
        b"{\"event_id\": \"b1\", \"timestamp\": 1795313307, \"source_type\": \"EXPORT_TASK\", \"event_data\": {\"job_id\": \"AQAAAA==\"}}\n",
    );
    std::fs::write(export_dir(ray).join("event_EXPORT_TASK.log"), &body).unwrap();
    drop(body);
    let c = w.start(&[], &[]);
    // What a pass holds is the point, not how fast a debug build scans 96 MiB: 20 s was not
    // enough at a load of 10 on two cores.
    wait_metric_within(
        &c,
        "rhc_events_accepted_total",
        1.0,
        Duration::from_secs(120),
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", c.pid())).unwrap();
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        hwm_kib < 64 << 10,
        "peak memory {} MiB reading {BLANK_MIB} MiB of blank lines",
        hwm_kib >> 10
    );
}

/// Ray rotates the live file while a pass is reading it: the pass reads the new live file
/// through the same name, and its offset stays saved after the pass (it was pruned by the
/// listing taken at the pass's start, so the next pass read the whole file again, and a
/// kill -9 then stored it twice).
#[test]
fn a_rotation_during_a_pass_keeps_the_new_live_files_offset() {
    let _files = beside_others();
    use std::os::unix::fs::MetadataExt;
    let w = work();
    let ray = &w.ray.root;
    let dir = export_dir(ray);
    let live = dir.join("event_EXPORT_TASK.log");
    std::fs::write(&live, backlog(40_000, "a")).unwrap();
    let ino_a = std::fs::metadata(&live).unwrap().ino();
    // The next live file, under a name the tailer does not read.
    let next = dir.join(".next");
    std::fs::write(&next, backlog(6_000, "b")).unwrap();
    let ino_b = std::fs::metadata(&next).unwrap().ino();
    let spool = &w.spool;
    let c = w.start(&[], &[]);
    let offsets = || -> HashMap<String, u64> {
        std::fs::read(spool.join("export-offsets.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| {
                v["files"].as_object().map(|m| {
                    m.iter()
                        .map(|(k, o)| (k.clone(), o["offset"].as_u64().unwrap_or(0)))
                        .collect()
                })
            })
            .unwrap_or_default()
    };
    let key_a = format!("{SESSION}/{ino_a}");
    let key_b = format!("{SESSION}/{ino_b}");
    let deadline = Instant::now() + Duration::from_secs(30);
    // The first batch of the file is stored: its pass is still reading it.
    while !offsets().contains_key(&key_a) {
        assert!(Instant::now() < deadline, "nothing read:\n{}", c.log_text());
        std::thread::sleep(Duration::from_millis(1));
    }
    // Ray's rotation: the live file becomes `.1` and a new live file takes its name.
    std::fs::rename(&live, dir.join("event_EXPORT_TASK.log.1")).unwrap();
    std::fs::rename(&next, &live).unwrap();
    let mut seen = false;
    while c.metric("rhc_events_accepted_total") < 46_000.0 {
        let now = offsets();
        seen |= now.contains_key(&key_b);
        assert!(
            !seen || now.contains_key(&key_b) || now.is_empty(),
            "the new live file's offset was dropped: {now:?}"
        );
        assert!(
            Instant::now() < deadline,
            "lines missing:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.metric("rhc_events_duplicate_total"),
        0.0,
        "lines were read twice:\n{}",
        c.log_text()
    );
    assert_eq!(
        offsets().get(&key_b),
        Some(&(std::fs::metadata(&live).unwrap().len())),
        "the new live file's offset is saved"
    );
}

/// `n` lines of the Ray 2.60 fixture's `EXPORT_DRIVER_JOB` event (512 bytes each, all with
/// the same first 64 bytes, as Ray writes them), each with its own `event_id` (36 hex digits:
/// `tag`, then the line's number).
fn driver_job_lines(n: usize, tag: u16) -> String {
    let text =
        std::fs::read_to_string(Path::new(FIXTURES).join("event_EXPORT_DRIVER_JOB.log")).unwrap();
    let first = text.lines().next().unwrap();
    let v: Value = serde_json::from_str(first).unwrap();
    let id = v["event_id"].as_str().unwrap();
    assert_eq!(id.len(), 36);
    let mut out = String::with_capacity(n * (first.len() + 1));
    for i in 0..n {
        out.push_str(&first.replace(id, &format!("{tag:04x}{i:032x}")));
        out.push('\n');
    }
    out
}

/// The inode of `path`.
fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// The files of Ray's rotation with its backup count reached: `.log.1` (50 lines) and the
/// live `.log` (5 lines) are written; [`rotate_onto_the_freed_inode`] then does the rest.
struct DriverJobFiles {
    live: PathBuf,
    backup: PathBuf,
}

impl DriverJobFiles {
    fn write(ray: &Path) -> DriverJobFiles {
        let dir = export_dir(ray);
        let f = DriverJobFiles {
            live: dir.join("event_EXPORT_DRIVER_JOB.log"),
            backup: dir.join("event_EXPORT_DRIVER_JOB.log.1"),
        };
        let backup = driver_job_lines(50, 1);
        assert_eq!(backup.len(), 25_600);
        std::fs::write(&f.backup, backup).unwrap();
        std::fs::write(&f.live, driver_job_lines(5, 2)).unwrap();
        f
    }

    /// Ray's rotation: the oldest backup deleted, the live file renamed to `.log.1`, a new
    /// live file with 100 lines, which gets the deleted backup's inode (asserted: made so if
    /// the filesystem gave another one first, a failure if it never does). Returns the time
    /// the whole burst took.
    fn rotate_onto_the_freed_inode(&self) -> Duration {
        let started = Instant::now();
        let freed = inode(&self.backup);
        std::fs::remove_file(&self.backup).unwrap();
        std::fs::rename(&self.live, &self.backup).unwrap();
        let aside = rhc_testkit::collector::create_on_freed_inode(
            &self.live,
            freed,
            driver_job_lines(100, 3).as_bytes(),
        )
        .unwrap_or_else(|e| panic!("the test needs a reused inode: {e}"));
        let took = started.elapsed();
        assert_eq!(
            inode(&self.live),
            freed,
            "the new live file reuses the inode"
        );
        eprintln!("rotation onto the freed inode {freed}: {took:?}, {aside} files moved aside");
        took
    }
}

/// Waits (up to 30 s) until `n` lines were accepted by this run of the collector.
fn wait_accepted(c: &Collector, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.metric("rhc_events_accepted_total") < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every one of the 155 lines written (50 + 5 + 100) is in the bucket exactly once.
fn assert_all_155_once(bucket: &Path, log: &str) {
    let ids = stored_ids(bucket);
    let mut missing = Vec::new();
    for (tag, n) in [(1u16, 50usize), (2, 5), (3, 100)] {
        for i in 0..n {
            let id = format!("{tag:04x}{i:032x}");
            match ids.get(&id) {
                Some(1) => {}
                Some(k) => panic!("line {i} of file {tag} stored {k} times"),
                None => missing.push((tag, i)),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of 155 lines missing (file 3 is the new live file), first {:?}:\n{log}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(ids.len(), 155, "unexpected extra lines");
}

/// Issue 41.1, across a restart: the new live file created by Ray's rotation gets the inode
/// of the backup deleted by the same rotation, whose offset (25,600 bytes) is saved. Ray's
/// lines of one type share their first 64 bytes, so the file is told apart by its birth time
/// and its whole first line: the new file is read from its start.
#[test]
fn a_new_file_on_a_deleted_backups_inode_is_read_whole_after_a_restart() {
    let _files = alone();
    let w = work();
    let ray = &w.ray.root;
    let files = DriverJobFiles::write(ray);
    let freed = inode(&files.backup);
    let bucket = &w.bucket;
    let spool = &w.spool;
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", 55.0);
    c.terminate_ok(Duration::from_secs(30));
    let saved: Value =
        serde_json::from_slice(&std::fs::read(spool.join("export-offsets.json")).unwrap()).unwrap();
    assert_eq!(
        saved["files"][format!("{SESSION}/{freed}")]["offset"],
        25_600,
        "the backup's offset is saved: {saved}"
    );

    files.rotate_onto_the_freed_inode();
    c.restart();
    wait_accepted(&c, 100.0);
    c.terminate_ok(Duration::from_secs(30));
    assert_all_155_once(bucket, &c.log_text());
}

/// Issue 41.1, the collector running: the whole rotation lands within the tailer's 100 ms
/// debounce, so the next pass finds the new live file at the deleted backup's inode with the
/// backup's offset still kept. Read from its start, and nothing read twice.
#[test]
fn a_new_file_on_a_deleted_backups_inode_is_read_whole_while_running() {
    let _files = alone();
    let w = work();
    let ray = &w.ray.root;
    let files = DriverJobFiles::write(ray);
    let bucket = &w.bucket;
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", 55.0);
    // The pass that read them has saved its offsets.
    std::thread::sleep(Duration::from_millis(500));
    let took = files.rotate_onto_the_freed_inode();
    assert!(
        took < Duration::from_millis(100),
        "the rotation took {took:?}, longer than the debounce: the test would not be the one of the issue"
    );
    wait_accepted(&c, 155.0);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        c.metric("rhc_events_duplicate_total"),
        0.0,
        "lines were read twice:\n{}",
        c.log_text()
    );
    c.terminate_ok(Duration::from_secs(30));
    assert_all_155_once(bucket, &c.log_text());
}

/// Review r41n D1: a backup's lines are read into a batch, and in the same pass (the tailer
/// held by the fault shim between two files) Ray's rotation deletes that backup and creates
/// the new live file, empty, on its inode. When the pass reaches the live file, the batch's
/// entry for that inode is another file's. Before, the entry was dropped from the batch, which
/// then held no offsets and was not stored: the backup's 50 lines were lost. Now the batch is
/// stored first, with the backup's offset, and the new live file read from its start.
#[test]
fn a_backup_read_into_a_batch_is_stored_when_its_inode_is_reused_in_the_same_pass() {
    backup_in_a_batch_on_a_reused_inode(false);
}

/// Review r41q: the same, and the spool's write of that batch (stored first, before the new
/// live file is read) fails once with ENOSPC. Before, the batch was dropped with its offsets
/// restored ("read again next pass"), but its backup was gone and the next pass read the new
/// file on that inode from its start: the backup's 50 lines were lost. Now the batch is kept
/// and stored again by the next pass before anything new is read: every line once.
#[test]
fn a_backup_read_into_a_batch_is_stored_when_its_first_store_fails() {
    backup_in_a_batch_on_a_reused_inode(true);
}

/// The case of the two tests above; `store_fails`: the first write of a segment after the
/// rotation (the batch holding the backup's lines) fails with ENOSPC.
fn backup_in_a_batch_on_a_reused_inode(store_fails: bool) {
    let _files = alone();
    let w = work();
    let faults = Faults::build(&w.dir);
    let files = DriverJobFiles::write(&w.ray.root);
    // Read after the backup and before the live file (a live file sorts after every
    // backup, then by name), with nothing in it: the tailer is held at its metadata when it
    // reads it in the first pass (the pass's listing takes it once before).
    let between = export_dir(&w.ray.root).join("event_EXPORT_A.log");
    std::fs::write(&between, b"").unwrap();
    faults.pause_at_stat(2, "export_events/event_EXPORT_A.log$");
    let mut c = w.start(&[], &faults.env());
    assert!(
        faults.wait_paused(Duration::from_secs(30)),
        "the tailer never reached {}:\n{}",
        between.display(),
        c.log_text()
    );
    // Ray's rotation, the new live file empty on the deleted backup's inode.
    let freed = inode(&files.backup);
    std::fs::remove_file(&files.backup).unwrap();
    std::fs::rename(&files.live, &files.backup).unwrap();
    rhc_testkit::collector::create_on_freed_inode(&files.live, freed, b"")
        .unwrap_or_else(|e| panic!("the test needs a reused inode: {e}"));
    if store_fails {
        // Nothing was written to a segment yet: the next write is the batch's.
        let segments = format!("{}/events/", w.spool.display());
        faults.arm("writev", ENOSPC, 1, &segments);
    }
    faults.resume();
    // The old live file (now the backup) is read next pass; then Ray writes on.
    wait_accepted(&c, 55.0);
    append(&files.live, driver_job_lines(100, 3).as_bytes());
    wait_accepted(&c, 155.0);
    let status = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    assert!(status.success(), "{log}");
    if store_fails {
        assert!(
            !faults.armed("writev") && log.contains("storing export events failed"),
            "the batch's store never failed (not the case of the test):\n{log}"
        );
        // Before the fix the kept batch was dropped: the backup's 50 lines are missing (and
        // the new live file is read as a file never seen, its entry restored away).
        assert_all_155_once(&w.bucket, &log);
    }
    assert!(
        log.contains("export file at the inode of a file read before"),
        "the pass never met the new live file at the backup's inode (not the case of the test):\n{log}"
    );
    if !store_fails {
        assert_all_155_once(&w.bucket, &log);
    }
}

/// Review r41n D3: a file rewritten in place (same inode and birth time) holds a new bad line
/// at the offset of a bad line of its old content. The tailer reads it from its start (another
/// first line); before, the new line's quarantine record was dropped as a repeat of the old
/// one, remembered by session, inode and birth time only. Now it is remembered by the identity
/// the offsets use (first line too): both lines are kept.
#[test]
fn a_bad_line_of_a_file_rewritten_in_place_keeps_its_record() {
    let _files = beside_others();
    let w = work();
    let path = export_dir(&w.ray.root).join("event_EXPORT_DRIVER_JOB.log");
    let good = |tag| driver_job_lines(1, tag);
    std::fs::write(&path, format!("OLD bad line, not json\n{}", good(1))).unwrap();
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", 1.0);
    wait_metric(&c, "rhc_events_quarantined_total", 1.0);
    let ino = inode(&path);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(0).unwrap();
        f.write_all(format!("NEW bad line, not json\n{}", good(2)).as_bytes())
            .unwrap();
    }
    assert_eq!(inode(&path), ino, "rewritten in place");
    wait_metric(&c, "rhc_events_accepted_total", 2.0);
    // The pass that took the good line took the bad one before it.
    let quarantined = c.metric("rhc_events_quarantined_total");
    c.terminate_ok(Duration::from_secs(30));
    let mut raw: Vec<String> = quarantine_records(&w.bucket)
        .iter()
        .map(|r| r["raw"].as_str().unwrap_or_default().to_string())
        .collect();
    raw.sort();
    assert_eq!(
        (quarantined, raw),
        (
            2.0,
            vec![
                "NEW bad line, not json".to_string(),
                "OLD bad line, not json".to_string()
            ]
        ),
        "{}",
        c.log_text()
    );
}

/// Rewrites the offsets file as the collector before issue 41 wrote it: version 0, three
/// fields per file (inode, offset, a hash of the first 64 bytes); two files in it.
fn to_version_0(path: &Path) {
    let mut saved: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    saved["version"] = 0.into();
    for entry in saved["files"].as_object_mut().unwrap().values_mut() {
        entry
            .as_object_mut()
            .unwrap()
            .retain(|k, _| ["inode", "offset", "fingerprint"].contains(&k.as_str()));
    }
    assert_eq!(saved["files"].as_object().unwrap().len(), 2, "{saved}");
    std::fs::write(path, serde_json::to_vec(&saved).unwrap()).unwrap();
}

/// Issue 41 (review, defect 3): the same upgrade on a filesystem without birth times (ext4
/// with 128-byte inodes, NFS), here made by the fault shim, whose `statx` hides the birth
/// time (test-only, loaded with LD_PRELOAD). A version-0 entry then cannot be proven to be
/// its file (Ray's lines of one type share their first 64 bytes), so every such file is read
/// again from its start: the new live file at the deleted backup's inode whole (before: its
/// first 25,600 bytes skipped, 50 of 100 lines lost), and the 5 lines of the old live file
/// (now `.log.1`) again, dropped as repeats by the deduplication window, which the ids
/// journal refilled across the restart. (`offsets_of_an_older_collector_on_a_filesystem_
/// without_birth_times` runs the same on a real ext4 without birth times, where it can mount
/// one.)
#[test]
fn offsets_of_an_older_collector_without_birth_times_lose_no_line() {
    let _files = alone();
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    faults.hide_birth_times();
    upgrade_from_version_0_without_birth_times(tmp.path(), &faults.env());
}

/// The same on a real filesystem without birth times: a loop-mounted ext4 with 128-byte
/// inodes. Skipped, saying so, only where one cannot be mounted (not root, no loop device).
#[test]
fn offsets_of_an_older_collector_on_a_filesystem_without_birth_times() {
    let _files = alone();
    let tmp = tempfile::tempdir().unwrap();
    let fs = match rhc_testkit::nobtime::NoBirthTimeFs::mount(tmp.path()) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("SKIPPED: cannot mount a filesystem without birth times here: {why}");
            return;
        }
    };
    let work = fs.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    upgrade_from_version_0_without_birth_times(&work, &[]);
}

/// The upgrade of [`offsets_of_an_older_collector_without_birth_times_lose_no_line`] in
/// `work`, on whatever filesystem that is: run 1 reads 55 lines and stops, its offsets
/// become version 0, Ray's rotation puts a new live file of 100 lines on the freed inode,
/// run 2 must store exactly those 100 and drop the 5 it reads again.
fn upgrade_from_version_0_without_birth_times(work: &Path, env: &[(&str, &str)]) {
    let w = work_at(work);
    let (ray, bucket, spool) = (&w.ray.root, &w.bucket, &w.spool);
    let files = DriverJobFiles::write(ray);
    let mut c = w.start(&[], env);
    assert!(
        std::fs::metadata(&files.live).unwrap().created().is_err() || !env.is_empty(),
        "the test needs a filesystem without birth times, or the shim hiding them"
    );
    wait_metric(&c, "rhc_events_accepted_total", 55.0);
    c.terminate_ok(Duration::from_secs(30));
    to_version_0(&spool.join("export-offsets.json"));

    files.rotate_onto_the_freed_inode();
    c.restart();
    wait_accepted(&c, 100.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.metric("rhc_events_duplicate_total") < 5.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let repeats = c.metric("rhc_events_duplicate_total");
    c.terminate_ok(Duration::from_secs(30));
    assert_all_155_once(bucket, &c.log_text());
    assert_eq!(
        repeats,
        5.0,
        "the old live file's 5 lines are read again and dropped as repeats:\n{}",
        c.log_text()
    );
}

/// Issue 41 (review r40b, D2): the upgrade from a collector older than the ids journal (its
/// offsets file of version 0, no `dedup/` in the spool) on a filesystem without birth times
/// (the fault shim's `statx` hides them), the export files unchanged since the save. Before,
/// no version-0 entry applied without a birth time: every file was read again from its start
/// and, with no journal to refill the window, all 55 lines were stored twice (1878716 stored
/// none twice). Now a file whose ctime is before the offsets file's save is the entry's file:
/// its offset applies and nothing is read again.
#[test]
fn an_upgrade_without_birth_times_reads_no_unchanged_file_again() {
    let _files = alone();
    let w = work();
    let faults = Faults::build(&w.dir);
    faults.hide_birth_times();
    let (ray, bucket, spool) = (&w.ray.root, &w.bucket, &w.spool);
    let _files = DriverJobFiles::write(ray);
    let mut c = w.start(&[], &faults.env());
    wait_metric(&c, "rhc_events_accepted_total", 55.0);
    c.terminate_ok(Duration::from_secs(30));
    // The files' last change is now before the save below (timestamps tick in milliseconds).
    std::thread::sleep(Duration::from_millis(50));
    let path = spool.join("export-offsets.json");
    to_version_0(&path);
    // A collector before the ids journal left no `dedup/`.
    std::fs::remove_dir_all(spool.join("dedup")).unwrap();
    c.restart();
    // The pass that takes the entries saves them with their identity.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if now["files"]
            .as_object()
            .is_some_and(|f| f.values().all(|e| e["first_line"].is_object()))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{now}\n{}", c.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let again = c.metric("rhc_events_accepted_total");
    c.terminate_ok(Duration::from_secs(30));
    let twice = stored_ids(bucket).values().filter(|&&n| n > 1).count();
    assert_eq!(
        (again, twice),
        (0.0, 0),
        "unchanged files were read again after the upgrade:\n{}",
        c.log_text()
    );
}

/// Issue 41.1, the upgrade: the offsets file of an older collector (version 0: inode, offset
/// and a hash of the first 64 bytes per file) is read. Its entry for a file still there
/// resumes at its offset (nothing read twice), and the new live file at the deleted backup's
/// inode, born after that offsets file was saved, is read from its start.
#[test]
fn offsets_of_an_older_collector_neither_lose_nor_repeat_lines() {
    let _files = alone();
    let w = work();
    let ray = &w.ray.root;
    let files = DriverJobFiles::write(ray);
    assert!(
        std::fs::metadata(&files.live).unwrap().created().is_ok(),
        "this test needs a filesystem that records birth times (ext4, xfs, btrfs, tmpfs)"
    );
    let bucket = &w.bucket;
    let spool = &w.spool;
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", 55.0);
    c.terminate_ok(Duration::from_secs(30));
    let path = spool.join("export-offsets.json");
    to_version_0(&path);

    files.rotate_onto_the_freed_inode();
    c.restart();
    wait_accepted(&c, 100.0);
    std::thread::sleep(Duration::from_millis(500));
    c.terminate_ok(Duration::from_secs(30));
    assert_all_155_once(bucket, &c.log_text());
    // Both entries now carry the file's identity.
    let now: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for (k, entry) in now["files"].as_object().unwrap() {
        assert!(entry["first_line"].is_object(), "{k}: {now}");
    }
}

/// The offsets file cannot be written (the fault shim refuses its temp file): the stored
/// lines are not sealed while their offsets are unsaved (their open segment's object may
/// grow in the bucket, but the segment stays in the spool), so a kill -9 and a restart
/// (which reloads their ids from the spool) store none of them twice.
#[test]
fn an_unsaved_checkpoint_keeps_its_lines_from_the_bucket() {
    let _files = beside_others();
    const LINES: usize = 20_000;
    /// `EACCES`, as if the spool directory had become read-only for the offsets file.
    const EACCES: i32 = 13;
    let w = work();
    let faults = Faults::build(&w.dir);
    faults.arm("open", EACCES, 1_000_000, "export-offsets.json.tmp");
    let ray = &w.ray.root;
    std::fs::write(
        export_dir(ray).join("event_EXPORT_TASK.log"),
        backlog(LINES, "c"),
    )
    .unwrap();
    let bucket = &w.bucket;
    let mut c = w.start(&["--max-segment-bytes", "1MiB"], &faults.env());
    wait_metric(&c, "rhc_events_accepted_total", 1.0);
    // Several rotation intervals: time enough to seal and upload segments.
    std::thread::sleep(Duration::from_secs(4));
    let uploaded = stored_ids(bucket).len();
    c.kill9();
    assert!(faults.armed("open"), "the rule was used up");
    faults.disarm("open");
    c.restart();
    wait_metric(&c, "rhc_events_accepted_total", 1.0);
    std::thread::sleep(Duration::from_secs(3));
    c.terminate_ok(Duration::from_secs(60));
    let ids = stored_ids(bucket);
    let twice = ids.values().filter(|&&n| n > 1).count();
    assert_eq!(
        twice,
        0,
        "{twice} ids stored more than once ({uploaded} uploaded before the kill):\n{}",
        c.log_text()
    );
    assert_eq!(ids.len(), LINES, "lines missing");
    // Lines whose offsets are unsaved may be in the bucket already (the open segment's
    // object grows within --upload-window), but their segment is not sealed, so it stays in
    // the spool: the restart reloads their ids and the lines read again are duplicates of
    // those, not new objects. Hence the check above, not "nothing uploaded".
    println!("{uploaded} ids in the bucket before the kill, none stored twice");
}

/// Bytes the spool's budget counts as stored, read from the disk: segments, quarantine
/// files, and the compressed copies of open segments (`growth/*.gz`).
fn spool_bytes_on_disk(spool: &Path) -> u64 {
    let size = |p: &PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
    let under = |d: &str| -> u64 {
        rhc_testkit::collector::files_under(&spool.join(d))
            .iter()
            .filter(|p| d != "growth" || p.extension().is_some_and(|e| e == "gz"))
            .map(size)
            .sum()
    };
    under("events") + under("quarantine") + under("growth")
}

/// Issue 41, item 2: one 5,632,000-byte export file (54 % of a 10 MiB budget) while the
/// bucket refuses every write, segments open (the default rotation): the export lines are
/// counted once, and Ray's pushed events (batches of 50 every 100 ms) keep getting 200
/// until the spool really holds close to the 90 % mark: at least 85 % of the budget on
/// disk at the first 503 (f6212bd answered 503 from the first request, "11310298 of
/// 9437184 bytes used" with 5.7 MB on disk, as the unpublished export bytes counted twice).
#[test]
fn an_export_backlog_is_counted_once_while_the_bucket_refuses_writes() {
    let _files = beside_others();
    const BUDGET: u64 = 10 << 20;
    const LINES: usize = 5500;
    let w = work();
    let ray = &w.ray.root;
    let spool = &w.spool;
    let budget = BUDGET.to_string();
    // The default rotations.
    let c = w
        .collector()
        .only(&[
            "--cluster-name",
            "exp",
            "--enable-log-collector",
            "false",
            "--max-spool-bytes",
            &budget,
        ])
        .start();
    // The bucket becomes a file: every write to it fails from now on.
    w.refuse_uploads();
    // Lines of 1,024 bytes, as in the issue.
    let file = backlog(LINES, "e").replace(&"x".repeat(900), &"x".repeat(890));
    assert_eq!(file.len(), 5_632_000);
    std::fs::write(export_dir(ray).join("event_EXPORT_TASK.log"), &file).unwrap();
    wait_metric(&c, "rhc_events_accepted_total", LINES as f64);
    let url = c.url("/v1/events");
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut n = 0usize;
    let refused = loop {
        assert!(
            Instant::now() < deadline,
            "never refused:\n{}",
            c.log_tail(20)
        );
        let events: Vec<String> = (n..n + 50)
            .map(|i| {
                format!(
                    r#"{{"eventId":"p-{i}","sourceType":"CORE_WORKER","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:08:40.945470430Z","severity":"INFO","sessionName":"{SESSION}","nodeId":"OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==","taskLifecycleEvent":{{"taskId":"t-{i}","jobId":"AQAAAA==","stateTransitions":[{{"state":"RUNNING","timestamp":"2026-11-22T02:08:40.945470430Z"}}]}},"message":""}}"#
                )
            })
            .collect();
        let r = rhc_testkit::http::try_http_request(
            "POST",
            &url,
            &[("Content-Type", "application/json")],
            format!("[{}]", events.join(",")).as_bytes(),
        )
        .expect("POST");
        if r.status != 200 {
            break r;
        }
        n += 50;
        std::thread::sleep(Duration::from_millis(100));
    };
    let on_disk = spool_bytes_on_disk(spool);
    let said = String::from_utf8_lossy(&refused.body).into_owned();
    println!(
        "first refusal after {n} pushed events: {} {said:?}; on disk {on_disk} bytes of {BUDGET} ({:.1} %)",
        refused.status,
        on_disk as f64 * 100.0 / BUDGET as f64
    );
    assert_eq!(refused.status, 503, "{said}");
    assert!(
        on_disk >= BUDGET / 100 * 85,
        "503 with {on_disk} bytes on disk, below 85 % of {BUDGET}: {said}"
    );
    assert!(on_disk <= BUDGET / 10 * 9, "{on_disk} bytes on disk");
}

/// Issue 35, point 3: every save of the offsets fails (a directory where their temp file
/// goes), SIGTERM, the fault removed, a restart that reads every line again, SIGTERM: each
/// line is in the bucket once. The shutdown's seal uploads and deletes the segments although
/// the offsets are unsaved; the ids journal keeps their ids for the restart's window (before
/// it, 500 of 500 lines were stored twice).
#[test]
fn a_shutdown_with_an_unsaved_checkpoint_then_a_restart_stores_each_line_once() {
    let _files = beside_others();
    const LINES: usize = 500;
    let w = work();
    let ray = &w.ray.root;
    std::fs::write(
        export_dir(ray).join("event_EXPORT_TASK.log"),
        backlog(LINES, "u"),
    )
    .unwrap();
    let bucket = &w.bucket;
    let spool = &w.spool;
    let blocker = spool.join("export-offsets.json.tmp");
    std::fs::create_dir_all(&blocker).unwrap();
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", LINES as f64);
    assert!(
        !spool.join("export-offsets.json").exists(),
        "the offsets were saved"
    );
    c.terminate_ok(Duration::from_secs(60));
    std::fs::remove_dir(&blocker).unwrap();
    c.restart();
    // The restart reads every line again: each is a duplicate or (before) stored again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.metric("rhc_events_accepted_total") + c.metric("rhc_events_duplicate_total")
        < LINES as f64
    {
        assert!(
            Instant::now() < deadline,
            "the lines were not read again:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    c.terminate_ok(Duration::from_secs(60));
    let ids = stored_ids(bucket);
    let twice = ids.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "{twice} of {LINES} lines stored twice");
    assert_eq!(ids.len(), LINES, "lines missing");
}

/// Review r41n D2: as above, with a bad line after each good one. The restart reads every
/// line again; before, the quarantine's memory of the bad lines was the writer's, in memory
/// only, and each got a second record (20 of 20). Now a line read from a file is remembered in
/// the deduplication window too, whose ids the journal keeps: each is recorded once.
#[test]
fn a_restart_after_an_unsaved_checkpoint_records_each_bad_line_once() {
    let _files = beside_others();
    const LINES: usize = 20;
    let w = work();
    let mut text = String::new();
    for (i, line) in backlog(LINES, "q").lines().enumerate() {
        text.push_str(line);
        text.push_str(&format!("\nbad line {i}, not json\n"));
    }
    std::fs::write(export_dir(&w.ray.root).join("event_EXPORT_TASK.log"), text).unwrap();
    let blocker = w.spool.join("export-offsets.json.tmp");
    std::fs::create_dir_all(&blocker).unwrap();
    let mut c = w.start(&[], &[]);
    wait_metric(&c, "rhc_events_accepted_total", LINES as f64);
    wait_metric(&c, "rhc_events_quarantined_total", LINES as f64);
    c.terminate_ok(Duration::from_secs(60));
    std::fs::remove_dir(&blocker).unwrap();
    c.restart();
    // Every line read again: each a duplicate, or (before) stored or recorded again.
    let seen = |c: &Collector| {
        c.metric("rhc_events_accepted_total")
            + c.metric("rhc_events_duplicate_total")
            + c.metric("rhc_events_quarantined_total")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen(&c) < 2.0 * LINES as f64 {
        assert!(
            Instant::now() < deadline,
            "the lines were not read again:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    c.terminate_ok(Duration::from_secs(60));
    let mut records: HashMap<(String, u64), usize> = HashMap::new();
    for r in quarantine_records(&w.bucket) {
        let at = (
            r["source_file"].as_str().unwrap_or_default().to_string(),
            r["source_offset"].as_u64().unwrap_or(u64::MAX),
        );
        *records.entry(at).or_default() += 1;
    }
    let twice = records.values().filter(|&&n| n > 1).count();
    assert_eq!(
        (records.len(), twice),
        (LINES, 0),
        "bad lines recorded (distinct, twice):\n{}",
        c.log_text()
    );
    let ids = stored_ids(&w.bucket);
    assert_eq!(ids.len(), LINES, "lines missing");
    assert!(ids.values().all(|&n| n == 1), "lines stored twice");
}

/// Issue 37 (r37i D1): a Train run line over 8 MiB (a 9 MiB status detail) at the default
/// 1 GiB budget is cut, its first part quarantined, and reading goes on: the run's later
/// lines and the session's other files are stored. (The quarantine record of an 8 MiB cut
/// is larger than a batch's 8 MiB; an empty batch once refused it, stopping every export
/// file of the node for good, "spool at 80%" with the spool empty.)
#[test]
fn a_line_over_8_mib_is_cut_and_quarantined_and_reading_goes_on() {
    let _files = beside_others();
    let w = work();
    let dir = export_dir(&w.ray.root);
    let mut run: Value = serde_json::from_str(&train_line("EXPORT_TRAIN_RUN")).unwrap();
    run["event_data"]["status_detail"] =
        Value::String(format!("Traceback START\n{}\nEND", "x".repeat(9 << 20)));
    let attempt = train_line("EXPORT_TRAIN_RUN_ATTEMPT");
    std::fs::write(
        dir.join("event_EXPORT_TRAIN_RUN.log"),
        format!("{run}\n{}\n", train_line("EXPORT_TRAIN_RUN")),
    )
    .unwrap();
    std::fs::write(
        dir.join("event_EXPORT_TRAIN_RUN_ATTEMPT.log"),
        format!("{attempt}\n"),
    )
    .unwrap();
    let mut c = w.start(&[], &[]);
    wait_metric_within(
        &c,
        "rhc_events_accepted_total",
        2.0,
        Duration::from_secs(60),
    );
    wait_metric(&c, "rhc_events_quarantined_total", 1.0);
    c.terminate_ok(Duration::from_secs(60));
    let log = c.log_text();
    assert!(
        !log.contains("export event files wait on disk"),
        "the tailer stopped on the long line:\n{log}"
    );
    let stored = stored_export_lines(&w.bucket);
    assert_eq!(
        stored.values().map(Vec::len).sum::<usize>(),
        2,
        "the run's next line and the attempt: {stored:?}"
    );
    let quarantined = quarantine_records(&w.bucket);
    let first = quarantined
        .iter()
        .find(|r| r["source_offset"] == 0)
        .unwrap_or_else(|| panic!("no record of the line's first part: {}", quarantined.len()));
    assert_eq!(first["source_file"], "event_EXPORT_TRAIN_RUN.log");
    assert_eq!(first["raw"].as_str().unwrap().len(), 8 << 20);
}

/// Every quarantine record in the bucket.
fn quarantine_records(bucket: &Path) -> Vec<Value> {
    bucket_objects(bucket)
        .iter()
        .filter(|(k, _)| k.starts_with("collector-quarantine/"))
        .flat_map(|(k, v)| {
            decode(k, v)
                .split(|&c| c == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Review r41j D2: two lines of one file longer than the longest kept whole (8 MiB) whose
/// first 8 MiB are the same (Ray's two `EXPORT_DRIVER_JOB` lines of a job with a 9 MiB
/// runtime env): each keeps its own record of its first part, at its own offset. (main at 27030f5 remembered such records by their bytes: the second line's
/// record was taken for a repeat of the first and dropped.)
#[test]
fn two_overlong_lines_with_the_same_first_part_keep_a_record_each() {
    let _files = beside_others();
    let w = work();
    let pad = "e".repeat(9 << 20);
    let line = |id: &str| {
        format!(
            "{{\"event_data\": {{\"pad\": \"{pad}\", \"job_id\": \"BwAAAA==\"}}, \"event_id\": \"{id}\", \"timestamp\": 1795313307, \"source_type\": \"EXPORT_DRIVER_JOB\"}}\n"
        )
    };
    let (first, second) = (line("submit"), line("end"));
    let file = format!("{first}{second}{}", job_line(8, 1_795_313_307, "ok-"));
    std::fs::write(
        export_dir(&w.ray.root).join("event_EXPORT_DRIVER_JOB.log"),
        &file,
    )
    .unwrap();
    let mut c = w.start(&[], &[]);
    wait_metric_within(
        &c,
        "rhc_events_accepted_total",
        1.0,
        Duration::from_secs(60),
    );
    // Each line's first part, and its rest (not JSON).
    wait_metric_within(
        &c,
        "rhc_events_quarantined_total",
        4.0,
        Duration::from_secs(60),
    );
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "{}", c.log_tail(20));
    let mut cut: Vec<u64> = quarantine_records(&w.bucket)
        .iter()
        .filter(|r| r["reason"] == "export_bad_event")
        .map(|r| r["source_offset"].as_u64().unwrap())
        .collect();
    cut.sort();
    assert_eq!(
        cut,
        [0, first.len() as u64],
        "a record of each line's first part"
    );
}

/// One `EXPORT_DRIVER_JOB` line of job `job` (4 bytes) at `ts`, with its id.
fn job_line(job: u32, ts: u64, tag: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(job.to_be_bytes());
    format!(
        "{{\"event_id\": \"{tag}{job:08}\", \"timestamp\": {ts}, \"source_type\": \"EXPORT_DRIVER_JOB\", \"event_data\": {{\"job_id\": \"{b64}\", \"pad\": \"{}\"}}}}\n",
        "x".repeat(120)
    )
}

/// Review r41i D1: a backlog naming 600 jobs over three hours (1,800 partitions of the
/// spool): every line lands under its own job and its own hour, none in quarantine. The
/// spool bounds one request at 512 partitions (past 256 it files events under the arrival
/// hour, past 512 it quarantines them as `too_many_partitions`); a batch of the tailer ends
/// before it would pass that bound. (main at 1cfd7e4: 512 stored, 88 quarantined, and lines
/// of the hours read later filed under the arrival hour.)
#[test]
fn a_backlog_of_more_jobs_than_one_request_may_name_keeps_each_line_at_its_job_and_hour() {
    let _files = beside_others();
    const JOBS: u32 = 600;
    let w = work();
    let mut file = String::new();
    let mut hour_of: HashMap<String, u64> = HashMap::new();
    for job in 0..JOBS {
        for h in 0..3u64 {
            let ts = 1_795_313_307 + h * 3600;
            file.push_str(&job_line(job, ts, &format!("h{h}-")));
            hour_of.insert(format!("h{h}-{job:08}"), ts / 3600);
        }
    }
    std::fs::write(
        export_dir(&w.ray.root).join("event_EXPORT_DRIVER_JOB.log"),
        &file,
    )
    .unwrap();
    let mut c = w.start(&[], &[]);
    let total = f64::from(JOBS * 3);
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.metric("rhc_events_accepted_total") + c.metric("rhc_events_quarantined_total") < total
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let quarantined = c.metric("rhc_events_quarantined_total");
    let status = c.terminate(Duration::from_secs(60));
    assert!(status.success(), "{}", c.log_tail(20));
    let prefix = format!("cluster-history/raycluster/default/exp/{SESSION}/{NODE}/export_events/");
    // Each line's hour (unix hours) to the hours named by the keys it is stored under.
    let mut keys_of: HashMap<u64, std::collections::BTreeSet<String>> = HashMap::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut misfiled = 0;
    for (k, v) in bucket_objects(&w.bucket)
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
    {
        let (group, name) = k[prefix.len()..].split_once('/').unwrap();
        let hour = name[NODE.len() + 1..NODE.len() + 14].to_string();
        for line in decode(k, v)
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
        {
            let v: Value = serde_json::from_slice(line).unwrap();
            let id = v["event_id"].as_str().unwrap().to_string();
            let job: u32 = id[3..].parse().unwrap();
            if group != format!("{job:08x}") {
                misfiled += 1;
            }
            keys_of
                .entry(hour_of[&id])
                .or_default()
                .insert(hour.clone());
            *seen.entry(id).or_insert(0) += 1;
        }
    }
    println!("hours: {keys_of:?}");
    assert_eq!(
        seen.len(),
        hour_of.len(),
        "{} of {} lines stored; quarantined {quarantined}:\n{}",
        seen.len(),
        hour_of.len(),
        c.log_tail(20)
    );
    assert!(seen.values().all(|&n| n == 1), "a line stored twice");
    assert_eq!(misfiled, 0, "lines under another job's directory");
    assert_eq!(keys_of.len(), 3);
    let hours: std::collections::BTreeSet<&String> = keys_of.values().flatten().collect();
    assert!(
        keys_of.values().all(|h| h.len() == 1) && hours.len() == 3,
        "lines filed under another hour than their own: {keys_of:?}"
    );
}

/// Review r41i D2: export lines of 1,200 new jobs, in three waves, while the bucket refuses
/// every write (10 MiB budget): each new job is a new partition, whose segment file and two
/// growth files count 4 KiB each in the budget besides its line. The tailer counts them, so
/// it stops below 80 % and Ray's pushed events keep getting 200 (main at 1cfd7e4 counted the
/// lines only: 503 "over its high watermark" with 800 jobs read, 380 KB of lines).
#[test]
fn export_lines_of_many_new_jobs_leave_room_for_pushed_events() {
    let _files = beside_others();
    let w = work();
    // Segments stay open (the default rotation), as in the review.
    let mut c = w
        .collector()
        .only(&[
            "--cluster-name",
            "exp",
            "--enable-log-collector",
            "false",
            "--max-spool-bytes",
            "10MiB",
        ])
        .start();
    w.refuse_uploads();
    let path = export_dir(&w.ray.root).join("event_EXPORT_DRIVER_JOB.log");
    std::fs::write(&path, b"").unwrap();
    for wave in 0..3u32 {
        let lines: String = (0..400)
            .map(|j| job_line(wave * 400 + j, 1_795_313_307, "w-"))
            .collect();
        append(&path, lines.as_bytes());
        // Read as far as the budget lets the tailer (680 jobs or so), then steady.
        wait_read_steady(&c);
        assert_pushed_events_taken(&c, &format!("wave {}", wave + 1));
    }
    c.kill9();
}

/// Waits until the tailer has read what it will (accepted events steady for 2 s).
fn wait_read_steady(c: &Collector) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = -1.0;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = c.metric("rhc_events_accepted_total");
        if now == last && now > 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the tailer kept reading");
        last = now;
    }
}

/// Three of Ray's pushed batches get 200, and `/readyz` 200.
fn assert_pushed_events_taken(c: &Collector, when: &str) {
    let body = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/posts-camel.jsonl"
    ))
    .unwrap();
    let post = body.lines().next().unwrap().as_bytes();
    for _ in 0..3 {
        let r = c.post(post);
        assert_eq!(
            r.status,
            200,
            "{when}: {} (spool bytes {}, segments {})",
            String::from_utf8_lossy(&r.body),
            c.metric("rhc_spool_bytes"),
            c.metric("rhc_spool_segments")
        );
    }
    let ready = c.get("/readyz").unwrap();
    assert_eq!(
        ready.status,
        200,
        "{when}: {}",
        String::from_utf8_lossy(&ready.body)
    );
}

/// Review r41j D1: 1 s rotations (as the reviewer ran) and a bucket that refuses every
/// write (4 MiB budget): the segments of 200 jobs' export lines are sealed, each with its
/// shadow and record claimed (three files of 4 KiB), then lines of 300 new jobs come. The
/// tailer leaves aside the files every segment in the spool, open or sealed, has yet to
/// claim, so it stops below 80 % and pushed events keep getting 200. (main at 27030f5 left
/// aside those the open segments lacked less those the sealed ones had, none here: it read
/// on, and once the new segments claimed theirs, 503 "spool is over its high watermark"
/// with 0.1 MB of lines in the spool.)
#[test]
fn export_lines_of_new_jobs_beside_sealed_segments_leave_room_for_pushed_events() {
    let _files = beside_others();
    let w = work();
    let mut c = w.start(&["--max-spool-bytes", "4MiB"], &[]);
    w.refuse_uploads();
    let path = export_dir(&w.ray.root).join("event_EXPORT_DRIVER_JOB.log");
    let jobs = |from: u32, n: u32| -> String {
        (from..from + n)
            .map(|j| job_line(j, 1_795_313_307, "s-"))
            .collect()
    };
    let count = |d: &str| {
        let dir = w.spool.join(d);
        if dir.is_dir() {
            rhc_testkit::collector::files_under(&dir).len()
        } else {
            0
        }
    };
    let wait_growth_files = |at_least: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while count("growth") < at_least && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    std::fs::write(&path, jobs(0, 200)).unwrap();
    wait_metric(&c, "rhc_events_accepted_total", 200.0);
    // Sealed, and the seal tried: a shadow and a record each.
    wait_growth_files(400);
    assert!(count("growth") >= 400, "{}", c.log_tail(20));
    append(&path, jobs(200, 300).as_bytes());
    wait_read_steady(&c);
    // The new segments sealed too, and their files claimed (as far as there is room).
    wait_growth_files(2 * count("events"));
    // What the budget counts, from the disk: bytes, and 4 KiB a file.
    let files = ["events", "quarantine", "growth", "markers"].map(count);
    let used = spool_bytes_on_disk(&w.spool) + files.iter().sum::<usize>() as u64 * 4096;
    let mark = (4u64 << 20) / 100 * 80;
    println!("{used} bytes of the budget used, files {files:?}, the tailer's mark {mark}");
    assert!(
        used <= mark,
        "the tailer filled the spool to {used} bytes, past its mark {mark} (files {files:?})"
    );
    assert_pushed_events_taken(&c, "after the second wave");
    c.kill9();
}

/// Quarantine records whose `raw` is `raw`, by the offset they name.
fn records_of(bucket: &Path, raw: &str) -> HashMap<u64, usize> {
    let mut at: HashMap<u64, usize> = HashMap::new();
    for r in quarantine_records(bucket)
        .iter()
        .filter(|r| r["raw"] == raw)
    {
        *at.entry(r["source_offset"].as_u64().unwrap_or(u64::MAX))
            .or_default() += 1;
    }
    at
}

/// Review r41q D1: a kill -9 after a batch holding a bad line is durable, at the ids
/// journal's append (before the offsets are saved). The restart reads the line again; a good
/// line's id comes back from the spool's segment, and now a bad line's key comes back from
/// its record (`source_key`), so it keeps one record (main at 6731502: two, the key being in
/// the journal only).
#[test]
fn a_kill9_before_the_journal_append_records_a_bad_line_once() {
    let _files = beside_others();
    let w = work();
    let faults = Faults::build(&w.dir);
    let path = export_dir(&w.ray.root).join("event_EXPORT_TASK.log");
    let good = backlog(2, "j");
    let (first, second) = good.split_at(good.find('\n').unwrap() + 1);
    std::fs::write(&path, first).unwrap();
    let mut c = w.start(&[], &faults.env());
    wait_metric(&c, "rhc_events_accepted_total", 1.0);
    // The pass that read it is over, its offsets saved.
    std::thread::sleep(Duration::from_millis(1500));
    faults.arm("write", rhc_testkit::fault_shim::KILL, 1, "/dedup/ids-");
    append(&path, format!("this line is not json\n{second}").as_bytes());
    let status = c.wait_exit(Duration::from_secs(30));
    assert!(
        status.as_ref().is_ok_and(|s| !s.success()) && !faults.armed("write"),
        "not killed at the journal's append ({status:?}):\n{}",
        c.log_text()
    );
    c.restart();
    let seen = |c: &Collector| {
        c.metric("rhc_events_accepted_total")
            + c.metric("rhc_events_duplicate_total")
            + c.metric("rhc_events_quarantined_total")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen(&c) < 2.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    c.terminate_ok(Duration::from_secs(60));
    let records = records_of(&w.bucket, "this line is not json");
    assert_eq!(
        records,
        HashMap::from([(first.len() as u64, 1)]),
        "records of the bad line by offset:\n{}",
        c.log_text()
    );
    let ids = stored_ids(&w.bucket);
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.values().all(|&n| n == 1), "{ids:?}");
}

/// Review r41q D4: a file whose first line (300,000 bytes, not JSON) is longer than the
/// longest line kept whole at a 1 MiB budget, then a good line and a short bad one; the
/// bucket refuses writes, so what run 1 stored stays in the spool. kill -9 at the offsets'
/// save; the restart reads the file again from its start with less room. Each line is now
/// cut at the limit whatever the room of the read, so the file has the same identity in
/// both runs and each bad piece keeps one record (main at 6731502: run 1 read the first
/// line whole, run 2 cut it, and the file's other identity gave every bad line a second
/// record).
#[test]
fn an_overlong_first_line_gives_a_file_the_same_identity_after_a_kill9() {
    let _files = beside_others();
    let w = work();
    let faults = Faults::build(&w.dir);
    let long = "Z".repeat(300_000);
    let good = backlog(1, "o");
    let mut c = w.start(&["--max-spool-bytes", "1MiB"], &faults.env());
    w.refuse_uploads();
    faults.arm(
        "open",
        rhc_testkit::fault_shim::KILL,
        1,
        "export-offsets.json.tmp",
    );
    std::fs::write(
        export_dir(&w.ray.root).join("event_EXPORT_TASK.log"),
        format!("{long}\n{good}short bad\n"),
    )
    .unwrap();
    let status = c.wait_exit(Duration::from_secs(30));
    assert!(
        status.as_ref().is_ok_and(|s| !s.success()) && !faults.armed("open"),
        "not killed at the offsets' save ({status:?}):\n{}",
        c.log_text()
    );
    // The bucket a directory again (a start needs one), every object written to it failing
    // (`EIO`) while the restart reads the file again.
    std::fs::remove_file(&w.bucket).unwrap();
    std::fs::create_dir_all(&w.bucket).unwrap();
    faults.arm("open", 5, 1_000_000, &format!("{}/", w.bucket.display()));
    c.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.metric("rhc_events_duplicate_total") + c.metric("rhc_events_accepted_total") < 1.0
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    // The bucket back: what the spool holds goes up.
    faults.disarm("open");
    c.terminate_ok(Duration::from_secs(60));
    let short = records_of(&w.bucket, "short bad");
    assert_eq!(
        short.values().copied().collect::<Vec<_>>(),
        [1],
        "records of the short bad line by offset:\n{}",
        c.log_text()
    );
    let mut pieces: HashMap<u64, usize> = HashMap::new();
    for r in quarantine_records(&w.bucket)
        .iter()
        .filter(|r| r["raw"].as_str().is_some_and(|s| s.starts_with('Z')))
    {
        *pieces
            .entry(r["source_offset"].as_u64().unwrap())
            .or_default() += 1;
    }
    assert!(
        pieces.values().all(|&n| n == 1),
        "pieces of the long line recorded twice: {pieces:?}"
    );
    let covered: usize = quarantine_records(&w.bucket)
        .iter()
        .filter(|r| r["raw"].as_str().is_some_and(|s| s.starts_with('Z')))
        .map(|r| r["raw"].as_str().unwrap().len())
        .sum();
    assert_eq!(
        covered,
        long.len(),
        "the long line kept whole, once: {pieces:?}"
    );
    let ids = stored_ids(&w.bucket);
    assert_eq!(ids.values().copied().collect::<Vec<_>>(), [1], "{ids:?}");
}

/// Review r41n D4 (r41q D5): the copy ratio learnt low first (a compressible backlog
/// uploaded, 4 MiB budget), then the bucket refuses writes and 300 earlier sessions appear on
/// the node, one export line each. Each new session also makes a marker file on the head (4
/// KiB in the budget), which a batch now counts: the tailer stops below 80 % and pushed events
/// keep getting 200 (main at 6731502 counted segment, shadow and record only: 237 sessions
/// read, the markers took the spool to 97 % and pushed events got 503).
#[test]
fn export_lines_of_many_new_sessions_leave_room_for_pushed_events() {
    let _files = beside_others();
    let w = work();
    let c = w.start(&["--max-spool-bytes", "4MiB"], &[]);
    std::fs::write(
        export_dir(&w.ray.root).join("event_EXPORT_TASK.log"),
        backlog(3000, "r"),
    )
    .unwrap();
    wait_metric_within(
        &c,
        "rhc_events_accepted_total",
        3000.0,
        Duration::from_secs(60),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.metric("rhc_spool_bytes") >= 5000.0 {
        assert!(
            Instant::now() < deadline,
            "never uploaded:\n{}",
            c.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    w.refuse_uploads();
    // The sessions made aside, then moved in at once.
    let staging = rhc_testkit::ray_logs::RayRoot::new(&w.dir.join("staging"));
    let mut names = Vec::new();
    for s in 0..300u32 {
        let name = format!(
            "session_2026-11-21_{:02}-{:02}-{:02}_000001_{}",
            s / 3600,
            s / 60 % 60,
            s % 60,
            1000 + s
        );
        let logs = staging.session(&name, NODE, false);
        std::fs::create_dir_all(logs.join("export_events")).unwrap();
        std::fs::write(
            logs.join("export_events")
                .join("event_EXPORT_DRIVER_JOB.log"),
            job_line(s, 1_795_313_307, &format!("s{s}-")),
        )
        .unwrap();
        names.push(name);
    }
    for name in &names {
        std::fs::rename(staging.root.join(name), w.ray.root.join(name)).unwrap();
    }
    wait_read_steady(&c);
    assert_pushed_events_taken(&c, "after the sessions were read");
    let mut c = c;
    c.kill9();
}

/// Pseudo-random bytes (xorshift), base64: what compresses badly.
fn noise(state: &mut u64, n: usize) -> String {
    let bytes: Vec<u8> = (0..n)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            (*state >> 24) as u8
        })
        .collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A POST body of `n` of Ray's pushed events whose message compresses badly.
fn noisy_events(state: &mut u64, n: usize) -> Vec<u8> {
    let events: Vec<String> = (0..n)
        .map(|_| {
            format!(
                r#"{{"eventId":"{}","sourceType":"GCS","eventType":"NODE_LIFECYCLE_EVENT","timestamp":"2026-11-22T02:06:40.945470430Z","severity":"INFO","sessionName":"{SESSION}","nodeId":"OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==","message":"{}"}}"#,
                noise(state, 20),
                noise(state, 700)
            )
        })
        .collect();
    format!("[{}]", events.join(",")).into_bytes()
}

/// Review r41s D1: a batch kept because it holds the lines of a backup Ray's rotation deleted
/// (2,800 lines, 2.9 MB, read in one batch at a 4 MiB budget while the copy ratio was low: a
/// compressible backlog uploaded first) fails to store (ENOSPC on the export segments), and
/// meanwhile Ray's pushed events, which compress badly, raise the ratio. Once the disk has room
/// again, the batch's lines with their copies' reserve at the new ratio need more than the
/// whole budget. It is now stored in parts sized to the room below the mark, as uploads make
/// room, while pushed events keep getting 200: every line of the deleted backup is in the
/// bucket once (main at 6731502 retried it whole, refused as over budget for as long as pushed
/// events held a few KiB of the spool: none of its lines stored, nothing new read).
#[test]
fn a_kept_batch_read_at_a_low_copy_ratio_is_stored_in_parts() {
    let _files = alone();
    let w = work();
    let faults = Faults::build(&w.dir);
    let mut c = w.start(
        &["--max-spool-bytes", "4MiB", "--upload-window", "1s"],
        &faults.env(),
    );
    // The ratio learnt low.
    std::fs::write(
        export_dir(&w.ray.root).join("event_EXPORT_TASK.log"),
        backlog(300, "l"),
    )
    .unwrap();
    wait_metric(&c, "rhc_events_accepted_total", 300.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.metric("rhc_spool_bytes") >= 5000.0 {
        assert!(
            Instant::now() < deadline,
            "never uploaded:\n{}",
            c.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Another session appears whole: the backup, an empty file read after it (the tailer is
    // held there), and the live file.
    let session = "session_2026-11-23_01-00-00_000001_4242";
    let staging = rhc_testkit::ray_logs::RayRoot::new(&w.dir.join("staging"));
    let dir = staging.session(session, NODE, false).join("export_events");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("event_EXPORT_TASK.log.1"), backlog(2800, "k")).unwrap();
    std::fs::write(dir.join("event_EXPORT_A.log"), b"").unwrap();
    std::fs::write(dir.join("event_EXPORT_TASK.log"), backlog(5, "v")).unwrap();
    let dir = w.ray.root.join(session).join("logs").join("export_events");
    // Its first read (a listing's stat names the file alone, not its path).
    faults.pause_at_stat(1, &format!("{}/event_EXPORT_A.log$", dir.display()));
    std::fs::rename(staging.root.join(session), w.ray.root.join(session)).unwrap();
    assert!(
        faults.wait_paused(Duration::from_secs(30)),
        "the tailer never reached the file after the backup:\n{}",
        c.log_text()
    );
    // Ray's rotation: the backup deleted, the live file renamed, a new one on the freed inode.
    let (live, backup) = (
        dir.join("event_EXPORT_TASK.log"),
        dir.join("event_EXPORT_TASK.log.1"),
    );
    let freed = inode(&backup);
    std::fs::remove_file(&backup).unwrap();
    std::fs::rename(&live, &backup).unwrap();
    rhc_testkit::collector::create_on_freed_inode(&live, freed, b"")
        .unwrap_or_else(|e| panic!("the test needs a reused inode: {e}"));
    // No room on the disk for export segments; pushed events still pass.
    faults.arm("writev", ENOSPC, 1_000_000, "/export_events/");
    faults.resume();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.log_text().contains("storing export events failed") {
        assert!(
            Instant::now() < deadline,
            "no failed store:\n{}",
            c.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut codes: HashMap<u16, usize> = HashMap::new();
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        let r = c.post(&noisy_events(&mut state, 40));
        *codes.entry(r.status).or_default() += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    faults.disarm("writev");
    // A trickle of pushed events keeps the spool from ever being empty.
    let deadline = Instant::now() + Duration::from_secs(60);
    let stored = |c: &Collector| {
        c.log_text()
            .contains("export events kept after a failed store are stored")
    };
    while !stored(&c) && Instant::now() < deadline {
        let r = c.post(&noisy_events(&mut state, 2));
        *codes.entry(r.status).or_default() += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    let log = c.log_text();
    assert!(
        stored(&c),
        "the kept batch was never stored (pushes {codes:?}); last failure: {:?}",
        log.lines()
            .rev()
            .find(|l| l.contains("failed again"))
            .unwrap_or_default()
    );
    // The renamed live file is read after it.
    wait_metric(&c, "rhc_events_accepted_total", 300.0 + 2805.0);
    println!(
        "pushes {codes:?}; {}",
        log.lines()
            .filter(|l| l.contains("kept") || l.contains("failed again"))
            .map(|l| &l[l.len().saturating_sub(300)..])
            .collect::<Vec<_>>()
            .join("\n")
    );
    c.terminate_ok(Duration::from_secs(60));
    // Every session's export lines.
    let mut ids: HashMap<String, usize> = HashMap::new();
    for (k, v) in w.objects() {
        if !k.contains("/export_events/") {
            continue;
        }
        for line in decode(&k, &v)
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
        {
            let v: Value = serde_json::from_slice(line).unwrap();
            *ids.entry(v["event_id"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    let kept = ids.keys().filter(|k| k.starts_with('k')).count();
    assert_eq!(kept, 2800, "lines of the deleted backup in the bucket");
    assert!(ids.values().all(|&n| n == 1), "lines stored twice");
    assert_eq!(ids.keys().filter(|k| k.starts_with('v')).count(), 5);
    assert_eq!(
        codes.keys().copied().collect::<Vec<_>>(),
        [200],
        "pushed events refused: {codes:?}"
    );
}
