//! A segment's growth files under `<spool>/growth/`: where its shadow and record are, how a
//! state is loaded from them, how they are counted in the spool's budget (claimed before
//! they are made, given back as they go, so what is claimed is what is given back), and how
//! the record is written: replaced whole through a temporary (none left behind on failure),
//! fsync'd with its directory when it names a key before its first write.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::events::spool::{growth_names, FileKind, SealedFile, FILE_BUDGET_BYTES, GROWTH_DIR};

use super::{PublishError, Publisher, Record, State};

impl Publisher {
    pub(super) fn growth_paths(
        &self,
        kind: FileKind,
        segment: &Path,
    ) -> Option<(PathBuf, PathBuf)> {
        let name = segment.file_name()?.to_str()?;
        let (shadow, record) = growth_names(kind, name);
        let dir = self.spool_dir.join(GROWTH_DIR);
        Some((dir.join(shadow), dir.join(record)))
    }

    pub(super) fn load(&self, st: &mut State, kind: FileKind, segment: &Path) {
        if st.loaded {
            return;
        }
        st.loaded = true;
        let Some((shadow, record)) = self.growth_paths(kind, segment) else {
            return;
        };
        st.record = fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
        // Counted as long as it is: by the spool's recovery when it found it, and by every
        // publication since, which leaves the count at the shadow's length on disk
        // ([`CopyAccount`]), whether it succeeded or not.
        st.counted = fs::metadata(&shadow).map(|m| m.len()).unwrap_or(0);
        // Counted when they were made (by this run or the spool's recovery).
        st.files = u64::from(shadow.exists()) + u64::from(record.exists());
    }

    /// Counts, before they are created, the growth files of `segment` that a publication
    /// makes (its shadow with compression, its record), when the budget has room for them:
    /// else [`PublishError::NoRoom`].
    pub(super) fn claim_growth_files(
        &self,
        st: &mut State,
        kind: FileKind,
        segment: &Path,
        shadow: bool,
    ) -> Result<(), PublishError> {
        let Some((s, r)) = self.growth_paths(kind, segment) else {
            return Ok(());
        };
        let wanted = u64::from(shadow) + 1;
        if st.files >= wanted {
            return Ok(());
        }
        let have = u64::from(shadow && s.exists()) + u64::from(r.exists());
        let new = wanted.saturating_sub(have.max(st.files));
        if new > 0 && !self.stats.budget().claim_files(new) {
            return Err(PublishError::NoRoom {
                path: segment.to_path_buf(),
                needed: new * FILE_BUDGET_BYTES,
            });
        }
        st.files += new;
        Ok(())
    }

    /// After a publication, whatever came of it: the growth files counted are those that
    /// exist (one claimed and never made, or a record removed after a failed write, is
    /// given back).
    pub(super) fn settle_growth_files(&self, st: &mut State, kind: FileKind, segment: &Path) {
        let Some((s, r)) = self.growth_paths(kind, segment) else {
            return;
        };
        let have = u64::from(s.exists()) + u64::from(r.exists());
        if have < st.files {
            self.stats.budget().files_gone(st.files - have);
            st.files = have;
        }
    }

    /// Writes `r` as the record of `segment` and makes it durable (the file and the
    /// directory fsync'd) before anything is written under a key it names for the first
    /// time: a write-ahead entry, once per segment (and per key switch).
    ///
    /// `sync: false` (a seal of a segment never published: the shutdown's path, 5,000
    /// partitions at once) writes it like every other record, which a kill -9 keeps (the
    /// page cache) but a power loss may not: see the module doc.
    pub(super) async fn write_intent(
        &self,
        kind: FileKind,
        segment: &Path,
        r: &Record,
        sync: bool,
    ) -> Result<(), PublishError> {
        let Some((_, path)) = self.growth_paths(kind, segment) else {
            return Ok(());
        };
        let written = if sync {
            // Off the runtime's threads: an fsync of the file and of the directory.
            let (p, r) = (path.clone(), r.clone());
            tokio::task::spawn_blocking(move || write_record_synced(&p, &r))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
        } else {
            write_record(&path, r)
        };
        written.map_err(|e| PublishError::Copy {
            path: path.clone(),
            why: format!("recording the key before writing it: {e}"),
        })
    }

    /// Deletes the shadow of `f`; its state is done. The record stays on disk until the
    /// segment is gone ([`Publisher::uploaded`]): a kill before that, then a restart with
    /// another `--compression`, must still know the key its object is under; it stays
    /// counted in the budget's files until then, so every growth file is counted from just
    /// before it is made until it is removed, and what is claimed is what is given back.
    pub(super) fn forget(&self, st: &mut State, f: &SealedFile) {
        let mut kept = 0;
        if let Some((shadow, record)) = self.growth_paths(f.kind, &f.path) {
            let _ = fs::remove_file(&shadow);
            kept = u64::from(record.exists()).min(st.files);
        }
        self.stats.budget().sub_stored(st.counted);
        self.stats.budget().files_gone(st.files - kept);
        st.counted = 0;
        st.files = kept;
        st.record = None;
        st.done = true;
    }
}

/// Replaces the record (not fsync'd: see the module doc).
pub(super) fn write_record(path: &Path, r: &Record) -> io::Result<()> {
    write_record_with(path, r, false)
}

/// Replaces the record durably: the file fsync'd before the rename, the directory after.
fn write_record_synced(path: &Path, r: &Record) -> io::Result<()> {
    write_record_with(path, r, true)
}

fn write_record_with(path: &Path, r: &Record, sync: bool) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(r).map_err(io::Error::other)?;
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(&bytes)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        // No temporary left behind (a full disk: the record stays as it was).
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if sync {
        if let Some(dir) = path.parent() {
            crate::util::fs::fsync_dir(dir)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record whose write fails leaves no temporary behind (review r35i, D2).
    #[test]
    fn a_failed_record_write_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: the target is a non-empty directory.
        let path = dir.path().join("e.x.rec");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), b"x").unwrap();
        let r = Record {
            key: "k".into(),
            raw: 0,
            object_len: 0,
            e_tag: None,
            version: None,
            stale: Vec::new(),
        };
        assert!(write_record(&path, &r).is_err());
        assert!(!path.with_extension("tmp").exists(), "the temporary stayed");
    }
}
