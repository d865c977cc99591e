//! How the tailer tells an export file it has read from another file that later got the same
//! inode, so an offset is only ever applied to the file it was read from.
//!
//! Ray rotates an export file by renaming it (`name` → `name.1`), which keeps its inode, and
//! once the backup count is reached it deletes the oldest backup first. On ext4 (and most
//! filesystems) the new live file created right after that delete gets the freed inode. An
//! offset kept for the deleted backup must then not be applied to the new file: its first
//! bytes would be skipped as already read. Bytes every file shares cannot tell them apart
//! (Ray's export lines of one type begin with the same 64 bytes: `{"event_data":{...`), so a
//! file is recognised by three signals, any one of which says "another file":
//!
//! - its **birth time** (`statx`'s `btime`, where the filesystem records it: ext4, xfs, btrfs
//!   and tmpfs do): a new file has a new one;
//! - its **first line**, hashed whole (its first and last [`SAMPLE_BYTES`] when it is longer):
//!   every export line carries its own `event_id` (at the end of the line, Ray sorts its keys),
//!   so two files never share it; a first line the tailer cuts (of `line_limit` bytes or more)
//!   is its first `line_limit` bytes, the part read, which every read of the file cuts alike
//!   whatever its room (review r41q D4; `--max-spool-bytes`, which sets the limit, changed
//!   between a kill -9 and the restart still changes it);
//! - its **size gone backwards**: Ray only appends, so a file shorter than the offset already
//!   read from it is another file.
//!
//! Entries written by an older collector (offsets file of version 0) hold only a hash of the
//! first 64 bytes. They are still honoured, so an upgrade neither reads a file again nor
//! skips one: such an entry applies only if the file was born before the entry was saved (the
//! offsets file's modification time, recorded on load: a file born later cannot be the one
//! the entry was read from; one born in the same clock tick is taken as another file) and its
//! first bytes still match; the entry then gains the new identity, saved with the pass. On a
//! filesystem without birth times (ext4 with 128-byte inodes, NFS, overlay on some kernels)
//! the file's **ctime** stands in: a file whose inode has not changed since the entry was
//! saved (ctime strictly before the offsets file's modification time; a create, write,
//! rename, truncate or chmod all set it) is the file that was there at the save, so the offset
//! applies (the common upgrade: nothing is read twice). A file changed after the save
//! (appended to, rotated, or a new file on a reused inode) is not proved: it is read again
//! from its start, and the lines already stored are dropped as repeats by the deduplication
//! window (kept across the restart by the spool's ids journal) — a repeat is dropped, a
//! skipped line would be lost. What can then be stored twice: every line of such files
//! before the saved offset that is not in the window, which is all of them when the files
//! re-read hold more lines than `--dedup-window` (262,144 ids by default; each line accepted
//! again takes a place in the window); an offsets file of version 0 is only met once, at the
//! upgrade.
//!
//! A clock stepped back between the save and the upgrade (the save time then lies in the
//! future of the files' times) makes a file changed after the save look unchanged (or, with
//! birth times, born before): its offset is applied, which is right for a file only appended
//! to and loses the first lines of a new file on that inode up to the offset (as every
//! collector before this one did).

use std::fs::{File, Metadata};
use std::os::unix::fs::FileExt;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

/// Bytes hashed at each end of a long first line: enough for the `event_id`, `source_type`
/// and `timestamp` that end every Ray export line, while a check reads at most twice this per
/// file and pass whatever the line's length.
pub(super) const SAMPLE_BYTES: u64 = 4096;

/// Bytes hashed by entries of an older collector (version 0 of the offsets file): too few to
/// tell two of Ray's export files apart, kept to read those entries and so that an older
/// collector can still read this file.
pub(super) const LEGACY_FINGERPRINT_BYTES: u64 = 64;

/// When the inode `meta` describes last changed (its ctime), in nanoseconds since the epoch.
fn changed_ns(meta: &Metadata) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let secs = u64::try_from(meta.ctime()).ok()?;
    let nanos = u64::try_from(meta.ctime_nsec()).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Bytes read at a time while looking for the end of the first line of an older entry's
/// file (once per file, at the upgrade).
const SCAN_CHUNK: usize = 64 << 10;

/// The first line of a file: its length with the newline (or the bytes of it that were read,
/// when it was cut or is a backup's torn last line) and a hash of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FirstLine {
    pub(super) len: u64,
    pub(super) hash: u64,
}

/// What makes a file the one an offset was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) first_line: FirstLine,
    /// Nanoseconds since the epoch, where the filesystem records a birth time.
    pub(super) born_ns: Option<u64>,
}

/// What is known of a file from the offsets file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Known {
    pub(super) offset: u64,
    pub(super) legacy_fingerprint: u64,
    pub(super) identity: Option<Identity>,
    /// For an entry without an identity (an older collector's): when it was saved at the
    /// latest.
    pub(super) saved_before_ns: Option<u64>,
}

/// Why an older collector's entry is not applied on a filesystem without birth times.
pub(super) const NO_BIRTH_TIME: &str =
    "no birth time to tell it from another file on the same inode (an older collector's entry)";

