//! The ids journal: the deduplication window kept beside the spool, so that it outlives the
//! segments its ids came from, and the record of which lines of the spool it covers.
//!
//! Ray resends a batch whose answer took more than 3 s, with the same event ids, and a
//! restart of the collector may fall in between. A segment sealed by size or age, or at
//! shutdown, is uploaded and then deleted, and its ids with it. So the writer appends the
//! record of every group it answers to this journal (`<spool>/dedup/`): the group's id
//! hashes, then the durable length of each spool file it wrote ids into (the file's creation
//! number and its length). Each generation starts with a head: the newest creation number
//! then, and the durable length of every open segment. A start reloads the newest
//! `--dedup-window` distinct ids from it, and learns where its knowledge of the spool ends
//! ([`Lengths`]): lines of a file past the length the journal gives it, and every line of a
//! file numbered after the newest it knows of, were stored after its last record (a group in
//! flight at a crash, or records a power loss took), and are the newest ids
//! ([`super::recovery`]). Nothing is guessed from clocks or modification times (reviews
//! r40d and r40f: a quiet partition's open segment, a group in flight written into one, or
//! a clock set back, made old ids push answered ones out of the window; a group answered
//! before a power loss, in files it created, was taken as older).
//!
//! When it is durable: a record goes to the page cache with the group's answer (after the
//! group's sync, so a rolled-back group is never recorded), which a kill -9 keeps. The
//! journal is fsync'd before a segment is handed to the uploader, which deletes the segment
//! once uploaded: after a power loss too, an answered id is in the journal or on a line of a
//! segment still in the spool past what the journal covers. That is one `fdatasync` per
//! round of seals (none when nothing was appended since the last; one more, and a directory
//! sync, when a generation was started since), on the writer thread, and one more whenever
//! a quarter of the window was answered since the last ([`Journal::due_for_sync`]), or before
//! a group is written that would take the ids not yet durable here past a quarter window
//! (review r40j D2): what a power loss takes then always fits in the window a start refills,
//! whose order across files nothing durable records (review r40i D1); none per group commit
//! (the group's lines are synced before its answer, and a start finds them past the lengths
//! the journal holds, so the record needs no sync of its own), none when a generation is
//! full. A start reads each generation up to its first incomplete or damaged block (a
//! prefix of what was written); across generations, a full one ends with an end block
//! ([`KIND_END`]) before the next one starts, and a start that finds a generation without
//! it (a power loss took its end, not the newer one's start), a generation without its
//! head (one never synced, cut to nothing by a power loss: review r40h), or a gap in the
//! generations' numbers (a file lost) uses no length of the newer ones ([`chain_lengths`]):
//! no length it uses covers lines whose ids it lacks.
//!
//! Bounded: the journal is a few generation files `ids-<n>`, each filled with a quarter of the
//! window ([`GENERATIONS_PER_WINDOW`]); when one is full the next is started, and the oldest
//! are removed once the newer ones hold a whole window (their ids have left the window). A
//! group's record names only the files it wrote ids into, so it holds at most 16 bytes of
//! lengths per id beside the id's 8; a head, at most [`MAX_HEAD_FILES`] open segments (16
//! bytes each, in every generation: beside the ids below, review r40i D5). So
//! between snapshots it holds at most 1.25 windows of ids (8 bytes each, and lengths) plus
//! one group's (a window and [`MIN_GENERATION_IDS`] for a window under 16,384): 2.5 MiB of
//! ids at the default window, beside the spool's budget.
//! A snapshot adds the new window to the old files until it is complete, and a start first
//! removes every file that gave no id to the window it read, so a crash loop cannot pile
//! files up: at any moment at most 2.5 windows (plus a group, and a generation for a small
//! window). After `--dedup-window` was made smaller, the generations kept are those of the
//! previous run's size (a quarter of its window each; the newest, partly filled, and the one
//! before can both give ids to the new window): until that first rewrite completes, half the
//! previous window more. A start that holds ids reloaded in no known order beyond its window
//! ([`crate::util::dedup::DedupWindow::hold`]: after a power loss with a larger window
//! before, or a kill -9 with a group in flight) writes them last in its snapshot (then the
//! ids accepted after them), and how many in the hold file beside the generations
//! ([`HoldFile`]); until a window of ids was appended after them, rotations keep their
//! generations and a start reads them back as held ([`Loaded::held`], at most
//! [`MAX_HELD_IDS`] beyond the window), the ids after them counting towards its end
//! ([`Loaded::after`]): up to that many ids more on disk (reviews r40n D1 and D5, r40o).
//! The hold file is durable before the snapshot renames its first generation into place,
//! and names the hold before it as well: a start that does not find the snapshot's newest
//! generation reads the journal as it was before, with that hold; one that finds it counts
//! only ids appended after the snapshot as new (review r40p D1, D2: written last, a kill -9
//! before it lost the hold; cut short after two generations, the rewrite's own ids ended
//! it). A failed write of it fails the snapshot, which is tried again (review r40p D3).
//!
//! Crash-safe rewrite: a snapshot (every start, and after a failed write) writes the window's
//! generations newest first, each under a temporary name, fsync'd, renamed into place under
//! the numbers after the old ones, and the directory fsync'd, before the next; the old files
//! are removed only once the whole window is in place. A kill -9 or a power loss at any
//! step leaves the newest part of the window under the highest numbers and the old files
//! holding all of it, so the next start reads the same ids in the same order (before, the
//! oldest quarter was written first under the highest number: a crash then made the newest
//! ids the first to leave the window). Each generation of a snapshot starts with the head of
//! the whole window (the spool as the start found it), which is true only once all of them
//! are in place: so a rewrite mark ([`RewriteMark`], `<spool>/dedup/rewrite`) names the
//! snapshot's numbers, durable before its first rename and removed (the folder fsync'd) once
//! the old files are; a start that finds some of them missing uses their ids but none of
//! their heads (review r40t D1: a window refilled from the spool's lines, its rewrite cut
//! after the newest generation, made the next start take every line of the spool as covered
//! and reload only that generation's ids). The lengths then come from the generations before
//! the snapshot, which it left as they were, or, with none, every line of the spool is newer
//! than the journal: the start reloads what the one before it reloaded. Nor does a start
//! remove a generation that says where the journal's knowledge of the spool ends because it
//! gave no id (its ids are newer elsewhere): only the snapshot that replaces it does. The
//! mark of snapshots cut short in a row names the lowest number any of them wrote, so a
//! crash loop trusts none of them. A mark whose snapshot is all in place is finished by the
//! next start (the generations before it removed), and one with a generation numbered after
//! its snapshot is of no use (the journal went on after it).

