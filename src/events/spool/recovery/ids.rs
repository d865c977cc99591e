//! The newest event ids a start reloads from the spool's files into the deduplication
//! window (the reading half of [`super`]'s work): the lines past what the ids journal knows
//! ([`unrecorded_ids`]), the newest by the files' times when there is no journal
//! ([`newest_by_time`]), and beside a journal of the older format ([`newest_ids`]); each file
//! read from its end in bounded chunks ([`TailIds`]). How many, and why those, is said in
//! [`super`]'s doc.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::super::journal::{Lengths, Loaded};
use super::super::{dedup_key, EXPORT_ID_SALT};
use crate::events::dedup::id_hash;
use crate::events::parse::{parse_event, ParsedEvent};
use crate::events::quarantine::{overflow_record_event, record_source_key, SOURCE_KEY_TAIL_BYTES};
use crate::util::dedup::{DedupWindow, PassThrough};

/// Bytes read at a time when reading a segment backwards for its ids.
const ID_SCAN_CHUNK: usize = 64 * 1024;

/// A line longer than this is skipped when reloading ids (its id is not reloaded): bounds the
/// memory of reading one line backwards. Ray's events are a few KiB; a larger one is rare.
const MAX_ID_LINE: usize = 8 << 20;

/// The chunk each of `readers` readers of the spool's ids reads at a time: together about
/// [`UNRECORDED_READ_BYTES`], each at least [`MIN_ID_SCAN_CHUNK`] and at most [`ID_SCAN_CHUNK`].
fn chunk_for(readers: usize) -> usize {
    (UNRECORDED_READ_BYTES / readers.max(1)).clamp(MIN_ID_SCAN_CHUNK, ID_SCAN_CHUNK)
}

/// A spool file whose ids could not be reloaded: logged, and left out.
fn unreadable(path: &Path, e: &io::Error) {
    tracing::warn!(path = %path.display(), error = %e, "could not reload the event ids of a spool file; a resend of its events may be stored twice");
}

/// With no ids journal at all ([`newest_by_time`]): the ids a start reloads at most, when
/// the window is smaller. Held until a window of new ids was accepted (24 to 40 bytes each),
/// so four default windows take at most 40 MiB while held.
pub(super) const MAX_NO_JOURNAL_IDS: usize = 1 << 20;

/// For a journal of format 1 only ([`newest_ids`]): at most this many files (the most
/// recently written) are read for ids at start.
const MAX_ID_FILES: usize = 1024;

/// What the readers of [`unrecorded_ids`] hold at once, about: each reads chunks of this
/// divided by their number (at least [`MIN_ID_SCAN_CHUNK`]), so every file with lines the
/// journal lacks is read, whatever their number, in bounded memory.
const UNRECORDED_READ_BYTES: usize = 64 << 20;

/// The smallest chunk a reader of [`unrecorded_ids`] reads.
const MIN_ID_SCAN_CHUNK: usize = 4 << 10;

/// The most ids [`unrecorded_ids`] reloads at a start, when the window is smaller: the ids a
/// power loss can take from the journal are those answered since its last fsync, at most a
/// quarter of the window of the run that wrote it (or one request holding more). So they all
/// come back after `--dedup-window` was made smaller too, from any previous window up to four
/// times this (review r40m D1: only the new window's worth did, and a power loss after a
/// 16,384 window then a start with 1,024 stored 288 ids of the batches answered last twice).
/// The default window's worth: about 8 MiB of ids while read, and 24 to 40 bytes each in the
/// window until a window of new ids was accepted
/// ([`crate::util::dedup::DedupWindow::insert_unordered`]). Not more: a journal that fell
/// behind (a full disk) before the crash leaves any number of ids past it, and a start that
/// reloaded a quarter of the largest window (4 Mi ids) took 60 s and 273 MiB (review r40n
/// D2), past the memory limit the charts set.
const MAX_UNRECORDED_IDS: usize = 1 << 18;

/// Fills a start's empty window with the ids it reloaded: the spool's older than the
/// journal's, the journal's (oldest first), and the spool's stored after the journal's last
/// record read, which are the newest.
pub(in crate::events::spool) fn refill_window(
    dedup: &mut DedupWindow,
    loaded: &Loaded,
    spool: &SpoolIds,
) {
    for h in spool.older.iter().rev() {
        dedup.insert(*h);
    }
    // The journal's ids that a start before held are held again with the spool's, and the
    // ids accepted after them count towards ending that hold (reviews r40n D1, r40o D2).
    let (ordered, rest) = loaded
        .ids
        .split_at(loaded.ids.len() - (loaded.held + loaded.after).min(loaded.ids.len()));
    let (held, after) = rest.split_at(rest.len() - loaded.after.min(rest.len()));
    for h in ordered {
        dedup.insert(*h);
    }
    if loaded.lengths.is_some() {
        // Their order is unknown: all are kept until a window of new ids was accepted,
        // however many (review r40m D1). The spool's are held with the journal's, and so
        // end with them: a window of ids after the journal's held ones, which may be fewer
        // after the spool's (documented).
        let newer: Vec<u64> = held
            .iter()
            .chain(spool.newer.iter().rev())
            .copied()
            .collect();
        dedup.insert_unordered(&newer);
        for h in after {
            dedup.insert(*h);
        }
    } else {
        for h in held.iter().chain(after) {
            dedup.insert(*h);
        }
        for h in spool.newer.iter().rev() {
            dedup.insert(*h);
        }
    }
}

