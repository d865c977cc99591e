//! rhc-testkit: what the integration tests and the dev tools of ray-history-collector share,
//! so there is one of each.
//!
//! - [`http`]: the one blocking HTTP/1.1 client (one-shot requests, keep-alive connections).
//! - [`collector`]: the collector as a real process (start, post, metrics, SIGTERM, kill -9,
//!   restart), and reading a bucket back.
//! - [`services`]: the storage emulators (moto for S3 and GCS's XML API, Azurite, fake-gcs-server)
//!   that `scripts/install-test-deps.sh` installs, on loopback ports.
//! - [`preload`]: an `LD_PRELOAD` shim that swaps a file for a symlink as it is opened.
//! - [`ray_logs`]: a Ray temp root with sessions and log files, for the log shipper's tests,
//!   and [`ray_logs::LocalRig`]: a Ray temp root, a `file://` bucket, a spool and collectors
//!   between them.
//! - [`nobtime`]: a loop-mounted ext4 without birth times.
//! - [`fault_proxy`]: an HTTP proxy that records requests and injects errors, delays and drops.
//! - [`moto_rig`]: moto behind the fault proxy, a bucket, a Ray session, and collectors
//!   shipping its logs there through the proxy (the S3 append tests' set-up).
//! - [`relay`]: a TCP relay that can be cut and restored, for storage outages.
//! - [`ray`]: real Ray from PyPI, run by the end-to-end tests.
//! - [`history_server`]: KubeRay's history server as a peer, with the Kubernetes API it needs.
//! - [`chromium`]: headless Chromium, for screenshots and the DOM of a page.
//! - [`dashboard`]: a Ray dashboard stand-in for the head's snapshot poller, which can switch
//!   to the bad answers of a dashboard going down.
//! - [`peer`]: KubeRay's Go collector as a peer, with the stand-ins it needs to start, and
//!   [`peer::AnyCollector`] to drive it and ours alike.
//! - [`prometheus`]: a real Prometheus scraping collectors and evaluating the chart's alerts.
//! - [`serve`]: `ray-history-collector serve` as a real process, and a bucket for it written by
//!   the real collector with the head's dashboard snapshots.
//! - [`serve_rig`]: `serve` reading moto through the fault proxy, with many sessions copied
//!   from one the collector wrote (the slow snapshot reads' tests' set-up).
//! - [`usage`]: what a process cost (CPU time, peak resident set) from the kernel's accounting.
//! - [`hostile`]: clients that stall bodies, never read answers or never end heads, and
//!   [`hostile::tries`], which counts how often Ray and the probe still get through.
//!
//! Everything binds 127.0.0.1 only (but KubeRay's collector, which listens on every interface
//! by design and is only ever sent requests on loopback), and every process started here is
//! stopped when its handle is dropped.

pub mod chromium;
pub mod collector;
pub mod dashboard;
pub mod fault_proxy;
pub mod fault_shim;
pub mod history_server;
pub mod hostile;
pub mod http;
pub mod moto_rig;
pub mod nobtime;
pub mod peer;
pub mod preload;
pub mod prometheus;
pub mod ray;
pub mod ray_logs;
pub mod relay;
pub mod serve;
pub mod serve_rig;
pub mod services;
pub mod usage;

use std::path::PathBuf;

/// The repository's root (where `Cargo.toml` of the collector is).
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
