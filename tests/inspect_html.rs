//! `inspect --html` rendered for real: the page made from an export-only Ray Train session
//! (`tests/data/export-session`, put through the real collector) is loaded in headless
//! Chromium (`RHC_CHROMIUM`, Debian's `chromium` from `./scripts/install-test-deps.sh`); its
//! screenshot is kept under `target/tmp/inspect-html/` for people to look at, and the DOM
//! Chromium parsed must draw every task attempt of the session's timeline (`--timeline`, made
//! by the same command) and every failure, inside the chart.
//!
//! Without Chromium the test prints `skipping: ...` and passes, unless
//! `RHC_REQUIRE_SERVICES=1` (as `./scripts/test.sh` and CI set it), where it fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use rhc_testkit::chromium::{chromium, dump_dom, png_size, screenshot};
use rhc_testkit::collector::ship_session_logs;
use rhc_testkit::services::run_with_timeout;

const SESSION: &str = "session_2026-11-25_16-46-44_859917_18993";
const FAILING_TASK: &str = "32d950ec0ccf9d2affffffffffffffffffffffff01000000";
/// The chart's time axis starts after the lane labels and is this wide (src/inspect/html.rs).
const CHART_LEFT: f64 = 330.0;
const CHART_WIDTH: f64 = 1000.0;
const SHOT: (u32, u32) = (1400, 1500);

/// The fixture session through the real collector into a file bucket.
fn bucket(work: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/export-session/logs");
    ship_session_logs(work, &fixture, SESSION, "train")
}

/// `(task id, attempt)` of the elements of `dom` that match `pattern` (whose first two
/// groups are the task id and the attempt), with the rest of their captures.
fn drawn(dom: &str, pattern: &str) -> Vec<((String, i64), Vec<String>)> {
    let re = regex::Regex::new(pattern).unwrap();
    re.captures_iter(dom)
        .map(|c| {
            let key = (c[1].to_string(), c[2].parse().unwrap());
            let rest = (3..c.len()).map(|i| c[i].to_string()).collect();
            (key, rest)
        })
        .collect()
}

#[test]
fn html_page_draws_every_attempt_and_failure_in_chromium() {
    let Some(chromium) = chromium() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let store = bucket(work.path());
    let page = work.path().join("session.html");
    let timeline = work.path().join("timeline.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ray-history-collector"));
    cmd.args([
        "inspect",
        store.to_str().unwrap(),
        "--session",
        SESSION,
        "--json",
    ])
    .arg("--html")
    .arg(&page)
    .arg("--timeline")
    .arg(&timeline)
    .env_remove("STORAGE_ROOT_DIR");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "inspect: {}\n{}",
        out.status,
        out.stderr
    );
    let report: Value = serde_json::from_str(&out.stdout).unwrap();

    // What must be drawn: the attempts and failures of the timeline.
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&timeline).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let key = |e: &Value| {
        (
            e["args"]["task_id"].as_str().unwrap().to_string(),
            e["args"]["attempt"].as_i64().unwrap(),
        )
    };
    let attempts: BTreeSet<(String, i64)> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "task")
        .map(key)
        .collect();
    let failures: BTreeSet<(String, i64)> = events
        .iter()
        .filter(|e| e["ph"] == "i" && e["cat"] == "failure")
        .map(key)
        .collect();
    assert!(attempts.len() > 50, "{} attempts", attempts.len());
    assert_eq!(
        failures,
        BTreeSet::from([(FAILING_TASK.to_string(), 0)]),
        "{}",
        report["failed_tasks"]
    );

    // The page, as Chromium sees it.
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inspect-html");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("export-session.png");
    let _ = std::fs::remove_file(&png);
    screenshot(&chromium, &page, &png, SHOT.0, SHOT.1);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(png_size(&bytes), Some(SHOT), "{}", png.display());
    assert!(
        bytes.len() > 20_000,
        "a near-empty screenshot: {} bytes",
        bytes.len()
    );
    println!("screenshot: {}", png.display());

    let dom = dump_dom(&chromium, &page);
    let bars = drawn(
        &dom,
        r#"<rect class="attempt (?:finished|failed|running|other)" data-task-id="([0-9a-f]+)" data-attempt="(-?\d+)" data-state="([A-Z_]+)" x="([0-9.]+)" y="[0-9.]+" width="([0-9.]+)""#,
    );
    let drawn_attempts: BTreeSet<(String, i64)> = bars.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(bars.len(), drawn_attempts.len(), "an attempt drawn twice");
    assert_eq!(
        drawn_attempts, attempts,
        "bars in the DOM vs attempts in the timeline"
    );
    for ((task, _), rest) in &bars {
        let (x, width): (f64, f64) = (rest[1].parse().unwrap(), rest[2].parse().unwrap());
        assert!(
            width >= 1.0 && x >= CHART_LEFT - 0.1 && x + width <= CHART_LEFT + CHART_WIDTH + 1.1,
            "task {task}'s bar at x={x} width={width} is outside the chart"
        );
    }
    let state_of = |task: &str| {
        bars.iter()
            .find(|((t, _), _)| t == task)
            .map(|(_, rest)| rest[0].clone())
    };
    assert_eq!(state_of(FAILING_TASK).as_deref(), Some("FAILED"));
    let marks = drawn(
        &dom,
        r#"<path class="failure" data-failure="1" data-task-id="([0-9a-f]+)" data-attempt="(-?\d+)""#,
    );
    let drawn_failures: BTreeSet<(String, i64)> = marks.into_iter().map(|(k, _)| k).collect();
    assert_eq!(drawn_failures, failures);
    assert!(
        dom.contains(&format!(
            "<tr class=\"failed-task\" data-task-id=\"{FAILING_TASK}\""
        )),
        "the failed task is not in the failed-tasks table"
    );
    for track in ["job 01000000", "Train run probe-run"] {
        assert!(dom.contains(track), "no {track} track");
    }
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("<script") && !html.contains("http://") && !html.contains("https://"),
        "the page must be self-contained"
    );
}
