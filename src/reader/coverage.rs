//! What a read of a session covered: the objects it read and the directories they are in,
//! and what it missed (the prefixes whose listing failed, the objects not read), so that two
//! reads of one session can be compared by what the second lost of what the first had.
//!
//! `serve` keeps the index it holds when a reload lost something the held index had
//! ([`Coverage::lost_against`]): an object the held read read whole that the reload could not
//! read, or a prefix the reload could not list under which the held read read an object. A
//! key the held read never saw (an object added since, broken or not) or missed as well is no
//! loss, so a live session keeps being followed while one of its objects is broken. Counts
//! alone could not tell (reviews r55a D1, r55b D1 and D2: a reload that read nothing replaced
//! a good index; r55c D1: one new broken object froze a live session), nor could what each
//! read missed alone.
//!
//! The keys read are kept as 64-bit hashes, at most [`MAX_READ_KEYS`]; the keys missed as
//! text (for the message), at most [`MAX_MISSED_KEYS`]. A read past either bound is compared
//! by its counts: it lost something when it missed more than the held read did.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

/// Objects read whose hashes are kept (about 10 bytes each with the set's overhead, so
/// ~2.5 MB at most beside an index). A session our collector writes holds a few objects an
/// hour per node and stream; past this, the counts decide.
pub const MAX_READ_KEYS: usize = 250_000;
/// Missed prefixes and objects kept as text (about 150 bytes each: ~1.5 MB at most).
pub const MAX_MISSED_KEYS: usize = 10_000;

/// What one read of a session covered and missed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// Hashes of the objects read whole.
    read_objects: HashSet<u64>,
    /// Hashes of every directory (`a/`, `a/b/`, ...) above an object read whole.
    read_dirs: HashSet<u64>,
    /// Prefixes (ending in `/`) whose listing failed.
    missed_prefixes: Vec<String>,
    /// Objects listed but not read to their end.
    missed_objects: Vec<String>,
    /// Prefixes and objects missed in all, kept or not.
    missed: u64,
    /// A bound was passed: the sets are incomplete, and the counts decide.
    overflow: bool,
}

