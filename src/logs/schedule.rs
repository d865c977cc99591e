//! When a live log file that changed is uploaded again: the size-aware schedule.
//!
//! Uploading every changed file whole every round makes the bytes sent grow with the square
//! of a job's duration (a log that grows steadily is sent again in full each interval). The
//! schedule bounds that. For a file whose bucket copy has `S` bytes and that now has `N`:
//!
//! - a file never uploaded, or one of at most [`SMALL`] bytes, goes now (small files stay
//!   one interval fresh);
//! - a file that was replaced by a new one under the same name, or shrank (truncated), goes
//!   now;
//! - a file that has at least doubled (`N ≥ 2 S`) goes now (the growth pays for the upload);
//! - otherwise it waits until `S / SMALL` intervals have passed since its last upload (a
//!   time that grows with its size), then goes with whatever it has.
//!
//! What that costs, for a file that reached `F` bytes (the tests below check it over random
//! growth): the uploads made because the file doubled are each at least twice the one
//! before, so they add up to at most `2 F`, and the final one is at most `F`; an upload made
//! because time passed costs less than `2 S` and comes at least `S / SMALL` intervals after
//! the previous one, and a small file costs at most `SMALL` a round, so together they cost
//! at most `2 × SMALL` (2 MiB) per interval of the file's life. Bytes uploaded ≤ `3 F` +
//! 2 MiB × intervals (a file that keeps growing steadily: about `2.5 F`). The longest a
//! change waits is `max(1, S / SMALL)` intervals (the table in docs/logs.md), and less when
//! the file grows fast: it goes once it has doubled. The final flush, earlier sessions and
//! rotated backups do not wait: they upload whatever is not in the bucket yet. Where the
//! store can append (S3 from 5 MiB, `file://`; not in a versioned bucket), a file that only
//! grew sends only its new bytes, so it goes every interval (see `append`).

use std::time::Duration;

/// Files up to this size are uploaded every interval they change.
pub(crate) const SMALL: u64 = 1 << 20;

/// Why a changed file is uploaded this round, or that it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Not in the bucket yet.
    New,
    /// Small enough to keep one interval fresh.
    Small,
    /// A new file under the same name, or smaller than its bucket copy (truncated).
    Replaced,
    /// At least twice what the bucket has.
    Grew,
    /// Waited its size's share of intervals.
    Waited,
    /// Not yet.
    Later,
}

impl Due {
    /// True when the file goes this round.
    pub(crate) fn now(self) -> bool {
        self != Due::Later
    }
}

/// The longest a change to a file whose bucket copy has `uploaded` bytes waits.
pub(crate) fn longest_wait(uploaded: u64, interval: Duration) -> Duration {
    let intervals = (uploaded / SMALL).max(1);
    interval.saturating_mul(u32::try_from(intervals).unwrap_or(u32::MAX))
}

/// Decides for a file of `size` bytes whose bucket copy (if any) has `uploaded` bytes and was
/// made `age` ago; `replaced` when the file is not the one that copy came from.
pub(crate) fn due(
    uploaded: Option<u64>,
    age: Duration,
    size: u64,
    interval: Duration,
    replaced: bool,
) -> Due {
    let Some(s) = uploaded else {
        return Due::New;
    };
    if size <= SMALL {
        return Due::Small;
    }
    if replaced || size < s {
        return Due::Replaced;
    }
    if size - s >= s {
        return Due::Grew;
    }
    if age >= longest_wait(s, interval) {
        return Due::Waited;
    }
    Due::Later
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: Duration = Duration::from_secs(60);

    #[test]
    fn the_rules() {
        let z = Duration::ZERO;
        assert_eq!(due(None, z, 5 << 30, I, false), Due::New);
        assert_eq!(due(Some(10), z, SMALL, I, false), Due::Small);
        assert_eq!(due(Some(20 << 20), z, 10 << 20, I, false), Due::Replaced);
        assert_eq!(due(Some(10 << 20), z, 11 << 20, I, true), Due::Replaced);
        assert_eq!(due(Some(10 << 20), z, 20 << 20, I, false), Due::Grew);
        assert_eq!(due(Some(10 << 20), z, (20 << 20) - 1, I, false), Due::Later);
        assert_eq!(due(Some(10 << 20), I * 9, 11 << 20, I, false), Due::Later);
        assert_eq!(due(Some(10 << 20), I * 10, 11 << 20, I, false), Due::Waited);
        assert_eq!(longest_wait(0, I), I);
        assert_eq!(longest_wait(SMALL, I), I);
        assert_eq!(longest_wait(100 * SMALL, I), I * 100);
    }

    /// Runs the schedule over a file that grows by `growth(round)` bytes per interval for
    /// `rounds` intervals, then the final flush; returns (bytes uploaded, final size, the
    /// longest wait of a change in intervals).
    fn simulate(rounds: u64, mut growth: impl FnMut(u64) -> u64) -> (u64, u64, u64) {
        let mut size = 0u64;
        let mut uploaded: Option<u64> = None;
        let mut last = 0u64;
        let mut sent = 0u64;
        let mut longest = 0u64;
        let mut changed_since: Option<u64> = None;
        for round in 1..=rounds {
            let g = growth(round);
            size += g;
            if g > 0 && changed_since.is_none() && uploaded != Some(size) {
                changed_since = Some(round);
            }
            if uploaded == Some(size) {
                continue;
            }
            let age = I * u32::try_from(round - last).unwrap();
            if due(uploaded, age, size, I, false).now() {
                sent += size;
                uploaded = Some(size);
                last = round;
                if let Some(c) = changed_since.take() {
                    longest = longest.max(round - c);
                }
            }
        }
        if uploaded != Some(size) {
            sent += size;
        }
        (sent, size, longest)
    }

    #[test]
    fn steady_growth_costs_at_most_three_times_the_file() {
        // 1 MB/s at a 60 s interval, for 10 minutes and for 24 hours.
        for rounds in [10u64, 1440] {
            let (sent, size, longest) = simulate(rounds, |_| 60_000_000);
            let factor = sent as f64 / size as f64;
            assert!(factor <= 3.0, "{rounds} rounds: {factor}");
            // It doubles faster than it waits: the longest wait is the time to double.
            assert!(longest <= rounds / 2, "{rounds} rounds: waited {longest}");
        }
        // A slow writer (12 kB/s for a day): what the schedule spends to keep it fresh is
        // the documented 2 MiB per interval at most, beside the 3 F.
        let (sent, size, longest) = simulate(1440, |_| 720_000);
        assert!(sent <= 3 * size + 1440 * 2 * SMALL, "{sent} for {size}");
        assert!(longest <= size / SMALL, "waited {longest}");
    }

    #[test]
    fn any_growth_is_bounded_as_documented() {
        // Random growth patterns: bursts, silences, slow trickles, big and small files.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2_000 {
            let rounds = 1 + next() % 2_000;
            let style = next() % 4;
            let scale = 1 + next() % (64 << 20);
            let mut r = next;
            let (sent, size, longest) = simulate(rounds, |_| match style {
                0 => scale / 8,
                1 => {
                    if r() % 10 == 0 {
                        r() % scale
                    } else {
                        0
                    }
                }
                2 => r() % 4_096,
                _ => r() % scale,
            });
            next = r;
            let bound = 3 * size + rounds * 2 * SMALL;
            assert!(
                sent <= bound,
                "sent {sent} > {bound} (size {size}, {rounds} rounds)"
            );
            // A change waits at most its size's share of intervals.
            assert!(
                longest <= (size / SMALL).max(1),
                "waited {longest} rounds for {size}"
            );
        }
    }
}
