//! The spool's durability edges through the real binary on a `file://` bucket: the dedup
//! window after a restart, timestamps at the ends of the year range, a rolled-back write that
//! cannot be cut off, failed directory syncs, requests spread over thousands of hours, and a
//! full disk while creating a segment.
//!
//! The I/O failures come from `tests/fault_shim/fault_shim.c`, built here with `cc` and loaded
//! with `LD_PRELOAD`: a rule file in `RHC_FAULT_DIR` makes a call on a matching path fail, and
//! the shim logs every fsync, fdatasync and ftruncate it sees.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::local::LocalFileSystem;
use object_store::ObjectStore;
use serde_json::Value;

use rhc_testkit::collector::{decode, history_server_accepts, read_all, Collector};
use rhc_testkit::fault_shim::Faults;

const NODE_B64: &str = "OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==";
const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn event(id: &str, session: &str, ts: &str) -> String {
    format!(
        r#"{{"eventId":"{id}","sourceType":"GCS","eventType":"NODE_LIFECYCLE_EVENT","timestamp":"{ts}","severity":"INFO","sessionName":"{session}","nodeId":"{NODE_B64}","message":""}}"#
    )
}

fn body(events: &[String]) -> String {
    format!("[{}]", events.join(","))
}

fn ids(range: std::ops::Range<u32>, tag: &str) -> Vec<String> {
    range.map(|i| format!("{tag}-{i}")).collect()
}

fn batch_at(ids: &[String], session: &str, ts: &str) -> String {
    body(
        &ids.iter()
            .map(|id| event(id, session, ts))
            .collect::<Vec<_>>(),
    )
}

/// Posts and returns (status, accepted, duplicates, quarantined); 0s when the answer is not 200.
fn post(c: &Collector, body: &str) -> (u16, u64, u64, u64) {
    let r = c.post(body.as_bytes());
    if r.status != 200 {
        return (r.status, 0, 0, 0);
    }
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let n = |k: &str| v[k].as_u64().unwrap();
    (r.status, n("accepted"), n("duplicates"), n("quarantined"))
}

fn store(dir: &Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap())
}

