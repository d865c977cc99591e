//! A bounded window of recently seen 64-bit hashes, for dropping repeats: the spool's
//! deduplication of Ray's resent events, and `inspect`'s of events stored twice.
//!
//! The window is bounded by count: a ring of the hashes plus a set of the same hashes, about
//! 24 bytes per remembered hash. Keys are hashes already, so the set uses
//! [`PassThroughHasher`] rather than hashing them again.

use std::collections::{HashMap, HashSet, VecDeque};
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
    set: HashSet<u64, PassThrough>,
    /// Ids with entries in `order` that were forgotten, and how many such entries each has.
    stale: HashMap<u64, u32, PassThrough>,
    stale_total: usize,
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
            set: HashSet::default(),
            stale: HashMap::default(),
            stale_total: 0,
        }
    }

    /// Records `hash`; returns false if it was already in the window (a duplicate).
    pub fn insert(&mut self, hash: u64) -> bool {
        if self.capacity == 0 {
            return true;
        }
        if !self.set.insert(hash) {
            return false;
        }
        // `set` already counts `hash`: evict live ids until it is back at the capacity.
        while self.set.len() > self.capacity {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if self.stale_total == 0 || !self.drop_stale(old) {
                self.set.remove(&old);
            }
        }
        self.order.push_back(hash);
        true
    }

    /// Forgets `hash`, used when a write that recorded it failed and Ray will resend it.
    pub fn forget(&mut self, hash: u64) {
        if !self.set.remove(&hash) {
            return;
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

    /// Number of ids remembered.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
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
}
