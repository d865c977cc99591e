//! Whether a growing log is appended to this round, from what the store answered before.
//!
//! Only refusals count: an answer meaning the store will not copy (it cannot do
//! `UploadPartCopy`, or refuses it for an object). The refused object goes whole on the
//! schedule for [`KEY_REFUSED_FOR`], so one object the store will not copy costs one whole
//! upload per schedule, not one per round; [`MAX_APPEND_REFUSALS`] refusals in a row turn
//! appends off for [`APPENDS_RETRY_AFTER`], after which they are tried again (a store
//! upgraded, a policy fixed) and one more refusal turns them off again. A successful append
//! resets the count. Transient failures (5xx, throttling, timeouts, credentials) never reach
//! the gate. A versioned bucket has appends off for good (see `storage::append`).
//!
//! Time is passed in, so the rules are tested without waiting.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Refusals in a row after which appends are off for [`APPENDS_RETRY_AFTER`]: each refusal
/// costs a whole upload, and without appends the schedule bounds what is sent.
pub(super) const MAX_APPEND_REFUSALS: u32 = 3;

/// How long appends stay off after [`MAX_APPEND_REFUSALS`]: a store that cannot append then
/// costs one refused copy (and a whole upload) per quarter hour.
pub(super) const APPENDS_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// How long one object whose copy was refused goes whole on the schedule, while the other
/// objects keep appending.
pub(super) const KEY_REFUSED_FOR: Duration = Duration::from_secs(60 * 60);

/// Objects remembered as refused, at most: past it the oldest refusals are forgotten (those
/// objects are tried again sooner), so the map cannot grow with the number of logs.
const MAX_REFUSED_KEYS: usize = 4096;

/// What a call changed, for the log and the gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// Nothing.
    None,
    /// Appends were just turned off.
    TurnedOff,
    /// Appends were just turned on again, after [`APPENDS_RETRY_AFTER`].
    TurnedOn,
}

/// The state (see the module doc).
#[derive(Debug, Default)]
pub(super) struct AppendGate {
    refusals: u32,
    off_until: Option<Instant>,
    versioned: bool,
    refused_keys: HashMap<String, Instant>,
}

impl AppendGate {
    /// The bucket keeps versions: no appends, for good.
    pub(super) fn set_versioned(&mut self) {
        self.versioned = true;
    }

    /// True while appends are on at all.
    pub(super) fn on(&self, now: Instant) -> bool {
        !self.versioned && self.off_until.is_none_or(|until| now >= until)
    }

    /// Whether `key` may be appended to at `now`, and whether appends just came back on.
    pub(super) fn allows(&mut self, key: &str, now: Instant) -> (bool, Change) {
        if self.versioned {
            return (false, Change::None);
        }
        let mut change = Change::None;
        match self.off_until {
            Some(until) if now < until => return (false, Change::None),
            Some(_) => {
                self.off_until = None;
                // One more refusal turns them off again.
                self.refusals = MAX_APPEND_REFUSALS - 1;
                change = Change::TurnedOn;
            }
            None => {}
        }
        match self.refused_keys.get(key) {
            Some(until) if now < *until => (false, change),
            Some(_) => {
                self.refused_keys.remove(key);
                (true, change)
            }
            None => (true, change),
        }
    }

    /// An append succeeded.
    pub(super) fn succeeded(&mut self) {
        self.refusals = 0;
    }

    /// The store refused to copy `key` at `now`; the number of refusals in a row, and
    /// whether that turned appends off.
    pub(super) fn refused(&mut self, key: &str, now: Instant) -> (u32, Change) {
        if self.refused_keys.len() >= MAX_REFUSED_KEYS {
            if let Some(oldest) = self
                .refused_keys
                .iter()
                .min_by_key(|(_, until)| **until)
                .map(|(k, _)| k.clone())
            {
                self.refused_keys.remove(&oldest);
            }
        }
        self.refused_keys
            .insert(key.to_string(), now + KEY_REFUSED_FOR);
        self.refusals += 1;
        if self.refusals >= MAX_APPEND_REFUSALS && self.off_until.is_none() {
            self.off_until = Some(now + APPENDS_RETRY_AFTER);
            return (self.refusals, Change::TurnedOff);
        }
        (self.refusals, Change::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_turn_appends_off_for_a_while_then_on_again() {
        let t0 = Instant::now();
        let mut g = AppendGate::default();
        assert_eq!(g.allows("a", t0), (true, Change::None));
        assert_eq!(g.refused("a", t0), (1, Change::None));
        // The refused object goes whole; the others still append.
        assert!(!g.allows("a", t0).0);
        assert!(g.allows("b", t0).0);
        // A success in between resets the count.
        g.succeeded();
        assert_eq!(g.refused("b", t0), (1, Change::None));
        assert_eq!(g.refused("c", t0), (2, Change::None));
        assert_eq!(g.refused("d", t0), (3, Change::TurnedOff));
        assert!(!g.on(t0));
        assert!(!g.allows("e", t0 + APPENDS_RETRY_AFTER / 2).0);
        // After a while they are tried again, not only after a restart.
        let later = t0 + APPENDS_RETRY_AFTER;
        assert!(g.on(later));
        assert_eq!(g.allows("e", later), (true, Change::TurnedOn));
        assert_eq!(g.allows("f", later), (true, Change::None));
        // One more refusal turns them off again.
        assert_eq!(g.refused("e", later), (3, Change::TurnedOff));
        assert!(!g.allows("f", later).0);
        // A refused object is tried again after its own time.
        let much_later = t0 + KEY_REFUSED_FOR + APPENDS_RETRY_AFTER;
        assert!(g.allows("a", much_later).0);
    }

    #[test]
    fn a_versioned_bucket_never_appends() {
        let t0 = Instant::now();
        let mut g = AppendGate::default();
        g.set_versioned();
        assert!(!g.on(t0));
        assert!(!g.allows("a", t0 + KEY_REFUSED_FOR * 10).0);
    }

    #[test]
    fn refused_keys_are_bounded() {
        let t0 = Instant::now();
        let mut g = AppendGate::default();
        for i in 0..MAX_REFUSED_KEYS + 10 {
            g.refused(&format!("k{i}"), t0 + Duration::from_millis(i as u64));
            g.succeeded();
        }
        assert_eq!(g.refused_keys.len(), MAX_REFUSED_KEYS);
        // The oldest were forgotten, the newest kept.
        assert!(g.allows("k0", t0).0);
        assert!(!g.allows(&format!("k{}", MAX_REFUSED_KEYS + 9), t0).0);
    }
}