//! A failed write (a full disk) never fails a request: its events are in their segment. The
//! journal is then behind: appends stop, a WARN and `rhc_dedup_journal_failures_total{what=
//! "write"}` say so, and the next seal writes the whole window as new generations instead (at
//! most once every [`RETRY_AFTER`], except at shutdown, whose final seals always try:
//! [`Journal::retry_now`]). Until that succeeds, a resend after a restart of events
//! whose segments were uploaded in the meantime may be stored twice.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::metrics as m;
use crate::util::dedup::PassThrough;
use crate::util::fs::fsync_dir;

mod format;

use format::*;

/// Most ids held beyond the window that a start reads back ([`Loaded::held`]): as many as a
/// start reloads from the spool's lines at most (`recovery::ids::MAX_UNRECORDED_IDS`).
const MAX_HELD_IDS: usize = 1 << 18;

/// Below the spool dir: the generations of the ids journal.
pub(super) const JOURNAL_DIR: &str = "dedup";

/// A generation is full at this share of the window: the journal keeps a whole window plus at
/// most one generation (and one group) beyond it, so 1.25 windows on disk.
const GENERATIONS_PER_WINDOW: usize = 4;

/// A generation holds at least this many ids, so a small window does not start a new file
/// every few groups.
const MIN_GENERATION_IDS: usize = 4096;

/// After a failed write, a new snapshot of the window is tried at most this often (each try
/// writes the whole window, up to a few MiB, which a full disk refuses again).
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// File name prefix of a generation; its number follows, 20 digits.
const PREFIX: &str = "ids-";

/// Appended to a generation's name while a snapshot writes it: such a file is never read, and
/// a start removes it (a crash cut that snapshot). The binaries before it leave it alone.
const TMP_SUFFIX: &str = ".tmp";

/// The journal of one spool, owned by the writer thread.
pub(super) struct Journal {
    dir: PathBuf,
    /// `--dedup-window`; 0 turns the journal off (nothing read, nothing written).
    window: usize,
    /// A generation is full at this many ids.
    generation_ids: usize,
    /// Generations on disk, oldest first: (number, ids in it).
    generations: VecDeque<(u64, usize)>,
    /// The number the next new generation takes: after every generation-like name seen in
    /// the folder (ours, a `.tmp` one, or a foreign entry the journal cannot remove), so a
    /// rename or create never lands on a name it cannot use.
    next: u64,
    /// The newest generation, open for appends; `None` while behind.
    current: Option<File>,
    /// Its length: a failed append is cut back to it.
    current_len: u64,
    /// Full generations appended to since the last sync: (number, file).
    unsynced: Vec<(u64, File)>,
    /// A generation was created since the last sync (its directory entry is not durable).
    dir_dirty: bool,
    /// Appended since the last sync.
    dirty: bool,
    /// A write failed: appends stop until a snapshot of the window succeeds.
    behind: bool,
    /// The hold file still holds two holds (its rewrite with one failed): tried again at
    /// each sync (review r40r D2: a failure was never retried, and a downgrade after a clean
    /// shutdown dropped the hold).
    hold_rewrite_due: bool,
    /// The failure of that rewrite was logged.
    hold_rewrite_due_logged: bool,
    /// Ids answered (appended, or not appended while behind) since the journal was last
    /// made durable: a power loss can take their records, so a start reloads them from the
    /// spool's lines. Kept under a quarter of the window ([`Journal::due_for_sync`]); a
    /// start reloads them all, whatever their order across files and whatever window it
    /// runs with (`recovery::ids::unrecorded_limit`).
    unsynced_ids: usize,
    /// While the window holds ids a start reloaded in no known order
    /// ([`crate::util::dedup::DedupWindow::hold`]): how many, and how many ids were
    /// appended after them (fewer than the window). Generations that hold them are not
    /// removed before that ([`Journal::rotate`]).
    hold: Option<(usize, usize)>,
    /// The hold a start reads from the journal as it is on disk now (the hold file's entry
    /// whose generation is there): kept as [`HoldFile::before`] by the next snapshot's hold
    /// file, which a start uses until that snapshot's newest generation is in place.
    disk_hold: Option<Hold>,
    /// While a snapshot cut short may have left generations in the folder (its rewrite mark
    /// says so, or a snapshot failed after writing its mark): the lowest number they can
    /// have, [`RewriteMark::from`] of the next snapshot's mark. `None` once a snapshot
    /// completed.
    unfinished_from: Option<u64>,
    last_try: Option<Instant>,
    buf: Vec<u8>,
    /// Unit tests: a snapshot stops (as a crash would) after this many new generations.
    #[cfg(test)]
    stop_after: Option<usize>,
    /// Unit tests: a snapshot stops (as a crash would) at this step of its rewrite
    /// ([`Journal::crash_here`]), counted from 0.
    #[cfg(test)]
    crash_at_step: Option<usize>,
    /// Unit tests: the steps of the current snapshot passed so far.
    #[cfg(test)]
    steps: usize,
}

/// What a start found in the journal.
#[derive(Debug, Default)]
pub(super) struct Loaded {
    /// The newest distinct ids, oldest first: at most the window, or the ids a start before
    /// held and those after them ([`Loaded::held`]).
    pub(super) ids: Vec<u64>,
    /// How many of the newest [`Loaded::ids`], before the last [`Loaded::after`], the window
    /// must hold again, whatever its capacity: a start before reloaded them in no known order,
    /// and fewer than a window of ids was accepted after them ([`Hold`], review r40n D1).
    pub(super) held: usize,
    /// The newest ids, accepted after the held ones (fewer than the window): they count
    /// towards ending the hold (review r40o D2: taken as held too, a crash loop's new ids
    /// kept a hold from ever ending).
    pub(super) after: usize,
    /// What the generations read say of the spool's files; `None` when none of them has a
    /// head (a journal of format 1, written by the binaries before, or no journal).
    pub(super) lengths: Option<Lengths>,
    /// Files (or their tails) discarded as damaged.
    pub(super) damaged: usize,
    /// The last rewrite of the journal was cut short (a crash during a snapshot), and
    /// generations it wrote were read: what they say of the spool's files is not used
    /// (review r40t D1).
    pub(super) unfinished: bool,
    /// No generation was found: the journal knows nothing of the spool (a lost `dedup/`
    /// folder, or the first start after a binary that kept none); [`Loaded::lengths`] is
    /// then empty, every line newer than the journal.
    pub(super) no_journal: bool,
    /// Bytes of generations read (at most [`MAX_BYTES_READ_AT_START`]).
    pub(super) bytes_read: u64,
    /// The latest modification time of the files that gave ids: when the journal was last
    /// written (the kernel's coarse clock, never later than the write itself). Only a journal
    /// of format 1 needs it ([`super::recovery`]).
    pub(super) modified: Option<SystemTime>,
}

