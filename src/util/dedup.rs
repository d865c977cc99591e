//! A bounded window of recently seen 64-bit hashes, for dropping repeats: the spool's
//! deduplication of Ray's resent events, and `inspect`'s of events stored twice.
//!
//! The window is bounded by count: a ring of the hashes plus a set of the same hashes, 24 to
//! 40 bytes per remembered hash (the set's table has two to four slots per id it holds: it
//! doubles while it fills, up to twice the window rounded up to a power of two). The set is
//! our own open-addressing table of the hashes themselves ([`Slots`]) rather than a
//! `HashSet`: at the default window (262,144 ids, 4 MiB of table) nearly every lookup misses
//! the CPU caches, and the spool writer looks up every event three times (the check of a
//! request's ids, all of them before any is inserted; the insertion; and the evicted id).
//! One array of hashes makes that one miss per lookup instead of a control byte and a
//! bucket, and [`DedupWindow::prefetch`] lets the writer start the miss for an event before
//! it gets there.
//!
//! One exception to the count, at a start only: ids whose order among themselves is unknown
//! but that are newer than every other ([`DedupWindow::insert_unordered`]: the ids a power
//! loss took from the spool's ids journal, reloaded from the spool's lines) are all kept,
//! however many, until `capacity` further ids were inserted (the newest `capacity` ids could
//! be any of them); the window then shrinks back by one id per insertion, and its table to
//! the size of the capacity. The caller bounds how many it hands over.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for keys that are already uniform 64-bit hashes (or that feed one through
/// `write_u64`): it passes the value through, since hashing it again would be wasted work.
/// Other input is folded in byte by byte, so any key still hashes.
#[derive(Default)]
pub struct PassThroughHasher(u64);

/// Builds [`PassThroughHasher`]s, for `HashMap`s and `HashSet`s of such keys.
pub type PassThrough = BuildHasherDefault<PassThroughHasher>;

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The table's first size; it doubles from there as ids arrive.
const MIN_SLOTS: usize = 8;

/// How many insertions ahead [`DedupWindow::insert`] prefetches the slot of the id it will
/// evict: about as many as cover a cache miss to memory.
const EVICTION_LOOKAHEAD: usize = 8;

/// A bounded set of the most recently inserted hashes.
///
/// `order` lists insertions oldest first; `set` holds the ids that are live (remembered).
/// [`DedupWindow::forget`] removes an id from `set` at once but leaves its entry in `order`
/// (finding it there would cost a scan); such a stale entry is counted in `stale`. A stale
/// entry always precedes any later insertion of the same id in `order`, so when eviction
/// pops an id that has stale entries, the popped one is stale and the live one stays.
pub struct DedupWindow {
    capacity: usize,
    order: VecDeque<u64>,
    set: Slots,
    /// Ids with entries in `order` that were forgotten, and how many such entries each has.
    stale: HashMap<u64, u32, PassThrough>,
    stale_total: usize,
    /// Ids kept beyond the capacity ([`DedupWindow::insert_unordered`]).
    over: Over,
}

/// The window's room beyond its capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// None: the window holds `capacity` ids at most.
    No,
    /// `held` unordered ids are all kept until `capacity` ids were inserted after them
    /// (`inserted` so far): the window holds `max(capacity, held + inserted)` ids.
    Holding { held: usize, inserted: usize },
    /// The hold ended: this many ids beyond the capacity are left, one fewer per insertion
    /// (each evicts two).
    Shrinking(usize),
}

impl std::fmt::Debug for DedupWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DedupWindow({} ids)", self.set.len())
    }
}

impl DedupWindow {
    /// A window remembering up to `capacity` ids; 0 turns deduplication off.
    pub fn new(capacity: usize) -> Self {
        DedupWindow {
            capacity,
            order: VecDeque::new(),
            set: Slots::new(capacity),
            stale: HashMap::default(),
            stale_total: 0,
            over: Over::No,
        }
    }

