//! Finding and reading Ray's export files: which files a session holds (runs first, then each
//! live file's backups before it), which are still present, a file's id across renames, and
//! the next whole lines of one file read into a batch (bounded by `MAX_READ` and the room
//! left in the spool; a line longer than the limit is cut and quarantined, never read twice).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::contract::is_safe_segment;
use crate::events::quarantine::{raw_record, QuarantineReason};
use crate::events::spool::{LineSource, QuarantinedEvent};
use crate::node::session::list_sessions;

use super::batch::Batch;
use super::identity::{self, FirstLine, Identity, Verdict};
use super::{line_limit, ExportTailer, FileRef};

/// What reading a file into a batch did.
pub(super) enum Piece {
    /// Lines were added; more may follow.
    Read,
    /// Nothing new (or only an incomplete last line).
    Done,
    /// The batch has no room for the file's next line.
    NoRoom,
    /// The batch holds lines of another file that had this inode (Ray's rotation deleted a
    /// backup read into it and the new live file took its inode): the batch is stored first,
    /// with that file's offset, and this file is then read from its start (review r41n D1).
    StoreFirst,
}

impl ExportTailer {
    /// Adds the next whole lines of one file to `batch`, as many as its room takes. In a
    /// `finished` file (a backup Ray no longer writes) a last line without its newline is
    /// read as a line too. A line with no newline within [`line_limit`] bytes is cut there
    /// and its first part quarantined.
    pub(super) async fn read_piece(
        &mut self,
        file: &FileRef<'_>,
        batch: &mut Batch,
    ) -> io::Result<Piece> {
        let meta = std::fs::symlink_metadata(file.path)?;
        if !meta.file_type().is_file() {
            return Ok(Piece::Done);
        }
        let key = format!("{}/{}", file.session, meta.ino());
        let known = batch
            .offsets
            .get(&key)
            .or_else(|| self.state.files.get(&key))
            .copied();
        let room = batch.room.saturating_sub(batch.cost);
        let base = batch.body.len();
        let body = &mut batch.body;
        // Up to 8 MiB of reading: off the async workers, which serve Ray's requests.
        /// What the blocking part found: where reading starts, the file's identity when it is
        /// the file `known` was read from, why not when another file took its inode, and the
        /// piece read (its length, and the file's first bytes) when there was anything new.
        struct Found {
            start: u64,
            id: Option<Identity>,
            other: Option<&'static str>,
            read: Option<(u64, Vec<u8>)>,
        }
        let found = off_async_thread(|| -> io::Result<Found> {
            // From the session directory's descriptor, never through a symlink (a `logs`
            // directory swapped for one included): see `util::fs::Beneath`.
            let mut f = crate::util::fs::Beneath {
                root: file.dir.to_path_buf(),
                rel: Path::new("logs").join("export_events").join(file.name),
                dev: meta.dev(),
                ino: meta.ino(),
            }
            .open()?;
            let (start, id, other) = match known.filter(|o| o.inode == meta.ino()) {
                Some(o) => match identity::judge(&f, &meta, &o.known())? {
                    Verdict::Same(id) if o.offset > 0 => (o.offset, Some(id), None),
                    Verdict::Same(_) => (0, None, None),
                    Verdict::Other(why) => (0, None, Some(why)),
                },
                None => (0, None, None),
            };
            if start >= meta.len() {
                return Ok(Found {
                    start,
                    id,
                    other,
                    read: None,
                });
            }
            let want = (meta.len() - start).min(room);
            body.resize(base + want as usize, 0);
            f.seek(SeekFrom::Start(start))?;
            f.read_exact(&mut body[base..])?;
            let mut head = vec![0u8; meta.len().min(identity::LEGACY_FINGERPRINT_BYTES) as usize];
            f.seek(SeekFrom::Start(0))?;
            f.read_exact(&mut head)?;
            Ok(Found {
                start,
                id,
                other,
                read: Some((want, head)),
            })
        });
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                batch.body.truncate(base);
                return Err(e);
            }
        };
        if found.other.is_some() && batch.offsets.contains_key(&key) {
            // The batch holds lines of the file this entry was read from (gone now): they
            // are stored first, with its offset; this file is read once that is done.
            batch.body.truncate(base);
            return Ok(Piece::StoreFirst);
        }
        if let Some(why) = found.other {
            // The entry was another file's, now gone: forgotten, so this is said once.
            tracing::info!(
                file = %file.path.display(),
                inode = meta.ino(),
                reason = why,
                "export file at the inode of a file read before: read from its start"
            );
            self.state.files.remove(&key);
            batch.offsets.remove(&key);
            self.dirty = true;
        } else if let (Some(id), Some(entry)) = (found.id, self.state.files.get_mut(&key)) {
            // An older collector's entry, recognised: it keeps the file's identity from now.
            if entry.first_line.is_none() {
                entry.first_line = Some(id.first_line);
                entry.born_ns = id.born_ns;
                entry.saved_before_ns = None;
                self.dirty = true;
            }
        }
        let (start, id) = (found.start, found.id);
        let Some((want, head)) = found.read else {
            batch.body.truncate(base);
            return Ok(Piece::Done);
        };
        // A file read from its start is known from now on by what this read holds.
        let born = identity::born_ns(&meta);
        let identify = |body: &[u8], consumed: u64| {
            id.unwrap_or_else(|| Identity {
                first_line: FirstLine::of(body, consumed as usize),
                born_ns: born,
            })
        };
        if want == 0 {
            return Ok(Piece::NoRoom);
        }
        // Its quarantined lines are remembered by the identity its offsets keep (the same
        // bytes make it), so a new file (rewritten in place, or on a reused inode) never
        // matches an old file's record.
        let file_id = |body: &[u8], consumed: u64| {
            file_id(file.session, meta.ino(), &identify(body, consumed))
        };
        let at_eof = start + want == meta.len();
        let piece = &batch.body[base..];
        let complete = piece.iter().rposition(|&c| c == b'\n').map(|i| i + 1);
        // A finished file's torn last line will never be completed: read it now.
        let torn = file.finished && at_eof && piece.last() != Some(&b'\n');
        let limit = line_limit(self.cfg.max_spool_bytes);
        // A line of `limit` bytes or more is cut there whatever the room of the read (and a
        // shorter one never is), so a file's pieces, their records and the file's identity
        // are the same in every run that reads it (review r41q D4: a long first line read
        // whole by a roomy read and cut by a tighter one after a kill -9 gave the file
        // another identity, and each of its bad lines a second record).
        let overlong = want >= limit && !batch.body[base..base + limit as usize].contains(&b'\n');
        let end = if overlong {
            // One line longer than the longest kept whole: keep its first part aside
            // instead of stalling.
            let cut = base + limit as usize;
            let cost = raw_record(
                QuarantineReason::ExportBadEvent,
                file.name,
                start,
                &batch.body[base..cut],
                Some(0),
            )
            .len() as u64;
            if !batch.takes(cost) {
                batch.body.truncate(base);
                return Ok(Piece::NoRoom);
            }
            tracing::warn!(file = %file.path.display(), offset = start, limit, "export event line longer than the longest kept whole; its first part is quarantined");
            batch.body.truncate(cut);
            let file_id = file_id(&batch.body[base..], limit);
            batch.cost += cost;
            batch.quarantined.push(QuarantinedEvent {
                reason: QuarantineReason::ExportBadEvent,
                start: base,
                end: cut,
                source: Some(LineSource {
                    file: file.name.to_string(),
                    file_id,
                    offset: start,
                }),
            });
            let id = identify(&batch.body[base..], limit);
            batch.record(key, meta.ino(), start, start + limit, &head, id, base..cut);
            return Ok(Piece::Read);
        } else if torn {
            batch.body.push(b'\n');
            want as usize + 1
        } else if let Some(end) = complete {
            end
        } else {
            batch.body.truncate(base);
            // An incomplete last line waits for its newline; a longer read may hold it.
            return Ok(if at_eof { Piece::Done } else { Piece::NoRoom });
        };
        // The bytes the batch's offsets identify the file by when any line is taken (a torn
        // last line's added newline is not the file's).
        let file_id = file_id(&batch.body[base..], (end as u64).min(want));
        let taken = self.route_into(batch, base, end, file, file_id, start, limit);
        // Stopped before a line of `limit` bytes or more: it is cut by the next read.
        let at_overlong = taken < end && {
            let next = &batch.body[base + taken..base + end];
            next.len() as u64 >= limit && !next[..limit as usize].contains(&b'\n')
        };
        batch.body.truncate(base + taken);
        if taken == 0 {
            return Ok(Piece::NoRoom);
        }
        let consumed = (taken as u64).min(want);
        if torn && taken == end {
            let at = start + complete.unwrap_or(0) as u64;
            tracing::warn!(
                file = %file.path.display(),
                offset = at,
                bytes = start + want - at,
                "a rotated export event file ends in a line without its newline; read as its last line"
            );
        }
        let id = identify(&batch.body[base..], consumed);
        batch.record(
            key,
            meta.ino(),
            start,
            start + consumed,
            &head,
            id,
            base..base + taken,
        );
        Ok(if taken < end && !at_overlong {
            Piece::NoRoom
        } else {
            Piece::Read
        })
    }
}

