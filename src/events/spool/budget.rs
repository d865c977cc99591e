//! The spool's disk budget (`--max-spool-bytes`): one rule for everything that fills the
//! spool and everything that asks whether there is room.
//!
//! What counts ([`Budget::used`]):
//!
//! - *stored*: bytes on disk not yet uploaded: segments (their durable length), quarantine
//!   files, kept bodies, and the compressed copies of open segments' objects
//!   (`spool/growth/`, see [`crate::events::publish`]); the gauge `rhc_spool_bytes`;
//! - [`FILE_BUDGET_BYTES`] per file not yet uploaded (a block at least, and an object),
//!   and per file the publisher keeps for an open segment (its shadow and its record under
//!   `spool/growth/`, counted before they are created: [`Budget::claim_files`]);
//! - *claimed*: bytes being written: a group of requests from its admission to its sync,
//!   a member of a compressed copy while it is written;
//! - the *copy reserve*: durable bytes of open segments that have no compressed copy yet
//!   (*uncopied*), times the ratio the copies have shown ([`RATIO_MARGIN_PERCENT`] over the
//!   measured one, at least [`MIN_RATIO_PPM`]; the raw size before any copy was measured;
//!   nothing with `--compression none`, which keeps no copies).
//!
//! Who asks, all against the same sum:
//!
//! - the writer admits a request only when used, its bytes and their copies' reserve stay
//!   within the budget ([`Budget::claim`], one lock with every other claim, so two writers of
//!   the spool never both take the last room);
//! - the HTTP side answers 503 (and `/readyz` 503) once used reaches 90 % of the budget
//!   ([`high_watermark`]); then, and when a write was refused for room that sealing can
//!   make, the writer seals the open segments whose events are all in the bucket
//!   ([`Budget::wants_room`]), which frees their bytes, copies and records within about the
//!   upload window (a refused write that sealing all of them cannot make room for, a batch
//!   near the budget's size, seals nothing: the review r35h found such a batch, retried
//!   every 2 s, sealing every published partition each time, 19 objects per partition a
//!   minute);
//! - the export tailer reads lines while used, the lines and their copies' reserve stay
//!   below 80 % ([`Budget::room_for_lines`]);
//! - a copy's member is written only when the disk holds room for it beside everything
//!   stored and claimed ([`Budget::claim_copy`]): the reserve is room set aside for copies,
//!   so when the estimate was short the copy gives way, never the budget (what it showed is
//!   noted in the ratio, and its segment is sealed to go up whole: see
//!   [`crate::events::publish`]).
//!
//! So a byte is counted once: a line is *uncopied* until its compressed copy is written,
//! then the copy is *stored*, whether or not the store took it. During a store outage the
//! copies are still written (they are local), so the spool fills with what is really on
//! disk; the earlier rule (every byte not yet published counted again, raw, for a copy a
//! tenth its size) answered 503 with the spool half full, and counted an export backlog
//! twice.
//!
//! Every counter is a [`Count`], which never goes below zero: a subtraction larger than the
//! count is an accounting error, logged and counted in `rhc_spool_accounting_errors_total`
//! (by counter), and the count stops at zero instead of wrapping to 2^64 (which once made
//! every request 503 for good).

use std::sync::Mutex;

use crate::metrics as m;

/// What each spool file counts against the disk budget beside its bytes: the block it
/// takes at least, and an object to upload. So a request spread over many partitions pays
/// for its files, not only for its lines.
pub const FILE_BUDGET_BYTES: u64 = 4096;