/// Event ids in the bucket's event objects of `session`, with how often each is stored; and
/// the object names.
fn stored(
    objects: &BTreeMap<String, Vec<u8>>,
    session: &str,
) -> (HashMap<String, u32>, Vec<String>) {
    let mut count = HashMap::new();
    let mut names = Vec::new();
    for (k, v) in objects
        .iter()
        .filter(|(k, _)| k.contains(&format!("/{session}/")))
    {
        let name = k.rsplit('/').next().unwrap().to_string();
        assert!(history_server_accepts(&name), "{k}");
        names.push(name);
        for line in decode(k, v)
            .split(|&c| c == b'\n')
            .filter(|l| !l.is_empty())
        {
            let e: Value = serde_json::from_slice(line).unwrap();
            *count
                .entry(e["eventId"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
    }
    (count, names)
}

fn assert_once(count: &HashMap<String, u32>, want: &[String]) {
    for id in want {
        assert_eq!(count.get(id), Some(&1), "{id}: {count:?}");
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The spool holds nothing but its lock file.
fn assert_spool_empty(spool: &Path) {
    let left: Vec<PathBuf> = files_under(spool)
        .into_iter()
        .filter(|p| !p.ends_with("LOCK"))
        .collect();
    assert!(left.is_empty(), "left in the spool: {left:?}");
}

fn start(tmp: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Collector, PathBuf) {
    let bucket = tmp.join("bucket");
    let mut args = vec!["--storage", bucket.to_str().unwrap()];
    args.extend_from_slice(extra);
    let c = Collector::start(&tmp.join("spool"), &args, env);
    (c, bucket)
}

/// Point 1: after kill -9 the window holds the newest ids (the end of the newest segment),
/// which are what Ray resends, not the oldest.
#[test]
fn restart_reloads_the_newest_ids_into_the_dedup_window() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = start(tmp.path(), &["--dedup-window", "10"], &[]);
    let all = ids(0..15, "win");
    for chunk in all.chunks(5) {
        let (status, accepted, _, _) =
            post(&c, &batch_at(chunk, "session_win", "2026-11-22T02:06:40Z"));
        assert_eq!((status, accepted), (200, 5));
    }
    c.kill9();
    c.restart();
    let (status, accepted, duplicates, _) = post(
        &c,
        &batch_at(&all[10..], "session_win", "2026-11-22T02:06:40Z"),
    );
    assert_eq!(
        (status, accepted, duplicates),
        (200, 0, 5),
        "the resend of the last batch was stored again"
    );
    assert!(
        c.terminate(Duration::from_secs(30)).success(),
        "{}",
        c.log_text()
    );
    let (count, _) = stored(&read_all(&store(&bucket)), "session_win");
    assert_once(&count, &all);
}

/// Point 1, as Ray resends: the batch in flight at the crash is the tail of the files the
/// last group wrote, however many older and larger partitions the spool holds. Three older
/// hours fill more than the window; the last batch spans a new hour and one of the older
/// ones. After kill -9 its resend is all duplicates (reading every file's tail side by side,
/// older files took most of the window).
#[test]
fn restart_reloads_the_batch_written_last_before_older_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = start(tmp.path(), &["--dedup-window", "100"], &[]);
    let session = "session_gen";
    let mut all = Vec::new();
    for h in ["07", "08", "09"] {
        let old = ids(0..100, &format!("old{h}"));
        let ts = format!("2026-11-26T{h}:10:00Z");
        assert_eq!(post(&c, &batch_at(&old, session, &ts)).1, 100);
        all.extend(old);
    }
    // Right after the older ones (the generations do not depend on time between writes).
    let last_new = ids(0..40, "last11");
    let last_old_hour = ids(0..20, "last09");
    let last: Vec<String> = last_new
        .iter()
        .map(|id| event(id, session, "2026-11-26T11:10:00Z"))
        .chain(
            last_old_hour
                .iter()
                .map(|id| event(id, session, "2026-11-26T09:20:00Z")),
        )
        .collect();
    assert_eq!(post(&c, &body(&last)), (200, 60, 0, 0));
    c.kill9();
    c.restart();
    assert_eq!(
        post(&c, &body(&last)),
        (200, 0, 60, 0),
        "the resend of the last batch was stored again"
    );
    assert!(
        c.terminate(Duration::from_secs(30)).success(),
        "{}",
        c.log_text()
    );
    let (count, _) = stored(&read_all(&store(&bucket)), session);
    all.extend(last_new);
    all.extend(last_old_hour);
    assert_once(&count, &all);
}

/// Point 2: a timestamp whose UTC hour has no four-digit year is filed under the first or
/// last hour; the segment is recognised after a restart (ids reloaded, uploaded), and the
/// event is stored once, as sent.
#[test]
fn edge_timestamps_are_filed_at_the_ends_and_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = start(tmp.path(), &[], &[]);
    let cases = [
        ("edge-low", "0000-01-01T00:30:00+01:00", "-0000-01-01-00-"),
        ("edge-high", "9999-12-31T23:30:00-01:00", "-9999-12-31-23-"),
    ];
    let events: Vec<String> = cases
        .iter()
        .map(|(id, ts, _)| event(id, "session_edge", ts))
        .collect();
    let (status, accepted, _, quarantined) = post(&c, &body(&events));
    assert_eq!((status, accepted, quarantined), (200, 2, 0));
    c.kill9();
    c.restart();
    assert!(
        !c.log_text().contains("unrecognised file"),
        "{}",
        c.log_text()
    );
    let (status, accepted, duplicates, _) = post(&c, &body(&events));
    assert_eq!(
        (status, accepted, duplicates),
        (200, 0, 2),
        "resend stored again"
    );
    let exit = c.terminate(Duration::from_secs(30));
    assert!(exit.success(), "{exit}: {}", c.log_text());
    assert_spool_empty(&c.spool);
    let objects = read_all(&store(&bucket));
    let (count, names) = stored(&objects, "session_edge");
    for (id, ts, label) in cases {
        assert_eq!(count.get(id), Some(&1), "{id}");
        assert!(
            names.iter().any(|n| n.contains(label)),
            "{label} not among {names:?}"
        );
        // Kept as sent.
        let line = objects
            .iter()
            .map(|(k, v)| String::from_utf8_lossy(&decode(k, v)).into_owned())
            .find(|t| t.contains(id))
            .unwrap();
        assert!(line.contains(ts), "{line}");
    }
}

/// Point 2: a file the spool cannot place is named at start and at shutdown, which does not
/// claim that everything was uploaded.
#[test]
fn unplaceable_files_are_named_at_start_and_at_shutdown() {
    let tmp = tempfile::tempdir().unwrap();
    let spool = tmp.path().join("spool");
    let odd_dir = spool.join("events/session_odd/somenode/node_events");
    std::fs::create_dir_all(&odd_dir).unwrap();
    let odd = odd_dir.join("somenode-10000-01-01-00-1.jsonl");
    std::fs::write(&odd, "{\"eventId\":\"odd\"}\n").unwrap();
    let (mut c, _bucket) = start(tmp.path(), &[], &[]);
    let name = odd.display().to_string();
    assert!(c.log_text().contains(&name), "{}", c.log_text());
    let exit = c.terminate(Duration::from_secs(30));
    let log = c.log_text();
    let after_signal = &log[log.find("shutting down").unwrap()..];
    assert!(after_signal.contains(&name), "{after_signal}");
    assert!(
        !after_signal.contains("everything uploaded"),
        "{after_signal}"
    );
    assert_eq!(exit.code(), Some(3), "{after_signal}");
}

/// Point 3: a sync fails and so does the truncate that would undo the write: the segment is
/// uploaded only up to what was acknowledged, so the resend of the refused batch is stored
/// once.
#[test]
fn a_rolled_back_write_that_cannot_be_cut_is_not_uploaded() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    let (mut c, bucket) = start(tmp.path(), &[], &faults.env());
    let ts = "2026-11-22T02:06:40Z";
    let first = ids(0..5, "cut-a");
    assert_eq!(post(&c, &batch_at(&first, "session_cut", ts)).0, 200);
    faults.arm("fdatasync", EIO, 1, "/events/session_cut/");
    faults.arm("ftruncate64", EIO, 1, "/events/session_cut/");
    faults.arm("ftruncate", EIO, 1, "/events/session_cut/");
    let refused = ids(0..5, "cut-b");
    let (status, ..) = post(&c, &batch_at(&refused, "session_cut", ts));
    assert!(status >= 500, "{status}");
    assert!(!faults.armed("fdatasync"), "the sync was not attempted");
    assert!(
        !faults.armed("ftruncate64") || !faults.armed("ftruncate"),
        "the rollback did not truncate"
    );
    faults.disarm("ftruncate64");
    faults.disarm("ftruncate");
    // Ray resends the refused batch.
    let (status, accepted, ..) = post(&c, &batch_at(&refused, "session_cut", ts));
    assert_eq!((status, accepted), (200, 5));
    let exit = c.terminate(Duration::from_secs(30));
    assert!(exit.success(), "{exit}: {}", c.log_text());
    let (count, _) = stored(&read_all(&store(&bucket)), "session_cut");
    assert_once(&count, &first);
    assert_once(&count, &refused);
}

/// Point 3 across a crash: the segment whose rolled-back lines could not be truncated is not
/// uploaded before the process dies (its reads fail), while Ray's resend of the refused batch
/// went to a new segment; the restart must upload the first segment only up to what was
/// acknowledged, so the batch is stored once.
#[test]
fn a_rolled_back_tail_stays_out_after_a_crash_too() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    let (mut c, bucket) = start(tmp.path(), &[], &faults.env());
    let ts = "2026-11-22T02:06:40Z";
    let first = ids(0..5, "crash-a");
    assert_eq!(post(&c, &batch_at(&first, "session_crash", ts)).0, 200);
    faults.arm("fdatasync", EIO, 1, "/events/session_crash/");
    faults.arm("ftruncate64", EIO, 1, "/events/session_crash/");
    faults.arm("ftruncate", EIO, 1, "/events/session_crash/");
    // Uploads cannot read any segment from now on.
    faults.arm("openr", EIO, 1_000_000, ".jsonl$");
    let refused = ids(0..5, "crash-b");
    let (status, ..) = post(&c, &batch_at(&refused, "session_crash", ts));
    assert!(status >= 500, "{status}");
    assert!(!faults.armed("fdatasync"), "the sync was not attempted");
    let (status, accepted, ..) = post(&c, &batch_at(&refused, "session_crash", ts));
    assert_eq!((status, accepted), (200, 5), "the resend was not stored");
    c.kill9();
    for call in ["ftruncate64", "ftruncate", "openr"] {
        faults.disarm(call);
    }
    c.restart();
    let exit = c.terminate(Duration::from_secs(30));
    assert!(exit.success(), "{exit}: {}", c.log_text());
    assert_spool_empty(&c.spool);
    let (count, _) = stored(&read_all(&store(&bucket)), "session_crash");
    assert_once(&count, &first);
    assert_once(&count, &refused);
}

