//! Whether a growing log is appended to this round, from what the store answered before.
//!
//! Only refusals count: an answer meaning the store will not copy (it cannot do
//! `UploadPartCopy`, or refuses it for an object). The refused object goes whole on the
//! schedule for [`KEY_REFUSED_FOR`], so one object the store will not copy costs one whole
//! upload per schedule, not one per round; [`MAX_APPEND_REFUSALS`] refusals in a row turn
//! appends off for [`APPENDS_RETRY_AFTER`], after which they are tried again (a store
//! upgraded, a policy fixed) and one more refusal turns them off again. A successful append
//! resets the count. A deterministic failure of any request of an append (a 4xx other than
//! 401, 408 and 429, an error document in a 200 answer: a HEAD refused to write-only
//! credentials, a completion refused with `InvalidPart`) is such a refusal.
//!
//! Transient failures (5xx, throttling, timeouts, credentials) never turn appends off, but
//! an object whose appends fail transiently [`MAX_TRANSIENT_APPEND_ROUNDS`] rounds in a row,
//! or whose failing appends go on for [`MAX_TRANSIENT_APPEND_INTERVALS`] intervals since the
//! first of them started (a copy that always times out, say), is uploaded whole at that
//! failure, and then goes whole on the schedule for [`KEY_REFUSED_FOR`] like a refused one:
//! its bucket copy is at most about five intervals stale because of its appends, or one
//! failed append's own duration when that is longer (an S3 copy left unanswered fails after
//! 30 s: at a 2 s interval, five such failures counted in rounds only left the object 150 s,
//! 75 intervals, stale; review r42t D5). A versioned bucket has appends off for good (see
//! `storage::append`).
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

/// Rounds in a row an object's append may fail transiently before it is uploaded whole
/// instead: an object whose appends cannot succeed is at most this many intervals stale
/// (5 minutes at the default 60 s), while an outage shorter than an interval, retried
/// within each round, passes in fewer rounds (no whole upload for it). At short intervals
/// [`MAX_TRANSIENT_APPEND_INTERVALS`] comes first: at 1 s, an outage that keeps appends
/// failing for 4 s costs one whole upload.
pub(super) const MAX_TRANSIENT_APPEND_ROUNDS: u32 = 5;

/// How long, in upload intervals since the first failed append of a streak started, an
/// object's appends may keep failing transiently: the failure that ends this late sends it
/// whole, however few rounds that took (each failure may itself last longer than an
/// interval: a copy left unanswered fails after 30 s).
pub(super) const MAX_TRANSIENT_APPEND_INTERVALS: u32 = 4;

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
    /// Per object, its appends' transient failures in a row (at most [`MAX_REFUSED_KEYS`]).
    transient: HashMap<String, Streak>,
}

/// An object's appends failing transiently in a row.
#[derive(Debug, Clone, Copy)]
struct Streak {
    failures: u32,
    /// When the first failed append of the streak started.
    since: Instant,
}