    /// Inserts `hashes`, ids newer than every id in the window whose order among themselves
    /// is unknown (at a start: the ids stored after the last record of the spool's ids
    /// journal that survived a power loss). The newest `capacity` ids could be any of them,
    /// so all of them are kept, however many, until `capacity` further ids were inserted;
    /// older ids are evicted first, as usual. Meanwhile the window holds up to
    /// `capacity + hashes.len()` ids; then it shrinks back by one id per insertion, and its
    /// table to the capacity's size once there. At most once, at a start. An id already in
    /// the window is held too: it moves to the newest end with the others (review r40n D4:
    /// ids both in a journal generation whose lengths a start cannot use and on the spool's
    /// lines past them kept their journal place, and were the first evicted).
    pub fn insert_unordered(&mut self, hashes: &[u64]) {
        if self.capacity == 0 || hashes.is_empty() {
            return;
        }
        self.set
            .allow(self.capacity.saturating_add(hashes.len()).saturating_add(1));
        let mut held = 0;
        let mut seen: HashMap<u64, (), PassThrough> = HashMap::default();
        for &h in hashes {
            if seen.insert(h, ()).is_some() {
                continue;
            }
            if self.set.insert(h) {
                self.order.push_back(h);
                held += 1;
            } else {
                // Its entry in `order` becomes stale (it precedes the new one), and the id
                // stays in `set`: evicting the old entry drops only the stale count.
                *self.stale.entry(h).or_insert(0) += 1;
                self.stale_total += 1;
                self.order.push_back(h);
                held += 1;
            }
        }
        self.over = Over::Holding { held, inserted: 0 };
        self.evict_to_limit();
    }

    /// While ids reloaded by [`DedupWindow::insert_unordered`] are all held: how many were
    /// held, and how many ids were inserted after them (fewer than the capacity). They are
    /// the newest of [`DedupWindow::ids`], held ones first. The ids journal records it, so
    /// that a start before the hold ends holds them again (review r40n D1).
    pub fn hold(&self) -> Option<(usize, usize)> {
        match self.over {
            Over::Holding { held, inserted } => Some((held, inserted)),
            _ => None,
        }
    }

    /// The most ids the window holds now.
    fn limit(&self) -> usize {
        match self.over {
            Over::No => self.capacity,
            Over::Holding { held, inserted } => self.capacity.max(held + inserted),
            Over::Shrinking(n) => self.capacity + n,
        }
    }

    /// Evicts the oldest live ids until the window is within [`DedupWindow::limit`].
    fn evict_to_limit(&mut self) {
        let limit = self.limit();
        while self.set.len() > limit {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if self.stale_total == 0 || !self.drop_stale(old) {
                self.set.remove(old);
            }
        }
    }

    /// One more id was inserted: the room beyond the capacity moves on.
    fn count_insertion(&mut self) {
        self.over = match self.over {
            Over::No => return,
            Over::Holding { held, inserted } if inserted + 1 < self.capacity => Over::Holding {
                held,
                inserted: inserted + 1,
            },
            // `capacity` ids were inserted after the held ones: they may go, the oldest first.
            Over::Holding { .. } | Over::Shrinking(_) => {
                let n = match self.over {
                    Over::Shrinking(n) => n.saturating_sub(1),
                    _ => self.set.len().saturating_sub(self.capacity + 1),
                };
                if n == 0 {
                    self.over = Over::No;
                    self.evict_to_limit();
                    self.set.shrink(self.capacity);
                    return;
                }
                Over::Shrinking(n)
            }
        };
    }

    /// Records `hash`; returns false if it was already in the window (a duplicate).
    pub fn insert(&mut self, hash: u64) -> bool {
        if self.capacity == 0 {
            return true;
        }
        if !self.set.insert(hash) {
            return false;
        }
        if self.over != Over::No {
            self.count_insertion();
        }
        // `set` already counts `hash`: evict live ids until it is back at the capacity (or
        // the room beyond it that held ids have).
        self.evict_to_limit();
        self.order.push_back(hash);
        // The id evicted a few insertions from now: start loading its slot.
        if let Some(&later) = self.order.get(EVICTION_LOOKAHEAD) {
            if self.order.len() >= self.capacity {
                self.set.prefetch(later);
            }
        }
        true
    }

