//! What a read of a session covered: how far it read each object (whole, or the bytes it
//! decoded before it failed), the directories above the objects it read, and the prefixes
//! whose listing failed, so that a second read of the session can be told whether it lost
//! something the first one had.
//!
//! `serve` keeps the index it holds when a reload lost something the held index had
//! ([`Coverage::lost_against`]): an object the held load read further than the reload did
//! (whole, or in part: the events of a part read are in the index), or a prefix the reload
//! could not list under which the held load read an object. A key the held load never saw
//! (an object added since, broken or not), or read no further, is no loss, so a live session
//! keeps being followed while one of its objects is broken. Counts could not tell (reviews
//! r55a D1, r55b D1 and D2: a reload that read nothing replaced a good index; r55c D1: one
//! new broken object froze a live session; r55d D1: past a bound, a blank reload was taken
//! and the good ones after it refused), nor could what each read missed alone.
//!
//! Bounded: at most [`MAX_OBJECTS`] objects read whole, [`MAX_OBJECTS`] objects missed and
//! [`MAX_DIRS`] directories are kept, as 64-bit hashes of their keys (the missed ones apart, so
//! that many objects read never push out the few missed: review r55f D1), and [`MAX_NAMED`]
//! missed keys as text (for the message). Past a
//! bound, what is not kept is decided so that no reload is refused for ever: a key the held
//! load did not keep is no loss (a reload that then lost it is taken, and the next look that
//! reads it takes it back); a reload that could not keep all the objects (or prefixes) it
//! missed is not taken when it missed more of them than the held load did.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

/// Objects read whole kept per read, and objects missed (each a hash, the missed ones with how
/// far they were read: about 30 bytes each with the sets' overhead, measured by review r55f,
/// so ~8 MB at most of each beside an index). A session our collector writes holds a few
/// objects an hour per node and stream.
pub const MAX_OBJECTS: usize = 250_000;
/// Directories above the objects read, kept per read (far fewer than objects).
pub const MAX_DIRS: usize = 250_000;
/// Missed prefixes and objects kept as text, to name one in a message (about 150 bytes
/// each: ~1.5 MB at most).
pub const MAX_NAMED: usize = 10_000;

/// How far an object was read: [`WHOLE`], or the bytes decoded before it failed.
const WHOLE: u64 = u64::MAX;

/// What one read of a session covered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// Hashes of the keys of the objects read whole.
    read: HashSet<u64>,
    /// By hash of the key: how far an object not read whole was read (decoded bytes).
    missed: HashMap<u64, u64>,
    /// Objects missed and not kept past [`MAX_OBJECTS`].
    missed_dropped: u64,
    /// Hashes of every directory (`a/`, `a/b/`, ...) above an object read, whole or in part.
    dirs: HashSet<u64>,
    /// Prefixes (ending in `/`) whose listing failed, the first [`MAX_NAMED`].
    missed_prefixes: Vec<String>,
    /// Prefixes whose listing failed, in all.
    prefixes_missed: u64,
    /// Missed objects by key, the first [`MAX_NAMED`], to name one.
    named: HashMap<u64, String>,
    /// Objects not read to their end.
    missed_objects: u64,
}