/// How many of the ids stored after the journal's last record read a start reloads: all of
/// them (a power loss took their records; at most [`MAX_UNRECORDED_IDS`]), or the window's
/// worth when the journal is damaged (a power loss does not damage a block: lines past its
/// lengths may then be older than its ids, and are not all worth the memory and the reading).
pub(super) fn unrecorded_limit(cfg: &super::super::SpoolConfig, loaded: &Loaded) -> usize {
    if cfg.dedup_window == 0 || loaded.damaged > 0 {
        cfg.dedup_window
    } else {
        cfg.dedup_window.max(MAX_UNRECORDED_IDS)
    }
}

/// Which lines of a file carry ids, and how they are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::events::spool) enum IdLines {
    /// An event segment: every line is an event; ids hashed with this salt.
    Events(u64),
    /// A quarantine records file: only `too_many_partitions` records (valid events) count.
    Overflow,
}

/// A file to reload ids from.
#[derive(Debug, Clone)]
pub(in crate::events::spool) struct IdFile {
    pub(in crate::events::spool) path: PathBuf,
    pub(in crate::events::spool) lines: IdLines,
    /// Its durable length: nothing after it is read.
    pub(in crate::events::spool) len: u64,
    /// When it was last written.
    pub(in crate::events::spool) modified: SystemTime,
    /// Its creation number, to order files written at the same instant, and to tell it
    /// from the files the ids journal knows of.
    pub(in crate::events::spool) created: u64,
    /// Where its lines not recorded in the ids journal start ([`unrecorded_ids`]).
    pub(in crate::events::spool) floor: u64,
}

/// The event ids of the files in the spool that the journal does not hold, newest first,
/// split by where they belong beside the journal's ids.
#[derive(Debug, Default, PartialEq, Eq)]
pub(in crate::events::spool) struct SpoolIds {
    /// Written after the newest id the journal holds: the journal's missing tail (its append
    /// lost to a power loss, or a kill -9 between a group's write and its append).
    pub(in crate::events::spool) newer: Vec<u64>,
    /// Written before an id the journal holds: older than the journal's newest.
    pub(in crate::events::spool) older: Vec<u64>,
}

/// The deduplication keys of the event ids stored after the journal's last record read,
/// newest first, at most `want`: the lines of each file past the length the journal gives it,
/// and every line of a file numbered after the newest it knows of ([`Lengths`]); a file the
/// journal knows of without a length (sealed, or quiet since before the generations read)
/// gives none. Every such file is read (review r40i D1: only the 1,024 created last were,
/// so a batch answered last into an older partition was left out), side by side from
/// their ends, one id from each in turn, each reader holding a chunk of
/// [`UNRECORDED_READ_BYTES`] divided among them. Their order across files is recorded
/// nowhere durable; the journal is made durable every quarter window of ids
/// ([`super::super::journal::Journal::due_for_sync`]), and before a group is written that would
/// take the ids not yet durable there past that (review r40j D2), so after a kill -9 or a
/// power loss they are at most a quarter of the window of the run that answered them (or
/// one request), and the caller asks for all of them ([`unrecorded_limit`]), whatever the
/// window now (review r40m D1: a window made four times smaller got only part of the last
/// batches). Only when more are missing than `want` (a damaged journal, or one behind a
/// full disk that refuses its snapshot) do fewer of each file's oldest come back. A file that cannot be read is logged and left out. No clock is consulted:
/// the journal's lengths and the files' creation numbers tell what is newer (reviews r40d,
/// r40f: times set back, or a whole quiet file taken as newer, evicted answered ids).
pub(in crate::events::spool) fn unrecorded_ids(
    mut files: Vec<IdFile>,
    want: usize,
    lengths: &Lengths,
) -> Vec<u64> {
    let mut out = Vec::new();
    files.retain_mut(|f| {
        let Some(floor) = lengths.unrecorded_from(f.created) else {
            return false;
        };
        f.floor = floor;
        floor < f.len
    });
    files.sort_by_key(|f| std::cmp::Reverse(f.created));
    let chunk = chunk_for(files.len());
    let mut readers: Vec<TailIds> = files
        .iter()
        .filter_map(
            |f| match TailIds::open_from(&f.path, f.lines, f.floor, f.len) {
                Ok(mut r) => {
                    r.chunk = chunk;
                    Some(r)
                }
                Err(e) => {
                    unreadable(&f.path, &e);
                    None
                }
            },
        )
        .collect();
    while out.len() < want && !readers.is_empty() {
        readers.retain_mut(|r| {
            if out.len() >= want {
                return true;
            }
            match r.next_id() {
                Ok(Some(id)) => {
                    out.push(id);
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    unreadable(&r.path, &e);
                    false
                }
            }
        });
    }
    out
}