    /// True when `hash` is in the window. A request checks all its ids with this before
    /// inserting any ([`DedupWindow::insert`] evicts the oldest ids, which may be the
    /// request's own still to be checked: review r40j D1).
    pub fn contains(&self, hash: u64) -> bool {
        self.capacity != 0 && self.set.contains(hash)
    }

    /// Starts loading the memory that inserting `hash` will touch, so that an insertion a
    /// few events later does not wait for it. Only a hint: it changes nothing.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        if self.capacity != 0 {
            self.set.prefetch(hash);
        }
    }

    /// Forgets `hash`, used when a write that recorded it failed and Ray will resend it.
    pub fn forget(&mut self, hash: u64) {
        if !self.set.remove(hash) {
            return;
        }
        // A rolled-back id was never accepted: it does not count towards the new ids that
        // end the hold on reloaded ones (review r40n D3: twelve 503s and 300 new ids let
        // batches answered before a power loss be stored again).
        if let Over::Holding { held, inserted } = self.over {
            self.over = Over::Holding {
                held,
                inserted: inserted.saturating_sub(1),
            };
        }
        *self.stale.entry(hash).or_insert(0) += 1;
        self.stale_total += 1;
        // Writes that fail again and again would otherwise grow `order` without bound.
        if self.stale_total > self.capacity {
            self.compact();
        }
    }

    /// If `hash` has a stale entry, counts one of them as gone and returns true.
    fn drop_stale(&mut self, hash: u64) -> bool {
        let Some(n) = self.stale.get_mut(&hash) else {
            return false;
        };
        *n -= 1;
        if *n == 0 {
            self.stale.remove(&hash);
        }
        self.stale_total -= 1;
        true
    }

    /// Removes every stale entry from `order`, keeping the live ones in their order.
    fn compact(&mut self) {
        let mut order = std::mem::take(&mut self.order);
        order.retain(|h| !self.drop_stale(*h));
        self.order = order;
        debug_assert_eq!(self.stale_total, 0);
    }

    /// The ids remembered, in the order they were inserted (oldest first): what the window
    /// would hold again if they were inserted in this order into an empty one.
    pub fn ids(&self) -> Vec<u64> {
        let mut stale = self.stale.clone();
        let mut out = Vec::with_capacity(self.set.len());
        for &h in &self.order {
            // A forgotten entry precedes any later insertion of the same id.
            if let Some(n) = stale.get_mut(&h).filter(|n| **n > 0) {
                *n -= 1;
                continue;
            }
            out.push(h);
        }
        out
    }

    /// Number of ids remembered.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// Largest `--dedup-window`: 16 Mi ids, up to a 256 MiB table and a 128 MiB ring, about
/// eleven minutes of a busy node's events. Memory follows the ids held, but a mistyped value
/// must fail at the command line rather than exhaust memory once the window fills; the ids
/// journal also bounds what a start reads by it.
pub const MAX_DEDUP_WINDOW: usize = 1 << 24;

/// A set of 64-bit hashes in one array: open addressing, linear probing, deletion by
/// shifting the following entries back (no tombstones, so probes stay short however many
/// ids come and go), at a load of at most one half.
struct Slots {
    /// 0 marks an empty slot; the hash 0 itself is kept in `zero`.
    slots: Box<[u64]>,
    /// `64 - log2(slots.len())`, at most 61: a hash's home slot is its top bits after mixing.
    shift: u32,
    /// The size the table stops growing at.
    largest: usize,
    zero: bool,
    len: usize,
}