/// Where the journal's knowledge of the spool's files ends: a file's lines up to its length
/// here are those of groups whose ids the journal holds (or that left the window); the lines
/// after it, and every line of a file numbered above [`Lengths::last_n`], were stored after
/// the journal's last record read (groups in flight at a crash, or answered just before a
/// power loss took the journal's last records).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Lengths {
    /// The highest file number (creation number, [`super::segments::Segments::next_n`]) the
    /// journal read knows of.
    pub(super) last_n: u64,
    /// Per file number, its durable length in the newest record that names it.
    pub(super) files: HashMap<u64, u64, PassThrough>,
}

impl Lengths {
    /// Where the lines of the spool file numbered `n` stop being covered by the journal:
    /// the length it gives the file, 0 for a file numbered after the newest it knows of
    /// (every line newer), `None` for a file it knows of without a length (sealed, or quiet
    /// since before the generations read: no line newer).
    pub(super) fn unrecorded_from(&self, n: u64) -> Option<u64> {
        match self.files.get(&n) {
            Some(&len) => Some(len),
            None if n > self.last_n => Some(0),
            None => None,
        }
    }

    fn apply(&mut self, fact: Fact) {
        match fact {
            Fact::Last(n) => self.last_n = self.last_n.max(n),
            Fact::Len(n, len) => {
                self.last_n = self.last_n.max(n);
                self.files.insert(n, len);
            }
        }
    }
}

/// The state of the spool's files a generation starts with: the writer's last creation
/// number and the durable length of every open segment.
#[derive(Debug, Default, Clone)]
pub(super) struct Head {
    pub(super) last_n: u64,
    pub(super) files: Vec<(u64, u64)>,
}

impl Journal {
    /// Reads the journal in `spool/dedup` (creating the folder if needed): the newest
    /// `window` distinct ids, oldest first. Never fails: what cannot be read is reported and
    /// left out. The journal is behind until [`Journal::snapshot`] has written the window.
    pub(super) fn open(spool: &Path, window: usize) -> (Journal, Loaded) {
        let dir = spool.join(JOURNAL_DIR);
        let mut journal = Journal {
            dir,
            window,
            generation_ids: (window / GENERATIONS_PER_WINDOW).max(MIN_GENERATION_IDS),
            generations: VecDeque::new(),
            next: 1,
            current: None,
            current_len: 0,
            unsynced: Vec::new(),
            dir_dirty: false,
            dirty: false,
            behind: true,
            hold_rewrite_due: false,
            hold_rewrite_due_logged: false,
            unsynced_ids: 0,
            hold: None,
            disk_hold: None,
            unfinished_from: None,
            last_try: None,
            buf: Vec::new(),
            #[cfg(test)]
            stop_after: None,
            #[cfg(test)]
            crash_at_step: None,
            #[cfg(test)]
            steps: 0,
        };
        if window == 0 {
            return (journal, Loaded::default());
        }
        if let Err(e) = fs::create_dir_all(&journal.dir) {
            write_failed("creating", &journal.dir, &e);
            return (journal, Loaded::default());
        }
        let loaded = journal.load();
        (journal, loaded)
    }

    fn load(&mut self) -> Loaded {
        self.load_within(MAX_BYTES_READ_AT_START)
    }

