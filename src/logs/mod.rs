//! Live snapshots of the Ray session logs, captured rotations, earlier sessions, and the
//! final flush at SIGTERM.
//!
//! KubeRay's collector uploads logs once, at SIGTERM, whole files in memory: a pod killed
//! hard loses every log. Here every `--log-upload-interval` the files that changed since
//! their last upload are streamed to `P/<session>/<node>/logs/<relative path>`, and a ledger
//! in the spool dir (size, mtime, hash per object) means a restart re-uploads nothing that
//! did not change. A notify watch catches Ray's log rotations (`name` → `name.1` …) as they
//! happen, and each rotated file is uploaded once under a stable name,
//! `<name>.rotated.<UTC mtime>`, before Ray can delete it. Log uploads run one at a time
//! on their own lane, so a 10 GB worker log never delays events.
//!
//! The files: [`scan`] lists a session's log files and recognises rotated backups,
//! [`ledger`] remembers what the bucket holds, [`shipper`] runs the rounds and the final flush.

mod ledger;
mod scan;
mod shipper;

use std::path::PathBuf;
use std::time::Duration;

use crate::contract::ClusterLayout;

pub use shipper::{LogShipper, RoundReport};

/// Settings of the log shipper.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Ray's temp root (`/tmp/ray`), holding `session_latest` and the session dirs.
    pub ray_tmp: PathBuf,
    /// Where the ledger lives (the spool dir).
    pub state_dir: PathBuf,
    /// Time between snapshots.
    pub upload_interval: Duration,
    /// Multipart part size.
    pub part_size: usize,
    /// Key layout.
    pub layout: ClusterLayout,
}

/// Errors that stop the log shipper from starting.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The ledger exists but cannot be read.
    #[error("reading the log ledger {path}: {message}")]
    Ledger {
        /// Its path.
        path: PathBuf,
        /// Why.
        message: String,
    },
}