impl Slots {
    /// An empty table for up to `capacity` hashes (the window's; one more while it
    /// evicts). It starts small and doubles while it fills, up to its largest size, at least
    /// twice `capacity`: it is never more than half full, and memory follows the ids held.
    fn new(capacity: usize) -> Slots {
        // The CLI bounds the capacity ([`MAX_DEDUP_WINDOW`]); a window of 0 keeps none.
        let largest = capacity
            .saturating_mul(2)
            .max(MIN_SLOTS)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1));
        Slots {
            slots: vec![0u64; MIN_SLOTS].into_boxed_slice(),
            shift: u64::BITS - MIN_SLOTS.trailing_zeros(),
            largest,
            zero: false,
            len: 0,
        }
    }

    /// Lets the table grow to hold `n` hashes at most half full (ids held beyond the window's
    /// capacity: [`DedupWindow::insert_unordered`]).
    fn allow(&mut self, n: usize) {
        let size = n
            .saturating_mul(2)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1));
        self.largest = self.largest.max(size);
    }

    /// Back to a table for `capacity` hashes (after [`Slots::allow`]): rebuilt at the size
    /// the hashes it holds need, if that is smaller.
    fn shrink(&mut self, capacity: usize) {
        let mut small = Slots::new(capacity);
        if small.largest >= self.largest {
            return;
        }
        for hash in self.slots.iter().copied().filter(|&h| h != 0) {
            small.insert(hash);
        }
        if self.zero {
            small.insert(0);
        }
        *self = small;
    }

    /// Doubles the table and puts every hash back in its place in it.
    fn grow(&mut self) {
        let size = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![0u64; size].into_boxed_slice());
        self.shift = u64::BITS - size.trailing_zeros();
        for hash in old.iter().copied().filter(|&h| h != 0) {
            let (i, _) = self.find(hash);
            self.slots[i] = hash;
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot a hash starts probing at. The multiply spreads keys that are not uniform
    /// hashes (small numbers in tests, ids of other callers) over the table too.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// The slot holding `hash`, or the empty slot where it would go.
    #[inline]
    fn find(&self, hash: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(hash);
        loop {
            match self.slots[i] {
                0 => return (i, false),
                v if v == hash => return (i, true),
                _ => i = (i + 1) & mask,
            }
        }
    }

    fn contains(&self, hash: u64) -> bool {
        if hash == 0 {
            return self.zero;
        }
        self.find(hash).1
    }

    /// Adds `hash`; false if it was already there.
    fn insert(&mut self, hash: u64) -> bool {
        if hash == 0 {
            let new = !self.zero;
            self.zero = true;
            self.len += usize::from(new);
            return new;
        }
        let (mut i, found) = self.find(hash);
        if found {
            return false;
        }
        // At most half full: the largest table has twice the window's slots, and the window
        // holds at most one more id than its capacity. So every probe ends, and stays short.
        if (self.len + 1) * 2 > self.slots.len() && self.slots.len() < self.largest {
            self.grow();
            i = self.find(hash).0;
        }
        debug_assert!(self.len < self.slots.len() - 1);
        self.slots[i] = hash;
        self.len += 1;
        true
    }

    /// Removes `hash`; false if it was not there.
    fn remove(&mut self, hash: u64) -> bool {
        if hash == 0 {
            let had = self.zero;
            self.zero = false;
            self.len -= usize::from(had);
            return had;
        }
        let (mut hole, found) = self.find(hash);
        if !found {
            return false;
        }
        self.len -= 1;
        // Shift back every later entry of the run that may live in the hole: one whose home
        // is not cyclically after the hole (its probe passed through the hole's slot).
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let v = self.slots[j];
            if v == 0 {
                self.slots[hole] = 0;
                return true;
            }
            let home = self.home(v);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = v;
                hole = j;
            }
        }
    }

    /// Starts loading the slot `hash` probes first.
    #[inline]
    fn prefetch(&self, hash: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let slot = self.slots.as_ptr().wrapping_add(self.home(hash));
            // SAFETY: a prefetch is a hint that never faults nor reads architecturally;
            // `home` is within the table anyway. SSE is part of x86_64's baseline.
            unsafe { _mm_prefetch(slot.cast::<i8>(), _MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = hash;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_inside_the_window_only() {
        let mut w = DedupWindow::new(3);
        assert!(w.insert(1));
        assert!(!w.insert(1));
        assert!(w.insert(2));
        assert!(w.insert(3));
        assert!(w.insert(4)); // evicts 1
        assert!(w.insert(1));
        assert_eq!(w.len(), 3);
        w.forget(4);
        assert!(w.insert(4));
        let mut off = DedupWindow::new(0);
        assert!(off.insert(9) && off.insert(9));
    }

    #[test]
    fn contains_changes_nothing() {
        let mut w = DedupWindow::new(2);
        assert!(w.insert(0) && w.insert(7));
        assert!(w.contains(0) && w.contains(7) && !w.contains(8));
        assert!(w.insert(8)); // evicts 0
        assert!(!w.contains(0) && w.contains(7));
        assert_eq!(w.len(), 2);
        assert!(!DedupWindow::new(0).contains(7));
    }

    #[test]
    fn a_forgotten_id_inserted_again_keeps_its_place_and_the_window_stays_full() {
        let mut w = DedupWindow::new(3);
        for h in [1, 2, 3] {
            assert!(w.insert(h));
        }
        // A failed write forgets 3; Ray resends it and it is stored again.
        w.forget(3);
        assert_eq!(w.len(), 2);
        assert!(w.insert(3));
        assert_eq!(w.len(), 3, "the window holds its stated capacity");
        assert!(w.insert(4)); // evicts 1
        assert!(w.insert(5)); // evicts 2
        assert_eq!(w.len(), 3);
        assert!(
            !w.insert(3),
            "3 was inserted after 1 and 2 and must outlive them"
        );
        assert!(w.insert(6)); // evicts the stale 3 and then 3 itself
        assert!(w.insert(3), "3 is the oldest and was evicted");
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn ids_lists_the_live_ids_oldest_first() {
        let mut w = DedupWindow::new(4);
        for h in [1, 2, 3] {
            assert!(w.insert(h));
        }
        w.forget(2);
        assert!(w.insert(2));
        assert!(w.insert(4));
        assert!(w.insert(5)); // evicts 1 (the stale 2 goes with the next eviction)
        assert_eq!(w.ids(), vec![3, 2, 4, 5]);
        assert_eq!(w.ids().len(), w.len());
        assert!(DedupWindow::new(0).ids().is_empty());
    }

    #[test]
    fn repeated_forgets_do_not_grow_memory() {
        let mut w = DedupWindow::new(4);
        for round in 0..10_000u64 {
            // Every write fails: each id is inserted and forgotten again.
            assert!(w.insert(round % 7));
            w.forget(round % 7);
        }
        assert!(w.is_empty());
        assert!(w.order.len() <= 2 * 4 + 1, "{} entries kept", w.order.len());
        for h in 100..104 {
            assert!(w.insert(h));
        }
        assert_eq!(w.len(), 4);
        assert!(!w.insert(100));
    }

    /// The table against `HashSet` on the same random inserts and removes, with keys drawn
    /// from a small range so that runs of neighbouring slots form and break up, 0 included.
    #[test]
    fn slots_agree_with_a_hash_set() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for (capacity, key_range) in [(4usize, 12u64), (100, 300), (1000, 1500)] {
            let mut table = Slots::new(capacity);
            let mut model = std::collections::HashSet::new();
            for _ in 0..50_000 {
                let key = next() % key_range;
                if next() % 2 == 0 && model.len() < capacity + 1 {
                    assert_eq!(table.insert(key), model.insert(key), "insert {key}");
                } else {
                    assert_eq!(table.remove(key), model.remove(&key), "remove {key}");
                }
                assert_eq!(table.len(), model.len());
            }
            for key in 0..key_range {
                assert_eq!(
                    table.find(key).1 || (key == 0 && table.zero),
                    model.contains(&key)
                );
            }
        }
    }

    /// Keys that all start at the same slot: the run wraps around the end of the table and
    /// removing from its middle keeps every other key findable.
    #[test]
    fn slots_keep_colliding_keys_findable_across_removals() {
        // A window of 4: the table never grows past its first 8 slots, so homes stay put.
        let mut table = Slots::new(4);
        assert_eq!(table.largest, table.slots.len());
        let home = table.home(1);
        let same: Vec<u64> = (1..u64::MAX)
            .filter(|&k| table.home(k) == home)
            .take(5)
            .collect();
        for &k in &same {
            assert!(table.insert(k));
        }
        for (i, &k) in same.iter().enumerate() {
            assert!(table.remove(k));
            for &rest in &same[i + 1..] {
                assert!(table.find(rest).1, "{rest} lost after removing {k}");
            }
        }
        assert!(table.is_empty());
    }

    #[test]
    fn a_full_window_of_random_hashes_evicts_in_order() {
        let mut w = DedupWindow::new(1000);
        let hashes: Vec<u64> = (1..=5000u64)
            .map(|i| i.wrapping_mul(0xff51_afd7_ed55_8ccd))
            .collect();
        for &h in &hashes {
            w.prefetch(h);
            assert!(w.insert(h));
        }
        assert_eq!(w.len(), 1000);
        assert_eq!(
            w.set.slots.len(),
            2048,
            "grown to twice the window, no further"
        );
        for &h in &hashes[4000..] {
            assert!(!w.insert(h), "recent ids are remembered");
        }
        assert!(w.insert(hashes[3999]), "the 1001st most recent was evicted");
    }

    /// Review r40m D1: ids of unknown order, newer than the rest, are all kept, however many,
    /// until `capacity` ids were inserted after them (older ids go first); then the window
    /// shrinks back by one id per insertion, and its table to the capacity's size.
    #[test]
    fn rolled_back_ids_do_not_end_the_hold_on_unordered_ones() {
        let mut w = DedupWindow::new(100);
        let unordered: Vec<u64> = (1001..=1400).collect();
        w.insert_unordered(&unordered);
        // A group of 50 refused 30 times (inserted, then forgotten): nothing was accepted.
        for _ in 0..30 {
            for h in 5001..5051 {
                assert!(w.insert(h));
            }
            for h in 5001..5051 {
                w.forget(h);
            }
        }
        for h in 6001..6099 {
            assert!(w.insert(h));
        }
        assert!(
            unordered.iter().all(|&h| w.contains(h)),
            "99 accepted: all held"
        );
    }

    #[test]
    fn unordered_ids_are_all_kept_until_a_window_of_new_ones() {
        let mut w = DedupWindow::new(100);
        let older: Vec<u64> = (1..=100).collect();
        for &h in &older {
            assert!(w.insert(h));
        }
        let unordered: Vec<u64> = (1001..=1400).collect();
        w.insert_unordered(&unordered);
        assert_eq!(w.len(), 400, "every unordered id, no older one");
        assert!(older.iter().all(|&h| !w.contains(h)));
        // 99 new ids: every unordered one is still there.
        for h in 5001..5100 {
            assert!(w.insert(h));
        }
        assert_eq!(w.len(), 499);
        assert!(unordered.iter().all(|&h| w.contains(h)));
        // The 100th: the unordered ids may go now, the oldest first, one more per insertion.
        assert!(w.insert(5100));
        assert_eq!(w.len(), 499);
        assert!(!w.contains(1001) && w.contains(1002));
        assert!(w.insert(5101));
        assert_eq!(w.len(), 498);
        for h in 5102..6000 {
            assert!(w.insert(h));
        }
        assert_eq!(w.len(), 100);
        assert_eq!(w.ids(), (5900..6000).collect::<Vec<u64>>());
        assert_eq!(
            w.set.slots.len(),
            256,
            "the table is back to the capacity's size"
        );
        // Fewer than the capacity: the newest older ids fill the rest, and stay until the
        // new ones push them out as usual.
        let mut w = DedupWindow::new(100);
        for &h in &older {
            w.insert(h);
        }
        w.insert_unordered(&[2001, 2002, 50, 2001]);
        assert_eq!(w.hold(), Some((3, 0)));
        assert_eq!(w.len(), 100);
        assert!(!w.contains(1) && !w.contains(2) && w.contains(3) && w.contains(50));
        for h in 3001..3098 {
            assert!(w.insert(h));
        }
        assert_eq!(w.hold(), Some((3, 97)));
        // 50 was there already: it is held with the others, at the newest end (review r40n
        // D4), and its older place is stale.
        assert!(!w.contains(100) && w.contains(2001) && w.contains(2002) && w.contains(50));
        assert!(w.insert(3098));
        // Still fewer than the capacity after them: all three held, one beyond it.
        assert!(w.contains(2001) && w.contains(2002) && w.contains(50));
        assert_eq!(w.len(), 101);
        assert_eq!(&w.ids()[..3], &[2001, 2002, 50]);
        let mut off = DedupWindow::new(0);
        off.insert_unordered(&[1, 2]);
        assert!(off.is_empty());
    }
}