    /// [`Journal::load`], reading at most `budget` bytes of generations.
    fn load_within(&mut self, budget: u64) -> Loaded {
        let mut loaded = Loaded::default();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not list the ids journal; a resend after this restart of events uploaded before it may be stored twice");
                return loaded;
            }
        };
        let mut numbers: Vec<u64> = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_str();
            let tmp = name
                .and_then(|n| n.strip_suffix(TMP_SUFFIX))
                .and_then(generation_number);
            let number = name.and_then(generation_number);
            // Only regular files are read or removed: a FIFO would block the start, a
            // directory or a link is not one the journal wrote. Only theirs count for the
            // numbering ([`counts_for_numbering`]); a new generation never lands on another
            // entry's name ([`Journal::free_numbers`]).
            let regular = entry.file_type().is_ok_and(|t| t.is_file());
            if let Some(n) = number
                .or(tmp)
                .filter(|&n| regular && counts_for_numbering(n))
            {
                self.next = self.next.max(n + 1);
            }
            if (number.is_some() || tmp.is_some()) && !regular {
                tracing::warn!(path = %entry.path().display(), "an entry in the ids journal's folder named like a generation is not a regular file; left alone, and no new generation takes its name");
            } else if let Some(n) = number {
                numbers.push(n);
            } else if tmp.is_some() {
                // A generation a snapshot was writing when the process stopped: the older
                // files still hold its ids.
                let _ = fs::remove_file(entry.path());
            } else if name == Some(HOLD_FILE) {
                // Read below ([`Journal::read_hold`]).
            } else if name == Some(REWRITE_FILE) {
                // Read below ([`Journal::read_rewrite`]).
            } else if name == Some(&format!("{HOLD_FILE}{TMP_SUFFIX}"))
                || name == Some(&format!("{REWRITE_FILE}{TMP_SUFFIX}"))
            {
                // A hold or a rewrite mark a snapshot was writing when the process stopped.
                let _ = fs::remove_file(entry.path());
            } else {
                tracing::warn!(path = %entry.path().display(), "unknown file in the ids journal's folder; left alone");
            }
        }
        numbers.sort_unstable();
        // No generation at all, with files in the spool: a lost `dedup/` folder, or the first
        // start after a binary that kept no journal. The journal then knows nothing of the
        // spool, so every line of it is newer than the journal: its ids are reloaded newest
        // first as the files' times tell (`recovery::ids::newest_by_time`), up to four default
        // windows, and all held, as after a cut snapshot with nothing before it. (Taken as a
        // journal of format 1, the files were read one after another by their modification
        // times into the window alone: 3,856 of the newest 200,000 ids resent after a lost
        // `dedup/` with 300,000 ids in three partitions and a window of 262,144 were stored
        // twice, review r40v.)
        let no_generation = numbers.is_empty();
        // A snapshot cut short (review r40t D1): its generations hold the newest part of the
        // window it was writing, and their ids are read as before; but their heads, written
        // whole in each of them, cover lines of the spool whose ids are in its generations
        // never written, so no generation numbered from the mark's `from` on says anything of
        // the files: the lengths come from the generations before it, which the snapshot left
        // as they were (or, with none, every line of the spool is newer than the journal), as
        // the start that wrote it found them. A snapshot that did complete (a crash before its
        // mark was removed) is finished: the generations before it are removed unread, as it
        // would have done.
        let untrusted_from = self.unfinished_rewrite(&mut numbers);
        self.unfinished_from = untrusted_from;
        let trusted = |n: u64| untrusted_from.is_none_or(|from| n < from);
        // Each file's ids in order; files newest first, so that reading can stop once the
        // window is full of distinct ids.
        let mut seen: HashSet<u64, PassThrough> = HashSet::default();
        let mut newest_first: Vec<u64> = Vec::new();
        // What the generations read say of the files, newest generation first: (number,
        // what it holds, its ids taken out).
        let mut facts: Vec<(u64, Generation)> = Vec::new();
        // Generations that hold ids of the window, or what it says of the files; the others
        // are removed below.
        let mut kept: Vec<u64> = Vec::new();
        // How many ids to read: the window, or more for a hold ([`Hold`]).
        let mut wanted = self.window;
        // The hold of the snapshot that wrote the file, when its newest generation is there;
        // else the one before it (that snapshot was cut short before its first rename, or
        // its files were removed again after a failed write): the journal is then as that
        // one left it (review r40p D1, D2).
        let has = |h: &Hold| numbers.binary_search(&h.generation).is_ok();
        let hold = self
            .read_hold()
            .and_then(|f| {
                if has(&f.now) {
                    Some(f.now)
                } else {
                    f.before.filter(has)
                }
            })
            .filter(|h| h.held > 0);
        self.disk_hold = hold;
        for &n in numbers.iter().rev() {
            if newest_first.len() >= wanted {
                break;
            }
            let path = self.path_of(n);
            let left = budget - loaded.bytes_read;
            let (mut generation, mut damage, mut read) = read_generation(&path, wanted, left);
            // The snapshot that wrote the hold: the ids appended to its newest generation
            // since, and every id of the newer ones, were accepted after the held ones.
            if let Some(mark) = hold.filter(|h| h.generation == n) {
                let after = (newest_first.len() as u64)
                    .saturating_add(generation.total_ids.saturating_sub(mark.snapshot_ids))
                    .saturating_add(mark.inserted);
                if after < self.window as u64 {
                    let after = after as usize;
                    let held = (mark.held as usize).min(MAX_HELD_IDS + self.window - after);
                    let need = after + held;
                    (loaded.held, loaded.after) = (held, after);
                    if need > wanted {
                        let kept_all = generation.ids.len() < wanted;
                        wanted = need;
                        if !kept_all {
                            // It was read for fewer ids than it may hold: again, for all.
                            (generation, damage, read) = read_generation(&path, wanted, left);
                        }
                    }
                }
            }
            loaded.bytes_read += read;
            if let Some(why) = damage {
                generation.damaged = true;
                loaded.damaged += 1;
                m::dedup_journal_failure("damaged");
                tracing::warn!(path = %path.display(), ids_kept = generation.ids.len(), reason = %why, "damaged ids journal file: the rest of it is discarded; a resend of those events after this restart may be stored twice");
            }
            let before = newest_first.len();
            for &id in generation.ids.iter().rev() {
                if newest_first.len() >= wanted {
                    break;
                }
                if seen.insert(id) {
                    newest_first.push(id);
                }
            }
            // A generation read that says something of the files (one just started, its head
            // alone; or one whose ids are all newer elsewhere) is kept for that, unless a cut
            // snapshot wrote it: the lengths of the next start must be those of this one
            // (review r40t D1: a generation removed here because it gave no id was the one
            // whose head told the start that the spool's lines were newer than the journal).
            if newest_first.len() > before || (trusted(n) && !generation.facts.is_empty()) {
                kept.push(n);
                if let Ok(t) = fs::symlink_metadata(&path).and_then(|m| m.modified()) {
                    loaded.modified = loaded.modified.max(Some(t));
                }
            }
            // Its ids are in the window now; what it says of the files is kept.
            generation.ids = Vec::new();
            facts.push((n, generation));
        }
        // A file that gave no id to the window (all of them newer elsewhere, or older than
        // the window), and says nothing of the files a start uses, changes nothing a start
        // reads: removed now, so that starts cut short during their snapshot (a crash loop)
        // cannot pile files up.
        for &n in &numbers {
            if !kept.contains(&n) {
                let _ = fs::remove_file(self.path_of(n));
            }
        }
        let untrusted_read = facts.iter().any(|(n, g)| !trusted(*n) && !g.v1);
        loaded.unfinished = untrusted_read;
        loaded.lengths = chain_lengths(facts.into_iter().rev().filter(|(n, _)| trusted(*n)));
        loaded.no_journal = no_generation;
        if (untrusted_read || no_generation) && loaded.lengths.is_none() {
            // Ids of a cut snapshot, and nothing before it that says where the journal's
            // knowledge of the spool ends, or no journal at all: every line of the spool is
            // newer than the journal.
            loaded.lengths = Some(Lengths::default());
        }
        if untrusted_read {
            tracing::info!(dir = %self.dir.display(), "the last rewrite of the ids journal was cut short (a crash while a start wrote it): the spool's lines it covered are reloaded as newer than the journal");
        }
        // The kept ones are replaced by the start's snapshot.
        kept.sort_unstable();
        self.generations = kept.into_iter().map(|n| (n, 0)).collect();
        // Fewer read than the hold said (a generation lost or damaged): the newest first.
        loaded.after = loaded.after.min(newest_first.len());
        loaded.held = loaded.held.min(newest_first.len() - loaded.after);
        newest_first.reverse();
        loaded.ids = newest_first;
        loaded
    }

    /// The hold file, if it holds a whole one. A file that is not one (cut, damaged, not a
    /// regular file) is reported like a damaged generation, and left out: a start then holds
    /// no ids beyond its window (review r40p D4: it was left out silently).
    fn read_hold(&self) -> Option<HoldFile> {
        use std::io::Read as _;
        let path = self.dir.join(HOLD_FILE);
        // Only a regular file, and only as much as a hold file takes.
        let read = open_regular(&path).and_then(|(f, len)| {
            if len > MAX_HOLD_FILE_BYTES {
                return Err(io::Error::other("longer than a hold file"));
            }
            let mut bytes = Vec::new();
            f.take(MAX_HOLD_FILE_BYTES).read_to_end(&mut bytes)?;
            Ok(bytes)
        });
        let why = match read.map(|bytes| HoldFile::decode(&bytes)) {
            Ok(Some(file)) => return Some(file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Ok(None) => "not a whole hold (cut short, or a failed check)".to_string(),
            Err(e) => e.to_string(),
        };
        m::dedup_journal_failure("damaged");
        tracing::warn!(path = %path.display(), reason = %why, "damaged hold file beside the ids journal: ignored; ids a start before held beyond its window are held no more, and a resend of their events after this restart may be stored twice");
        None
    }

    /// Writes `file` as the hold file ([`Journal::write_small`]). A directory under its
    /// name is reported and the file is left unwritten (a start then holds no ids beyond its
    /// window).
    fn write_hold(&self, file: &HoldFile) -> io::Result<()> {
        self.write_small(HOLD_FILE, &file.encode(), "a directory is named like the hold file beside the ids journal: no hold written, so a restart before a window of new ids holds only its window of the ids reloaded")
    }

    /// Writes `bytes` as the file `name` beside the generations: under a temporary name,
    /// fsync'd, renamed into place, the folder fsync'd. A directory under either name (not
    /// one the journal wrote, and that it cannot replace) is reported with `if_dir` and the
    /// file is left unwritten; any other failure is returned.
    fn write_small(&self, name: &str, bytes: &[u8], if_dir: &'static str) -> io::Result<()> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}{TMP_SUFFIX}"));
        let is_dir = |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
        if is_dir(&path) || is_dir(&tmp) {
            tracing::warn!(dir = %self.dir.display(), "{if_dir}");
            return Ok(());
        }
        // A link or a FIFO left under the temporary name is replaced, never written through.
        let _ = fs::remove_file(&tmp);
        let written = open_for_write(&tmp)
            .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_data()))
            .and_then(|()| fs::rename(&tmp, &path))
            .and_then(|()| fsync_dir(&self.dir));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// The rewrite mark, if it holds a whole one ([`RewriteMark`]). One that is not (it is
    /// renamed into place whole: not ours, or damaged) is reported like a damaged generation
    /// and left out: a rewrite cut short is then not told apart.
    fn read_rewrite(&self) -> Option<RewriteMark> {
        use std::io::Read as _;
        let path = self.dir.join(REWRITE_FILE);
        let read = open_regular(&path).and_then(|(f, len)| {
            if len > MAX_REWRITE_FILE_BYTES {
                return Err(io::Error::other("longer than a rewrite mark"));
            }
            let mut bytes = Vec::new();
            f.take(MAX_REWRITE_FILE_BYTES).read_to_end(&mut bytes)?;
            Ok(bytes)
        });
        let why = match read.map(|bytes| RewriteMark::decode(&bytes)) {
            Ok(Some(mark)) => return Some(mark),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Ok(None) => "not a whole rewrite mark (a failed check)".to_string(),
            Err(e) => e.to_string(),
        };
        m::dedup_journal_failure("damaged");
        tracing::warn!(path = %path.display(), reason = %why, "damaged rewrite mark beside the ids journal: ignored; if the last rewrite of the journal was cut short, a resend after this restart of events whose ids it did not write yet may be stored twice");
        None
    }

    /// What the rewrite mark says of the generations `numbers` (sorted): the number from
    /// which they were written by a snapshot that did not complete (their heads are not
    /// used), if one did not. A snapshot that completed but whose mark was not removed yet
    /// is finished here: the generations before it are removed (and taken out of `numbers`).
    /// A mark with a generation numbered above its snapshot is of no use (the journal went
    /// on after that snapshot completed; a foreign file named above [`NUMBERING_LIMIT`] does
    /// not count).
    fn unfinished_rewrite(&self, numbers: &mut Vec<u64>) -> Option<u64> {
        let mark = self.read_rewrite()?;
        // Only a generation the journal numbered can be one it wrote after the mark (a file
        // named above [`NUMBERING_LIMIT`] never moves the numbering).
        if numbers
            .iter()
            .any(|&n| n > mark.top && counts_for_numbering(n))
        {
            return None;
        }
        let present = numbers.partition_point(|&n| n <= mark.top)
            - numbers.partition_point(|&n| n < mark.first);
        let complete = (mark.top - mark.first).checked_add(1) == Some(present as u64);
        if !complete {
            return Some(mark.from);
        }
        numbers.retain(|&n| {
            if n < mark.first {
                let _ = fs::remove_file(self.path_of(n));
                false
            } else {
                true
            }
        });
        None
    }

    fn path_of(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{PREFIX}{n:020}"))
    }

    /// Where generation `n` of a snapshot is written before it is renamed into place.
    fn tmp_path_of(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{PREFIX}{n:020}{TMP_SUFFIX}"))
    }

    /// True when the next [`Journal::sync`] wants the window's ids (a snapshot), and so
    /// nothing may be in flight then: the ids must be those of answered groups only.
    pub(super) fn wants_snapshot(&self) -> bool {
        self.window != 0 && self.behind && self.last_try.is_none_or(|t| t.elapsed() >= RETRY_AFTER)
    }

    /// True when a quarter of the window ([`GENERATIONS_PER_WINDOW`]) was answered since the
    /// journal was last made durable, and the caller should make it durable now
    /// ([`super::writer::Writer::sync_journal`]): one `fdatasync` per quarter window of ids
    /// (or a snapshot, when behind and [`Journal::wants_snapshot`]). So after a power loss
    /// (or a failed write) the ids a start must reload from the spool's lines, whose order
    /// across files nothing durable records, are at most a quarter window (review r40i D1),
    /// or one request holding more: the writer also syncs before writing a group that would
    /// take them past it (review r40j D2: a large group after a smaller one made more than a
    /// window). A start reloads them all, even with a smaller `--dedup-window` (they stay
    /// until a window of new ids was accepted), and the journal's newest ids fill the rest.
    pub(super) fn due_for_sync(&self) -> bool {
        self.syncs_now() && self.unsynced_ids >= self.sync_every()
    }

    /// The ids answered between two syncs at most, a quarter of the window (0 when the
    /// window is off): the writer also syncs before a group that would take the ids not
    /// yet durable here past it ([`Journal::unsynced_ids`], review r40j D2).
    pub(super) fn sync_every(&self) -> usize {
        if self.window == 0 {
            0
        } else {
            (self.window / GENERATIONS_PER_WINDOW).max(1)
        }
    }

    /// Ids answered since the journal was last made durable.
    pub(super) fn unsynced_ids(&self) -> usize {
        self.unsynced_ids
    }

    /// True when [`super::writer::Writer::sync_journal`] would make the journal durable
    /// now: not while it is behind and waiting for its next try.
    pub(super) fn syncs_now(&self) -> bool {
        self.window != 0 && (!self.behind || self.wants_snapshot())
    }

    /// The next [`Journal::wants_snapshot`] holds at once, whatever the last try: the final
    /// seal at shutdown tries a journal that is behind again (review r40i D3: a SIGTERM within
    /// [`RETRY_AFTER`] of a failed write left it unwritten although the disk had room).
    pub(super) fn retry_now(&mut self) {
        self.last_try = None;
    }

    /// Writes `ids` (the window, oldest first: ids of answered groups only) as new
    /// generations, then removes every older generation. On failure the files written are
    /// removed again, the older ones stay, and the journal stays behind (reported).
    ///
    /// Crash-safe at every step: the new generations take the numbers after the old ones
    /// (the oldest quarter the lowest), but they are written newest first, each under a
    /// temporary name ([`TMP_SUFFIX`]), fsync'd, renamed into place and the directory fsync'd
    /// before the next one. So a crash at any moment leaves the old generations plus the
    /// newest part of the window under the highest numbers, in order: a start reads the same
    /// window back in the same order (the old files supply the rest), and removes what is
    /// left over ([`Journal::open`]). The rewrite mark ([`RewriteMark`]) is durable before the
    /// first rename, and removed once the old generations are: until then a start uses none
    /// of the new generations' heads (review r40t D1).
    ///
    /// `hold`: while the window holds ids a start reloaded in no known order, how many, and
    /// how many ids were accepted after them ([`crate::util::dedup::DedupWindow::hold`]);
    /// recorded in the hold file ([`Hold`]), so that a start before a window of new ids holds
    /// them again.
    pub(super) fn snapshot(&mut self, ids: &[u64], head: &Head, hold: Option<(usize, usize)>) {
        if self.window == 0 {
            return;
        }
        self.last_try = Some(Instant::now());
        let old: Vec<u64> = self.generations.iter().map(|(n, _)| *n).collect();
        // After every name in the folder, not only after the generations kept: an entry the
        // journal cannot remove (a directory, say) must never be the target of a rename, or
        // every retry would fail on it again.
        self.number_after_every_name();
        let chunks: Vec<&[u64]> = if ids.is_empty() {
            vec![&[][..]]
        } else {
            ids.chunks(self.generation_ids).collect()
        };
        let first = self.free_numbers(self.next, chunks.len() as u64);
        // The hold, named after the newest generation of this snapshot and its ids (a start
        // counts every id appended after them as accepted after the held ones).
        let top = first + chunks.len() as u64 - 1;
        let new_hold = hold
            .filter(|&(held, inserted)| held > 0 && inserted < self.window)
            .map(|(held, inserted)| Hold {
                generation: top,
                snapshot_ids: chunks.last().map_or(0, |c| c.len()) as u64,
                held: held as u64,
                inserted: inserted as u64,
            });
        // The generations of snapshots cut short before this one are numbered from the
        // lowest of them on, or from this one's first.
        let mark = RewriteMark {
            from: self.unfinished_from.map_or(first, |from| from.min(first)),
            first,
            top,
        };
        #[cfg(test)]
        {
            self.steps = 0;
        }
        // (number, ids in it), newest first as written.
        let mut written: Vec<(u64, usize)> = Vec::new();
        let mut newest: Option<(File, u64)> = None;
        let result = (|| -> io::Result<()> {
            // The hold is durable before any generation is renamed into place (review r40p
            // D1, D2): until the newest one is, a start uses the hold before it, which the
            // journal still is as it describes. A failed write fails the snapshot (review
            // r40p D3: the journal stays behind, and the next seal, or the last one at
            // shutdown, tries again).
            if let Some(now) = new_hold {
                self.write_hold(&HoldFile {
                    now,
                    before: self.disk_hold,
                })?;
            }
            #[cfg(test)]
            self.crash_here()?;
            // The rewrite mark is durable before any generation is renamed into place too
            // (review r40t D1): until all of them are, a start uses none of their heads.
            self.write_small(REWRITE_FILE, &mark.encode(), "a directory is named like the rewrite mark beside the ids journal: no mark written, so a crash during this rewrite can make the next start take the spool's lines as covered by the journal")?;
            #[cfg(test)]
            self.crash_here()?;
            for (i, chunk) in chunks.iter().enumerate().rev() {
                let n = first + i as u64;
                #[cfg(test)]
                if self.stop_after == Some(written.len()) {
                    return Err(io::Error::other("stopped by the test"));
                }
                let tmp = self.tmp_path_of(n);
                let mut f = open_for_write(&tmp)?;
                self.buf.clear();
                self.buf.extend_from_slice(MAGIC);
                encode_head(&mut self.buf, head);
                f.write_all(&self.buf)?;
                let mut len = self.buf.len() as u64;
                // A block at a time: memory stays at one block whatever the window.
                for block in chunk.chunks(MAX_BLOCK_IDS) {
                    self.buf.clear();
                    encode_blocks(&mut self.buf, KIND_IDS, block);
                    f.write_all(&self.buf)?;
                    len += self.buf.len() as u64;
                }
                if i + 1 < chunks.len() {
                    // Not the newest: complete, as a rotated generation is.
                    self.buf.clear();
                    encode_blocks(&mut self.buf, KIND_END, &[0]);
                    f.write_all(&self.buf)?;
                    len += self.buf.len() as u64;
                }
                f.sync_data()?;
                #[cfg(test)]
                self.crash_here()?;
                fs::rename(&tmp, self.path_of(n))?;
                written.push((n, chunk.len()));
                #[cfg(test)]
                self.crash_here()?;
                fsync_dir(&self.dir)?;
                #[cfg(test)]
                self.crash_here()?;
                if newest.is_none() {
                    newest = Some((f, len));
                }
            }
            Ok(())
        })();
        self.buf = Vec::new();
        // Those numbers are used (or were tried): never again, whatever the outcome.
        self.next = first + chunks.len() as u64;
        match result {
            Ok(()) => {
                // The new generations hold the whole window and are read first: the old ones
                // are not read any more, so removing them needs no sync (a crash leaves them
                // to the next start, which removes them unread: the mark names a complete
                // snapshot).
                for n in old {
                    let _ = fs::remove_file(self.path_of(n));
                }
                #[cfg(test)]
                if self.crash_here().is_err() {
                    return;
                }
                // Then the mark, durably, before anything is appended: a generation of this
                // snapshot may be removed by a rotation from then on. (Were the removal lost,
                // the mark is of no use once a rotation made a generation above it.)
                if fs::remove_file(self.dir.join(REWRITE_FILE)).is_ok() {
                    let _ = fsync_dir(&self.dir);
                }
                self.unfinished_from = None;
                #[cfg(test)]
                if self.crash_here().is_err() {
                    return;
                }
                // The hold before is of no use now that the new generations are all in
                // place: the file is written again with this snapshot's hold alone, the form
                // the binaries before this one read (review r40q D1: a file of two holds was
                // unreadable to them, which dropped the hold for good after a downgrade). A
                // crash first leaves the file of two, which this binary reads the same.
                self.hold_rewrite_due = new_hold.is_some() && self.disk_hold.is_some();
                if let Some(now) = new_hold.filter(|_| self.hold_rewrite_due) {
                    self.rewrite_hold(now);
                }
                written.reverse();
                self.generations = written.into_iter().collect();
                let (file, len) = newest.unzip();
                self.current = file;
                self.current_len = len.unwrap_or(0);
                self.unsynced.clear();
                self.dir_dirty = false;
                self.dirty = false;
                self.behind = false;
                self.unsynced_ids = 0;
                self.hold = new_hold.map(|h| (h.held as usize, h.inserted as usize));
                if new_hold.is_none() {
                    // No hold now: the file's, if any, names what was just removed.
                    if fs::remove_file(self.dir.join(HOLD_FILE)).is_ok() {
                        let _ = fsync_dir(&self.dir);
                    }
                }
                self.disk_hold = new_hold;
            }
            Err(e) => {
                #[cfg(test)]
                if self.stop_after.is_some() || self.crash_at_step.is_some() {
                    // A crash: nothing is cleaned up.
                    return;
                }
                // Its mark may be in place: the generations of this snapshot (removed now)
                // and of those before it that were cut short stay untrusted.
                self.unfinished_from = Some(mark.from);
                for i in 0..chunks.len() {
                    let n = first + i as u64;
                    let _ = fs::remove_file(self.tmp_path_of(n));
                    if written.iter().any(|w| w.0 == n) {
                        let _ = fs::remove_file(self.path_of(n));
                    }
                }
                write_failed("writing a snapshot of the window to", &self.dir, &e);
            }
        }
    }

    /// Appends the record of a group that was just made durable (page cache only; see
    /// [`Journal::sync`]): its ids, then `files`, (file number, durable length) of each file
    /// it wrote lines with ids into. The ids come first, so that a record cut short by a
    /// crash never gives a length without the ids of the lines before it. When the
    /// generation is full, the next one starts with `head()`. A failure is reported and
    /// makes the journal behind.
    pub(super) fn append(
        &mut self,
        ids: &[u64],
        files: &[(u64, u64)],
        head: impl FnOnce() -> Head,
    ) {
        self.unsynced_ids = self.unsynced_ids.saturating_add(ids.len());
        if ids.is_empty() || self.behind {
            return;
        }
        if let Some((held, inserted)) = self.hold {
            let inserted = inserted.saturating_add(ids.len());
            self.hold = (inserted < self.window).then_some((held, inserted));
        }
        let Some(f) = self.current.as_mut() else {
            return;
        };
        self.buf.clear();
        encode_blocks(&mut self.buf, KIND_IDS, ids);
        encode_pairs(&mut self.buf, files);
        if let Err(e) = f.write_all(&self.buf) {
            // Cut back what part of it was written, so the next generation's reader does not
            // stop at a damaged block before later ones; the journal is behind either way.
            let _ = f.set_len(self.current_len);
            self.fall_behind("appending to", &e);
            return;
        }
        self.current_len += self.buf.len() as u64;
        self.dirty = true;
        if let Some(g) = self.generations.back_mut() {
            g.1 += ids.len();
            if g.1 >= self.generation_ids {
                self.rotate(&head());
            }
        }
        if self.buf.capacity() > 2 * MAX_BLOCK_IDS * 8 {
            self.buf = Vec::new();
        }
    }

    /// The newest generation is full: it gets its end block, then the next one is created,
    /// starting with `head`, and the oldest removed while the newer ones hold a whole window
    /// (their ids have left the window). Nothing is synced here, on the writer's path: the
    /// full generation, the new one and its entry are synced by the next [`Journal::sync`],
    /// before any segment leaves the spool; until then the ids appended since the last sync
    /// are in segments still in the spool anyway. A power loss that takes the end of the full
    /// generation but keeps some of the new one is told by the missing end block
    /// ([`KIND_END`]): a start then uses no length of the newer generations.
    fn rotate(&mut self, head: &Head) {
        self.buf.clear();
        encode_blocks(&mut self.buf, KIND_END, &[0]);
        if let Some(f) = self.current.as_mut() {
            if let Err(e) = f.write_all(&self.buf) {
                let _ = f.set_len(self.current_len);
                self.fall_behind("ending a full generation of", &e);
                return;
            }
        }
        if let Some((full_n, full)) = self
            .generations
            .back()
            .map(|g| g.0)
            .zip(self.current.take())
        {
            self.unsynced.push((full_n, full));
        }
        let n = self.free_numbers(self.next, 1);
        self.next = n + 1;
        let path = self.path_of(n);
        self.buf.clear();
        self.buf.extend_from_slice(MAGIC);
        encode_head(&mut self.buf, head);
        let created = open_for_write(&path).and_then(|mut f| f.write_all(&self.buf).map(|()| f));
        match created {
            Ok(f) => {
                self.current = Some(f);
                self.current_len = self.buf.len() as u64;
                self.dir_dirty = true;
                self.generations.push_back((n, 0));
                // While a hold lasts, the generations of the ids held are kept too.
                let keep = self.window + self.hold.map_or(0, |(held, _)| held);
                loop {
                    let newer: usize = self.generations.iter().skip(1).map(|g| g.1).sum();
                    if newer < keep || self.generations.len() < 2 {
                        break;
                    }
                    if let Some((old, _)) = self.generations.pop_front() {
                        self.unsynced.retain(|(u, _)| *u != old);
                        let _ = fs::remove_file(self.path_of(old));
                    }
                }
            }
            Err(e) => {
                let _ = fs::remove_file(&path);
                self.fall_behind("starting a new generation of", &e);
            }
        }
    }

    /// Makes every append durable (the generations written since the last sync, and their
    /// directory entries): before a segment is handed to the uploader. A journal that is
    /// behind does nothing here (the caller writes a snapshot when
    /// [`Journal::wants_snapshot`]).
    pub(super) fn sync(&mut self) {
        if self.behind {
            return;
        }
        if let Some(now) = self.disk_hold.filter(|_| self.hold_rewrite_due) {
            self.rewrite_hold(now);
        }
        if !self.dirty {
            self.unsynced_ids = 0;
            return;
        }
        let mut result = Ok(());
        for (_, f) in self.unsynced.drain(..) {
            result = result.and_then(|()| f.sync_data());
        }
        if let Some(f) = &self.current {
            result = result.and_then(|()| f.sync_data());
        }
        if self.dir_dirty {
            result = result.and_then(|()| fsync_dir(&self.dir));
        }
        if let Err(e) = result {
            self.fall_behind("syncing", &e);
            return;
        }
        self.dir_dirty = false;
        self.dirty = false;
        self.unsynced_ids = 0;
    }

    /// Moves [`Journal::next`] past every regular generation-like file now in the folder
    /// numbered up to [`NUMBERING_LIMIT`] (one may have appeared since the start); other
    /// entries are stepped over by [`Journal::free_numbers`]. A folder that cannot be listed keeps the
    /// number: the write that follows reports its own failure.
    fn number_after_every_name(&mut self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let n = generation_number(name)
                .or_else(|| name.strip_suffix(TMP_SUFFIX).and_then(generation_number));
            let regular = entry.file_type().is_ok_and(|t| t.is_file());
            if let Some(n) = n.filter(|&n| regular && counts_for_numbering(n)) {
                self.next = self.next.max(n + 1);
            }
        }
    }

    /// The first of `len` consecutive numbers from `from` on whose names (generation and
    /// temporary) are free: a foreign entry (a directory, a FIFO, a link, a file named above
    /// [`NUMBERING_LIMIT`]) is stepped over, never renamed onto, and never moves the
    /// numbering towards [`MAX_GENERATION`] (review r40c: one entry named just below it sent
    /// every new generation past what a start reads back).
    fn free_numbers(&self, from: u64, len: u64) -> u64 {
        let taken = |n: u64| {
            fs::symlink_metadata(self.path_of(n)).is_ok()
                || fs::symlink_metadata(self.tmp_path_of(n)).is_ok()
        };
        let mut first = from;
        // Each step passes at least one existing entry: bounded by the folder's size.
        while let Some(k) = (0..len).find(|&i| taken(first + i)) {
            first += k + 1;
        }
        first
    }

    /// Writes the hold file with `now` alone (see [`Journal::snapshot`]); a failure is
    /// logged (once until a rewrite succeeds again) and tried again at the next sync.
    fn rewrite_hold(&mut self, now: Hold) {
        match self.write_hold(&HoldFile { now, before: None }) {
            Ok(()) => {
                self.hold_rewrite_due = false;
                // A later failure is news again (review r40s: a second episode in the same
                // run was never logged).
                self.hold_rewrite_due_logged = false;
            }
            Err(e) => {
                if !self.hold_rewrite_due_logged {
                    self.hold_rewrite_due_logged = true;
                    tracing::warn!(dir = %self.dir.display(), error = %e, "could not rewrite the hold file with one hold; tried again at each sync (until then a binary before this one would not read it)");
                }
                self.hold_rewrite_due = true;
            }
        }
    }

    /// Unit tests: an error (a crash: the caller cleans nothing up) at the step
    /// [`Journal::crash_at_step`] of a snapshot.
    #[cfg(test)]
    fn crash_here(&mut self) -> io::Result<()> {
        let step = self.steps;
        self.steps += 1;
        if self.crash_at_step == Some(step) {
            return Err(io::Error::other("crashed by the test"));
        }
        Ok(())
    }

    fn fall_behind(&mut self, action: &'static str, e: &io::Error) {
        self.behind = true;
        self.current = None;
        self.unsynced.clear();
        self.dirty = false;
        // The next seal may try a snapshot at once.
        self.last_try = None;
        write_failed(action, &self.dir, e);
    }
}

