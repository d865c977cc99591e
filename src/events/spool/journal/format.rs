//! The on-disk format of a generation of the ids journal ([`super::Journal`]), and its
//! bounded reading.
//!
//! Format of a generation: the magic `RHCIDS2\n`, then blocks `[check: u32 LE][kind and
//! count: u32 LE][count words: u64 LE]`, `check` the low 32 bits of the xxh3 of the count
//! word and the words, the kind in the count word's top four bits: ids (0), files (1: pairs
//! of creation number and length), state (2: one word, the newest creation number). A
//! generation starts with a state block and the files blocks of the open segments; then
//! each group's ids blocks and its files block. The generations of the binaries before
//! (magic `RHCIDS1\n`, ids blocks only) are read too: their ids come back, and no lengths
//! ([`Loaded::lengths`] is `None`), so that start places the spool's ids as those binaries
//! did. A start reads every generation oldest first. An incomplete block at the end of a
//! file (a write cut short by a crash, or a tail of zeros after a power loss) ends that file
//! quietly. A block that fails its check or its bound, or a file without a magic, is
//! damaged: the rest of that file is discarded with a WARN and counted
//! (`rhc_dedup_journal_failures_total{what="damaged"}`); a start is never refused for it.
//! Each start then writes the window it reloaded as new generations and removes the older
//! files, damaged ones included. A file `ids-<n>.tmp` is a generation a snapshot was
//! writing: never read, removed at start (the binaries before this one leave it alone, with
//! a WARN, and read the rest as before). Beside the generations, the hold file
//! ([`HoldFile`]) and, while a snapshot is under way, its rewrite mark ([`RewriteMark`]; the
//! binaries before this one leave it alone, with a WARN).
//!
//! What a start reads is bounded, so no file put in the folder delays /readyz: a file larger
//! than a generation ever is ([`MAX_GENERATION_BYTES`]) is damaged unread; a hole running to
//! a file's end (`SEEK_HOLE`/`SEEK_DATA`: zeros a crash left) is not read; and a start reads
//! at most [`MAX_BYTES_READ_AT_START`] bytes of generations in all, newest first, which
//! every journal a run writes fits in: a file past it is damaged unread, with a WARN saying
//! so (review r40d D2: eight sparse files of 511 MiB kept a start from /readyz for 82 s).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek};
use std::path::Path;

use crate::util::dedup::MAX_DEDUP_WINDOW;

use super::Head;

/// The first bytes of every generation this version writes (format 2: ids blocks, and the
/// files' lengths: a state block at its head, a files block after each group's ids).
pub(super) const MAGIC: &[u8; 8] = b"RHCIDS2\n";

/// The first bytes of a generation of format 1 (the binaries before: ids blocks only). Read
/// at start, never written.
pub(super) const MAGIC_V1: &[u8; 8] = b"RHCIDS1\n";

/// A block's count word holds its kind in its top bits, the number of words below them.
pub(super) const KIND_SHIFT: u32 = 28;
/// A block of event ids (the only kind format 1 has).
pub(super) const KIND_IDS: u32 = 0;
/// A block of pairs (file number, durable length): after a group's ids, the files it wrote
/// lines with ids into; in a head, every open segment.
pub(super) const KIND_FILES: u32 = 1;
/// A block of one word, at the head of a generation: the newest file number then (the
/// writer's last creation number).
pub(super) const KIND_STATE: u32 = 2;
/// A block of one word (0), the last of a generation once the next one is started: a
/// generation without it (not the newest) lost its end to a power loss, so the lengths the
/// newer ones give may cover lines whose ids it lost, and a start does not use them.
pub(super) const KIND_END: u32 = 3;

/// Most open segments a head lists (16 MiB of pairs): a spool holds fewer, each costing
/// [`super::FILE_BUDGET_BYTES`] of the disk budget; past it, the others are left out (a
/// group in flight at a crash in one of them is then not recognised when resent).
pub(super) const MAX_HEAD_FILES: usize = 1 << 20;

/// Most ids in one block (512 KiB): a group with more is written as several blocks. Also the
/// bound a block read back must respect, so a damaged count cannot make a start allocate
/// more.
pub(super) const MAX_BLOCK_IDS: usize = 1 << 16;

/// Bytes of a block's head: its check and its count.
pub(super) const BLOCK_HEAD: usize = 8;