/// Runs blocking file work without stalling the other tasks of an async worker thread
/// (they move to another worker meanwhile); runs it inline outside a multi-thread runtime.
fn off_async_thread<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// `event_EXPORT_TASK.log.3` (Python, Ray's patched spdlog) and `event_EXPORT_TASK.3.log`
/// (stock spdlog) → (`event_EXPORT_TASK.log`, 3); the live file → (its name, 0).
pub(super) fn split_backup(name: &str) -> (Cow<'_, str>, u32) {
    if let Some((base, n)) = name.rsplit_once('.') {
        if let Ok(i) = n.parse::<u32>() {
            return (Cow::Borrowed(base), i);
        }
    }
    if let Some(stem) = name.strip_suffix(".log") {
        if let Some((base, n)) = stem.rsplit_once('.') {
            if let Ok(i) = n.parse::<u32>() {
                return (Cow::Owned(format!("{base}.log")), i);
            }
        }
    }
    (Cow::Borrowed(name), 0)
}

/// The order files are read in: files that can hold Train runs first (so every attempt's run
/// is known when the attempt is routed), then the rest; within each, the oldest backup first
/// and the live file last, then by name.
pub(super) fn read_order(name: &str) -> (u8, std::cmp::Reverse<u32>, String) {
    let (base, index) = split_backup(name);
    let runs_first = base.starts_with("event_EXPORT_TRAIN_STATE")
        || (base.starts_with("event_EXPORT_TRAIN_RUN") && !base.contains("ATTEMPT"));
    (
        u8::from(!runs_first),
        std::cmp::Reverse(index),
        base.into_owned(),
    )
}