/// Point 4: the spool dir and its folders (and lock) are synced in their parents at first
/// start.
#[test]
fn first_start_makes_the_spool_dir_durable_in_its_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    let (mut c, _bucket) = start(tmp.path(), &[], &faults.env());
    let spool = c.spool.canonicalize().unwrap();
    let parent = spool.parent().unwrap().to_path_buf();
    let log = faults.log();
    for dir in [&spool, &parent] {
        assert!(
            log.iter()
                .any(|(call, p, ok)| call == "fsync" && Path::new(p) == dir.as_path() && *ok),
            "{} not synced at first start: {log:?}",
            dir.display()
        );
    }
    assert!(
        c.terminate(Duration::from_secs(30)).success(),
        "{}",
        c.log_text()
    );
}

/// Point 4: a directory whose sync failed is synced again before the next group is
/// answered.
#[test]
fn a_failed_directory_sync_is_retried_before_the_next_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    let (mut c, bucket) = start(tmp.path(), &[], &faults.env());
    let ts = "2026-11-22T02:06:40Z";
    faults.arm("fsync", EIO, 1, "/session_dirs/");
    let refused = ids(0..3, "dirs-a");
    let (status, ..) = post(&c, &batch_at(&refused, "session_dirs", ts));
    assert!(status >= 500, "{status}");
    assert!(!faults.armed("fsync"), "no directory sync was attempted");
    let failed: Vec<String> = faults
        .log()
        .into_iter()
        .filter(|(call, _, ok)| call == "fsync" && !ok)
        .map(|(_, p, _)| p)
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let next = ids(0..3, "dirs-b");
    let (status, accepted, ..) = post(&c, &batch_at(&next, "session_dirs", ts));
    assert_eq!((status, accepted), (200, 3));
    let log = faults.log();
    let fail_at = log
        .iter()
        .position(|(call, p, ok)| call == "fsync" && !ok && *p == failed[0])
        .unwrap();
    assert!(
        log[fail_at..]
            .iter()
            .any(|(call, p, ok)| call == "fsync" && *ok && *p == failed[0]),
        "{} never synced again after its failure: {:?}",
        failed[0],
        &log[fail_at..]
    );
    let (status, accepted, ..) = post(&c, &batch_at(&refused, "session_dirs", ts));
    assert_eq!((status, accepted), (200, 3));
    assert!(
        c.terminate(Duration::from_secs(30)).success(),
        "{}",
        c.log_text()
    );
    let (count, _) = stored(&read_all(&store(&bucket)), "session_dirs");
    assert_once(&count, &refused);
    assert_once(&count, &next);
}

