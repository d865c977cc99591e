//! `ray-history-collector inspect` on buckets whose shape is hostile or just big, through
//! the real binary: 100,000 objects under a low open-file limit (and 20,000 on moto's S3),
//! keys with control characters, names that would steer a terminal, symbolic links out of
//! a `file://` bucket, a FIFO named like an event object, and the smaller edges (a worker
//! id matching thousands of logs, `--tail` past its read-back bound, ids that are not ids,
//! `--session latest` with an empty marker). Each bucket is built here; what the report
//! must say is computed from the fixture or from a run on the same bucket without the
//! damage.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use rhc_testkit::services::{limit_open_files, run_with_timeout, CommandOutput, MotoS3};

const CAMEL: &str = include_str!("data/posts-camel.jsonl");
const SESSION: &str = "session_2026-11-22_02-06-36_260774_21819";
/// The node of the fixture (`nodeId` in hex).
const NODE: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
const JOB: &str = "01000000";
const PREFIX: &str = "cluster-history/raycluster/default/c1";
const MARKERS: &str = "cluster-metadata/raycluster/default_c1";
const INSPECT_TIMEOUT: Duration = Duration::from_secs(300);
/// The event type of the filler objects (counted by type in the report).
const FILLER: &str = "BUCKET_SHAPE_FILLER";

// ------------------------------------------------------------------------ helpers

/// Runs `inspect <args>` with `env`, under an open-file limit of `nofile` when given.
fn inspect_with(args: &[&str], env: &[(&str, &str)], nofile: Option<u64>) -> CommandOutput {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.arg("inspect").args(args).env_remove("STORAGE_ROOT_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(n) = nofile {
        limit_open_files(&mut cmd, n);
    }
    run_with_timeout(&mut cmd, INSPECT_TIMEOUT)
}

fn inspect(args: &[&str]) -> CommandOutput {
    inspect_with(args, &[], None)
}

/// The JSON report of a run that must succeed.
fn json_of(out: &CommandOutput, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what}: {}\nstderr: {}",
        out.status,
        out.stderr
    );
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: no JSON ({e}):\n{}", out.stdout))
}

/// No character a terminal would act on, raw, in `text`.
fn assert_terminal_safe(text: &str, what: &str) {
    for bad in ['\u{1b}', '\u{7}', '\u{9b}', '\u{85}', '\u{202e}'] {
        assert!(
            !text.contains(bad),
            "{what}: raw U+{:04X} printed:\n{text}",
            bad as u32
        );
    }
}