/// One thing a generation says of the spool's files, in the order written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fact {
    /// A head: the writer's last creation number.
    Last(u64),
    /// A file's durable length.
    Len(u64, u64),
}

/// The name of the hold file beside the generations ([`Hold`]).
pub(super) const HOLD_FILE: &str = "hold";

/// The first bytes of the hold file.
const HOLD_MAGIC: &[u8; 8] = b"RHCHOLD1";

/// A start's hold on ids reloaded in no known order
/// ([`crate::util::dedup::DedupWindow::hold`]), as its snapshot wrote them: the last
/// `inserted` ids of the window were accepted after the `held` ones before them. Kept in a
/// file of its own (`<spool>/dedup/hold`), not in a generation, so the binaries before it
/// (which leave an unknown file alone) read every generation as before (review r40o D1: a
/// block of a new kind in the newest generation, where appends go on, cost the binaries
/// before it every group appended after it). `generation` is the newest generation of that
/// snapshot and `snapshot_ids` its ids: a start that finds it reads the ids appended to it
/// after those, and every id of newer generations, as inserted too. `held` 0: no hold.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hold {
    pub(super) generation: u64,
    pub(super) snapshot_ids: u64,
    pub(super) held: u64,
    pub(super) inserted: u64,
}

/// The hold file: the hold of the snapshot that wrote it ([`HoldFile::now`]), and the one it
/// replaced ([`HoldFile::before`]). A snapshot writes it, durably, before it renames its first
/// generation into place (review r40p D1: written after the old generations were removed, a
/// kill -9 in between lost the hold). Its newest generation is renamed first, so a start that
/// does not find `now.generation` finds the journal as it was before that snapshot, which
/// `before` describes (review r40p D2: a rewrite cut short after its newest generations were
/// renamed made them count as ids accepted after the old hold's, which ended it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct HoldFile {
    pub(super) now: Hold,
    pub(super) before: Option<Hold>,
}

impl HoldFile {
    /// The file's bytes: the magic, four words per hold, and the check of the words.
    pub(super) fn encode(&self) -> Vec<u8> {
        let words: Vec<u64> = std::iter::once(&self.now)
            .chain(self.before.as_ref())
            .flat_map(|h| [h.generation, h.snapshot_ids, h.held, h.inserted])
            .collect();
        checked_words(HOLD_MAGIC, &words)
    }

    /// The holds of a file's bytes; `None` when they are not one whole (a crash cut the
    /// file, or it is not ours). A file of the binaries before holds `now` alone.
    pub(super) fn decode(bytes: &[u8]) -> Option<HoldFile> {
        let w = read_checked_words(bytes, HOLD_MAGIC)?;
        let holds = match w.len() {
            4 => 1,
            8 => 2,
            _ => return None,
        };
        let hold = |k: usize| Hold {
            generation: w[4 * k],
            snapshot_ids: w[4 * k + 1],
            held: w[4 * k + 2],
            inserted: w[4 * k + 3],
        };
        Some(HoldFile {
            now: hold(0),
            before: (holds == 2).then(|| hold(1)),
        })
    }
}

/// A small file of ours written whole (the hold file, the rewrite mark): `magic`, `words`
/// little-endian, and the check of the words.
fn checked_words(magic: &[u8; 8], words: &[u64]) -> Vec<u8> {
    let mut out = magic.to_vec();
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let check = block_check(&out[magic.len()..]);
    out.extend_from_slice(&check.to_le_bytes());
    out
}

/// The words of a file [`checked_words`] wrote with `magic`; `None` when the bytes are not
/// whole words and their check (a crash cut the file, or it is not ours).
fn read_checked_words(bytes: &[u8], magic: &[u8; 8]) -> Option<Vec<u64>> {
    let body = bytes.strip_prefix(magic.as_slice())?;
    let len = body.len().checked_sub(4)?;
    if !len.is_multiple_of(8) {
        return None;
    }
    let (words, check) = body.split_at(len);
    if block_check(words).to_le_bytes() != check {
        return None;
    }
    Some(
        words
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect(),
    )
}

/// Most bytes a hold file takes ([`HoldFile::encode`]).
pub(super) const MAX_HOLD_FILE_BYTES: u64 = 8 + 64 + 4;

/// The name of the rewrite mark beside the generations ([`RewriteMark`]).
pub(super) const REWRITE_FILE: &str = "rewrite";

/// The first bytes of the rewrite mark.
const REWRITE_MAGIC: &[u8; 8] = b"RHCREWR1";