/// Point 5: one request with events in 2,000 different hours opens at most 512 partitions;
/// every event is stored once, as sent.
#[test]
fn one_request_opens_a_bounded_number_of_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = start(tmp.path(), &[], &[]);
    let all = ids(0..2000, "hours");
    let events: Vec<String> = all
        .iter()
        .enumerate()
        .map(|(i, id)| event(id, "session_hours", &hour_ts(i)))
        .collect();
    let (status, accepted, _, quarantined) = post(&c, &body(&events));
    assert_eq!((status, accepted + quarantined), (200, 2000));
    let spool_files = files_under(&c.spool.join("events")).len();
    assert!(
        spool_files <= 512,
        "{spool_files} spool files for one request"
    );
    assert!(
        c.terminate(Duration::from_secs(60)).success(),
        "{}",
        c.log_text()
    );
    let (count, names) = stored(&read_all(&store(&bucket)), "session_hours");
    assert!(
        names.len() <= 512,
        "{} objects for one request",
        names.len()
    );
    assert_once(&count, &all);
}

/// A job event of job `job` (one job stream each).
fn job_event(id: &str, session: &str, job: u32) -> String {
    format!(
        r#"{{"eventId":"{id}","sourceType":"CORE_WORKER","eventType":"TASK_LIFECYCLE_EVENT","timestamp":"2026-11-26T09:10:00Z","severity":"INFO","sessionName":"{session}","nodeId":"{NODE_B64}","taskLifecycleEvent":{{"jobId":"{job:08x}"}}}}"#
    )
}

