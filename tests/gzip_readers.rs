//! The event objects the collector uploads are gzip files of several members (one per MiB of
//! input, `storage::gzip`). A multi-member file is one valid gzip file, but only readers that
//! go on after the first member see all of it. This test uploads a segment of several
//! members through the real binary and reads the object back with Go's `compress/gzip` (the
//! history server's reader, `tests/go/gunzip.go`), Python's `gzip` and flate2's
//! `MultiGzDecoder` (inspect's): each must give back every line. Once at the default
//! `--gzip-level` (libdeflate, or igzip in a build with the `igzip` feature) and once at a
//! libdeflate level.
//!
//! Go and Python are on every machine the project runs on; with `RHC_REQUIRE_SERVICES=1` (as
//! `scripts/test.sh` sets) a missing one fails the test instead of skipping it.

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rhc_testkit::collector::Collector;

/// More input than three members hold.
const SEGMENT_BYTES: usize = 3 << 20;

fn required() -> bool {
    std::env::var_os("RHC_REQUIRE_SERVICES").is_some_and(|v| v == "1")
}

/// Ray 2.60 events from the capture, each with a fresh id, as bodies of 500 events.
fn bodies() -> (Vec<Vec<u8>>, usize) {
    let text = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/posts-camel.jsonl"
    ))
    .expect("capture");
    let mut events: Vec<serde_json::Value> = Vec::new();
    for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
        events
            .extend(serde_json::from_slice::<Vec<serde_json::Value>>(line).expect("capture line"));
    }
    // Only node-level events, so that everything lands in one segment (node_events).
    events.retain(|e| {
        e.as_object().is_some_and(|o| {
            o.values()
                .filter_map(|v| v.get("jobId"))
                .all(|j| j.as_str().is_none_or(str::is_empty))
        })
    });
    assert!(!events.is_empty(), "the capture has events without a job");
    let mut out = Vec::new();
    let mut total = 0usize;
    let mut i = 0usize;
    while total < SEGMENT_BYTES {
        let mut batch = Vec::new();
        for _ in 0..500 {
            let mut e = events[i % events.len()].clone();
            e["eventId"] = format!("gzip-readers-{i:09}").into();
            total += serde_json::to_vec(&e).expect("json").len() + 1;
            batch.push(e);
            i += 1;
        }
        out.push(serde_json::to_vec(&batch).expect("json"));
    }
    (out, i)
}

fn run(cmd: &mut Command) -> Option<Vec<u8>> {
    match cmd.output() {
        Ok(o) if o.status.success() => Some(o.stdout),
        Ok(o) => panic!(
            "{cmd:?} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) if !required() => {
            eprintln!("skipped {cmd:?}: {e}");
            None
        }
        Err(e) => panic!("{cmd:?}: {e}"),
    }
}

/// The default level (the build's compressor) and a libdeflate level: both objects read whole,
/// and the flag reaches the uploads (level 6 stores less).
#[test]
fn multi_member_objects_read_whole_in_go_python_and_rust() {
    let default = upload_and_read_back(&[]);
    let level6 = upload_and_read_back(&["--gzip-level", "6"]);
    assert!(
        level6 < default,
        "--gzip-level 6 stored {level6} bytes, the default {default}"
    );
}

/// Uploads the bodies through the binary with `flags`, reads the one `node_events` object
/// back with every reader, and returns its size.
fn upload_and_read_back(flags: &[&str]) -> usize {
    let tmp = tempfile::tempdir().expect("tmp");
    let bucket = tmp.path().join("bucket");
    let mut args = vec![
        "--storage",
        bucket.to_str().expect("utf-8 path"),
        "--enable-log-collector",
        "false",
        "--enable-export-events",
        "false",
    ];
    args.extend_from_slice(flags);
    let mut c = Collector::start(&tmp.path().join("spool"), &args, &[]);
    let (bodies, events) = bodies();
    for b in &bodies {
        let r = c.post(b);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert!(c.terminate(Duration::from_secs(30)).success());

    let objects: Vec<_> = walk(&bucket)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/node_events/"))
        .collect();
    assert_eq!(objects.len(), 1, "one node_events segment: {objects:?}");
    let object = &objects[0];
    assert!(object.to_string_lossy().ends_with(".jsonl.gz"));
    let gz = std::fs::read(object).expect("object");

    let mut whole = Vec::new();
    flate2::read::MultiGzDecoder::new(&gz[..])
        .read_to_end(&mut whole)
        .expect("gzip");
    assert_eq!(whole.iter().filter(|&&b| b == b'\n').count(), events);
    let mut first = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut first)
        .expect("first member");
    assert!(
        first.len() < whole.len() / 2,
        "the object should hold several members ({} of {} bytes in the first)",
        first.len(),
        whole.len()
    );

    let go_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go/gunzip.go");
    if let Some(out) = run(Command::new("go")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .arg("run")
        .arg(&go_src)
        .arg(object))
    {
        assert!(
            out == whole,
            "Go read {} of {} bytes ({flags:?})",
            out.len(),
            whole.len()
        );
    }
    let python = std::env::var("RHC_PYTHON").unwrap_or_else(|_| "python3".into());
    if let Some(out) = run(Command::new(python)
        .args([
            "-c",
            "import gzip, sys; sys.stdout.buffer.write(gzip.open(sys.argv[1]).read())",
        ])
        .arg(object))
    {
        assert!(
            out == whole,
            "Python read {} of {} bytes ({flags:?})",
            out.len(),
            whole.len()
        );
    }
    gz.len()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}
