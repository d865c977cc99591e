//! The shadow: a segment's new bytes compressed as whole gzip members and appended to the
//! copy of its object's bytes (`<spool>/growth/<e|q>.<file>.gz`), member by member, each only
//! when the spool's budget has room for it.
//!
//! Guarantees, whatever fails (a full disk half way through a member, no room in the
//! budget, lines that are not whole): the shadow is cut back to what its record says, so it
//! never holds more than the object plus whole members of the round in progress; and the
//! spool's count of it ([`CopyAccount`]) ends at its length on disk, so `rhc_spool_bytes`
//! can neither drift above what the disk holds nor below zero (issue 35's review found a
//! failed write left 153,872 bytes uncounted, and the count wrapped below zero).
//!
//! A failure writing the shadow is [`PublishError::Copy`] (the segment goes up whole if it
//! lasts, see the variant), one reading the segment [`PublishError::Io`] (tried again).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Ahead, Compressor, PublishError};
use crate::events::spool::SpoolStats;
use crate::util::fs::open_scanned;

/// Why reading an open segment failed: [`PublishError::Local`] (the seal uploads it whole)
/// only when the file itself is not what it must be (a symlink or not a regular file now,
/// gone, shorter than its durable length); any other error (EIO, EMFILE, ENFILE, ENOMEM, a
/// signal) says nothing about the file, so it is [`PublishError::Io`] and the publication
/// is tried again half a window later (the review of issue 35 found one EMFILE stopping a
/// segment's publication until its seal).
pub(super) fn segment_read_error(segment: &Path, e: io::Error) -> PublishError {
    let path = segment.to_path_buf();
    let why = e.to_string();
    match e.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::NotFound | io::ErrorKind::UnexpectedEof => {
            PublishError::Local { path, why }
        }
        _ => PublishError::Io { path, why },
    }
}

/// The last byte before `durable` must end a line.
pub(super) fn check_line_end(segment: &Path, durable: u64) -> Result<(), PublishError> {
    let local = |why: String| PublishError::Local {
        path: segment.to_path_buf(),
        why,
    };
    if durable == 0 {
        return Ok(());
    }
    let read_failed = |e: io::Error| segment_read_error(segment, e);
    let mut f = open_scanned(segment, None).map_err(read_failed)?;
    f.seek(SeekFrom::Start(durable - 1)).map_err(read_failed)?;
    let mut b = [0u8; 1];
    f.read_exact(&mut b).map_err(read_failed)?;
    if b[0] != b'\n' {
        return Err(local(format!("byte {durable} does not end a line")));
    }
    Ok(())
}

/// One extension of a shadow: the segment's bytes `[from, to)` appended as gzip members to
/// the shadow's first `object_len` bytes (the object's).
pub(super) struct CopyJob {
    pub(super) segment: PathBuf,
    pub(super) shadow: PathBuf,
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) object_len: u64,
    /// The copy of an earlier round to continue ([`State::ahead`]), if the shadow still
    /// ends where it did.
    pub(super) resume: Option<Ahead>,
}

/// The spool's count of one shadow: every change of the shadow's length goes through it, so
/// `rhc_spool_bytes` holds what the shadow holds on disk, whatever fails.
pub(super) struct CopyAccount {
    pub(super) stats: Arc<SpoolStats>,
    /// Bytes of the shadow counted in the spool's stored bytes.
    pub(super) counted: u64,
}

impl CopyAccount {
    /// The shadow is `len` bytes long on disk now.
    pub(super) fn set_len(&mut self, len: u64) {
        if len > self.counted {
            self.stats.budget().add_stored(len - self.counted);
        } else {
            self.stats.budget().sub_stored(self.counted - len);
        }
        self.counted = len;
    }
}