/// How often each event id is kept in the bucket: in event objects, or in quarantine
/// records (of their `event`).
fn kept_anywhere(objects: &BTreeMap<String, Vec<u8>>) -> HashMap<String, u32> {
    let mut count = HashMap::new();
    for (k, v) in objects {
        for line in decode(k, v).split(|&c| c == b'\n') {
            let Ok(e) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            let id = e["eventId"].as_str().or(e["event"]["eventId"].as_str());
            if let Some(id) = id {
                *count.entry(id.to_string()).or_insert(0) += 1;
            }
        }
    }
    count
}

/// Point 5, its overflow: a request over the partition bound quarantines what has no room
/// (`too_many_partitions`), but those are valid events and deduplicated by their id like
/// stored ones: an event stored before is a duplicate when it comes again inside such a
/// request, and the resend of the request, before and after a kill -9, keeps nothing again.
#[test]
fn events_over_the_partition_bound_are_kept_once_across_resends_and_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, bucket) = start(tmp.path(), &[], &[]);
    let session = "session_jobs";
    // 600 job streams, two events each: 512 partitions, the last 88 jobs have no room.
    let events: Vec<(String, String)> = (0..600u32)
        .flat_map(|j| {
            (0..2).map(move |k| {
                (
                    format!("job{j}-{k}"),
                    job_event(&format!("job{j}-{k}"), session, j + 1),
                )
            })
        })
        .collect();
    let whole = body(&events.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>());
    // The last ten jobs' events, stored alone first.
    let tail: Vec<String> = events[1180..].iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(post(&c, &body(&tail)), (200, 20, 0, 0));
    let (status, accepted, duplicates, quarantined) = post(&c, &whole);
    assert_eq!(status, 200);
    assert_eq!(duplicates, 20, "events stored before were kept again");
    assert_eq!(accepted + quarantined, 1180);
    assert_eq!(quarantined, 2 * 88 - 20);
    assert_eq!(post(&c, &whole), (200, 0, 1200, 0), "resend kept again");
    c.kill9();
    c.restart();
    assert_eq!(
        post(&c, &whole),
        (200, 0, 1200, 0),
        "resend after a restart kept again"
    );
    assert!(
        c.terminate(Duration::from_secs(60)).success(),
        "{}",
        c.log_text()
    );
    let count = kept_anywhere(&read_all(&store(&bucket)));
    let want: Vec<String> = events.iter().map(|(id, _)| id.clone()).collect();
    assert_once(&count, &want);
}

