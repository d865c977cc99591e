//! Live snapshots of the Ray session logs, captured rotations, earlier sessions, and the
//! final flush at SIGTERM.
//!
//! KubeRay's collector uploads logs once, at SIGTERM, whole files in memory: a pod killed
//! hard loses every log. Here every `--log-upload-interval` the files that changed since
//! their last upload are streamed to `P/<session>/<node>/logs/<relative path>`, and a ledger
//! in the spool dir (size, mtime, hash per object) means a restart re-uploads nothing that
//! did not change. A notify watch catches Ray's log rotations (`name` → `name.1` …) as they
//! happen, and each rotated file is uploaded once under a stable name,
//! `<name>.rotated.<UTC mtime>.ino<inode>`, before Ray can delete it. Log uploads run one at a time
//! on their own lane, so a 10 GB worker log never delays events.
//!
//! A live file is not sent whole every round: where the store can append (S3 from 5 MiB,
//! `file://`), only its new bytes go; elsewhere [`schedule`] decides when a changed file is worth sending again
//! (small files every round, big ones when they grew by half or waited a time that grows
//! with their size), so the bytes uploaded stay within a constant factor of what Ray wrote.
//! Small files go first in a round, and `--log-upload-max-bytes-per-second` caps the lane.
//!
//! The files: [`scan`] lists a session's log files and recognises rotated backups,
//! [`ledger`] remembers what the bucket holds, [`schedule`] decides when, [`gate`] whether
//! appends are on after the store's refusals, [`shipper`] runs the rounds and the final flush.

mod gate;
mod ledger;
mod scan;
pub mod schedule;
mod shipper;

use std::path::PathBuf;
use std::time::Duration;

use crate::contract::ClusterLayout;
use crate::storage::append::Appender;

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
    /// The log lane's bandwidth cap in bytes per second (0: none).
    pub max_bytes_per_second: u64,
    /// How the store appends to an object, when it can; also, on S3, the start-up cleanup
    /// of incomplete uploads, which runs whether appends are on or not.
    pub appender: Option<Appender>,
    /// Whether growing logs are appended to (`--log-appends`).
    pub appends: bool,
    /// The bucket and prefix the ledger belongs to (`storage::Configured::identity`): a
    /// ledger written for another bucket is not used.
    pub bucket: String,
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
