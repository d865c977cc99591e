//! What a read of a session could not see: the prefixes whose listing failed and the objects
//! that could not be read, by key, so that two reads of one session can be compared by what
//! each missed rather than by how many things each missed.
//!
//! `serve` keeps the index it holds when a reload of the session missed something the held
//! index did not ([`Unread::misses_more_than`]): a prefix or object is missed "as well" by the
//! held index when the held index missed that key, or a prefix above it (a listing that failed
//! hides every key under it). Counts alone cannot tell: a failed listing of the whole session
//! and of one partition are one failure each, and 4 objects missed because the store refused
//! every GET are not fewer than 1 `logs/` listing missed (reviews r55a D1, r55b D1, D2).
//!
//! The keys kept are bounded ([`MAX_UNREAD_KEYS`]); a read that missed more is compared by its
//! counts, and conservatively: it misses more unless each of its counts is at most the other's.

use std::collections::HashSet;

/// Keys kept per read of a session; past it, the counts are compared ([`Unread::overflow`]).
/// A session with more unreadable objects than this is broken or hostile; the keys cost
/// about 150 bytes each, so at most ~1.5 MB beside an index.
pub const MAX_UNREAD_KEYS: usize = 10_000;

/// What one read of a session missed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unread {
    /// Prefixes (ending in `/`) whose listing failed: nothing under them is known.
    prefixes: Vec<String>,
    /// Objects listed but not read to their end.
    objects: HashSet<String>,
    /// Prefixes and objects missed in all, kept or not.
    prefixes_missed: u64,
    objects_missed: u64,
    /// More keys were missed than [`MAX_UNREAD_KEYS`]: the sets are incomplete.
    overflow: bool,
}

impl Unread {
    /// A prefix whose listing failed (`prefix` ends in `/`).
    pub(crate) fn prefix(&mut self, prefix: &str) {
        self.prefixes_missed += 1;
        if self.room() {
            self.prefixes.push(prefix.to_string());
        }
    }

    /// An object not read to its end.
    pub(crate) fn object(&mut self, key: &str) {
        self.objects_missed += 1;
        if self.room() {
            self.objects.insert(key.to_string());
        }
    }

    fn room(&mut self) -> bool {
        let room = self.prefixes.len() + self.objects.len() < MAX_UNREAD_KEYS;
        self.overflow |= !room;
        room
    }

    /// Prefixes whose listing failed.
    pub fn prefixes_missed(&self) -> u64 {
        self.prefixes_missed
    }

    /// Whether `key` (an object or a prefix) was missed by this read: that key itself, or a
    /// prefix above it.
    fn covers(&self, key: &str) -> bool {
        self.objects.contains(key) || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }

    /// Whether this read missed something `held` did not: a prefix or an object `held`
    /// neither missed itself nor under a prefix it missed. With either over its bound, by
    /// the counts: more prefixes or more objects than `held` missed.
    pub fn misses_more_than(&self, held: &Unread) -> bool {
        if self.overflow || held.overflow {
            return self.prefixes_missed > held.prefixes_missed
                || self.objects_missed > held.objects_missed;
        }
        self.prefixes.iter().any(|p| !held.covers(p))
            || self.objects.iter().any(|o| !held.covers(o))
    }

    /// One key this read missed and `held` did not (for the message that says why a reload
    /// was not taken), if any.
    pub fn first_missed_beyond(&self, held: &Unread) -> Option<&str> {
        self.prefixes
            .iter()
            .find(|p| !held.covers(p))
            .or_else(|| self.objects.iter().find(|o| !held.covers(o)))
            .map(String::as_str)
    }

    /// Bytes these keys take (the index's size counts them).
    pub fn bytes(&self) -> u64 {
        let keys = self.prefixes.iter().chain(self.objects.iter());
        keys.map(|k| k.len() as u64 + 48).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(prefixes: &[&str], objects: &[&str]) -> Unread {
        let mut u = Unread::default();
        prefixes.iter().for_each(|p| u.prefix(p));
        objects.iter().for_each(|o| u.object(o));
        u
    }

    #[test]
    fn a_read_missing_only_what_the_held_one_missed_is_not_worse() {
        let held = read(&["s/n/job_events/01/"], &["s/n/node_events/a.gz"]);
        assert!(!read(&[], &[]).misses_more_than(&held));
        assert!(!read(&[], &["s/n/node_events/a.gz"]).misses_more_than(&held));
        // Under a prefix the held read could not list.
        assert!(!read(&[], &["s/n/job_events/01/x.gz"]).misses_more_than(&held));
        assert!(!read(&["s/n/job_events/01/"], &[]).misses_more_than(&held));
    }

    #[test]
    fn a_blank_first_read_is_replaced_by_any_read_under_it() {
        let blank = read(&["s/"], &[]);
        let good = read(&[], &["s/n/node_events/a.gz", "s/n/node_events/b.gz"]);
        assert!(!good.misses_more_than(&blank));
        assert!(blank.misses_more_than(&good));
    }

    #[test]
    fn one_listing_that_hides_more_is_worse_whatever_the_counts() {
        // r55b D2: the session listing against two partition listings.
        let held = read(&["s/n/job_events/01/", "s/n/job_events/02/"], &[]);
        let new = read(&["s/", "s/fetched_endpoints/"], &[]);
        assert!(new.misses_more_than(&held));
        // r55b D1: a logs/ listing held against every object refused.
        let held = read(&["s/n/logs/"], &[]);
        let new = read(&[], &["s/n/node_events/a.gz"]);
        assert!(new.misses_more_than(&held));
        assert_eq!(new.first_missed_beyond(&held), Some("s/n/node_events/a.gz"));
        // r55a D1: three broken objects against the session's listing refused.
        let held = read(&[], &["s/n/a.gz", "s/n/b.gz", "s/n/c.gz"]);
        assert!(read(&["s/"], &[]).misses_more_than(&held));
    }

    #[test]
    fn past_the_bound_the_counts_decide_conservatively() {
        let mut held = Unread::default();
        for i in 0..MAX_UNREAD_KEYS + 5 {
            held.object(&format!("s/o{i}"));
        }
        assert!(held.overflow);
        assert!(held.bytes() < 2 << 20);
        let mut same = held.clone();
        assert!(!same.misses_more_than(&held));
        same.prefix("s/x/");
        assert!(same.misses_more_than(&held));
        assert!(!read(&[], &["s/o1"]).misses_more_than(&held));
    }
}