fn put(dir: &Path, key: &str, bytes: &[u8]) {
    let path = dir.join(key);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A bucket with the fixture's session: its marker, and every event of the fixture one
/// per line in one job object of node [`NODE`] (plus a `raylet.out`).
fn fixture_bucket(dir: &Path) {
    put(dir, &format!("{MARKERS}/{SESSION}"), b"");
    let mut content = String::new();
    for line in CAMEL.lines() {
        let Value::Array(events) = serde_json::from_str::<Value>(line).unwrap() else {
            panic!("not a POST body")
        };
        for ev in events {
            content.push_str(&ev.to_string());
            content.push('\n');
        }
    }
    put(
        dir,
        &format!("{PREFIX}/{SESSION}/{NODE}/job_events/{JOB}/{NODE}-2026-11-22-02-1.jsonl"),
        content.as_bytes(),
    );
    put(
        dir,
        &format!("{PREFIX}/{SESSION}/{NODE}/logs/raylet.out"),
        b"raylet says hello\n",
    );
}

/// One tiny event line of type [`FILLER`] with a unique id.
fn filler_line(i: usize) -> String {
    format!(
        "{{\"eventId\":\"filler-{i}\",\"eventType\":\"{FILLER}\",\"timestamp\":\"2026-11-22T02:00:00Z\"}}\n"
    )
}

/// The key of filler object `i`: `nodes` nodes, each with its share in `node_events/`.
fn filler_key(i: usize, nodes: usize) -> String {
    let node = format!("{:056x}", 0xf000 + i % nodes);
    format!(
        "{PREFIX}/{SESSION}/{node}/node_events/{node}-2026-11-22-02-{}.jsonl",
        i / nodes
    )
}

/// What must not change when the bucket around the fixture's data grows or is damaged.
fn fixture_view(report: &Value) -> Value {
    serde_json::json!({
        "jobs": report["jobs"],
        "tasks": report["tasks"],
        "failed_tasks_total": report["failed_tasks_total"],
        "actors": report["actors"],
    })
}

/// The report of the fixture's session alone, and a sanity check of it.
fn fixture_baseline(work: &Path) -> Value {
    let clean = work.join("clean");
    fixture_bucket(&clean);
    let r = json_of(
        &inspect(&[clean.to_str().unwrap(), "--session", SESSION, "--json"]),
        "clean bucket",
    );
    let job = &r["jobs"][0];
    assert_eq!(job["job_id"], JOB, "{r}");
    assert_ne!(job["status"], "UNKNOWN", "{r}");
    assert!(r["tasks"]["total"].as_u64().unwrap() > 0, "{r}");
    fixture_view(&r)
}

// ------------------------------------------------------------------------ 1. many objects

/// 100,000 tiny objects beside the real job, read under an open-file limit of 64: every
/// object is read, none is lost, and the real job comes out as it does alone.
#[test]
fn hundred_thousand_objects_under_a_low_open_file_limit_are_all_read() {
    const FILLERS: usize = 100_000;
    let work = tempfile::tempdir().unwrap();
    let want = fixture_baseline(work.path());
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    for i in 0..FILLERS {
        put(&bucket, &filler_key(i, 100), filler_line(i).as_bytes());
    }
    let dir = bucket.to_str().unwrap();
    for nofile in [64, 20] {
        let out = inspect_with(&[dir, "--session", SESSION, "--json"], &[], Some(nofile));
        let r = json_of(&out, &format!("RLIMIT_NOFILE {nofile}"));
        let objects = &r["objects"];
        assert_eq!(objects["event_objects_listed"], FILLERS + 1, "{objects}");
        assert_eq!(r["problems"]["unreadable_objects"], 0, "{}", r["problems"]);
        assert_eq!(r["events"]["by_type"][FILLER], FILLERS, "{}", r["events"]);
        assert_eq!(objects["read"], FILLERS + 1, "{objects}\n{}", r["problems"]);
        assert_eq!(objects["unreadable"], 0, "{objects}");
        assert_eq!(r["nodes"].as_array().unwrap().len(), 101);
        assert_eq!(fixture_view(&r), want, "nofile {nofile}");
    }
}

/// 20,000 objects on S3 (moto): the listings page through them all and every object is
/// read, under an open-file limit of 64. The bucket is put into moto's memory before it
/// serves ([`MotoS3::start_seeded`]): 20,000 PUTs over HTTP took about 100 s of the
/// machine, which is not what this test is about.
#[test]
fn twenty_thousand_objects_on_s3_are_listed_and_read() {
    const FILLERS: usize = 20_000;
    let work = tempfile::tempdir().unwrap();
    let want = fixture_baseline(work.path());
    // The bucket as a directory: the fixture's session and the fillers.
    let local = work.path().join("local");
    fixture_bucket(&local);
    for i in 0..FILLERS {
        put(&local, &filler_key(i, 20), filler_line(i).as_bytes());
    }
    let Some(s3) = MotoS3::start_seeded("shape", &local) else {
        return;
    };
    let env = s3.collector_env();
    let list = json_of(
        &inspect_with(&["s3://shape", "--json"], &env, Some(64)),
        "s3 list",
    );
    let session = &list["clusters"][0]["sessions"][0];
    assert_eq!(session["event_objects"], FILLERS + 1, "{list}");
    assert_eq!(session["nodes"], 21, "{list}");
    let out = inspect_with(
        &["s3://shape", "--session", SESSION, "--json"],
        &env,
        Some(64),
    );
    let r = json_of(&out, "s3 session");
    assert_eq!(r["objects"]["event_objects_listed"], FILLERS + 1);
    assert_eq!(r["objects"]["read"], FILLERS + 1, "{}", r["problems"]);
    assert_eq!(r["problems"]["unreadable_objects"], 0, "{}", r["problems"]);
    assert_eq!(r["events"]["by_type"][FILLER], FILLERS);
    assert_eq!(fixture_view(&r), want);
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

// ------------------------------------------------------------------------ 2. control characters

/// Markers, cluster folders, node folders, event objects and log folders named with ESC,
/// BEL or a newline: each is skipped and counted, the rest is read, and nothing raw
/// reaches the terminal.
#[test]
fn keys_with_control_characters_are_skipped_and_counted() {
    let work = tempfile::tempdir().unwrap();
    let want = fixture_baseline(work.path());
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let event = filler_line(1);
    let bad = [
        // A marker, and a cluster folder with a marker in it.
        format!("{MARKERS}/session_2026-11-23_00-00-00_000000_1\u{1b}]0;TITLE\u{7}"),
        "cluster-metadata/raycluster/default_c\u{7}2/session_2026-11-23_00-00-00_000000_2"
            .to_string(),
        "cluster-metadata/raycluster/default_c\n3/session_2026-11-23_00-00-00_000000_3".to_string(),
        // A node folder, and an event object beside the real one.
        format!("{PREFIX}/{SESSION}/node\u{1b}[31m/node_events/x-2026-11-22-02-1.jsonl"),
        format!("{PREFIX}/{SESSION}/{NODE}/job_events/{JOB}/\u{1b}x-2026-11-22-02-2.jsonl"),
        // A folder among the logs.
        format!("{PREFIX}/{SESSION}/{NODE}/logs/old\u{1b}]0;X\u{7}/raylet.out"),
    ];
    for key in &bad {
        put(&bucket, key, event.as_bytes());
    }
    let dir = bucket.to_str().unwrap();

    let out = inspect(&[dir, "--json"]);
    let list = json_of(&out, "list");
    let sessions = &list["clusters"][0]["sessions"];
    assert_eq!(sessions.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(sessions[0]["session"], SESSION);
    // The marker, the two cluster folders.
    // The marker, the two cluster folders; and, listed for the session's footprint, the
    // node folder, the event object and the logs folder.
    assert_eq!(
        list["problems"]["skipped_entries"], 6,
        "{}",
        list["problems"]
    );
    let text = inspect(&[dir]);
    assert!(text.status.success(), "{}", text.stderr);
    assert_terminal_safe(&text.stdout, "list");
    assert!(
        text.stdout.contains("\\u{1b}]0;TITLE\\u{7}"),
        "{}",
        text.stdout
    );

    let out = inspect(&[dir, "--session", SESSION, "--json"]);
    let r = json_of(&out, "session");
    assert_eq!(fixture_view(&r), want);
    assert_eq!(r["objects"]["read"], 1, "{}", r["objects"]);
    // The three under cluster-metadata/; the node folder, the event object, the logs
    // folder.
    assert_eq!(r["problems"]["skipped_entries"], 6, "{}", r["problems"]);
    let details = r["problems"]["details"].to_string();
    assert!(details.contains("node\\\\u{1b}[31m"), "{details}");
    let text = inspect(&[dir, "--session", SESSION]);
    assert!(text.status.success(), "{}", text.stderr);
    assert_terminal_safe(&text.stdout, "session");
    assert_terminal_safe(&text.stderr, "session");
    assert!(text.stdout.contains("6 entries skipped"), "{}", text.stdout);

    let out = inspect(&[dir, "--session", SESSION, "--logs", NODE]);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "raylet says hello\n");
    assert_terminal_safe(&out.stderr, "--logs");
}

/// The same on S3, where a key holding ESC used to fail its whole listing page (XML 1.0
/// cannot carry it): a marker and a cluster folder under `cluster-metadata/`, a node
/// folder and an object inside `node_events/`, named with ESC or a carriage return (moto
/// refuses a PUT whose key holds a newline: its router does not match it), beside two good
/// sessions. inspect lists with `encoding-type=url`: each bad key is skipped and counted,
/// the rest is read.
#[test]
fn keys_with_control_characters_on_s3_are_skipped_and_counted() {
    let Some(s3) = MotoS3::start() else { return };
    s3.create_bucket("ctl");
    let work = tempfile::tempdir().unwrap();
    let want = fixture_baseline(work.path());
    let local = work.path().join("local");
    fixture_bucket(&local);
    for entry in walk_files(&local) {
        let key = entry.strip_prefix(&local).unwrap().to_str().unwrap();
        s3.put_object("ctl", key, &std::fs::read(&entry).unwrap());
    }
    let event = filler_line(1);
    // A second good session, and node events beside the job's.
    let other = "session_2026-11-23_00-00-00_000000_9";
    s3.put_object("ctl", &format!("{MARKERS}/{other}"), b"");
    s3.put_object(
        "ctl",
        &format!("{PREFIX}/{other}/{NODE}/node_events/{NODE}-2026-11-23-00-1.jsonl"),
        event.as_bytes(),
    );
    s3.put_object(
        "ctl",
        &format!("{PREFIX}/{SESSION}/{NODE}/node_events/{NODE}-2026-11-22-02-1.jsonl"),
        event.as_bytes(),
    );
    let bad = [
        // A marker, and a cluster folder with a marker in it.
        format!("{MARKERS}/session_2026-11-23_00-00-00_000000_1\u{1b}]0;TITLE\u{7}"),
        "cluster-metadata/raycluster/default_c\r3/session_2026-11-23_00-00-00_000000_3".to_string(),
        // A node folder, and an object inside node_events/.
        format!("{PREFIX}/{SESSION}/node\u{1b}[31m/node_events/x-2026-11-22-02-1.jsonl"),
        format!("{PREFIX}/{SESSION}/{NODE}/node_events/\u{1b}x-2026-11-22-02-2.jsonl"),
    ];
    for key in &bad {
        s3.put_object("ctl", key, event.as_bytes());
    }
    let env = s3.collector_env();

    let out = inspect_with(&["s3://ctl", "--json"], &env, None);
    let list = json_of(&out, "s3 list");
    let sessions = &list["clusters"][0]["sessions"];
    let names: Vec<_> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 2, "{list}");
    assert!(names.iter().any(|n| n == SESSION), "{list}");
    assert!(names.iter().any(|n| n == other), "{list}");
    // The marker, the cluster folder; listed for the session's footprint, the node
    // folder's object and the object in node_events/.
    assert_eq!(
        list["problems"]["skipped_entries"], 4,
        "{}",
        list["problems"]
    );
    let text = inspect_with(&["s3://ctl"], &env, None);
    assert!(text.status.success(), "{}", text.stderr);
    assert_terminal_safe(&text.stdout, "s3 list");
    assert_terminal_safe(&text.stderr, "s3 list");
    assert!(
        text.stdout.contains("\\u{1b}]0;TITLE\\u{7}"),
        "{}",
        text.stdout
    );

    let out = inspect_with(&["s3://ctl", "--session", SESSION, "--json"], &env, None);
    let r = json_of(&out, "s3 session");
    assert_eq!(fixture_view(&r), want);
    assert_eq!(r["objects"]["read"], 2, "{}", r["objects"]);
    assert_eq!(r["events"]["by_type"][FILLER], 1, "{}", r["events"]);
    assert_eq!(r["problems"]["unreadable_objects"], 0, "{}", r["problems"]);
    assert_eq!(r["problems"]["skipped_entries"], 4, "{}", r["problems"]);
    let details = r["problems"]["details"].to_string();
    assert!(details.contains("node\\\\u{1b}[31m"), "{details}");
    assert!(details.contains("default_c\\\\u{d}3"), "{details}");
    let text = inspect_with(&["s3://ctl", "--session", SESSION], &env, None);
    assert!(text.status.success(), "{}", text.stderr);
    assert_terminal_safe(&text.stdout, "s3 session");
    assert_terminal_safe(&text.stderr, "s3 session");

    let out = inspect_with(
        &["s3://ctl", "--session", SESSION, "--logs", NODE],
        &env,
        None,
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "raylet says hello\n");
}

// ------------------------------------------------------------------------ 3. escaping

/// Names that are valid keys but steer a terminal (C1 controls, U+202E) are escaped in the
/// report, in JSON and in the errors on stderr, `--logs` included.
#[test]
fn names_that_steer_a_terminal_are_escaped_in_every_message() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let steering = "session_2026-11-24_00-00-00_000000_9\u{9b}31m\u{202e}txt.exe";
    put(&bucket, &format!("{MARKERS}/{steering}"), b"");
    // An unreadable object under a node named to reverse the line.
    let node = "\u{202e}gol.exe\u{85}";
    put(
        &bucket,
        &format!("{PREFIX}/{SESSION}/{node}/node_events/n-2026-11-22-02-1.jsonl.gz"),
        b"not gzip",
    );
    // Two nodes holding a log of the same worker: an error that names them.
    let worker = "ab".repeat(28);
    for n in ["\u{9b}2J", "\u{202e}b"] {
        put(
            &bucket,
            &format!("{PREFIX}/{SESSION}/{n}/logs/worker-{worker}-{JOB}-7.out"),
            b"x\n",
        );
    }
    let dir = bucket.to_str().unwrap();

    for args in [
        vec![dir],
        vec![dir, "--json"],
        vec![dir, "--session", SESSION],
        vec![dir, "--session", SESSION, "--json"],
    ] {
        let out = inspect(&args);
        assert!(out.status.success(), "{args:?}: {}", out.stderr);
        assert_terminal_safe(&out.stdout, &format!("{args:?} stdout"));
        assert_terminal_safe(&out.stderr, &format!("{args:?} stderr"));
    }
    let r = json_of(&inspect(&[dir, "--session", SESSION, "--json"]), "session");
    assert_eq!(r["problems"]["unreadable_objects"], 1, "{}", r["problems"]);
    let details = r["problems"]["details"].to_string();
    assert!(details.contains("\\\\u{202e}gol.exe\\\\u{85}"), "{details}");

    // A marker that is no session name is named, escaped, among the problems.
    let out = inspect(&[dir]);
    assert!(
        out.stdout.contains("\\u{9b}31m\\u{202e}txt.exe"),
        "{}",
        out.stdout
    );
    // An error on stderr: several logs, named by their nodes.
    let out = inspect(&[dir, "--session", SESSION, "--logs", &worker]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert_terminal_safe(&out.stderr, "several logs");
    assert!(out.stderr.contains("several logs match"), "{}", out.stderr);
    assert!(out.stderr.contains("\\u{9b}2J"), "{}", out.stderr);
}

// ------------------------------------------------------------------------ 4. symlinks

/// Links out of a `file://` bucket (a log, an event object, a node folder) are not
/// followed; the report and `--logs` say what was skipped.
#[test]
fn symlinks_are_not_followed_out_of_the_bucket() {
    use std::os::unix::fs::symlink;
    let work = tempfile::tempdir().unwrap();
    let want = fixture_baseline(work.path());
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let outside = work.path().join("outside");
    std::fs::create_dir_all(outside.join("node_events")).unwrap();
    std::fs::write(outside.join("secret"), "SECRET-OUTSIDE-THE-BUCKET\n").unwrap();
    let outside_event = "{\"eventId\":\"o\",\"eventType\":\"OUTSIDE_EVENT\",\"timestamp\":\"2026-11-22T02:00:00Z\"}\n";
    std::fs::write(outside.join("events.jsonl"), outside_event).unwrap();
    std::fs::write(
        outside.join("node_events/x-2026-11-22-02-1.jsonl"),
        outside_event,
    )
    .unwrap();
    let session = bucket.join(PREFIX).join(SESSION);
    symlink(
        outside.join("secret"),
        session.join(NODE).join("logs/raylet.err"),
    )
    .unwrap();
    std::fs::create_dir_all(session.join(NODE).join("node_events")).unwrap();
    symlink(
        outside.join("events.jsonl"),
        session
            .join(NODE)
            .join(format!("node_events/{NODE}-2026-11-22-02-9.jsonl")),
    )
    .unwrap();
    symlink(&outside, session.join("ffff")).unwrap();
    let dir = bucket.to_str().unwrap();

    let out = inspect(&[dir, "--session", SESSION, "--logs", NODE, "--err"]);
    assert!(
        !out.stdout.contains("SECRET") && !out.stderr.contains("SECRET"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);

    let r = json_of(&inspect(&[dir, "--session", SESSION, "--json"]), "session");
    assert!(
        r["events"]["by_type"].get("OUTSIDE_EVENT").is_none(),
        "{}",
        r["events"]
    );
    assert_eq!(fixture_view(&r), want);
    assert_eq!(r["nodes"].as_array().unwrap().len(), 1, "{}", r["nodes"]);
    // The log, the event object, the node folder.
    assert_eq!(r["problems"]["skipped_entries"], 3, "{}", r["problems"]);
    let details = r["problems"]["details"].to_string();
    assert!(details.contains("symbolic link"), "{details}");
    assert!(details.contains(&format!("{SESSION}/ffff")), "{details}");
}

// ------------------------------------------------------------------------ 5. FIFO

/// A FIFO named like an event object is skipped, not waited on.
#[test]
fn a_fifo_named_like_an_event_object_does_not_hang() {
    let work = tempfile::tempdir().unwrap();
    let want = fixture_baseline(work.path());
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let fifo = bucket.join(format!(
        "{PREFIX}/{SESSION}/{NODE}/job_events/{JOB}/{NODE}-2026-11-22-02-7.jsonl"
    ));
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let dir = bucket.to_str().unwrap();
    // run_with_timeout fails the test if it hangs.
    let r = json_of(&inspect(&[dir, "--session", SESSION, "--json"]), "fifo");
    assert_eq!(fixture_view(&r), want);
    assert_eq!(r["problems"]["skipped_entries"], 1, "{}", r["problems"]);
    assert!(
        r["problems"]["details"].to_string().contains("FIFO"),
        "{}",
        r["problems"]
    );
    let list = json_of(&inspect(&[dir, "--json"]), "fifo list");
    assert_eq!(list["clusters"][0]["sessions"][0]["event_objects"], 1);
}

// ------------------------------------------------------------------------ 6. smaller points

/// A worker id matching 2,000 logs gives a bounded error.
#[test]
fn a_worker_matching_thousands_of_logs_gives_a_bounded_error() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let worker = "cd".repeat(28);
    for pid in 0..2_000 {
        put(
            &bucket,
            &format!("{PREFIX}/{SESSION}/{NODE}/logs/worker-{worker}-{JOB}-{pid}.out"),
            b"",
        );
    }
    let out = inspect(&[
        bucket.to_str().unwrap(),
        "--session",
        SESSION,
        "--logs",
        &worker,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("several logs match"), "{}", out.stderr);
    assert!(out.stderr.len() < 4096, "{} bytes", out.stderr.len());
    assert!(out.stderr.contains("(2000 in all)"), "{}", out.stderr);
}

/// `--tail` on a log with fewer lines than asked for in its last 64 MiB says that it
/// starts mid-line.
#[test]
fn tail_past_its_bound_says_it_starts_mid_line() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let log = bucket.join(format!("{PREFIX}/{SESSION}/{NODE}/logs/raylet.err"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&log).unwrap());
    f.write_all(b"first line\n").unwrap();
    let block = vec![b'x'; 1 << 20];
    for _ in 0..65 {
        f.write_all(&block).unwrap();
    }
    f.write_all(b"\nlast line\n").unwrap();
    drop(f);
    let dir = bucket.to_str().unwrap();
    let args = [dir, "--session", SESSION, "--logs", NODE, "--err", "--tail"];
    let out = inspect(&[&args[..], &["3"]].concat());
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.ends_with("\nlast line\n"));
    assert!(!out.stdout.contains("first line"));
    assert!(out.stderr.contains("starts mid-line"), "{}", out.stderr);
    // Within the bound: no note.
    let out = inspect(&[&args[..], &["1"]].concat());
    assert_eq!(out.stdout, "last line\n");
    assert!(out.stderr.is_empty(), "{}", out.stderr);
}