/// With no ids journal at all (a lost `dedup/` folder, or the first start after a binary that
/// kept none), the deduplication keys of the event ids of `files`, newest first as far as the
/// files can tell, at most `want`. Nothing records when each line was written, so a line's time
/// is taken as its place between the file's creation (its number, the clock's nanoseconds when
/// it was made) and its last write (its modification time), and the files are read from their
/// ends, merged by that time: the file written last gives its last lines first, and files
/// written side by side give theirs in turn (review r40w D1: read one id from each file in
/// turn, each of 2,001 files gave a 2,001st of the window, and the batch written last, into a
/// new file, was stored twice; read file after file by modification time, the newest lines of
/// every file but the newest were left out, r40v). A clock set back can only misorder the
/// guess, and `want` is [`MAX_NO_JOURNAL_IDS`] or the window, whichever is larger: a spool of
/// fewer ids is reloaded whole, whatever the times. A file that cannot be read is logged and
/// left out.
pub(in crate::events::spool) fn newest_by_time(files: Vec<IdFile>, want: usize) -> Vec<u64> {
    let nanos = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    };
    let chunk = chunk_for(files.len());
    // Each reader with the times of its file's first and last line.
    let mut readers: Vec<(TailIds, u128, u128, u64)> = files
        .iter()
        .filter_map(|f| match TailIds::open(&f.path, f.lines, f.len) {
            Ok(mut r) => {
                r.chunk = chunk;
                let last = nanos(f.modified);
                let first = u128::from(f.created).min(last);
                Some((r, first, last, f.len.max(1)))
            }
            Err(e) => {
                unreadable(&f.path, &e);
                None
            }
        })
        .collect();
    let time = |(r, first, last, len): &(TailIds, u128, u128, u64)| {
        first + (last - first) * u128::from(r.position().min(*len)) / u128::from(*len)
    };
    let mut heap: std::collections::BinaryHeap<(u128, usize)> = readers
        .iter()
        .enumerate()
        .map(|(i, r)| (time(r), i))
        .collect();
    let mut out = Vec::new();
    while out.len() < want {
        let Some((_, i)) = heap.pop() else { break };
        let reader = &mut readers[i];
        match reader.0.next_id() {
            Ok(Some(id)) => {
                out.push(id);
                heap.push((time(reader), i));
            }
            Ok(None) => {}
            Err(e) => {
                unreadable(&reader.0.path, &e);
            }
        }
    }
    out
}

/// For a journal of format 1 (the binaries before, ids only: the first start after an
/// upgrade), the deduplication keys of the event ids of `files` that `journal` does not hold,
/// newest first, reading at most `want` ids: generation by generation (the files with the
/// same modification time: written last by one group of those binaries), newest first, and within one generation one
/// id from the end of each file in turn, round after round. A file that cannot be read is
/// logged and left out.
///
/// Where each id belongs: the journal holds every answered id up to its newest, so an id is
/// [`SpoolIds::newer`] than all of them only if nothing written after it is in the journal
/// (no later line of its file, no file of a newer generation) and either its file was
/// written after the journal's last write (`journal_modified`; `None`: no journal, every
/// id is newer) or an earlier line of its file is in the journal (the lines after it were
/// answered, so their append was lost, whatever the times say). Every other id the journal
/// does not hold is [`SpoolIds::older`] (review r40d D1: the ids of a quiet partition's open
/// segment, written long before, were taken as the newest and evicted the journal's window).
/// Both signals count: the busy partition's segments may all be uploaded (no id of the
/// journal left in the spool: the times tell), and a time is only as good as the clock and
/// the filesystem (a clock set back; a journal's time made durable without its last
/// blocks): an id of the journal in a file still tells what is older and what newer.
pub(in crate::events::spool) fn newest_ids(
    mut files: Vec<IdFile>,
    want: usize,
    journal: &HashSet<u64, PassThrough>,
    journal_modified: Option<SystemTime>,
) -> SpoolIds {
    files.sort_by_key(|f| std::cmp::Reverse((f.modified, f.created)));
    files.truncate(MAX_ID_FILES);
    let mut out = SpoolIds::default();
    let mut read = 0;
    // No newer generation held an id of the journal.
    let mut past_journal = true;
    let mut rest = &files[..];
    while !rest.is_empty() && read < want {
        let newest = rest[0].modified;
        let n = rest
            .iter()
            .take_while(|f| f.modified == newest)
            .count()
            .max(1);
        let place: fn() -> Place = if !past_journal {
            || Place::Older
        } else if journal_modified.is_none_or(|t| newest > t) {
            || Place::Newer
        } else {
            || Place::Held(Vec::new())
        };
        let met_journal = ids_side_by_side(&rest[..n], want, journal, place, &mut read, &mut out);
        past_journal &= !met_journal;
        rest = &rest[n..];
    }
    out
}