/// What the generations read (oldest first: number and content) say of the spool's files,
/// used only as far as nothing the journal wrote before them is missing. What the newer
/// generations say of the files may cover lines whose ids a lost record held, so it is not
/// used past:
/// - a generation of format 2 without its end block (a power loss took its end: a kill -9
///   keeps the page cache); what it says itself is used (its records come in order);
/// - a generation without a head that is not of format 1 (review r40h: a power loss cut a
///   generation never synced to 0 bytes, or its head is damaged, or it was not read);
/// - a missing number: generations are numbered one after the other (a rotation takes the
///   next number; a snapshot, consecutive ones), so a gap between two generations read is a
///   file lost or removed. A foreign entry the numbering stepped over, or a start cut short
///   after it removed files, makes a gap too: the lengths after it are left unused, which
///   costs reloading more of the spool, never an id.
///
/// A generation of format 1 (the binaries before) is passed over: it has no head by design.
/// `None` when no generation read has a head (format 1 alone, or no journal): the start
/// places the spool's ids as those binaries did. When the chain breaks before any head was
/// used, an empty [`Lengths`]: every line of the spool is taken as stored after the
/// journal's last record (the lines after the lengths are reloaded from the spool; ids the
/// journal may hold as well: no harm).
fn chain_lengths(generations: impl Iterator<Item = (u64, Generation)>) -> Option<Lengths> {
    let mut lengths: Option<Lengths> = None;
    let mut previous: Option<u64> = None;
    let mut lost = false;
    for (n, generation) in generations {
        if generation.v1 {
            continue;
        }
        // The oldest generation read, without its head or damaged: the ids it lost are older
        // than every newer generation's, so the newer lengths are still used and only its
        // own, oldest ids are missing (review r40i D2: a bit flipped in its head made every
        // line of the spool newer than the journal, and those old ids pushed the newest
        // answered ones out of the window). One a crash cut short (no end block, no damage)
        // still stops them: a power loss took its newest records, which Ray may resend.
        let oldest = previous.is_none();
        if previous.is_some_and(|p| p.checked_add(1) != Some(n)) {
            lost = true;
        }
        previous = Some(n);
        if !generation.headed {
            if oldest {
                continue;
            }
            // Its head, and perhaps records, are gone: nothing newer is used.
            lost = true;
            continue;
        }
        let lengths = lengths.get_or_insert_with(Lengths::default);
        if lost {
            break;
        }
        for fact in generation.facts {
            lengths.apply(fact);
        }
        let keeps_going = generation.ended || (oldest && generation.damaged);
        if !keeps_going {
            break;
        }
    }
    lengths
}