/// Most bytes a rewrite mark takes ([`RewriteMark::encode`]).
pub(super) const MAX_REWRITE_FILE_BYTES: u64 = 8 + 24 + 4;

/// A snapshot under way (`<spool>/dedup/rewrite`, review r40t D1): its generations are
/// numbered `first..=top`, and the generations numbered `from..first` are those of earlier
/// snapshots that were cut short (a crash loop). Written durably before the snapshot renames
/// its first generation into place, removed (and the folder synced) once all of them are in
/// place and the old generations are removed. What a cut snapshot's generation says of the
/// spool's files (its head: the state of the spool when the rewrite started) covers lines
/// whose ids are in its generations not yet written, so a start uses no head numbered from
/// `from` on while any of `first..=top` is missing; a start that finds all of them finishes
/// that snapshot (removes every generation numbered below `first`). A mark is of no use once
/// a generation numbered above `top` exists: the journal went on after that snapshot
/// completed (only a complete snapshot is appended to), and the mark's removal was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RewriteMark {
    pub(super) from: u64,
    pub(super) first: u64,
    pub(super) top: u64,
}

impl RewriteMark {
    /// The file's bytes: the magic, the three numbers, and the check of the words.
    pub(super) fn encode(&self) -> Vec<u8> {
        checked_words(REWRITE_MAGIC, &[self.from, self.first, self.top])
    }

    /// The mark of a file's bytes; `None` when they are not one whole mark (not ours, or
    /// damaged: it is renamed into place whole, so no crash cuts it).
    pub(super) fn decode(bytes: &[u8]) -> Option<RewriteMark> {
        let [from, first, top] = read_checked_words(bytes, REWRITE_MAGIC)?[..] else {
            return None;
        };
        let mark = RewriteMark { from, first, top };
        (mark.from <= mark.first && mark.first <= mark.top).then_some(mark)
    }
}

/// What one generation holds.
#[derive(Debug, Default)]
pub(super) struct Generation {
    /// How many ids it holds in all (its last `keep` are in [`Generation::ids`]).
    pub(super) total_ids: u64,
    /// Its last `keep` ids, in order.
    pub(super) ids: Vec<u64>,
    /// What it says of the files, in order.
    pub(super) facts: Vec<Fact>,
    /// It has a head (format 2).
    pub(super) headed: bool,
    /// It ends with an end block: the next generation was started after all of it.
    pub(super) ended: bool,
    /// It starts with the magic of format 1 (the binaries before: never a head).
    pub(super) v1: bool,
    /// A block failed its check or bound (a damage no crash or power loss makes: those cut
    /// a generation, or leave zeros at its end), and the rest of it was discarded.
    pub(super) damaged: bool,
}

/// The check of a block: the low 32 bits of the xxh3 of its count and ids.
pub(super) fn block_check(count_and_ids: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(count_and_ids) as u32
}

/// Appends `words` to `out` as blocks of `kind` of at most [`MAX_BLOCK_IDS`] words.
pub(super) fn encode_blocks(out: &mut Vec<u8>, kind: u32, words: &[u64]) {
    out.reserve(words.len() * 8 + words.len().div_ceil(MAX_BLOCK_IDS) * BLOCK_HEAD);
    for chunk in words.chunks(MAX_BLOCK_IDS) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&((kind << KIND_SHIFT) | chunk.len() as u32).to_le_bytes());
        for w in chunk {
            out.extend_from_slice(&w.to_le_bytes());
        }
        let check = block_check(&out[start + 4..]).to_le_bytes();
        out[start..start + 4].copy_from_slice(&check);
    }
}

/// Appends `files` (file number, durable length) as files blocks (none when it is empty).
pub(super) fn encode_pairs(out: &mut Vec<u8>, files: &[(u64, u64)]) {
    // [`MAX_BLOCK_IDS`] is even: a block never splits a pair.
    let words: Vec<u64> = files.iter().flat_map(|&(n, len)| [n, len]).collect();
    encode_blocks(out, KIND_FILES, &words);
}

/// Appends a generation's head: its state block, then the open segments' lengths (at most
/// [`MAX_HEAD_FILES`]).
pub(super) fn encode_head(out: &mut Vec<u8>, head: &Head) {
    encode_blocks(out, KIND_STATE, &[head.last_n]);
    let files = &head.files[..head.files.len().min(MAX_HEAD_FILES)];
    encode_pairs(out, files);
}