/// Where the ids read from the end of one file go while no id of the journal was met in it.
enum Place {
    /// After the journal's.
    Newer,
    /// Newer only if an id of the journal comes before them in the file (then they are its
    /// lost tail, whatever the times say), else older: held until that is known.
    Held(Vec<u64>),
    /// Before the journal's.
    Older,
}

/// Reads ids from the ends of `files`, one from each in turn, until `read` reaches `want` or
/// the files are read, and files each one the journal does not hold into `out`. `place`
/// says where the ids at a file's end go until an id of the journal is met in it; after one,
/// every id is older. True if any file held an id of the journal.
fn ids_side_by_side(
    files: &[IdFile],
    want: usize,
    journal: &HashSet<u64, PassThrough>,
    place: fn() -> Place,
    read: &mut usize,
    out: &mut SpoolIds,
) -> bool {
    let mut readers: Vec<(TailIds, Place)> = files
        .iter()
        .filter_map(|f| match TailIds::open(&f.path, f.lines, f.len) {
            Ok(r) => Some((r, place())),
            Err(e) => {
                unreadable(&f.path, &e);
                None
            }
        })
        .collect();
    let mut met_journal = false;
    while *read < want && !readers.is_empty() {
        readers.retain_mut(|(r, place)| {
            if *read >= want {
                return true;
            }
            let next = r.next_id();
            match next {
                Ok(Some(id)) => {
                    *read += 1;
                    if journal.contains(&id) {
                        met_journal = true;
                        if let Place::Held(ids) = std::mem::replace(place, Place::Older) {
                            out.newer.extend(ids);
                        }
                        *place = Place::Older;
                    } else {
                        match place {
                            Place::Newer => out.newer.push(id),
                            Place::Held(ids) => ids.push(id),
                            Place::Older => out.older.push(id),
                        }
                    }
                    true
                }
                Ok(None) | Err(_) => {
                    if let Err(e) = next {
                        unreadable(&r.path, &e);
                    }
                    if let Place::Held(ids) = std::mem::replace(place, Place::Older) {
                        out.older.extend(ids);
                    }
                    false
                }
            }
        });
    }
    // Cut short by `want`: what is still held never met the journal.
    for (_, place) in readers {
        if let Place::Held(ids) = place {
            out.older.extend(ids);
        }
    }
    met_journal
}

/// Reads one segment's event ids backwards, a chunk at a time; holds one chunk's ids and the
/// piece of a line that started before it (at most [`MAX_ID_LINE`]), and no open file.
pub(in crate::events::spool) struct TailIds {
    path: PathBuf,
    lines: IdLines,
    /// Where the part not read yet ends.
    pos: u64,
    /// Where the part to read starts (a line's start).
    floor: u64,
    /// The end of the line whose start is not read yet.
    carry: Vec<u8>,
    /// That line is longer than [`MAX_ID_LINE`]: skipped.
    skipping: bool,
    /// Ids of the chunk read last, oldest first (popped from the end).
    ids: Vec<u64>,
    /// Where the chunk read last ended, and how many ids it gave ([`TailIds::position`]).
    chunk_end: u64,
    chunk_ids: usize,
    /// Bytes read at a time.
    chunk: usize,
}

impl TailIds {
    /// Reads the file's first `len` bytes (its durable length) at most.
    pub(in crate::events::spool) fn open(
        path: &Path,
        lines: IdLines,
        len: u64,
    ) -> io::Result<TailIds> {
        TailIds::open_from(path, lines, 0, len)
    }

