//! Remembers recently accepted event ids so Ray's resent batches are not stored twice.
//!
//! Ray resends a whole batch when our answer took longer than 3 s, with the same `eventId`s.
//! The window is bounded by count: a ring of 64-bit hashes plus a set of the same hashes,
//! about 24 bytes per remembered event. A false match needs two ids to collide in 64 bits
//! while both are in the window: at 262,144 ids that is about one chance in 7·10^13 per event.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Hash of an event id as used by the window.
pub fn id_hash(event_id: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(event_id)
}

/// The keys are already uniform hashes: hashing them again would be wasted work.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
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

/// A bounded set of the most recently accepted event-id hashes.
pub struct DedupWindow {
    capacity: usize,
    order: VecDeque<u64>,
    set: HashSet<u64, BuildHasherDefault<PassThrough>>,
}

impl DedupWindow {
    /// A window remembering up to `capacity` ids; 0 turns deduplication off.
    pub fn new(capacity: usize) -> Self {
        DedupWindow {
            capacity,
            order: VecDeque::new(),
            set: HashSet::default(),
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
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(hash);
        true
    }

    /// Forgets `hash`, used when a write that recorded it failed and Ray will resend it.
    pub fn forget(&mut self, hash: u64) {
        self.set.remove(&hash);
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
        assert_ne!(id_hash(b"a"), id_hash(b"b"));
    }
}