/// Whether the file is the one `known` was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The same file: reading resumes at the offset; its identity (computed now for an older
    /// entry) is kept.
    Same(Identity),
    /// Another file at the same inode: read from its start. The reason is logged.
    Other(&'static str),
}

/// The birth time of the file `meta` describes, where the filesystem records one.
pub(super) fn born_ns(meta: &Metadata) -> Option<u64> {
    let d = meta.created().ok()?.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(d.as_nanos()).ok()
}

/// The byte ranges of a first line of `len` bytes that are hashed: all of it, or its first
/// and last [`SAMPLE_BYTES`].
fn sampled(len: u64) -> [(u64, u64); 2] {
    if len <= 2 * SAMPLE_BYTES {
        [(0, len), (len, len)]
    } else {
        [(0, SAMPLE_BYTES), (len - SAMPLE_BYTES, len)]
    }
}

/// The hash of a first line of `len` bytes, given the bytes of `ranges` (see [`sampled`]).
fn hash_parts(len: u64, parts: [&[u8]; 2]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&len.to_le_bytes());
    h.update(parts[0]);
    h.update(parts[1]);
    h.digest()
}

impl FirstLine {
    /// The first line of a file whose first `consumed` bytes are `bytes[..consumed]`: up to
    /// and with its first newline, or all of them.
    pub(super) fn of(bytes: &[u8], consumed: usize) -> FirstLine {
        let read = &bytes[..consumed.min(bytes.len())];
        let len = read
            .iter()
            .position(|&c| c == b'\n')
            .map_or(read.len(), |i| i + 1) as u64;
        let [a, b] = sampled(len);
        let part = |(s, e): (u64, u64)| &read[s as usize..e as usize];
        FirstLine {
            len,
            hash: hash_parts(len, [part(a), part(b)]),
        }
    }

    /// Whether the file `f` begins with this first line (reads at most 2 × [`SAMPLE_BYTES`]).
    fn matches(&self, f: &File) -> std::io::Result<bool> {
        let [a, b] = sampled(self.len);
        let read = |(s, e): (u64, u64)| -> std::io::Result<Vec<u8>> {
            let mut buf = vec![0u8; (e - s) as usize];
            f.read_exact_at(&mut buf, s)?;
            Ok(buf)
        };
        let (a, b) = (read(a)?, read(b)?);
        Ok(hash_parts(self.len, [&a, &b]) == self.hash)
    }

    /// The first line of the file `f`, looked for within its first `upto` bytes (at line
    /// boundaries, where an older entry's offset is).
    fn read(f: &File, upto: u64) -> std::io::Result<FirstLine> {
        let mut at = 0u64;
        let mut len = upto;
        let mut buf = vec![0u8; SCAN_CHUNK];
        while at < upto {
            let n = (upto - at).min(SCAN_CHUNK as u64) as usize;
            f.read_exact_at(&mut buf[..n], at)?;
            if let Some(i) = buf[..n].iter().position(|&c| c == b'\n') {
                len = at + i as u64 + 1;
                break;
            }
            at += n as u64;
        }
        let [a, b] = sampled(len);
        let read = |(s, e): (u64, u64)| -> std::io::Result<Vec<u8>> {
            let mut buf = vec![0u8; (e - s) as usize];
            f.read_exact_at(&mut buf, s)?;
            Ok(buf)
        };
        let (pa, pb) = (read(a)?, read(b)?);
        Ok(FirstLine {
            len,
            hash: hash_parts(len, [&pa, &pb]),
        })
    }
}

/// The hash an older collector kept: of the file's first `min(upto, 64)` bytes.
pub(super) fn legacy_fingerprint(f: &File, upto: u64) -> std::io::Result<u64> {
    let mut buf = vec![0u8; upto.min(LEGACY_FINGERPRINT_BYTES) as usize];
    f.read_exact_at(&mut buf, 0)?;
    Ok(xxhash_rust::xxh3::xxh3_64(&buf))
}

