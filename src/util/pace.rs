//! A bandwidth cap: callers ask for `n` bytes and are delayed so that, over time, no more
//! than the configured bytes per second pass. One second of burst is allowed, so a cap
//! never delays a lane that stays under it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Paces bytes to at most `rate` per second (shared by the tasks of one lane).
#[derive(Debug)]
pub struct Pacer {
    rate: u64,
    /// The instant at which everything granted so far has been paid for.
    paid_until: Mutex<Instant>,
}

impl Pacer {
    /// A pacer of `rate` bytes per second; `None` for 0 (unlimited).
    pub fn new(rate: u64) -> Option<Pacer> {
        Self::starting_at(rate, Instant::now())
    }

    fn starting_at(rate: u64, now: Instant) -> Option<Pacer> {
        (rate > 0).then(|| Pacer {
            rate,
            paid_until: Mutex::new(credit_start(now)),
        })
    }

    /// How long a request for `bytes` made at `now` must wait, and books it.
    fn book(&self, bytes: u64, now: Instant) -> Duration {
        let cost = Duration::from_secs_f64(bytes as f64 / self.rate as f64);
        let mut paid = match self.paid_until.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Idle time builds up at most one second of credit.
        let start = (*paid).max(credit_start(now));
        *paid = start + cost;
        paid.saturating_duration_since(now)
    }

    /// Waits until `bytes` more may pass.
    pub async fn take(&self, bytes: u64) {
        let wait = self.book(bytes, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// One second before `now` (or `now` on a clock that young): the most credit idle time gives.
fn credit_start(now: Instant) -> Instant {
    now.checked_sub(Duration::from_secs(1)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_unlimited() {
        assert!(Pacer::new(0).is_none());
    }

    #[test]
    fn holds_the_rate_after_one_second_of_burst() {
        let t0 = Instant::now();
        let p = Pacer::starting_at(1_000_000, t0).unwrap();
        // One second's worth passes at once.
        assert_eq!(p.book(1_000_000, t0), Duration::ZERO);
        // The next 2 MB must wait 2 s.
        assert_eq!(p.book(2_000_000, t0), Duration::from_secs(2));
        // 10 MB booked over time: the last waits until 10 s after the start, minus the burst.
        let p = Pacer::starting_at(1_000_000, t0).unwrap();
        let mut wait = Duration::ZERO;
        for _ in 0..10 {
            wait = p.book(1_000_000, t0);
        }
        assert_eq!(wait, Duration::from_secs(9));
        // After a long idle spell only one second of credit is left.
        let later = t0 + Duration::from_secs(100);
        assert_eq!(p.book(1_000_000, later), Duration::ZERO);
        assert_eq!(p.book(1_000_000, later), Duration::from_secs(1));
    }
}