    /// Reads the file's lines from `floor` (a line's start) up to `len` bytes at most.
    pub(in crate::events::spool) fn open_from(
        path: &Path,
        lines: IdLines,
        floor: u64,
        len: u64,
    ) -> io::Result<TailIds> {
        let pos = fs::metadata(path)?.len().min(len);
        Ok(TailIds {
            path: path.to_path_buf(),
            lines,
            pos,
            floor: floor.min(pos),
            carry: Vec::new(),
            skipping: false,
            ids: Vec::new(),
            chunk_end: pos,
            chunk_ids: 0,
            chunk: ID_SCAN_CHUNK,
        })
    }

    /// About where in the file the line of the next id is: within the chunk read last, in
    /// proportion to the ids of it not taken yet ([`newest_by_time`]).
    fn position(&self) -> u64 {
        if self.ids.is_empty() || self.chunk_ids == 0 {
            return self.pos;
        }
        let span = u128::from(self.chunk_end.saturating_sub(self.pos));
        let share = span * self.ids.len() as u128 / self.chunk_ids as u128;
        self.pos + share as u64
    }

    /// The id of the next line back, `None` at the start of the file.
    pub(in crate::events::spool) fn next_id(&mut self) -> io::Result<Option<u64>> {
        while self.ids.is_empty() {
            if self.pos == self.floor {
                if self.carry.is_empty() {
                    return Ok(None);
                }
                let first = std::mem::take(&mut self.carry);
                if !self.skipping {
                    self.push_line(&first);
                }
                self.skipping = false;
                continue;
            }
            self.read_chunk()?;
        }
        Ok(self.ids.pop())
    }

    fn push_line(&mut self, line: &[u8]) {
        if line.is_empty() {
            return;
        }
        let (event, salt) = match self.lines {
            IdLines::Events(salt) => (line, salt),
            IdLines::Overflow => match overflow_record_event(line) {
                Some((event, export)) => (event, if export { EXPORT_ID_SALT } else { 0 }),
                None => {
                    // The record of a line read from a file: its key (review r41q D1).
                    if let Some(key) = record_source_key(line) {
                        self.ids.push(dedup_key(key));
                    }
                    return;
                }
            },
        };
        if let Ok(ParsedEvent::Object(ev)) = parse_event(event) {
            if let Some(id) = ev.event_id.as_str() {
                self.ids.push(dedup_key(id_hash(id.as_bytes()) ^ salt));
            }
        }
    }

    /// Reads the chunk before `pos`: its complete lines' ids into `ids`, oldest first.
    fn read_chunk(&mut self) -> io::Result<()> {
        let start = self.pos.saturating_sub(self.chunk as u64).max(self.floor);
        let mut buf = vec![0u8; (self.pos - start) as usize];
        let mut f = File::open(&self.path)?;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf)?;
        self.chunk_end = self.pos;
        self.pos = start;
        // Lines found back to front; reversed at the end so `ids` pops newest first.
        let mark = self.ids.len();
        let mut end = buf.len();
        while let Some(i) = buf[..end].iter().rposition(|&c| c == b'\n') {
            if !self.skipping {
                if self.carry.is_empty() {
                    self.push_line(&buf[i + 1..end]);
                } else {
                    let mut line = buf[i + 1..end].to_vec();
                    line.extend_from_slice(&self.carry);
                    self.push_line(&line);
                }
            }
            self.carry.clear();
            self.skipping = false;
            end = i;
        }
        self.ids[mark..].reverse();
        if !self.skipping {
            if self.carry.len() + end > MAX_ID_LINE {
                // Too long to hold whole; a record of a line read from a file still gives
                // its key, its last field. The line ends in `carry` (or in this chunk when
                // nothing was carried); its key goes before the ids of the lines after it.
                if matches!(self.lines, IdLines::Overflow) {
                    let want = SOURCE_KEY_TAIL_BYTES;
                    let from_buf = want.saturating_sub(self.carry.len()).min(end);
                    let mut tail = buf[end - from_buf..end].to_vec();
                    tail.extend_from_slice(&self.carry[self.carry.len().saturating_sub(want)..]);
                    if let Some(key) = record_source_key(&tail) {
                        self.ids.insert(mark, dedup_key(key));
                    }
                }
                self.skipping = true;
                self.carry.clear();
            } else {
                self.carry.splice(0..0, buf[..end].iter().copied());
            }
        }
        self.chunk_ids = self.ids.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::quarantine::{raw_record, QuarantineReason};

    fn write_ids(path: &Path, tag: &str, n: usize, long_at: Option<usize>) -> Vec<u64> {
        let mut text = String::new();
        let mut ids = Vec::new();
        for i in 0..n {
            let id = format!("{tag}-{i}");
            if Some(i) == long_at {
                let pad = "x".repeat(ID_SCAN_CHUNK * 3 + 10);
                text.push_str(&format!("{{\"eventId\":\"{id}\",\"p\":\"{pad}\"}}\n"));
            } else {
                text.push_str(&format!("{{\"eventId\":\"{id}\"}}\n"));
            }
            ids.push(dedup_key(id_hash(id.as_bytes()) ^ 7));
        }
        fs::write(path, &text).unwrap();
        ids
    }

