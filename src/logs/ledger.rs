//! The log ledger: for every object uploaded, what the bucket holds (size, ETag, when) and
//! what the file it came from looked like (mtime, inode, a hash of the bytes just before the
//! end of what was uploaded), and the sessions completely done. Saved atomically in the spool
//! dir, so a restart uploads again only what changed, and an append can check that the file
//! only grew and the object is still ours.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::LogError;

/// What the bucket holds for one log object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LedgerEntry {
    /// Bytes of the file in the object (a prefix of the file).
    pub(super) size: u64,
    /// The file's mtime when they were read.
    pub(super) mtime_ns: i64,
    /// xxh3 of the last [`crate::storage::put::WINDOW`] bytes of that prefix (of the whole
    /// prefix in ledgers written before version 2).
    pub(super) hash: u64,
    /// The file's inode (0: not known), to tell a file replaced under the same name.
    #[serde(default)]
    pub(super) ino: u64,
    /// Unix seconds of the upload (0: not known).
    #[serde(default)]
    pub(super) uploaded_at: u64,
    /// The object's ETag after the upload, when the store gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) e_tag: Option<String>,
}

/// The ledger file: uploaded objects and sessions completely done.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct LedgerFile {
    version: u32,
    pub(super) objects: BTreeMap<String, LedgerEntry>,
    pub(super) finished_sessions: BTreeSet<String>,
}

pub(super) struct Ledger {
    path: PathBuf,
    pub(super) data: LedgerFile,
    pub(super) dirty: bool,
}

impl Ledger {
    pub(super) fn load(path: PathBuf) -> Result<Ledger, LogError> {
        let data = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LogError::Ledger {
                path: path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => LedgerFile {
                version: 2,
                ..Default::default()
            },
            Err(e) => {
                return Err(LogError::Ledger {
                    path,
                    message: e.to_string(),
                })
            }
        };
        Ok(Ledger {
            path,
            data,
            dirty: false,
        })
    }

    /// Writes the ledger atomically (temp file, fsync, rename) if it changed.
    pub(super) fn save(&mut self) {
        if !self.dirty {
            return;
        }
        self.data.version = 2;
        let result = crate::util::fs::write_json_atomically(&self.path, &self.data);
        match result {
            Ok(()) => self.dirty = false,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "could not save the log ledger; unchanged files may be uploaded again after a restart")
            }
        }
    }
}