/// Cuts the shadow back to `object_len` (what a failed round appended goes) and appends the
/// segment's bytes `[from, to)` as gzip members, each written only when the spool's budget
/// has room for it ([`crate::events::spool::Budget::claim_copy`]); the shadow's new
/// length. Whatever fails after the shadow is opened (a full disk half way through a
/// member, no room in the budget, lines not whole) cuts it back to `object_len` again, so
/// it never holds more than its record says plus whole members of this round, and `acct`
/// ends at the shadow's length on disk.
pub(super) fn extend_shadow(
    job: &CopyJob,
    compressor: &mut Compressor,
    acct: &mut CopyAccount,
) -> Result<u64, PublishError> {
    let local = |why: String| PublishError::Copy {
        path: job.shadow.to_path_buf(),
        why,
    };
    let mut out = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&job.shadow)
        .map_err(|e| local(format!("opening: {e}")))?;
    let have = out.metadata().map_err(|e| local(e.to_string()))?.len();
    // Counted as it is on disk (the same, unless something else changed the file).
    acct.set_len(have);
    if have < job.object_len {
        return Err(PublishError::Local {
            path: job.shadow.to_path_buf(),
            why: format!("the shadow has {have} bytes, the object {}", job.object_len),
        });
    }
    let written = append_members(job, &mut out, compressor, acct);
    if written.is_err() {
        // Back to the object's bytes; if even that fails, counted as it is.
        let _ = out.set_len(job.object_len);
        acct.stats.segment_copy_cut(&job.segment, job.from);
        match out.metadata() {
            Ok(m) => acct.set_len(m.len()),
            Err(e) => {
                tracing::warn!(path = %job.shadow.display(), error = %e, "could not read a shadow's length after a failed copy");
            }
        }
    }
    written
}

/// [`extend_shadow`] once the shadow is open: the cut, then the members.
fn append_members(
    job: &CopyJob,
    out: &mut File,
    (enc, member): &mut Compressor,
    acct: &mut CopyAccount,
) -> Result<u64, PublishError> {
    // Writing the shadow failed (a full or failing spool disk): [`PublishError::Copy`].
    let local = |why: String| PublishError::Copy {
        path: job.shadow.to_path_buf(),
        why,
    };
    // Reading the segment failed: [`PublishError::Io`] (tried again).
    let read_failed = |why: String| PublishError::Io {
        path: job.segment.to_path_buf(),
        why,
    };
    let (to, object_len) = (job.to, job.object_len);
    let (from, start) = match job.resume {
        Some(a) if a.shadow_len == acct.counted => (a.raw, a.shadow_len),
        _ => {
            out.set_len(object_len).map_err(|e| local(e.to_string()))?;
            acct.set_len(object_len);
            // The copy of the segment's bytes past `from` is gone with the cut.
            acct.stats.segment_copy_cut(&job.segment, job.from);
            (job.from, object_len)
        }
    };
    out.seek(SeekFrom::Start(start))
        .map_err(|e| local(e.to_string()))?;
    let mut src =
        open_scanned(&job.segment, None).map_err(|e| segment_read_error(&job.segment, e))?;
    src.seek(SeekFrom::Start(from))
        .map_err(|e| read_failed(e.to_string()))?;
    if from == to {
        // Nothing new (a whole upload of the object so far).
        return Ok(start);
    }
    // Never fed an empty input: a reused encoder then yields no member at all.
    let mut reader = src.take(to - from);
    let mut read = 0u64;
    let mut last = 0u8;
    loop {
        member.clear();
        let more = enc
            .next_member(&mut reader, member, |b| {
                read += b.len() as u64;
                if let Some(&l) = b.last() {
                    last = l;
                }
            })
            .map_err(|e| read_failed(format!("reading to compress: {e}")))?;
        let n = member.len() as u64;
        let budget = acct.stats.budget();
        if !budget.claim_copy(n) {
            // What this copy showed so far teaches the reserve: data that compresses worse
            // than what came before (the review of issue 35 found a reserve learned on
            // compressible lines, near nothing, admitting random ones whose copies never
            // fit) makes the writer leave room for its copies from now on.
            budget.note_copy(read, acct.counted.saturating_sub(start).saturating_add(n));
            return Err(PublishError::NoRoom {
                path: job.segment.to_path_buf(),
                needed: n,
            });
        }
        if let Err(e) = out.write_all(member) {
            budget.release(n);
            return Err(local(format!("writing: {e}")));
        }
        budget.claimed_stored(n);
        acct.counted += n;
        acct.stats.segment_copied(&job.segment, from + read);
        if !more {
            break;
        }
    }
    if read != to - from || last != b'\n' {
        return Err(PublishError::Local {
            path: job.segment.to_path_buf(),
            why: format!("bytes {from}..{to} are not whole lines ({read} read)"),
        });
    }
    let len = out.metadata().map_err(|e| local(e.to_string()))?.len();
    acct.set_len(len);
    acct.stats
        .budget()
        .note_copy(to - from, len.saturating_sub(start));
    Ok(len)
}
