//! The log ledger: for every object uploaded, what the bucket holds (size, ETag, when) and
//! what the file it came from looked like (mtime, inode, a hash of the bytes just before the
//! end of what was uploaded, one of its first bytes and one of all of them), the sessions completely done, and the node each session's
//! unattributed files are filed under. Saved atomically in the spool
//! dir, so a restart uploads again only what changed, and an append can check that the file
//! only grew and the object is still ours.
//!
//! The ledger names the bucket it describes (the URL requests go to and the root prefix):
//! the same spool pointed at another bucket, or at the same name on another server, starts
//! from an empty ledger, so every file is uploaded there. A ledger from before that field
//! (version 2) is taken as the current bucket's; the shipper's HEAD checks catch objects it
//! lacks.

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
    /// xxh3 of the first [`crate::storage::put::HEAD`] bytes of that prefix (`None` in
    /// ledgers before version 4, until the next upload): a file whose head changed is
    /// another file, never appended to this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) head: Option<u64>,
    /// xxh3 of the whole prefix, every byte the object holds (`None` in ledgers before
    /// version 5, until the next whole upload): an append is checked against it after it
    /// ran (the file must still hold exactly the object's bytes), so the object is appended
    /// to only when this is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) full: Option<u64>,
}

/// The ledger file: uploaded objects and sessions completely done.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct LedgerFile {
    version: u32,
    /// The bucket and prefix the entries describe (`None` in ledgers before version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) bucket: Option<String>,
    pub(super) objects: BTreeMap<String, LedgerEntry>,
    pub(super) finished_sessions: BTreeSet<String>,
    /// Per session, the node that owns its files no writer can be told for (the shipper's
    /// `session_owner`), pinned once known so a later raylet or a restart never moves them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) session_nodes: BTreeMap<String, String>,
}

pub(super) struct Ledger {
    path: PathBuf,
    pub(super) data: LedgerFile,
    pub(super) dirty: bool,
}

/// The ledger format written now (5: entries carry the hash of the whole prefix; 4: of the
/// file's head; versions 2 to 4 are read as they are, their entries without them).
const VERSION: u32 = 5;

impl Ledger {
    /// Loads the ledger at `path` for the bucket `bucket` (see the module doc).
    pub(super) fn load(path: PathBuf, bucket: &str) -> Result<Ledger, LogError> {
        let data: LedgerFile = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LogError::Ledger {
                path: path.clone(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => LedgerFile::default(),
            Err(e) => {
                return Err(LogError::Ledger {
                    path,
                    message: e.to_string(),
                })
            }
        };
        let mut ledger = Ledger {
            path,
            data,
            dirty: false,
        };
        match ledger.data.bucket.as_deref() {
            Some(b) if b == bucket => {}
            Some(other) => {
                tracing::warn!(
                    ledger = %ledger.path.display(),
                    was = other,
                    now = bucket,
                    objects = ledger.data.objects.len(),
                    "the log ledger describes another bucket; starting from an empty one, so \
                     every log file is uploaded to this bucket"
                );
                ledger.data = LedgerFile::default();
                ledger.data.bucket = Some(bucket.to_string());
                ledger.dirty = true;
            }
            None => {
                // A version-2 ledger is adopted for this bucket (saved with it at once); a
                // new, empty one is written only once it records something, so a collector
                // that ships no logs leaves no ledger behind.
                ledger.data.bucket = Some(bucket.to_string());
                ledger.dirty =
                    !ledger.data.objects.is_empty() || !ledger.data.finished_sessions.is_empty();
            }
        }
        Ok(ledger)
    }

    /// Writes the ledger atomically (temp file, fsync, rename) if it changed.
    pub(super) fn save(&mut self) {
        if !self.dirty {
            return;
        }
        self.data.version = VERSION;
        let result = crate::util::fs::write_json_atomically(&self.path, &self.data);
        match result {
            Ok(()) => self.dirty = false,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "could not save the log ledger; unchanged files may be uploaded again after a restart")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> LedgerEntry {
        LedgerEntry {
            size: 1,
            mtime_ns: 2,
            hash: 3,
            ino: 4,
            uploaded_at: 5,
            e_tag: None,
            head: None,
            full: None,
        }
    }

    #[test]
    fn a_ledger_of_another_bucket_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log-ledger.json");
        let mut l = Ledger::load(path.clone(), "http://127.0.0.1:1/a").unwrap();
        l.data.objects.insert("k".into(), entry());
        l.data.finished_sessions.insert("s".into());
        l.data.session_nodes.insert("s".into(), "n".into());
        l.dirty = true;
        l.save();
        let same = Ledger::load(path.clone(), "http://127.0.0.1:1/a").unwrap();
        assert_eq!(same.data.objects.len(), 1);
        assert_eq!(same.data.session_nodes["s"], "n");
        assert_eq!(same.data.finished_sessions.len(), 1);
        // The same bucket name on another server is another bucket.
        let mut other = Ledger::load(path.clone(), "http://127.0.0.1:2/a").unwrap();
        assert!(other.data.objects.is_empty());
        assert!(other.data.finished_sessions.is_empty());
        other.save();
        let back = Ledger::load(path.clone(), "http://127.0.0.1:1/a").unwrap();
        assert!(
            back.data.objects.is_empty(),
            "the new bucket's ledger replaced it"
        );
        // A version 2 ledger (no bucket) is taken as the current bucket's.
        std::fs::write(
            &path,
            r#"{"version":2,"objects":{"k":{"size":1,"mtime_ns":2,"hash":3}},"finished_sessions":[]}"#,
        )
        .unwrap();
        let old = Ledger::load(path.clone(), "http://127.0.0.1:1/a").unwrap();
        assert_eq!(old.data.objects.len(), 1);
        assert_eq!(old.data.bucket.as_deref(), Some("http://127.0.0.1:1/a"));
    }

    #[test]
    fn a_version_3_ledger_is_read_its_entries_without_a_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log-ledger.json");
        // As main's binary wrote it before the head's hash.
        std::fs::write(
            &path,
            r#"{"version":3,"bucket":"b","objects":{"k":{"size":10,"mtime_ns":2,"hash":3,"ino":4,"uploaded_at":5,"e_tag":"x"}},"finished_sessions":["s"],"session_nodes":{"s":"n"}}"#,
        )
        .unwrap();
        let mut l = Ledger::load(path.clone(), "b").unwrap();
        assert_eq!(l.data.objects["k"].head, None);
        assert_eq!(l.data.objects["k"].e_tag.as_deref(), Some("x"));
        l.data.objects.get_mut("k").unwrap().head = Some(9);
        l.dirty = true;
        l.save();
        let back = Ledger::load(path, "b").unwrap();
        assert_eq!(back.data.objects["k"].head, Some(9));
        assert_eq!(back.data.session_nodes["s"], "n");
    }
}