/// Parts per million: the unit of the copy ratio.
const PPM: u64 = 1_000_000;
/// The copy reserve never assumes copies smaller than an eighth of their lines. Ray's events
/// compress to about a tenth (an eighth with the margin), so this matters only for data
/// that compresses better, or when the data changes (a burst that compresses worse than
/// what came before); a short reserve then delays copies (and, at a seal, makes the
/// segment go up whole), never takes the spool past its budget.
pub const MIN_RATIO_PPM: u64 = 125_000;
/// The copy reserve is the measured ratio plus this much of it.
pub const RATIO_MARGIN_PERCENT: u64 = 25;
/// The measured ratio follows the recent copies: once this many raw bytes are measured,
/// both sums are halved, so what was compressed long ago weighs less.
const RATIO_WINDOW_BYTES: u64 = 64 << 20;
/// A byte of a line costs at most this many bytes of the budget: itself and, at the most,
/// as much again reserved for its compressed copy (the reserve never exceeds the raw size).
pub const MAX_COST_PER_LINE_BYTE: u64 = 2;

/// A byte count that never wraps: see the module doc.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Count(u64);

impl Count {
    /// Its value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// Adds `n`; at `u64::MAX` it stays there, reported as an accounting error.
    pub fn add(&mut self, n: u64, name: &'static str) -> bool {
        match self.0.checked_add(n) {
            Some(v) => {
                self.0 = v;
                true
            }
            None => {
                self.0 = u64::MAX;
                report(name, "overflow", n);
                false
            }
        }
    }

    /// Subtracts `n`; below zero it stops at zero, reported as an accounting error. False
    /// when it was short.
    pub fn sub(&mut self, n: u64, name: &'static str) -> bool {
        match self.0.checked_sub(n) {
            Some(v) => {
                self.0 = v;
                true
            }
            None => {
                let short = n - self.0;
                self.0 = 0;
                report(name, "below zero", short);
                false
            }
        }
    }
}

fn report(counter: &'static str, what: &'static str, by: u64) {
    tracing::error!(
        counter,
        by,
        "spool accounting error ({what}): a bug; the count is clamped, so the budget may be off by that much until the spool is empty"
    );
    m::spool_accounting_error(counter);
}

/// The share of `--max-spool-bytes`, in tenths, past which new requests get `503` (and
/// `/readyz` `503`), and open segments already in the bucket are sealed to free their room
/// ([`Budget::wants_room`]): 90 %, room left for the batches already admitted.
pub const HIGH_WATERMARK_TENTHS: u64 = 9;

/// The high watermark of a budget of `max` bytes ([`HIGH_WATERMARK_TENTHS`]).
pub fn high_watermark(max: u64) -> u64 {
    max / 10 * HIGH_WATERMARK_TENTHS
}

/// The counters, under one lock.
#[derive(Debug, Default)]
struct Ledger {
    stored: Count,
    files: Count,
    /// Of `files`, the publisher's growth files (shadows and records of open segments in
    /// `spool/growth/`): not segments, so not in `rhc_spool_segments`.
    growth_files: Count,
    /// The room lacked by the write refused for room that lacked the least, since
    /// [`Budget::wants_room`] last asked.
    refused: Option<u64>,
    claimed: Count,
    uncopied: Count,
    /// Decayed sums of the raw and compressed bytes of recent copies.
    ratio_raw: u64,
    ratio_compressed: u64,
    /// Accounting errors so far (also a metric).
    errors: u64,
}

/// Refused: the bytes would take the spool past its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    /// What the budget counts now.
    pub used: u64,
    /// What the write needs (its bytes and their copies' reserve).
    pub wanted: u64,
    /// `--max-spool-bytes`.
    pub max: u64,
}

/// The spool's disk budget: see the module doc.
#[derive(Debug)]
pub struct Budget {
    max: u64,
    /// Open segments get compressed copies (`--compression gzip`).
    copies: bool,
    ledger: Mutex<Ledger>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(u64::MAX, true)
    }
}