/// A failed task whose id is not an id gets no `--logs` command (it would look up another
/// id).
#[test]
fn ids_that_are_not_ids_get_no_log_command() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let failed = serde_json::json!({
        "eventId": "bad-id-1",
        "eventType": "TASK_LIFECYCLE_EVENT",
        "timestamp": "2026-11-22T02:06:50Z",
        "taskLifecycleEvent": {
            "taskId": "../not an id!",
            "taskAttempt": 0,
            "jobId": "AQAAAA==",
            "stateTransitions": [{"state": "FAILED", "timestamp": "2026-11-22T02:06:50Z"}]
        }
    });
    put(
        &bucket,
        &format!("{PREFIX}/{SESSION}/{NODE}/job_events/{JOB}/{NODE}-2026-11-22-02-5.jsonl"),
        format!("{failed}\n").as_bytes(),
    );
    let dir = bucket.to_str().unwrap();
    let r = json_of(
        &inspect(&[dir, "--session", SESSION, "--json", "--failed-limit", "100"]),
        "session",
    );
    let rows = r["failed_tasks"].as_array().unwrap();
    let bad: Vec<&Value> = rows
        .iter()
        .filter(|t| t["task_id"].as_str().unwrap().starts_with("invalid-"))
        .collect();
    assert_eq!(bad.len(), 1, "{rows:?}");
    assert!(bad[0]["log_command"].is_null(), "{}", bad[0]);
    for t in rows
        .iter()
        .filter(|t| !t["task_id"].as_str().unwrap().starts_with("invalid-"))
    {
        assert!(t["log_command"].as_str().unwrap().contains("--logs"), "{t}");
    }
    let text = inspect(&[dir, "--session", SESSION, "--failed-limit", "100"]);
    assert!(!text.stdout.contains("--logs invalid-"), "{}", text.stdout);
}