/// The last `keep` ids of one generation in order, why the rest of it was discarded if it
/// was damaged, and how many bytes were read (at most `budget`: a file whose data is larger
/// is not read, and is damaged). An incomplete last block (or a tail of zeros) is not damage:
/// a crash cut it. Read a block at a time: memory is `keep` ids and one block, whatever the
/// file's size (an earlier run with a larger window wrote larger generations).
pub(super) fn read_generation(
    path: &Path,
    keep: usize,
    budget: u64,
) -> (Generation, Option<String>, u64) {
    let (f, len) = match open_regular(path) {
        Ok(opened) => opened,
        Err(e) => return (Generation::default(), Some(format!("unreadable: {e}")), 0),
    };
    // Larger than any run writes (a sparse file of zeros reads at about 1.7 s a GiB): not
    // read at all, so no such file delays a start.
    if len > MAX_GENERATION_BYTES {
        let why =
            format!("{len} bytes, more than a generation ever holds ({MAX_GENERATION_BYTES})");
        return (Generation::default(), Some(why), 0);
    }
    // A hole running to the end of the file is a tail a crash left (zeros, which end a
    // generation quietly): not read (review r40d D2: eight sparse files of 511 MiB were read
    // for 82 s before /readyz).
    let mut f = f;
    let data = data_before_trailing_hole(&f, len);
    if let Err(e) = f.seek(io::SeekFrom::Start(0)) {
        return (Generation::default(), Some(format!("unreadable: {e}")), 0);
    }
    if data > budget {
        let why = format!("{data} bytes not read: a start reads at most {MAX_BYTES_READ_AT_START} bytes of the journal, the generations newer than this one took {} of them", MAX_BYTES_READ_AT_START.saturating_sub(budget));
        return (Generation::default(), Some(why), 0);
    }
    let (generation, damage) = decode_from(
        io::BufReader::with_capacity(READ_BUFFER, f.take(data)),
        keep,
    );
    (generation, damage, data)
}

/// `path` opened for reading, with its length, if it is a regular file. `O_NONBLOCK` and
/// `O_NOFOLLOW`: an entry that turned into a FIFO or a link since the folder was listed
/// neither blocks the start nor is followed.
pub(super) fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    match f.metadata() {
        Ok(m) if m.is_file() => Ok((f, m.len())),
        Ok(_) => Err(io::Error::other("not a regular file")),
        Err(e) => Err(e),
    }
}

/// The length of `f` without a hole that runs to its end: `len` where the filesystem does
/// not tell holes apart (the zeros are read then). Moves the file's offset.
pub(super) fn data_before_trailing_hole(f: &File, len: u64) -> u64 {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: `lseek` on a descriptor `f` owns and keeps open for the call; it only moves
    // the file's offset, which the caller sets again before reading.
    let hole = unsafe { libc::lseek(fd, MAGIC.len() as libc::off_t, libc::SEEK_HOLE) };
    let Ok(hole) = u64::try_from(hole) else {
        return len;
    };
    if hole >= len {
        return len;
    }
    // SAFETY: as above.
    let data = unsafe { libc::lseek(fd, hole as libc::off_t, libc::SEEK_DATA) };
    // No data after the hole (ENXIO): the rest of the file is a hole.
    if data < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
        hole
    } else {
        len
    }
}

/// The most bytes a head holds: its state block and [`MAX_HEAD_FILES`] pairs with their
/// block heads.
pub(super) const MAX_HEAD_BYTES: u64 = (2 * BLOCK_HEAD + 8 + MAX_HEAD_FILES * 17) as u64;

/// The most bytes a generation can hold: a generation rotates once it holds a quarter of
/// the window, so even with the largest window and one append past that it holds fewer
/// than twice [`MAX_DEDUP_WINDOW`] ids, at most 40 bytes each (an id with a block head of
/// its own, and a file's length with a block head of its own), after its head. A start
/// reads no file larger than this.
pub(super) const MAX_GENERATION_BYTES: u64 =
    (MAGIC.len() + 2 * MAX_DEDUP_WINDOW * 40) as u64 + MAX_HEAD_BYTES;

/// The most bytes of generations one start reads: the whole window at the largest window
/// ([`MAX_DEDUP_WINDOW`] ids, 40 bytes each at worst) in at most five generations, each
/// with its head, fits it, so every journal a run writes is read to its window; what a start
/// finds beyond it (files no run wrote) is not read, counted damaged, and cannot delay
/// /readyz further (review r40d D2: the cap of one file let many just under it through).
pub(super) const MAX_BYTES_READ_AT_START: u64 = MAX_GENERATION_BYTES + 4 * MAX_HEAD_BYTES;