    /// [`newest_ids`] with no journal: every id is newer than it.
    fn without_journal(files: Vec<IdFile>, want: usize) -> Vec<u64> {
        let out = newest_ids(files, want, &HashSet::default(), None);
        assert!(out.older.is_empty());
        out.newer
    }

    fn id_file(path: &Path, age_ms: u64, created: u64) -> IdFile {
        let modified = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000)
            - std::time::Duration::from_millis(age_ms);
        if let Ok(f) = File::options().write(true).open(path) {
            f.set_modified(modified).unwrap();
        }
        IdFile {
            path: path.to_path_buf(),
            lines: IdLines::Events(7),
            len: u64::MAX,
            modified,
            created,
            floor: 0,
        }
    }

    /// A file of `ids` made at `created` (seconds) and last written at `modified` (seconds).
    fn timed_file(path: &Path, created_s: u64, modified_s: u64) -> IdFile {
        let modified = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(modified_s);
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        IdFile {
            path: path.to_path_buf(),
            lines: IdLines::Events(7),
            len: fs::metadata(path).unwrap().len(),
            modified,
            created: created_s * 1_000_000_000,
            floor: 0,
        }
    }

    /// Review r40w D1: with no journal, a batch written last into a new file comes back
    /// first, however many older files the spool holds (read one id from each file in turn,
    /// each of 200 files gave a 200th of what was asked).
    #[test]
    fn without_a_journal_the_file_written_last_comes_back_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        for i in 0..200 {
            let p = dir.path().join(format!("old{i}"));
            write_ids(&p, &format!("old{i}"), 50, None);
            files.push(timed_file(&p, 1_800_000_000 + i, 1_800_000_300 + i));
        }
        let p = dir.path().join("new");
        let new = write_ids(&p, "new", 3_000, None);
        files.push(timed_file(&p, 1_800_001_000, 1_800_001_010));
        let out = newest_by_time(files, 4_000);
        assert_eq!(out.len(), 4_000);
        let want: Vec<u64> = new.iter().rev().copied().collect();
        assert_eq!(out[..3_000], want[..]);
    }

    /// Review r40v: files written side by side (three partitions of the same batches) each
    /// give their newest lines, not the file modified last all of its lines first.
    #[test]
    fn without_a_journal_files_written_side_by_side_give_their_newest_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        let mut all = Vec::new();
        for i in 0..3 {
            let p = dir.path().join(format!("p{i}"));
            all.push(write_ids(&p, &format!("p{i}"), 6_000, None));
            files.push(timed_file(&p, 1_800_000_000, 1_800_000_600 + i));
        }
        let out: HashSet<u64> = newest_by_time(files, 9_000).into_iter().collect();
        for ids in &all {
            // Each file's newest 2,500 of 6,000 (a third of what was asked, less the
            // granularity of a chunk).
            let newest = &ids[ids.len() - 2_500..];
            assert!(newest.iter().all(|id| out.contains(id)));
        }
        // A spool smaller than what is asked comes back whole.
        let files: Vec<IdFile> = (0..3)
            .map(|i| {
                let p = dir.path().join(format!("p{i}"));
                timed_file(&p, 1_800_000_000, 1_800_000_600 + i)
            })
            .collect();
        assert_eq!(newest_by_time(files, 100_000).len(), 18_000);
    }

    /// One file: its ids come back last line first, across chunk boundaries and a line longer
    /// than several chunks, and only as many as asked for.
    #[test]
    fn newest_ids_read_one_file_backwards_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let ids = write_ids(&p, "id", 30_000, Some(29_990));
        let out = without_journal(vec![id_file(&p, 0, 1)], 20_000);
        let want: Vec<u64> = ids.iter().rev().take(20_000).copied().collect();
        assert_eq!(out, want);
        let all = without_journal(vec![id_file(&p, 0, 1)], 1_000_000);
        assert_eq!(all.len(), 30_000);
        assert_eq!(all.last(), ids.first());
    }

    /// The files written last (by one group: the same modification time) are read side by
    /// side from their ends and wholly before any older file; an older file, however large,
    /// and even a millisecond older, only fills what room is left.
    #[test]
    fn newest_ids_fill_the_window_generation_by_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        // "old" was written a millisecond before the newest; "b" and "c" together, last.
        let ids_old = write_ids(&path("old"), "old", 5_000, None);
        let ids_b = write_ids(&path("b"), "b", 50, None);
        let ids_c = write_ids(&path("c"), "c", 80, None);
        let files = vec![
            id_file(&path("old"), 1, 1),
            id_file(&path("c"), 0, 2),
            id_file(&path("gone"), 0, 4),
            id_file(&path("b"), 0, 3),
        ];
        let out = without_journal(files.clone(), 200);
        assert_eq!(out.len(), 200);
        // b's newest, then c's newest, side by side.
        assert_eq!(&out[..4], &[ids_b[49], ids_c[79], ids_b[48], ids_c[78]]);
        let newest: Vec<u64> = ids_b.iter().chain(&ids_c).copied().collect();
        for id in &newest {
            assert!(out[..130].contains(id));
        }
        // Then the old file's tail, newest first.
        let old_tail: Vec<u64> = ids_old.iter().rev().take(70).copied().collect();
        assert_eq!(&out[130..], &old_tail[..]);
        // A window smaller than the newest generation holds only ids of it.
        let small = without_journal(files, 100);
        assert!(small.iter().all(|id| newest.contains(id)), "{small:?}");
    }

    /// Review r40d D1: the journal orders what it holds. Spool ids it lacks go after its
    /// ids only when nothing written after them is in the journal (its tail, lost to a power
    /// loss: a newer generation, or a file's last lines after its last journal id); a quiet
    /// partition's open segment, written before the journal's newest ids, is older.
    #[test]
    fn spool_ids_are_newer_than_the_journal_only_after_its_newest() {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        // Oldest first: a quiet partition's open segment, nothing of it in the journal (its
        // ids left the window long ago); the busy partition's segment, all in the journal,
        // then its last lines (a group whose append was lost), written with a new file and,
        // one group later, another one.
        let quiet = write_ids(&path("quiet"), "quiet", 300, None);
        let busy = write_ids(&path("busy"), "busy", 200, None);
        let created = write_ids(&path("created"), "created", 7, None);
        let last = write_ids(&path("last"), "last", 5, None);
        let (answered, lost) = busy.split_at(180);
        let journal: HashSet<u64, PassThrough> = answered.iter().copied().collect();
        let files = vec![
            id_file(&path("quiet"), 2, 1),
            id_file(&path("busy"), 1, 2),
            id_file(&path("created"), 1, 3),
            id_file(&path("last"), 0, 4),
        ];
        // The journal's last write: after the quiet segment's, before the lost group's.
        let journal_modified = files[1].modified - std::time::Duration::from_micros(500);
        let out = newest_ids(files.clone(), 10_000, &journal, Some(journal_modified));
        let mut newer: Vec<u64> = last.iter().rev().copied().collect();
        assert_eq!(&out.newer[..5], &newer[..]);
        newer.extend(lost.iter().chain(&created));
        let mut got = out.newer.clone();
        got.sort_unstable();
        newer.sort_unstable();
        assert_eq!(got, newer);
        let older: Vec<u64> = quiet.iter().rev().copied().collect();
        assert_eq!(out.older, older);
        // Without the journal (an older version's spool, a journal lost), every id is newer.
        assert_eq!(without_journal(files, 10_000).len(), 512);
        // Reading stops at the window, ids of the journal included.
        let some = newest_ids(
            vec![id_file(&path("busy"), 1, 2)],
            50,
            &journal,
            Some(journal_modified),
        );
        assert_eq!((some.newer.len(), some.older.len()), (20, 0));
        // No id of the journal left in the spool (the busy segments all uploaded): the
        // quiet segment, written before the journal's last write, is older all the same;
        // a file written after it is newer.
        let files = vec![id_file(&path("quiet"), 2, 1), id_file(&path("last"), 0, 4)];
        let out = newest_ids(files.clone(), 10_000, &journal, Some(journal_modified));
        let newer: Vec<u64> = last.iter().rev().copied().collect();
        assert_eq!((out.newer, out.older), (newer, older));
        // A quiet segment stamped after the journal (a clock set back since), older than a
        // file holding ids of the journal, stays older.
        let files = vec![id_file(&path("quiet"), 2, 1), id_file(&path("busy"), 1, 2)];
        let before_all = files[0].modified - std::time::Duration::from_secs(1);
        let out = newest_ids(files, 10_000, &journal, Some(before_all));
        assert_eq!(out.older, quiet.iter().rev().copied().collect::<Vec<_>>());
        // The journal's time later than every file (made durable without its last blocks):
        // a file's ids after an id of the journal are still its lost tail; a file without
        // one is older.
        let files = vec![
            id_file(&path("quiet"), 2, 1),
            id_file(&path("busy"), 1, 2),
            id_file(&path("created"), 1, 3),
        ];
        let after_all = files[1].modified + std::time::Duration::from_secs(1);
        let out = newest_ids(files, 10_000, &journal, Some(after_all));
        let lost_newest_first: Vec<u64> = lost.iter().rev().copied().collect();
        assert_eq!(out.newer, lost_newest_first);
        let mut got = out.older;
        got.sort_unstable();
        let mut want: Vec<u64> = quiet.iter().chain(&created).copied().collect();
        want.sort_unstable();
        assert_eq!(got, want);
    }

    /// Format 2 of the journal: a file's lines past the length the journal gives it, and every
    /// line of a file numbered after the newest it knows of, come back (newest first); a file
    /// it knows of without a length, or read to its length, gives none, whatever its time.
    #[test]
    fn unrecorded_ids_are_the_lines_past_the_journals_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        let recorded = write_ids(&path("recorded"), "recorded", 10, None);
        let tail = write_ids(&path("tail"), "tail", 10, None);
        let new = write_ids(&path("new"), "new", 3, None);
        let _quiet = write_ids(&path("quiet"), "quiet", 10, None);
        let line = |tag: &str, i: usize| format!("{{\"eventId\":\"{tag}-{i}\"}}\n").len() as u64;
        let mut lengths = Lengths {
            last_n: 5,
            ..Lengths::default()
        };
        let full = fs::metadata(path("recorded")).unwrap().len();
        lengths.files.insert(1, full);
        lengths
            .files
            .insert(2, (0..7).map(|i| line("tail", i)).sum());
        // The quiet file is the latest by its time (a clock set back): no matter.
        let files = vec![
            id_file(&path("recorded"), 5, 1),
            id_file(&path("tail"), 4, 2),
            id_file(&path("quiet"), 0, 3),
            id_file(&path("new"), 3, 9),
        ];
        let out = unrecorded_ids(files.clone(), 100, &lengths);
        let mut got = out.clone();
        got.sort_unstable();
        let mut want: Vec<u64> = tail[7..].iter().chain(&new).copied().collect();
        want.sort_unstable();
        assert_eq!(got, want);
        assert!(recorded.iter().all(|id| !out.contains(id)));
        // Newest first within a file, side by side across files.
        assert_eq!(&out[..2], &[new[2], tail[9]]);
        // At most `want`.
        assert_eq!(unrecorded_ids(files, 4, &lengths).len(), 4);
    }

    /// A quarantine file gives back the ids of its `too_many_partitions` records only, in
    /// the id space the record names.
    #[test]
    fn newest_ids_read_overflow_records_of_quarantine_files() {
        use crate::events::quarantine::{event_record, overflow_record};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("q");
        let mut text = overflow_record(br#"{"eventId":"pushed"}"#, false);
        text.extend(event_record(
            QuarantineReason::MissingSession,
            br#"{"eventId":"bad"}"#,
        ));
        text.extend(overflow_record(br#"{"event_id":"exported"}"#, true));
        fs::write(&p, &text).unwrap();
        let mut f = id_file(&p, 0, 1);
        f.lines = IdLines::Overflow;
        let out = without_journal(vec![f], 10);
        assert_eq!(
            out,
            vec![
                dedup_key(id_hash(b"exported") ^ EXPORT_ID_SALT),
                dedup_key(id_hash(b"pushed")),
            ]
        );
    }

    /// A quarantine file gives back the key of each record of a line read from a file (its
    /// last field), also of a record too long to be read whole, in the order written
    /// (review r41q D1: a kill -9 before the journal got the key made a second record).
    #[test]
    fn records_of_lines_read_from_files_give_back_their_keys() {
        use crate::events::quarantine::overflow_record;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("q");
        let mut text = raw_record(
            QuarantineReason::ExportNotJson,
            "a.log",
            0,
            b"bad",
            Some(11),
        );
        let long = vec![b'z'; MAX_ID_LINE + 10];
        text.extend(raw_record(
            QuarantineReason::ExportBadEvent,
            "a.log",
            4,
            &long,
            Some(22),
        ));
        text.extend(overflow_record(br#"{"event_id":"exported"}"#, true));
        text.extend(raw_record(
            QuarantineReason::TornLine,
            "s.jsonl",
            9,
            b"x",
            None,
        ));
        text.extend(raw_record(
            QuarantineReason::ExportNotJson,
            "b.log",
            0,
            b"\"}",
            Some(33),
        ));
        fs::write(&p, &text).unwrap();
        let mut f = id_file(&p, 0, 1);
        f.lines = IdLines::Overflow;
        let out = without_journal(vec![f], 10);
        assert_eq!(
            out,
            vec![
                dedup_key(33),
                dedup_key(id_hash(b"exported") ^ EXPORT_ID_SALT),
                dedup_key(22),
                dedup_key(11),
            ]
        );
    }
}