/// An object whose appends kept failing transiently, given up: it goes whole now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GaveUp {
    /// Failed appends in a row.
    pub(super) failures: u32,
    /// From the start of the first of them to the end of the last.
    pub(super) lasted: Duration,
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

    /// An append to `key` succeeded.
    pub(super) fn succeeded(&mut self, key: &str) {
        self.refusals = 0;
        self.transient.remove(key);
    }

    /// An append to `key` that started at `started` failed transiently at `now`, with
    /// uploads every `interval`; `Some` when the object goes whole now: that failure makes
    /// [`MAX_TRANSIENT_APPEND_ROUNDS`] in a row, or ends [`MAX_TRANSIENT_APPEND_INTERVALS`]
    /// intervals or more after the first of them started.
    pub(super) fn failed_transiently(
        &mut self,
        key: &str,
        started: Instant,
        now: Instant,
        interval: Duration,
    ) -> Option<GaveUp> {
        if self.transient.len() >= MAX_REFUSED_KEYS && !self.transient.contains_key(key) {
            // Bounded: forget one streak (that object is only tried longer).
            if let Some(k) = self.transient.keys().next().cloned() {
                self.transient.remove(&k);
            }
        }
        let streak = self.transient.entry(key.to_string()).or_insert(Streak {
            failures: 0,
            since: started,
        });
        streak.failures += 1;
        let lasted = now.saturating_duration_since(streak.since);
        let too_long = lasted >= interval.saturating_mul(MAX_TRANSIENT_APPEND_INTERVALS);
        (streak.failures >= MAX_TRANSIENT_APPEND_ROUNDS || too_long).then_some(GaveUp {
            failures: streak.failures,
            lasted,
        })
    }

    /// True while `key`'s appends are failing transiently (the last one did).
    pub(super) fn failing_transiently(&self, key: &str) -> bool {
        self.transient.contains_key(key)
    }

    /// `key` was uploaded whole after its appends kept failing transiently: it goes whole
    /// on the schedule for [`KEY_REFUSED_FOR`], without counting toward turning appends off.
    pub(super) fn gave_up_appending(&mut self, key: &str, now: Instant) {
        self.transient.remove(key);
        self.remember_refused(key, now);
    }

    /// The store refused to copy `key` at `now`; the number of refusals in a row, and
    /// whether that turned appends off.
    pub(super) fn refused(&mut self, key: &str, now: Instant) -> (u32, Change) {
        self.transient.remove(key);
        self.remember_refused(key, now);
        self.refusals += 1;
        if self.refusals >= MAX_APPEND_REFUSALS && self.off_until.is_none() {
            self.off_until = Some(now + APPENDS_RETRY_AFTER);
            return (self.refusals, Change::TurnedOff);
        }
        (self.refusals, Change::None)
    }

    /// `key` goes whole on the schedule until `now + KEY_REFUSED_FOR`.
    fn remember_refused(&mut self, key: &str, now: Instant) {
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
        g.succeeded("x");
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

    /// A failure that starts at `at` and lasts `took`, at `interval`.
    fn fail(g: &mut AppendGate, key: &str, at: Instant, took: Duration) -> Option<GaveUp> {
        g.failed_transiently(key, at, at + took, INTERVAL)
    }

    const INTERVAL: Duration = Duration::from_secs(60);

    #[test]
    fn transient_failures_in_a_row_send_the_object_whole_then_on_the_schedule() {
        let t0 = Instant::now();
        let quick = Duration::from_secs(1);
        let mut g = AppendGate::default();
        let round = |i: u32| t0 + INTERVAL / 2 * i;
        for i in 1..MAX_TRANSIENT_APPEND_ROUNDS {
            assert_eq!(fail(&mut g, "a", round(i), quick), None);
        }
        // A success in between starts the count again.
        g.succeeded("a");
        let t1 = round(MAX_TRANSIENT_APPEND_ROUNDS);
        let round = |i: u32| t1 + INTERVAL / 2 * i;
        for i in 1..MAX_TRANSIENT_APPEND_ROUNDS {
            assert_eq!(fail(&mut g, "a", round(i), quick), None);
            assert_eq!(fail(&mut g, "b", round(i), quick), None);
        }
        // The fifth in a row, two and a half intervals after the first began.
        let n = MAX_TRANSIENT_APPEND_ROUNDS;
        assert_eq!(
            fail(&mut g, "a", round(n), quick),
            Some(GaveUp {
                failures: n,
                lasted: round(n) + quick - round(1),
            })
        );
        g.gave_up_appending("a", t0);
        assert!(!g.allows("a", t0).0);
        assert!(g.allows("b", t0).0);
        // Never turns appends off.
        assert!(g.on(t0));
        assert!(g.allows("a", t0 + KEY_REFUSED_FOR).0);
    }

    /// Review r42t D5: at a short interval, each failed append lasting 30 s (a copy left
    /// unanswered), five of them left the object 75 intervals stale.
    #[test]
    fn failures_that_last_four_intervals_send_the_object_whole_however_few() {
        let t0 = Instant::now();
        let mut g = AppendGate::default();
        let hung = Duration::from_secs(30);
        let short = Duration::from_secs(2);
        // One failure lasting 15 intervals at 2 s: whole at once.
        assert_eq!(
            g.failed_transiently("a", t0, t0 + hung, short),
            Some(GaveUp {
                failures: 1,
                lasted: hung,
            })
        );
        // At 60 s, the same failure is not four intervals: tried again next round.
        assert_eq!(fail(&mut g, "b", t0, hung), None);
        // Counted from the start of the first failure to the end of the last: the second
        // ends at 4 intervals exactly.
        let second = t0 + hung + INTERVAL;
        let end = t0 + INTERVAL * MAX_TRANSIENT_APPEND_INTERVALS;
        assert_eq!(
            g.failed_transiently("b", second, end, INTERVAL),
            Some(GaveUp {
                failures: 2,
                lasted: INTERVAL * MAX_TRANSIENT_APPEND_INTERVALS,
            })
        );
        // Just under four intervals is not yet; a success starts the streak again, from
        // the next failure's own start.
        assert_eq!(fail(&mut g, "c", t0, hung), None);
        let under = t0 + INTERVAL * MAX_TRANSIENT_APPEND_INTERVALS - Duration::from_millis(1);
        assert_eq!(
            g.failed_transiently("c", under - hung, under, INTERVAL),
            None
        );
        g.succeeded("c");
        assert_eq!(fail(&mut g, "c", under, hung), None);
        assert_eq!(fail(&mut g, "c", under + INTERVAL, hung), None);
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
            g.succeeded("x");
        }
        assert_eq!(g.refused_keys.len(), MAX_REFUSED_KEYS);
        // The oldest were forgotten, the newest kept.
        assert!(g.allows("k0", t0).0);
        assert!(!g.allows(&format!("k{}", MAX_REFUSED_KEYS + 9), t0).0);
    }
}