/// Bytes read from a generation at a time.
pub(super) const READ_BUFFER: usize = 64 << 10;

/// Reads into `buf` until it is full or the input ends; how many bytes were read.
pub(super) fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Decodes a generation: its last `keep` ids, and what was wrong if it is damaged.
pub(super) fn decode_from(mut input: impl Read, keep: usize) -> (Generation, Option<String>) {
    let mut ids: VecDeque<u64> = VecDeque::new();
    let mut out = Generation::default();
    let damaged = (|| -> Result<(), String> {
        let io_err = |e: io::Error| format!("unreadable: {e}");
        let mut magic = [0u8; MAGIC.len()];
        let n = read_full(&mut input, &mut magic).map_err(io_err)?;
        if n < MAGIC.len() {
            // Cut while its magic was being written: nothing in it yet.
            return if MAGIC.starts_with(&magic[..n]) || MAGIC_V1.starts_with(&magic[..n]) {
                Ok(())
            } else {
                Err("no journal header".into())
            };
        }
        if &magic != MAGIC && &magic != MAGIC_V1 {
            return Err("no journal header".into());
        }
        out.v1 = &magic == MAGIC_V1;
        let mut at = MAGIC.len() as u64;
        let mut block: Vec<u8> = Vec::new();
        loop {
            let mut head = [0u8; BLOCK_HEAD];
            let n = read_full(&mut input, &mut head).map_err(io_err)?;
            if n < BLOCK_HEAD {
                // Nothing more, or an incomplete head: the last write was cut short.
                return Ok(());
            }
            let check = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
            let word = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
            let (kind, count) = (
                word >> KIND_SHIFT,
                (word & ((1 << KIND_SHIFT) - 1)) as usize,
            );
            if word == 0 && check == 0 {
                // Zeros where a block should start: a tail the crash left unwritten.
                let mut rest = [0u8; 4096];
                loop {
                    let n = read_full(&mut input, &mut rest).map_err(io_err)?;
                    if rest[..n].iter().any(|&b| b != 0) {
                        return Err(format!("damaged block at byte {at}"));
                    }
                    if n < rest.len() {
                        return Ok(());
                    }
                }
            }
            let possible = match kind {
                KIND_IDS => (1..=MAX_BLOCK_IDS).contains(&count),
                KIND_FILES => (2..=MAX_BLOCK_IDS).contains(&count) && count % 2 == 0,
                KIND_STATE | KIND_END => count == 1,
                _ => false,
            };
            if !possible {
                return Err(format!(
                    "impossible block of kind {kind} and {count} words at byte {at}"
                ));
            }
            block.clear();
            block.extend_from_slice(&head[4..]);
            block.resize(4 + count * 8, 0);
            let n = read_full(&mut input, &mut block[4..]).map_err(io_err)?;
            if n < count * 8 {
                // Incomplete: the last write was cut short.
                return Ok(());
            }
            if block_check(&block) != check {
                return Err(format!("block at byte {at} fails its check"));
            }
            let words = block[4..].chunks_exact(8).map(|w| {
                let mut b = [0u8; 8];
                b.copy_from_slice(w);
                u64::from_le_bytes(b)
            });
            match kind {
                KIND_IDS => {
                    out.total_ids += count as u64;
                    for id in words {
                        if ids.len() == keep {
                            ids.pop_front();
                        }
                        ids.push_back(id);
                    }
                }
                KIND_FILES => {
                    let words: Vec<u64> = words.collect();
                    out.facts
                        .extend(words.chunks_exact(2).map(|p| Fact::Len(p[0], p[1])));
                }
                KIND_STATE => {
                    out.facts.extend(words.map(Fact::Last));
                    out.headed = true;
                }
                _ => out.ended = true,
            }
            at += (BLOCK_HEAD + count * 8) as u64;
        }
    })();
    out.ids = ids.into();
    (out, damaged.err())
}

/// Decodes a generation's bytes: its ids, and what was wrong if it is damaged.
#[cfg(test)]
pub(super) fn decode_generation(bytes: &[u8]) -> (Vec<u64>, Option<String>) {
    let (g, damage) = decode_from(bytes, usize::MAX);
    (g.ids, damage)
}