impl Budget {
    /// A budget of `max` bytes; `copies` when open segments get compressed copies.
    pub fn new(max: u64, copies: bool) -> Budget {
        Budget {
            max,
            copies,
            ledger: Mutex::new(Ledger::default()),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `--max-spool-bytes`.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The reserve for copies of `raw` line bytes, in parts per million of them.
    fn ratio_ppm(&self, l: &Ledger) -> u64 {
        if !self.copies {
            return 0;
        }
        if l.ratio_raw == 0 {
            return PPM;
        }
        let measured = u128::from(l.ratio_compressed) * u128::from(PPM) / u128::from(l.ratio_raw);
        let with_margin = measured * u128::from(100 + RATIO_MARGIN_PERCENT) / 100;
        (with_margin.min(u128::from(PPM)) as u64).max(MIN_RATIO_PPM)
    }

    fn reserve(&self, l: &Ledger, raw: u64) -> u64 {
        let r = (u128::from(raw) * u128::from(self.ratio_ppm(l))).div_ceil(u128::from(PPM));
        u64::try_from(r).unwrap_or(u64::MAX)
    }

    fn used_in(&self, l: &Ledger) -> u64 {
        l.stored
            .get()
            .saturating_add(l.files.get().saturating_mul(FILE_BUDGET_BYTES))
            .saturating_add(l.claimed.get())
            .saturating_add(self.reserve(l, l.uncopied.get()))
    }

    /// What counts against the budget now (the module doc's sum).
    pub fn used(&self) -> u64 {
        self.used_in(&self.ledger())
    }

    /// Bytes on disk not yet uploaded (`rhc_spool_bytes`).
    pub fn stored(&self) -> u64 {
        self.ledger().stored.get()
    }

    /// Files not yet uploaded.
    pub fn files(&self) -> u64 {
        self.ledger().files.get()
    }

    /// Durable bytes of open segments without a compressed copy yet.
    pub fn uncopied(&self) -> u64 {
        self.ledger().uncopied.get()
    }

    /// Accounting errors so far.
    pub fn errors(&self) -> u64 {
        self.ledger().errors
    }

    /// Claims room for `bytes` about to be written, `to_copy` of them lines that will get a
    /// compressed copy (their reserve is claimed too), when used plus that stays within the
    /// budget; the bytes claimed, to be released with [`Budget::release`] once they are
    /// stored (or not written).
    pub fn claim(&self, bytes: u64, to_copy: u64) -> Result<u64, OverBudget> {
        let mut l = self.ledger();
        let used = self.used_in(&l);
        let mut reserve = self.reserve(&l, to_copy);
        if used == 0 && bytes <= self.max {
            // An empty spool admits whatever fits the budget, its copies' reserve cut to
            // the room left: a copy that then does not fit makes the publisher seal the
            // segment, uploaded whole without a copy (the review of issue 35 found a batch
            // of 68 % of the budget refused forever on an empty spool, the reserve being
            // the raw size before any ratio is measured).
            reserve = reserve.min(self.max - bytes);
        }
        let wanted = bytes.saturating_add(reserve);
        if used.saturating_add(wanted) > self.max {
            let short = used.saturating_add(wanted) - self.max;
            l.refused = Some(l.refused.map_or(short, |r| r.min(short)));
            return Err(OverBudget {
                used,
                wanted,
                max: self.max,
            });
        }
        let ok = l.claimed.add(wanted, "claimed");
        l.errors += u64::from(!ok);
        Ok(wanted)
    }

    /// Claims room for `bytes` of a compressed copy about to be written, when the disk has
    /// it: stored, files and claims, without the copy reserve (the room it stands for).
    pub fn claim_copy(&self, bytes: u64) -> bool {
        let mut l = self.ledger();
        let disk = l
            .stored
            .get()
            .saturating_add(l.files.get().saturating_mul(FILE_BUDGET_BYTES))
            .saturating_add(l.claimed.get());
        if disk.saturating_add(bytes) > self.max {
            return false;
        }
        let ok = l.claimed.add(bytes, "claimed");
        l.errors += u64::from(!ok);
        true
    }

    /// Counts `n` new files (the publisher's shadow and record of a segment, before they
    /// are created) when the disk has room for them beside everything stored and claimed,
    /// as [`Budget::claim_copy`]; false (nothing counted) when it has not.
    pub fn claim_files(&self, n: u64) -> bool {
        let mut l = self.ledger();
        let disk = l
            .stored
            .get()
            .saturating_add(l.files.get().saturating_mul(FILE_BUDGET_BYTES))
            .saturating_add(l.claimed.get());
        if disk.saturating_add(n.saturating_mul(FILE_BUDGET_BYTES)) > self.max {
            return false;
        }
        let ok = l.files.add(n, "files") && l.growth_files.add(n, "growth_files");
        l.errors += u64::from(!ok);
        true
    }

    /// `n` growth files without bytes of their own counted are gone (see
    /// [`Budget::claim_files`]).
    pub fn files_gone(&self, n: u64) {
        let mut l = self.ledger();
        let ok = l.files.sub(n, "files") && l.growth_files.sub(n, "growth_files");
        l.errors += u64::from(!ok);
    }

    /// One growth file found at start (a shadow or record of a segment in the spool).
    pub fn add_growth_file(&self) {
        let mut l = self.ledger();
        let ok = l.files.add(1, "files") && l.growth_files.add(1, "growth_files");
        l.errors += u64::from(!ok);
    }

    /// Growth files counted (the publisher's shadows and records of open segments).
    pub fn growth_files(&self) -> u64 {
        self.ledger().growth_files.get()
    }

    /// Growth files not yet claimed that the files not yet uploaded may still claim: a
    /// record each, and a shadow with compressed copies, less the growth files counted
    /// (see [`super::SpoolStats::unclaimed_growth_files`]).
    pub fn unclaimed_growth_files(&self) -> u64 {
        let l = self.ledger();
        let segments = l.files.get().saturating_sub(l.growth_files.get());
        segments
            .saturating_mul(1 + u64::from(self.copies))
            .saturating_sub(l.growth_files.get())
    }

    /// Files not yet uploaded that are not growth files: segments, quarantine files, kept
    /// bodies (`rhc_spool_segments`).
    pub fn segment_files(&self) -> u64 {
        let l = self.ledger();
        l.files.get().saturating_sub(l.growth_files.get())
    }

    /// Whether the spool needs room now, and how much: `Some(0)` (any room helps) when used
    /// is at or past the high watermark; else, when writes were refused for room since the
    /// last call (which clears that), the least room one of them lacked: sealing helps them
    /// only when it frees that much.
    pub fn wants_room(&self) -> Option<u64> {
        let mut l = self.ledger();
        let refused = l.refused.take();
        if self.used_in(&l) >= high_watermark(self.max) {
            return Some(0);
        }
        refused
    }

    /// Gives back `n` claimed bytes.
    pub fn release(&self, n: u64) {
        let mut l = self.ledger();
        let ok = l.claimed.sub(n, "claimed");
        l.errors += u64::from(!ok);
    }

    /// `n` claimed bytes were written: they are stored now.
    pub fn claimed_stored(&self, n: u64) {
        let mut l = self.ledger();
        let a = l.stored.add(n, "stored");
        let b = l.claimed.sub(n, "claimed");
        l.errors += u64::from(!a) + u64::from(!b);
    }

    /// `n` bytes more on disk.
    pub fn add_stored(&self, n: u64) {
        let mut l = self.ledger();
        let ok = l.stored.add(n, "stored");
        l.errors += u64::from(!ok);
    }

    /// `n` bytes fewer on disk (uploaded, cut, deleted).
    pub fn sub_stored(&self, n: u64) {
        let mut l = self.ledger();
        let ok = l.stored.sub(n, "stored");
        l.errors += u64::from(!ok);
    }

    /// One file more not yet uploaded.
    pub fn add_file(&self) {
        let mut l = self.ledger();
        let ok = l.files.add(1, "files");
        l.errors += u64::from(!ok);
    }

    /// A file of `bytes` is uploaded (or gone).
    pub fn file_done(&self, bytes: u64) {
        let mut l = self.ledger();
        let a = l.files.sub(1, "files");
        let b = l.stored.sub(bytes, "stored");
        l.errors += u64::from(!a) + u64::from(!b);
    }

    /// `n` durable bytes of open segments more without a copy.
    pub fn add_uncopied(&self, n: u64) {
        let mut l = self.ledger();
        let ok = l.uncopied.add(n, "uncopied");
        l.errors += u64::from(!ok);
    }

    /// `n` bytes of open segments got their copy (or their segment was sealed).
    pub fn sub_uncopied(&self, n: u64) {
        let mut l = self.ledger();
        let ok = l.uncopied.sub(n, "uncopied");
        l.errors += u64::from(!ok);
    }

    /// A copy turned `raw` line bytes into `compressed` bytes: the ratio follows it.
    pub fn note_copy(&self, raw: u64, compressed: u64) {
        if raw == 0 {
            return;
        }
        let mut l = self.ledger();
        l.ratio_raw = l.ratio_raw.saturating_add(raw);
        l.ratio_compressed = l.ratio_compressed.saturating_add(compressed);
        while l.ratio_raw > RATIO_WINDOW_BYTES {
            l.ratio_raw /= 2;
            l.ratio_compressed /= 2;
        }
    }

    /// Raw bytes of lines that may still be added, with their copies' reserve, before used
    /// reaches `limit`.
    pub fn room_for_lines(&self, limit: u64) -> u64 {
        let l = self.ledger();
        let used = self.used_in(&l);
        let left = u128::from(limit.saturating_sub(used));
        let per_line = u128::from(PPM + self.ratio_ppm(&l));
        u64::try_from(left * u128::from(PPM) / per_line).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_never_wraps_and_says_so() {
        let mut c = Count::default();
        assert!(c.add(10, "t"));
        assert!(c.sub(4, "t"));
        assert_eq!(c.get(), 6);
        // The bug the issue found: more taken away than was ever added.
        assert!(!c.sub(153_878, "t"));
        assert_eq!(c.get(), 0, "clamped at zero, not 2^64 - 153,872");
        assert!(c.add(5, "t"));
        assert_eq!(c.get(), 5);
        let mut full = Count(u64::MAX - 1);
        assert!(!full.add(2, "t"));
        assert_eq!(full.get(), u64::MAX);
    }

    #[test]
    fn the_budget_counts_an_error_and_stays_usable() {
        let b = Budget::new(1000, true);
        b.add_stored(100);
        b.file_done(300);
        assert_eq!(b.errors(), 2, "files and stored both short");
        assert_eq!(b.stored(), 0);
        assert_eq!(b.files(), 0);
        assert_eq!(b.used(), 0);
        // Still admits what fits, and refuses what does not.
        assert!(b.claim(500, 0).is_ok());
        assert!(b.claim(600, 0).is_err());
        b.release(700);
        assert_eq!(b.errors(), 3);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn the_copy_reserve_follows_the_measured_ratio_within_its_bounds() {
        let b = Budget::new(u64::MAX, true);
        b.add_uncopied(1000);
        assert_eq!(b.used(), 1000, "nothing measured: the raw size");
        b.note_copy(10_000, 1_000);
        assert_eq!(b.used(), 125, "a tenth with its margin is the floor");
        b.note_copy(10_000, 500);
        // 1,500 of 20,000 with its margin: 93.75 per 1,000, below the floor.
        assert_eq!(b.used(), 125);
        b.note_copy(80_000, 58_500);
        // 60,000 of 100,000, plus a quarter: 750 per 1,000.
        assert_eq!(b.used(), 750);
        b.note_copy(100_000, 200_000);
        assert_eq!(b.used(), 1000, "never more than the raw size");
        let none = Budget::new(u64::MAX, false);
        none.add_uncopied(1000);
        assert_eq!(none.used(), 0, "--compression none keeps no copies");
    }

    #[test]
    fn an_empty_spool_admits_what_fits_its_budget() {
        let b = Budget::new(8000, true);
        // Nothing measured: the reserve is the raw size, 11,000 in all, cut to the room.
        let c = b.claim(5500, 5500).unwrap();
        assert_eq!(c, 8000);
        b.release(c);
        assert!(b.claim(8001, 0).is_err(), "over the budget itself");
        b.add_stored(1);
        assert!(b.claim(5500, 5500).is_err(), "not empty: the whole reserve");
    }

    #[test]
    fn growth_files_count_like_every_spool_file() {
        let b = Budget::new(3 * FILE_BUDGET_BYTES, true);
        b.add_file();
        assert!(b.claim_files(2));
        assert_eq!(b.used(), 3 * FILE_BUDGET_BYTES);
        assert!(!b.claim_files(1), "no room for a fourth file");
        b.files_gone(2);
        assert_eq!(b.files(), 1);
        assert_eq!(b.errors(), 0);
    }

    #[test]
    fn growth_files_are_not_segments_and_room_is_wanted_past_the_watermark() {
        let b = Budget::new(100 * FILE_BUDGET_BYTES, true);
        b.add_file();
        assert!(b.claim_files(2));
        b.add_growth_file();
        assert_eq!((b.files(), b.segment_files()), (4, 1));
        b.files_gone(3);
        assert_eq!((b.files(), b.segment_files()), (1, 1));
        assert_eq!(b.wants_room(), None);
        b.add_stored(high_watermark(b.max()) - FILE_BUDGET_BYTES);
        assert_eq!(b.wants_room(), Some(0), "at the high watermark");
        b.sub_stored(1);
        assert_eq!(b.wants_room(), None);
        let used = high_watermark(b.max()) - 1;
        assert!(b.claim(b.max(), 0).is_err());
        assert!(b.claim(b.max() - used + 10, 0).is_err());
        assert_eq!(
            b.wants_room(),
            Some(10),
            "writes were refused for room: the least one lacked"
        );
        assert_eq!(b.wants_room(), None, "asked once");
        assert_eq!(b.errors(), 0);
    }

    #[test]
    fn growth_files_of_sealed_segments_never_stand_for_those_open_ones_lack() {
        let b = Budget::new(u64::MAX, true);
        // 500 sealed segments whose shadow and record are made, then 200 new ones.
        for _ in 0..700 {
            b.add_file();
        }
        assert!(b.claim_files(1000));
        assert_eq!(b.unclaimed_growth_files(), 400);
        assert!(b.claim_files(400));
        assert_eq!(b.unclaimed_growth_files(), 0);
        let none = Budget::new(u64::MAX, false);
        none.add_file();
        assert_eq!(none.unclaimed_growth_files(), 1, "a record only");
    }

    #[test]
    fn claims_share_the_room() {
        let b = Budget::new(10_000, true);
        b.note_copy(1000, 500);
        // An empty spool: 8,000 raw bytes of lines with their reserve cut to the room left.
        let e = b.claim(8000, 8000).unwrap();
        assert_eq!(e, 10_000);
        b.release(e);
        let c = b.claim(4000, 4000).unwrap();
        assert_eq!(c, 6500);
        // Not empty: the whole reserve, 5/8 of them: 13,000, over.
        let e = b.claim(8000, 8000).unwrap_err();
        assert_eq!(e.wanted, 13_000);
        // A copy needs the disk's room: 10,000 - 6,500 claimed.
        assert!(!b.claim_copy(3501));
        assert!(b.claim_copy(3500));
        b.claimed_stored(3500);
        assert_eq!(b.stored(), 3500);
        b.release(c);
        b.add_stored(4000);
        b.add_uncopied(4000);
        assert_eq!(b.used(), 3500 + 4000 + 2500);
        // Lines for the room up to 9,000 is none; up to 11,000: 1,000 / (1 + 5/8).
        assert_eq!(b.room_for_lines(9000), 0);
        assert_eq!(b.room_for_lines(11_000), 615);
        assert_eq!(b.errors(), 0);
    }
}
