//! The tailer's offsets file: how far each export file was read (by file id, its identity and
//! size), saved as a checkpoint with the batch that reached them, versioned
//! ([`OFFSETS_VERSION`]), and entries of files gone dated so they are dropped after a while.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::events::spool::{AppendBatch, Checkpoint};

use super::identity::{FirstLine, Identity, Known};
use super::{ExportTailer, StoreError};

/// Version of the offsets file written now: 1 added the file identity (first line, birth
/// time) to each entry; version 0 entries are read too (see `identity`).
pub(super) const OFFSETS_VERSION: u32 = 1;

/// Where reading stopped in one file, and which file that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FileOffset {
    pub(super) inode: u64,
    pub(super) offset: u64,
    /// Hash of the first `min(offset, 64)` bytes: all an older collector kept, and still
    /// written so that one can read this file.
    pub(super) fingerprint: u64,
    /// The file's first line (absent in entries of an older collector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) first_line: Option<FirstLine>,
    /// The file's birth time, where the filesystem records one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) born_ns: Option<u64>,
    /// An entry without `first_line`: when it was saved at the latest (the modification time
    /// of the offsets file it was loaded from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) saved_before_ns: Option<u64>,
}

impl FileOffset {
    pub(super) fn known(&self) -> Known {
        Known {
            offset: self.offset,
            legacy_fingerprint: self.fingerprint,
            identity: self.first_line.map(|first_line| Identity {
                first_line,
                born_ns: self.born_ns,
            }),
            saved_before_ns: self.saved_before_ns,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct OffsetsFile {
    pub(super) version: u32,
    /// `<session>/<inode>` → offset.
    pub(super) files: BTreeMap<String, FileOffset>,
    /// Train run id → job hex, so attempts follow their run across restarts.
    pub(super) run_jobs: BTreeMap<String, String>,
}

pub(super) fn offsets_path(dir: &Path) -> PathBuf {
    dir.join("export-offsets.json")
}

impl ExportTailer {
    /// Saves the offsets when they changed, as a checkpoint without lines: the spool's writer
    /// is the only one to write the file, and a save clears a failed batch's checkpoint.
    pub(super) async fn save(&mut self) {
        if !self.dirty {
            return;
        }
        let path = offsets_path(&self.cfg.state_dir);
        let result = match serde_json::to_vec(&self.state) {
            Ok(bytes) => self
                .spool
                .append(AppendBatch {
                    body: Bytes::new(),
                    partitions: Vec::new(),
                    quarantined: Vec::new(),
                    quarantine_dropped: 0,
                    checkpoint: Some(Checkpoint {
                        path: path.clone(),
                        bytes,
                    }),
                })
                .await
                .map_err(StoreError::Spool),
            Err(e) => Err(StoreError::Encode(e)),
        };
        match result {
            Ok(_) => self.dirty = false,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "could not save export offsets")
            }
        }
    }
}

/// Dates the entries of an older collector (without a file identity) with the modification
/// time of the offsets file they were loaded from: they were saved then at the latest, so a
/// file born later is not theirs (`identity`).
pub(super) fn date_older_entries(state: &mut OffsetsFile, path: &Path) {
    let saved = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_nanos()).ok());
    for entry in state.files.values_mut() {
        if entry.first_line.is_none() && entry.saved_before_ns.is_none() {
            entry.saved_before_ns = saved;
        }
    }
}