/// `--session latest` passes over a newer marker with nothing under it; a marker that is
/// not a session name is not listed as a session.
#[test]
fn latest_skips_an_empty_future_marker_and_non_sessions_are_not_listed() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    put(
        &bucket,
        &format!("{MARKERS}/session_2099-01-01_00-00-00_000000_1"),
        b"",
    );
    put(&bucket, &format!("{MARKERS}/notasession"), b"");
    let dir = bucket.to_str().unwrap();
    let r = json_of(&inspect(&[dir, "--session", "latest", "--json"]), "latest");
    assert_eq!(r["session"], SESSION, "{}", r["problems"]);
    assert!(
        r["problems"]["details"]
            .to_string()
            .contains("session_2099-01-01_00-00-00_000000_1"),
        "{}",
        r["problems"]
    );
    let list = json_of(&inspect(&[dir, "--json"]), "list");
    let names: Vec<&str> = list["clusters"][0]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"notasession"), "{names:?}");
    assert!(names.contains(&SESSION), "{names:?}");
}

/// The same bucket gives the same report, byte for byte, on every run (review f56d): every
/// bounded list keeps the same members however the objects are read and the attempts
/// drained (a hash map with a per-process seed). Failures of one cause at one time, more
/// than a group's examples; more causes and unfinished groups than are kept; more failed and
/// pending attempts than `--failed-limit`; all spread over objects read concurrently.
#[test]
fn the_same_bucket_gives_the_same_report_on_every_run() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    fixture_bucket(&bucket);
    let event = |i: usize, job: &str, state: &str, at: &str, error: Option<(String, String)>| {
        let mut life = serde_json::json!({
            "taskId": format!("{:048x}", 0xabc000 + i),
            "taskAttempt": i % 2,
            "jobId": job,
            "stateTransitions": [{"state": state, "timestamp": at}]
        });
        if let Some((error_type, message)) = error {
            life["rayErrorInfo"] = serde_json::json!({
                "errorType": error_type, "errorMessage": message
            });
        }
        serde_json::json!({
            "eventId": format!("same-{i}"),
            "eventType": "TASK_LIFECYCLE_EVENT",
            "timestamp": at,
            "taskLifecycleEvent": life
        })
        .to_string()
    };
    let mut lines = Vec::new();
    // 40 failures of one cause at one time, each with its own message.
    for i in 0..40 {
        let error = ("WORKER_DIED".to_string(), format!("Traceback\nError: {i}"));
        lines.push(event(
            i,
            "AQAAAA==",
            "FAILED",
            "2026-11-22T02:06:45Z",
            Some(error),
        ));
    }
    // 120 causes of their own, at one time, after "worker died" by name.
    for i in 40..160 {
        let error = (format!("ZZ_CAUSE_{i}"), "gone".to_string());
        lines.push(event(
            i,
            "AQAAAA==",
            "FAILED",
            "2026-11-22T02:06:45Z",
            Some(error),
        ));
    }
    // 120 jobs with a task left RUNNING, and 30 tasks pending since one time.
    for i in 160..280 {
        let job = format!("{:08x}", 0x1000 + i);
        lines.push(event(i, &job, "RUNNING", "2026-11-22T02:06:44Z", None));
    }
    for i in 280..310 {
        lines.push(event(
            i,
            "AQAAAA==",
            "PENDING_NODE_ASSIGNMENT",
            "2026-11-22T02:06:40Z",
            None,
        ));
    }
    for (n, chunk) in lines.chunks(20).enumerate() {
        put(
            &bucket,
            &format!(
                "{PREFIX}/{SESSION}/{NODE}/job_events/{JOB}/{NODE}-2026-11-22-02-{}.jsonl",
                100 + n
            ),
            (chunk.join("\n") + "\n").as_bytes(),
        );
    }
    let dir = bucket.to_str().unwrap();
    let args = [
        dir,
        "--session",
        SESSION,
        "--failed-limit",
        "3",
        "--pending-after",
        "1s",
    ];
    let run = |json: bool| {
        let mut a = args.to_vec();
        if json {
            a.push("--json");
        }
        let out = inspect(&a);
        assert!(out.status.success(), "{}", out.stderr);
        out.stdout
    };
    let first = run(true);
    for _ in 0..3 {
        let again = run(true);
        assert!(
            again == first,
            "two runs differ:\n{}",
            first
                .lines()
                .zip(again.lines())
                .filter(|(a, b)| a != b)
                .take(10)
                .map(|(a, b)| format!("- {a}\n+ {b}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let text = run(false);
    assert_eq!(text, run(false), "the text report differs between two runs");

    let r: Value = serde_json::from_str(&first).unwrap();
    let causes = r["failure_causes"].as_array().unwrap();
    assert_eq!(causes.len(), 100, "the groups kept");
    let other = &r["failure_causes_other"];
    let grouped: u64 = causes.iter().map(|g| g["attempts"].as_u64().unwrap()).sum();
    assert_eq!(
        grouped + other["attempts"].as_u64().unwrap(),
        r["failed_tasks_total"].as_u64().unwrap(),
        "every failed attempt is counted once"
    );
    assert!(other["attempts"].as_u64().unwrap() >= 20, "{other}");
    let died = causes
        .iter()
        .find(|g| g["cause"] == "worker died")
        .expect("the group of 40");
    assert_eq!(died["attempts"], 40);
    assert_eq!(died["examples"].as_array().unwrap().len(), 10);
    assert_eq!(
        died["detail"], "Error: 0",
        "from the first by time, then id"
    );
    assert_eq!(r["failed_tasks"].as_array().unwrap().len(), 3);
    let pending = r["hangs"]["pending_tasks"].as_array().unwrap();
    assert_eq!(pending.len(), 3);
    assert_eq!(r["hangs"]["pending_tasks_total"], 30);
    assert_eq!(
        pending[0]["task_id"],
        format!("{:048x}", 0xabc000 + 280),
        "{pending:?}"
    );
    let unfinished = r["session_end"]["tasks_unfinished"].as_array().unwrap();
    assert_eq!(unfinished.len(), 100);
    assert!(text.contains("of other causes"), "{text}");
    assert!(
        text.contains("more task attempt(s) left unfinished"),
        "{text}"
    );
}