/// The identity of an export file, by which its quarantined lines are remembered
/// ([`LineSource`]): its session and inode, and the identity its offsets keep ([`identity`]:
/// its first line and birth time), all of which Ray's rotation (a rename) keeps, so a file
/// rewritten in place or a new file on a reused inode never has an older file's identity
/// (review r41n D3).
pub(super) fn file_id(session: &str, ino: u64, id: &Identity) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(session.as_bytes());
    h.update(&[0]);
    h.update(&ino.to_le_bytes());
    h.update(&[u8::from(id.born_ns.is_some())]);
    h.update(&id.born_ns.unwrap_or(0).to_le_bytes());
    h.update(&id.first_line.len.to_le_bytes());
    h.update(&id.first_line.hash.to_le_bytes());
    h.digest()
}

/// The export files of one session's `export_events` directory: name, path and inode.
pub(super) fn list_export_files(dir: &Path) -> io::Result<Vec<(String, PathBuf, u64)>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let ino = e.metadata().ok()?.ino();
            (name.starts_with("event_EXPORT_") && is_safe_segment(&name))
                .then(|| (name, e.path(), ino))
        })
        .collect())
}

/// Inodes of the export files there now, by session whose directory could be listed.
pub(super) fn present_files(ray_tmp: &Path) -> BTreeMap<String, HashSet<u64>> {
    list_sessions(ray_tmp)
        .into_iter()
        .filter_map(|s| {
            let files = list_export_files(&s.dir.join("logs").join("export_events")).ok()?;
            Some((s.name, files.into_iter().map(|(_, _, ino)| ino).collect()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_first_then_backups_before_their_live_file() {
        let mut names = vec![
            "event_EXPORT_TASK.log",
            "event_EXPORT_TRAIN_RUN_ATTEMPT.log.1",
            "event_EXPORT_TASK.log.2",
            "event_EXPORT_TRAIN_RUN.log",
            "event_EXPORT_TASK.1.log",
            "event_EXPORT_TRAIN_STATE.log",
            "event_EXPORT_TRAIN_RUN.log.1",
        ];
        names.sort_by_key(|n| read_order(n));
        assert_eq!(
            names,
            [
                "event_EXPORT_TRAIN_RUN.log.1",
                "event_EXPORT_TRAIN_RUN.log",
                "event_EXPORT_TRAIN_STATE.log",
                "event_EXPORT_TASK.log.2",
                "event_EXPORT_TASK.1.log",
                "event_EXPORT_TRAIN_RUN_ATTEMPT.log.1",
                "event_EXPORT_TASK.log",
            ]
        );
    }

    #[test]
    fn backup_names_of_both_writers() {
        assert_eq!(
            split_backup("event_EXPORT_TASK.log"),
            ("event_EXPORT_TASK.log".into(), 0)
        );
        assert_eq!(
            split_backup("event_EXPORT_TASK.log.3"),
            ("event_EXPORT_TASK.log".into(), 3)
        );
        assert_eq!(
            split_backup("event_EXPORT_TASK.12.log"),
            ("event_EXPORT_TASK.log".into(), 12)
        );
        assert_eq!(
            split_backup("event_EXPORT_X.log.log"),
            ("event_EXPORT_X.log.log".into(), 0)
        );
    }
}
