//! Headless Chromium (Debian's `chromium`, `RHC_CHROMIUM` from
//! `./scripts/install-test-deps.sh`) for the tests that look at a page: a screenshot and the
//! DOM as Chromium parsed it.
//!
//! Chromium runs offline and leaves nothing behind: no sandbox (tests run as root in
//! containers), no GPU, no QUIC, no first-run, sync, component updates or background
//! networking, a fresh profile dir per run, bounded in time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::services::{run_with_timeout, tool, CommandOutput};

/// How long one Chromium run may take.
pub const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(90);

/// The Chromium binary, or `None` after printing why the test is skipped (panics instead
/// when `RHC_REQUIRE_SERVICES=1`, as [`tool`] does).
pub fn chromium() -> Option<PathBuf> {
    let found = tool("RHC_CHROMIUM");
    if found.is_none() {
        eprintln!("skipping: RHC_CHROMIUM is not set, so Chromium is not available (run ./scripts/test.sh)");
    }
    found
}

/// Chromium with the flags that keep it headless, offline and private to this run.
fn command(chromium: &Path, profile: &Path, width: u32, height: u32) -> Command {
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--window-size={width},{height}"))
    // Nothing on loopback or elsewhere is meant to be reached.
    .env("NO_PROXY", "*")
    .env_remove("http_proxy")
    .env_remove("https_proxy");
    cmd
}

fn check(what: &str, out: &CommandOutput) {
    assert!(
        out.status.success(),
        "chromium {what} failed with {}\n--- stderr ---\n{}",
        out.status,
        out.stderr
    );
}

/// Renders `page` (a local file) at `width` x `height` into the PNG `png`.
pub fn screenshot(chromium: &Path, page: &Path, png: &Path, width: u32, height: u32) {
    let profile = tempfile::tempdir().expect("chromium profile dir");
    let mut cmd = command(chromium, profile.path(), width, height);
    cmd.arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()));
    let out = run_with_timeout(&mut cmd, CHROMIUM_TIMEOUT);
    check("--screenshot", &out);
    assert!(
        png.exists(),
        "chromium wrote no {}: {}",
        png.display(),
        out.stderr
    );
}

/// The DOM of `page` after Chromium loaded and laid it out, serialized.
pub fn dump_dom(chromium: &Path, page: &Path) -> String {
    let profile = tempfile::tempdir().expect("chromium profile dir");
    let mut cmd = command(chromium, profile.path(), 1400, 1000);
    cmd.arg("--dump-dom")
        .arg(format!("file://{}", page.display()));
    let out = run_with_timeout(&mut cmd, CHROMIUM_TIMEOUT);
    check("--dump-dom", &out);
    out.stdout
}

/// The width and height of a PNG, from its IHDR chunk.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((be(&png[16..20]), be(&png[20..24])))
}

/// How long a page may run its scripts and fetches before Chromium takes the DOM or the
/// screenshot, in virtual time (Chromium fast-forwards timers while the network is idle, so
/// this bounds the wait rather than adding to it).
pub const PAGE_SETTLE_MS: u32 = 15_000;

/// The DOM of the page at `url` (an `http://127.0.0.1` address) once its scripts ran for at
/// most `settle_ms` of virtual time, serialized: what a single-page app shows after its
/// fetches.
pub fn dump_dom_url(chromium: &Path, url: &str, settle_ms: u32) -> String {
    let profile = tempfile::tempdir().expect("chromium profile dir");
    let mut cmd = command(chromium, profile.path(), 1400, 1000);
    cmd.arg(format!("--virtual-time-budget={settle_ms}"))
        .arg("--dump-dom")
        .arg(url);
    let out = run_with_timeout(&mut cmd, CHROMIUM_TIMEOUT);
    check("--dump-dom", &out);
    out.stdout
}

/// [`screenshot`] of the page at `url`, after its scripts ran for at most `settle_ms`.
pub fn screenshot_url(chromium: &Path, url: &str, png: &Path, size: (u32, u32), settle_ms: u32) {
    let profile = tempfile::tempdir().expect("chromium profile dir");
    let mut cmd = command(chromium, profile.path(), size.0, size.1);
    cmd.arg(format!("--virtual-time-budget={settle_ms}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(url);
    let out = run_with_timeout(&mut cmd, CHROMIUM_TIMEOUT);
    check("--screenshot", &out);
    assert!(
        png.exists(),
        "chromium wrote no {}: {}",
        png.display(),
        out.stderr
    );
}
