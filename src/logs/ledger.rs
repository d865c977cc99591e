//! The log ledger: for every object uploaded, the size, mtime and hash of the file it came
//! from, and the sessions completely done. Saved atomically in the spool dir, so a restart
//! uploads again only what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::LogError;

/// What the bucket holds for one log object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LedgerEntry {
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    pub(super) hash: u64,
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
                version: 1,
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
        let result = crate::util::fs::write_json_atomically(&self.path, &self.data);
        match result {
            Ok(()) => self.dirty = false,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "could not save the log ledger; unchanged files may be uploaded again after a restart")
            }
        }
    }
}