fn hash(key: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl Coverage {
    /// An object read to its end.
    pub(crate) fn read(&mut self, key: &str) {
        if self.read.len() < MAX_OBJECTS {
            self.read.insert(hash(key));
        }
        self.dirs_above(key);
    }

    /// An object not read to its end, of which `decoded` bytes were read.
    pub(crate) fn missed_object(&mut self, key: &str, decoded: u64) {
        self.missed_objects += 1;
        if self.named.len() < MAX_NAMED {
            self.named.insert(hash(key), key.to_string());
        }
        if self.missed.len() < MAX_OBJECTS {
            self.missed.insert(hash(key), decoded);
        } else {
            self.missed_dropped += 1;
        }
        if decoded > 0 {
            self.dirs_above(key);
        }
    }

    fn dirs_above(&mut self, key: &str) {
        for (i, _) in key.match_indices('/') {
            if self.dirs.len() < MAX_DIRS {
                self.dirs.insert(hash(&key[..=i]));
            }
        }
    }

    /// How far the held load read the object of this hash (0: not at all, or not kept).
    fn how_far(&self, h: &u64) -> u64 {
        if self.read.contains(h) {
            WHOLE
        } else {
            self.missed.get(h).copied().unwrap_or(0)
        }
    }

    /// A prefix whose listing failed (`prefix` ends in `/`).
    pub(crate) fn missed_prefix(&mut self, prefix: &str) {
        self.prefixes_missed += 1;
        if self.missed_prefixes.len() < MAX_NAMED {
            self.missed_prefixes.push(prefix.to_string());
        }
    }

    /// What this read (a reload) lost of what `held` had, if anything (see the module doc).
    pub fn lost_against(&self, held: &Coverage) -> Option<Lost> {
        if let Some(p) = self
            .missed_prefixes
            .iter()
            .find(|p| held.dirs.contains(&hash(p)))
        {
            return Some(Lost::Listing(p.clone()));
        }
        let lost = self.missed.iter().find(|(h, &far)| held.how_far(h) > far);
        if let Some((h, _)) = lost {
            return Some(Lost::Object(self.named.get(h).cloned()));
        }
        let prefixes_dropped = self.prefixes_missed > self.missed_prefixes.len() as u64;
        let more = (self.missed_dropped > 0 && self.missed_objects > held.missed_objects)
            || (prefixes_dropped && self.prefixes_missed > held.prefixes_missed);
        more.then_some(Lost::More {
            missed: self.missed_objects + self.prefixes_missed,
            held_missed: held.missed_objects + held.prefixes_missed,
        })
    }

    /// Bytes these keys take (the index's size counts them).
    pub fn bytes(&self) -> u64 {
        let maps =
            self.read.capacity() * 9 + self.missed.capacity() * 17 + self.dirs.capacity() * 9;
        let named = self.named.values().chain(&self.missed_prefixes);
        (maps + named.map(|k| k.len() + 40).sum::<usize>()) as u64
    }
}

/// What a reload lost of what the index held had (see [`Coverage::lost_against`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// A prefix it could not list, under which the held load read an object.
    Listing(String),
    /// An object the held load read further than it did (its key, when it is kept).
    Object(Option<String>),
    /// Past the bounds: it missed more objects (or prefixes) than the held load did.
    More { missed: u64, held_missed: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cov(read: &[&str], prefixes: &[&str], objects: &[(&str, u64)]) -> Coverage {
        let mut c = Coverage::default();
        read.iter().for_each(|k| c.read(k));
        prefixes.iter().for_each(|p| c.missed_prefix(p));
        objects.iter().for_each(|(o, far)| c.missed_object(o, *far));
        c
    }

    #[test]
    fn missing_what_the_held_read_never_had_is_no_loss() {
        let held = cov(&["s/n/e/a"], &["s/n/j/01/"], &[("s/n/e/b", 10)]);
        // The same broken object read as far, one under the listing the held read missed,
        // a new one.
        let new = cov(
            &["s/n/e/a", "s/n/e/c"],
            &[],
            &[("s/n/e/b", 10), ("s/n/j/01/x", 0), ("s/n/e/new", 0)],
        );
        assert_eq!(new.lost_against(&held), None);
        // r55c D1: a new broken object beside a new good one, the held read whole.
        let held = cov(&["s/n/e/a"], &[], &[]);
        let new = cov(&["s/n/e/a", "s/n/e/c"], &[], &[("s/n/e/d", 0)]);
        assert_eq!(new.lost_against(&held), None);
        // A new node whose listing failed; a node of logs only (nothing read under it).
        let held = cov(&["s/n/e/a"], &[], &[]);
        assert_eq!(cov(&["s/n/e/a"], &["s/m/"], &[]).lost_against(&held), None);
    }

    #[test]
    fn a_blank_first_read_loses_nothing_and_is_replaced() {
        let blank = cov(&[], &["s/"], &[]);
        let good = cov(&["s/n/a"], &[], &[("s/n/b", 0)]);
        assert_eq!(good.lost_against(&blank), None);
        assert_eq!(blank.lost_against(&good), Some(Lost::Listing("s/".into())));
    }

    #[test]
    fn losing_what_the_held_read_had_is_a_loss_whatever_the_counts() {
        // r55b D2: the session listing against two partition listings missed.
        let held = cov(&["s/n/e/a"], &["s/n/j/01/", "s/n/j/02/"], &[]);
        let new = cov(&[], &["s/", "s/f/"], &[]);
        assert_eq!(new.lost_against(&held), Some(Lost::Listing("s/".into())));
        // r55b D1: the held read missed logs/; the reload every object.
        let held = cov(&["s/n/e/a"], &["s/n/logs/"], &[]);
        let new = cov(&[], &[], &[("s/n/e/a", 0)]);
        assert_eq!(
            new.lost_against(&held),
            Some(Lost::Object(Some("s/n/e/a".into())))
        );
        let new = cov(&[], &["s/n/e/"], &[]);
        assert_eq!(
            new.lost_against(&held),
            Some(Lost::Listing("s/n/e/".into()))
        );
        // r55d D2: an object the held load read in part, read less far.
        let held = cov(&["s/n/e/a"], &[], &[("s/n/e/cut", 6000)]);
        let new = cov(&["s/n/e/a"], &[], &[("s/n/e/cut", 0)]);
        assert!(matches!(
            new.lost_against(&held),
            Some(Lost::Object(Some(_)))
        ));
        // ... read as far, or further: no loss.
        let new = cov(&["s/n/e/a", "s/n/e/cut"], &[], &[]);
        assert_eq!(new.lost_against(&held), None);
    }

    #[test]
    fn past_the_bounds_nothing_is_refused_for_ever() {
        // r55d D1: 10,005 broken objects held and 7 tasks read: a blank reload is a loss,
        // the good one after it is not.
        let mut held = cov(&["s/n/e/a"], &[], &[]);
        for i in 0..MAX_NAMED + 5 {
            held.missed_object(&format!("s/n/e/b{i}"), 0);
        }
        let blank = cov(&[], &["s/"], &[]);
        assert_eq!(blank.lost_against(&held), Some(Lost::Listing("s/".into())));
        let mut good = held.clone();
        good.missed_object("s/n/e/new", 0);
        assert_eq!(good.lost_against(&held), None);
        assert_eq!(held.lost_against(&blank), None);
        // Objects past MAX_OBJECTS: a key the held load did not keep is no loss; a reload
        // that could not keep all it missed is refused only when it missed more.
        let mut big = Coverage::default();
        for i in 0..MAX_OBJECTS + 1 {
            big.read(&format!("s/n/{i}"));
        }
        assert!(big.bytes() < 8 << 20, "{}", big.bytes());
        let mut lost_late = Coverage::default();
        lost_late.missed_object(&format!("s/n/{MAX_OBJECTS}"), 0);
        assert_eq!(lost_late.lost_against(&big), None);
        // r55f D1: past the bound of objects read, a new broken object is still known to be
        // new (the missed are kept apart).
        let mut big_and_new = big.clone();
        big_and_new.missed_object("s/n/new-broken", 0);
        assert_eq!(big_and_new.lost_against(&big), None);
        let mut many_missed = Coverage::default();
        for i in 0..MAX_OBJECTS + 1 {
            many_missed.missed_object(&format!("s/x/{i}"), 0);
        }
        assert!(matches!(
            many_missed.lost_against(&big),
            Some(Lost::More { .. })
        ));
    }
}