fn hash(key: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl Coverage {
    /// An object read to its end.
    pub(crate) fn read(&mut self, key: &str) {
        if self.read_objects.len() >= MAX_READ_KEYS {
            self.overflow = true;
            return;
        }
        self.read_objects.insert(hash(key));
        for (i, _) in key.match_indices('/') {
            self.read_dirs.insert(hash(&key[..=i]));
        }
    }

    /// A prefix whose listing failed (`prefix` ends in `/`).
    pub(crate) fn missed_prefix(&mut self, prefix: &str) {
        self.missed += 1;
        if self.room() {
            self.missed_prefixes.push(prefix.to_string());
        }
    }

    /// An object not read to its end.
    pub(crate) fn missed_object(&mut self, key: &str) {
        self.missed += 1;
        if self.room() {
            self.missed_objects.push(key.to_string());
        }
    }

    fn room(&mut self) -> bool {
        let room = self.missed_prefixes.len() + self.missed_objects.len() < MAX_MISSED_KEYS;
        self.overflow |= !room;
        room
    }

    /// What this read (a reload) lost of what `held` had: a prefix it could not list under
    /// which `held` read an object, or an object `held` read that it could not read; the
    /// first such key, or, with either read past its bounds, a count when this read missed
    /// more than `held` did. `None`: nothing lost.
    pub fn lost_against(&self, held: &Coverage) -> Option<Lost> {
        if self.overflow || held.overflow {
            return (self.missed > held.missed).then_some(Lost::More {
                missed: self.missed,
                held_missed: held.missed,
            });
        }
        let prefix = self
            .missed_prefixes
            .iter()
            .find(|p| held.read_dirs.contains(&hash(p)));
        let object = || {
            self.missed_objects
                .iter()
                .find(|o| held.read_objects.contains(&hash(o)))
        };
        match prefix {
            Some(p) => Some(Lost::Listing(p.clone())),
            None => object().map(|o| Lost::Object(o.clone())),
        }
    }

    /// Bytes these keys take (the index's size counts them).
    pub fn bytes(&self) -> u64 {
        let sets = (self.read_objects.capacity() + self.read_dirs.capacity()) * 9;
        let missed = self.missed_prefixes.iter().chain(&self.missed_objects);
        (sets + missed.map(|k| k.len() + 24).sum::<usize>()) as u64
    }
}

/// What a reload lost of what the index held had (see [`Coverage::lost_against`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// A prefix it could not list, under which the held read read an object.
    Listing(String),
    /// An object the held read read, that it could not read.
    Object(String),
    /// Past the bounds: it missed more prefixes and objects than the held read did.
    More { missed: u64, held_missed: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cov(read: &[&str], prefixes: &[&str], objects: &[&str]) -> Coverage {
        let mut c = Coverage::default();
        read.iter().for_each(|k| c.read(k));
        prefixes.iter().for_each(|p| c.missed_prefix(p));
        objects.iter().for_each(|o| c.missed_object(o));
        c
    }

    #[test]
    fn missing_what_the_held_read_never_had_is_no_loss() {
        let held = cov(
            &["s/n/node_events/a"],
            &["s/n/job_events/01/"],
            &["s/n/node_events/b"],
        );
        // The same broken object, one under the listing the held read missed, a new one.
        let new = cov(
            &["s/n/node_events/a", "s/n/node_events/c"],
            &[],
            &[
                "s/n/node_events/b",
                "s/n/job_events/01/x",
                "s/n/node_events/new",
            ],
        );
        assert_eq!(new.lost_against(&held), None);
        // r55c D1: a new broken object beside a new good one, the held read whole.
        let held = cov(&["s/n/node_events/a"], &[], &[]);
        let new = cov(
            &["s/n/node_events/a", "s/n/node_events/c"],
            &[],
            &["s/n/node_events/d"],
        );
        assert_eq!(new.lost_against(&held), None);
        // A new node whose listing failed.
        let new = cov(&["s/n/node_events/a"], &["s/m/"], &[]);
        assert_eq!(new.lost_against(&held), None);
    }

    #[test]
    fn a_blank_first_read_loses_nothing_and_is_replaced() {
        let blank = cov(&[], &["s/"], &[]);
        let good = cov(&["s/n/a"], &[], &["s/n/b"]);
        assert_eq!(good.lost_against(&blank), None);
        assert_eq!(blank.lost_against(&good), Some(Lost::Listing("s/".into())));
    }

    #[test]
    fn losing_what_the_held_read_had_is_a_loss_whatever_the_counts() {
        // r55b D2: the session listing against two partition listings missed.
        let held = cov(
            &["s/n/node_events/a"],
            &["s/n/job_events/01/", "s/n/job_events/02/"],
            &[],
        );
        let new = cov(&[], &["s/", "s/fetched_endpoints/"], &[]);
        assert_eq!(new.lost_against(&held), Some(Lost::Listing("s/".into())));
        // r55b D1: the held read missed logs/; the reload every object.
        let held = cov(&["s/n/node_events/a"], &["s/n/logs/"], &[]);
        let new = cov(&[], &[], &["s/n/node_events/a"]);
        assert_eq!(
            new.lost_against(&held),
            Some(Lost::Object("s/n/node_events/a".into()))
        );
        // A partition listing the held read had.
        let new = cov(&[], &["s/n/node_events/"], &[]);
        assert_eq!(
            new.lost_against(&held),
            Some(Lost::Listing("s/n/node_events/".into()))
        );
    }

    #[test]
    fn past_the_bounds_the_counts_decide() {
        let mut held = Coverage::default();
        for i in 0..MAX_MISSED_KEYS + 5 {
            held.missed_object(&format!("s/o{i}"));
        }
        assert!(held.overflow);
        let mut same = held.clone();
        assert_eq!(same.lost_against(&held), None);
        same.missed_prefix("s/x/");
        assert!(matches!(same.lost_against(&held), Some(Lost::More { .. })));
        assert_eq!(cov(&[], &[], &["s/o1"]).lost_against(&held), None);
        let mut many = Coverage::default();
        for i in 0..MAX_READ_KEYS + 1 {
            many.read(&format!("s/n/{i}"));
        }
        assert!(many.overflow);
        assert!(many.bytes() < 8 << 20, "{}", many.bytes());
    }
}