/// Creates (or truncates) a generation file for writing. `O_NOFOLLOW` and `O_NONBLOCK`: a
/// link or a FIFO put under that name fails at once instead of redirecting the write or
/// blocking the writer thread.
fn open_for_write(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Reports a failed write of the journal.
fn write_failed(action: &'static str, path: &Path, e: &io::Error) {
    m::dedup_journal_failure("write");
    tracing::warn!(action, path = %path.display(), error = %e, "the ids journal could not be written; it is written whole again at a later seal. Until then, a resend after a restart of events uploaded meanwhile may be stored twice");
}

/// The highest generation number taken as ours. Numbers are counted up from 1, one per
/// generation file, so no journal reaches this; a file named above it was not written by the
/// journal, and leaving it alone keeps the next number (`n + 1`) from overflowing.
const MAX_GENERATION: u64 = u64::MAX / 2;

/// The highest generation number that moves the numbering. The journal's own numbers grow by
/// one per generation from wherever the numbering stood, so they stay this far (2^40
/// generations) below [`MAX_GENERATION`] whatever a foreign file is named: a start always
/// reads back what the journal wrote.
const NUMBERING_LIMIT: u64 = MAX_GENERATION - (1 << 40);

/// Whether a regular file numbered `n` moves the numbering past it.
fn counts_for_numbering(n: u64) -> bool {
    n <= NUMBERING_LIMIT
}

/// `ids-<20 digits>` to its number, when it is one the journal can have written.
fn generation_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&n| n <= MAX_GENERATION)
}

#[cfg(test)]
mod tests;
