//! `inspect` on a session big enough to spill its task attempts to temporary files (past
//! 200,000 attempts), through the binary: the spill fits the open-file limit (review r56a
//! D1: one spill file per 16,384 attempts, all open at once, failed with "Too many open
//! files" where main's fewer files did not), and an `inspect` killed while it spills leaves
//! nothing in `TMPDIR` (r56a D2: a killed `inspect` left tens of MB there; the files now
//! never have a name, `O_TMPFILE`, or are unlinked as soon as they are created).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rhc_testkit::services::{limit_open_files, run_with_timeout};

const SESSION: &str = "session_2026-11-22_02-06-36_260774_21819";
const NODE: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";
const PREFIX: &str = "cluster-history/raycluster/default/c1";
const MARKERS: &str = "cluster-metadata/raycluster/default_c1";
/// Task attempts in the bucket: past the 200,000 kept in memory.
const ATTEMPTS: usize = 260_000;
/// Objects they are spread over: many, so that many are open while the spill begins.
const OBJECTS: usize = 40;

/// A bucket of [`ATTEMPTS`] task definitions, each its own task, in [`OBJECTS`] objects.
fn spilling_bucket(dir: &Path) {
    let put = |key: &str, bytes: &[u8]| {
        let path = dir.join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    };
    put(&format!("{MARKERS}/{SESSION}"), b"");
    let per_object = ATTEMPTS / OBJECTS;
    for o in 0..OBJECTS {
        let mut content = String::new();
        for i in o * per_object..(o + 1) * per_object {
            writeln!(
                content,
                "{{\"eventId\":\"ev{i:08x}\",\"eventType\":\"TASK_DEFINITION_EVENT\",\
                 \"timestamp\":\"2026-11-22T02:06:42.344511629Z\",\"sessionName\":\"{SESSION}\",\
                 \"taskDefinitionEvent\":{{\"taskId\":\"{i:048x}\",\"taskAttempt\":0,\
                 \"jobId\":\"AQAAAA==\",\"taskName\":\"f\",\"taskType\":\"NORMAL_TASK\"}}}}"
            )
            .unwrap();
        }
        put(
            &format!(
                "{PREFIX}/{SESSION}/{NODE}/job_events/01000000/{NODE}-2026-11-22-02-{o}.jsonl"
            ),
            content.as_bytes(),
        );
    }
}

/// `inspect <bucket> --json` with `TMPDIR=tmp`, under an open-file limit of `nofile`.
fn inspect_command(bucket: &Path, tmp: &Path, nofile: Option<u64>) -> Command {
    let mut cmd = Command::new(
        std::env::var("RHC_COLLECTOR_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ray-history-collector").to_string()),
    );
    cmd.arg("inspect")
        .arg(bucket)
        .args(["--session", SESSION, "--json"])
        .env_remove("STORAGE_ROOT_DIR")
        .env("TMPDIR", tmp);
    if let Some(n) = nofile {
        limit_open_files(&mut cmd, n);
    }
    cmd
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_spill_under_a_low_open_file_limit_is_read_and_a_kill_leaves_nothing() {
    let work = tempfile::tempdir().unwrap();
    let bucket = work.path().join("bucket");
    let tmp = work.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    spilling_bucket(&bucket);

    // Under `ulimit -n 40`: the 16 objects that may be open, the files kept free and the
    // spill files all fit (the branch before the fix opened 24 spill files here).
    let out = run_with_timeout(
        &mut inspect_command(&bucket, &tmp, Some(40)),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "{}\nstderr: {}",
        out.status,
        out.stderr
    );
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["tasks"]["total"], ATTEMPTS, "{}", report["tasks"]);
    assert_eq!(report["objects"]["read"], OBJECTS, "{}", report["objects"]);
    assert!(
        entries(&tmp).is_empty(),
        "left in TMPDIR: {:?}",
        entries(&tmp)
    );

    // SIGKILL while the spill files are open: they never had a name (or lost it when
    // created), so nothing is left (nor during the run: TMPDIR is empty whenever looked at).
    let mut child = inspect_command(&bucket, &tmp, None)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let fds = format!("/proc/{}/fd", child.id());
    let spilling = || {
        std::fs::read_dir(&fds)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                // A spill file has no name: `<TMPDIR>/#<inode> (deleted)`, or a named
                // one's path while it is unlinked.
                std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(&tmp))
            })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !spilling() {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "inspect never held a spill file open"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let seen = entries(&tmp);
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "{status}");
    assert!(seen.is_empty(), "in TMPDIR while spilling: {seen:?}");
    assert!(
        entries(&tmp).is_empty(),
        "left in TMPDIR: {:?}",
        entries(&tmp)
    );
}