/// Whether the open file `f` (of metadata `meta`, at the inode of `known`) is the file
/// `known` was read from; see the module doc for the signals.
pub(super) fn judge(f: &File, meta: &Metadata, known: &Known) -> std::io::Result<Verdict> {
    let len = meta.len();
    if known.offset > len {
        return Ok(Verdict::Other("the file is shorter than the offset read"));
    }
    let born = born_ns(meta);
    match known.identity {
        Some(id) => {
            if let (Some(then), Some(now)) = (id.born_ns, born) {
                if then != now {
                    return Ok(Verdict::Other("another birth time"));
                }
            }
            if id.first_line.len > len || !id.first_line.matches(f)? {
                return Ok(Verdict::Other("another first line"));
            }
            Ok(Verdict::Same(Identity {
                first_line: id.first_line,
                born_ns: id.born_ns.or(born),
            }))
        }
        None => {
            match (born, known.saved_before_ns) {
                // Without a birth time, a file whose inode has not changed at all since the
                // entry was saved (its ctime, which a create, a write, a rename and a
                // truncate all set, before the save) is the file that was at that inode
                // then: the entry's. Its offset applies, so an upgrade from an older
                // collector reads nothing twice when the files did not change.
                (None, Some(saved)) if changed_ns(meta).is_some_and(|c| c < saved) => {}
                // Changed since (or no save time): nothing proves it, the 64 bytes are the
                // same in every file of one type. Read again from the start: a repeat is
                // dropped by the deduplication window (the ids journal keeps it across the
                // restart), where an offset applied to another file loses its first lines.
                (None, _) => return Ok(Verdict::Other(NO_BIRTH_TIME)),
                // Equal too: timestamps are taken from a clock that ticks every few
                // milliseconds, and a file born in the tick of the save and read from its
                // start again costs a repeat (which the deduplication window drops while the
                // lines are in the spool), where one taken for the entry's file loses lines.
                (Some(now), Some(saved)) if now >= saved => {
                    return Ok(Verdict::Other(
                        "born after an older collector saved the offset",
                    ));
                }
                (Some(_), _) => {}
            }
            if legacy_fingerprint(f, known.offset)? != known.legacy_fingerprint {
                return Ok(Verdict::Other("other first bytes"));
            }
            Ok(Verdict::Same(Identity {
                first_line: FirstLine::read(f, known.offset)?,
                born_ns: born,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut t = tempfile::NamedTempFile::new().unwrap();
        t.write_all(bytes).unwrap();
        let f = File::open(t.path()).unwrap();
        (t, f)
    }

    #[test]
    fn a_first_line_is_recognised_from_the_file_and_from_the_read() {
        for line_len in [
            1usize,
            100,
            2 * SAMPLE_BYTES as usize,
            3 * SAMPLE_BYTES as usize,
        ] {
            let mut text = vec![b'a'; line_len - 1];
            text.push(b'\n');
            text.extend_from_slice(b"second line\n");
            let (_t, f) = file(&text);
            let from_read = FirstLine::of(&text, text.len());
            assert_eq!(from_read.len, line_len as u64);
            assert_eq!(FirstLine::read(&f, text.len() as u64).unwrap(), from_read);
            assert!(from_read.matches(&f).unwrap());
            // Same length, one byte different at the end (where Ray's event_id is).
            if line_len > 1 {
                let mut other = text.clone();
                other[line_len - 2] = b'b';
                let (_u, g) = file(&other);
                assert!(!from_read.matches(&g).unwrap(), "{line_len}");
            }
        }
    }

    #[test]
    fn a_cut_read_hashes_what_was_read() {
        let text = b"no newline here";
        let fl = FirstLine::of(text, 7);
        assert_eq!(fl.len, 7);
        let (_t, f) = file(text);
        assert!(fl.matches(&f).unwrap());
        assert_eq!(FirstLine::read(&f, 7).unwrap(), fl);
    }

    #[test]
    fn lines_sharing_their_first_bytes_are_told_apart() {
        let prefix = "{\"event_data\":{\"config\":{\"metadata\":{},\"runtime_env_info\":{\"runt";
        let a = format!("{prefix}\"}}}},\"event_id\":\"aa\"}}\n");
        let b = format!("{prefix}\"}}}},\"event_id\":\"bb\"}}\n");
        let (_t, f) = file(b.as_bytes());
        let meta = f.metadata().unwrap();
        let known = Known {
            offset: a.len() as u64,
            legacy_fingerprint: xxhash_rust::xxh3::xxh3_64(&a.as_bytes()[..64]),
            identity: Some(Identity {
                first_line: FirstLine::of(a.as_bytes(), a.len()),
                born_ns: None,
            }),
            saved_before_ns: None,
        };
        assert_eq!(
            judge(&f, &meta, &known).unwrap(),
            Verdict::Other("another first line")
        );
        // The older entry's 64 bytes cannot tell them apart (taken for the same file where a
        // birth time says nothing against it; never without birth times)...
        let legacy = Known {
            identity: None,
            ..known
        };
        match born_ns(&meta) {
            Some(_) => assert!(matches!(
                judge(&f, &meta, &legacy).unwrap(),
                Verdict::Same(_)
            )),
            None => assert_eq!(
                judge(&f, &meta, &legacy).unwrap(),
                Verdict::Other(NO_BIRTH_TIME)
            ),
        }
        // ...but a file born after (or in the clock tick of) the entry's save is another.
        let Some(born) = born_ns(&meta) else {
            return; // no birth times here: the first line is all there is
        };
        for (saved, other) in [(born - 1, true), (born, true), (born + 1, false)] {
            let dated = Known {
                saved_before_ns: Some(saved),
                ..legacy
            };
            assert_eq!(
                judge(&f, &meta, &dated).unwrap()
                    == Verdict::Other("born after an older collector saved the offset"),
                other,
                "{saved} vs born {born}"
            );
        }
        // A birth time that differs says "another file" whatever the first line.
        let reborn = Known {
            identity: Some(Identity {
                first_line: FirstLine::of(b.as_bytes(), b.len()),
                born_ns: Some(born + 1),
            }),
            ..known
        };
        assert_eq!(
            judge(&f, &meta, &reborn).unwrap(),
            Verdict::Other("another birth time")
        );
    }
}