/// Point 5, markers: on the head every new session adds a marker file (and object) beside
/// its segment; the budget counts it like a segment file, so a request of 150 new sessions
/// whose segments alone fit is refused with 503 when their markers do not.
#[test]
fn session_markers_count_against_the_spool_budget() {
    let tmp = tempfile::tempdir().unwrap();
    // 1 MiB: 150 segment files (4 KiB each) and their lines fit, 150 markers more do not.
    let (mut c, _bucket) = start(tmp.path(), &["--max-spool-bytes", "1MiB"], &[]);
    let sessions = |n: u32, tag: &str| -> Vec<String> {
        (0..n)
            .map(|i| {
                event(
                    &format!("{tag}-{i}"),
                    &format!("session_{tag}_{i}"),
                    "2026-11-26T09:10:00Z",
                )
            })
            .collect()
    };
    let r = c.post(body(&sessions(150, "many")).as_bytes());
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(post(&c, &body(&sessions(80, "some"))), (200, 80, 0, 0));
    assert!(
        c.terminate(Duration::from_secs(30)).success(),
        "{}",
        c.log_text()
    );
}

/// Point 5: files count in the disk budget, so a request spread over many partitions that
/// would fit by its bytes alone is refused with 503 when its files do not.
#[test]
fn files_count_against_the_spool_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut c, _bucket) = start(tmp.path(), &["--max-spool-bytes", "1MiB"], &[]);
    // 300 partitions (one per hour), about 70 KB of lines: 300 files need 1.2 MB.
    let events: Vec<String> = (0..300)
        .map(|i| event(&format!("budget-{i}"), "session_budget", &hour_ts(i)))
        .collect();
    let r = c.post(body(&events).as_bytes());
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    // One hour is fine.
    let (status, accepted, ..) = post(
        &c,
        &batch_at(
            &ids(0..300, "one-hour"),
            "session_budget",
            "2026-11-22T02:00:00Z",
        ),
    );
    assert_eq!((status, accepted), (200, 300));
    assert!(
        c.terminate(Duration::from_secs(30)).success(),
        "{}",
        c.log_text()
    );
}

/// Point 6: a full disk while creating a segment answers 503 to that request alone; the
/// requests grouped with it are stored.
#[test]
fn a_full_disk_creating_a_segment_fails_that_request_alone_with_503() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Faults::build(tmp.path());
    let (mut c, bucket) = start(tmp.path(), &[], &faults.env());
    let ts = "2026-11-22T02:06:40Z";
    // The good partition's segment exists before the disk "fills".
    assert_eq!(
        post(&c, &batch_at(&ids(0..1, "warm"), "session_ok", ts)).0,
        200
    );
    faults.arm("open", ENOSPC, 1_000_000, "/events/session_full/");
    let port = c.port;
    let mut acked = Vec::new();
    for round in 0..20 {
        let handles: Vec<_> = (0..6)
            .map(|k| {
                std::thread::spawn(move || {
                    let (session, tag) = if k == 0 {
                        ("session_full", format!("full-{round}"))
                    } else {
                        ("session_ok", format!("ok-{round}-{k}"))
                    };
                    let ids: Vec<String> = (0..20).map(|i| format!("{tag}-{i}")).collect();
                    let (status, text) = rhc_testkit::http::http_request(
                        "POST",
                        &format!("http://127.0.0.1:{port}/v1/events"),
                        &[("Content-Type", "application/json")],
                        batch_at(&ids, session, ts).as_bytes(),
                    );
                    (k, status, String::from_utf8_lossy(&text).into_owned(), ids)
                })
            })
            .collect();
        for h in handles {
            let (k, status, text, ids) = h.join().unwrap();
            if k == 0 {
                assert_eq!(status, 503, "round {round}: {text}");
            } else {
                assert_eq!(status, 200, "round {round}, request {k}: {text}");
                acked.extend(ids);
            }
        }
    }
    faults.disarm("open");
    assert!(
        c.terminate(Duration::from_secs(30)).success(),
        "{}",
        c.log_text()
    );
    let (count, _) = stored(&read_all(&store(&bucket)), "session_ok");
    assert_once(&count, &acked);
}

/// A timestamp in the `i`-th hour from 2020-01-01T00:00Z.
fn hour_ts(i: usize) -> String {
    let secs = 1_577_836_800 + i as i64 * 3600;
    let (y, m, d) = civil(secs / 86400);
    format!("{y:04}-{m:02}-{d:02}T{:02}:30:00Z", (secs % 86400) / 3600)
}

/// Days since 1970-01-01 to (year, month, day), for building timestamps.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}
