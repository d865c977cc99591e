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
//! on their own lane, so a 10 GB worker log never delays events; one that outlasts an
//! interval goes on beside the lane within its deadline ([`lane`]), so a hung request
//! never stalls the node's other logs.
//!
//! A live file is not sent whole every round: where the store can append (S3 from 5 MiB,
//! `file://`), only its new bytes go; elsewhere [`schedule`] decides when a changed file is worth sending again
//! (small files every round, big ones when they grew by half or waited a time that grows
//! with their size), so the bytes uploaded stay within a constant factor of what Ray wrote.
//! Small files go first in a round, and `--log-upload-max-bytes-per-second` caps the lane.
//!
//! One file is one object for the whole session: [`placement`] keeps the files no writer
//! can be told for under the session's first raylet (pinned in the ledger), a worker's file
//! under the node it first went to, and a backup written again after its rename under the
//! key of its first upload, where that one object grows.
//!
//! The files: [`scan`] lists a session's log files and recognises rotated backups,
//! [`ledger`] remembers what the bucket holds, [`schedule`] decides when, [`gate`] whether
//! appends are on after the store's refusals, [`lane`] sends one file within its deadline,
//! [`shipper`] runs the rounds and the final flush.

mod gate;
mod lane;
mod ledger;
mod placement;
mod scan;
pub mod schedule;
mod shipper;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::contract::ClusterLayout;
use crate::storage::append::Appender;
use object_store::ObjectStore;

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
    /// The client files' bytes are sent with, when not the shipper's store: on a remote
    /// store, one whose request timeout lets a part go over a slow uplink
    /// (`storage::Configured::for_log_bodies`). The shipper's store keeps the ledger's
    /// checks (a HEAD each), so a black hole towards the store holds a round no longer.
    pub body_store: Option<Arc<dyn ObjectStore>>,
    /// Whether growing logs are appended to (`--log-appends`).
    pub appends: bool,
    /// The longest object key the store takes, in bytes (`storage::Configured::max_key_bytes`):
    /// a file whose key is longer is skipped, logged once and counted, never sent.
    pub max_key_bytes: usize,
    /// The longest name (one segment of a key) the store takes, in bytes
    /// (`storage::Configured::max_name_bytes`): a file whose key holds a longer one (its own
    /// name, a directory's, or a rotated backup's longer name) is skipped as
    /// [`LogConfig::max_key_bytes`] says.
    pub max_name_bytes: usize,
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
