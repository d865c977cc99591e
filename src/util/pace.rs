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

/// When one send last moved: a deadline on progress cuts a send that stopped (a request
/// the store never answers), not one that is slow but going (a big file under a cap shared
/// by several sends, a body streaming over a slow uplink). Time a send waits for its share
/// of the cap is not a stop: the pacer says when it goes on. Nor is the time a request's
/// body takes on the wire at [`MIN_BODY_RATE`] ([`Progress::sending`]): a client that does
/// not count a body (object_store's own) says nothing until the answer, so a request
/// carrying `n` bytes counts as moving for `n / MIN_BODY_RATE` after it began (review r42c D3: a 6.1 MB PUT
/// at 30 to 100 kB/s was cut at the stall limit and restarted from byte 0 every round).
/// The log lane's client also counts the bytes of a body as the connection takes them
/// ([`Progress::took`], `storage::counted`): each moves the send, so [`Progress::last_moved`]
/// sees a slow body moving and a stopped one stopped (review r42h D3), and so do the bytes
/// of it the peer acknowledges once the client took it all ([`Progress::drained`]: the
/// kernel's send buffer holds the last few MiB; review r42i D2).
#[derive(Debug)]
pub struct Progress {
    inner: Mutex<Moves>,
}

#[derive(Debug, Clone, Copy)]
struct Moves {
    /// When the send last moved, or when it will (the end of a wait for the cap).
    last: Instant,
    /// Until when the request in flight counts as moving (its body's allowance), if one is.
    body_until: Option<Instant>,
    /// The HTTP client took the whole body of the request in flight: it waits for its
    /// answer ([`Progress::took`]).
    body_done: bool,
    /// Bytes of request bodies the HTTP client took, in all.
    taken: u64,
}

/// The slowest a request's body may go and still count as moving: 8 KiB/s (64 kbit/s).
/// Below the 30 to 100 kB/s of the slow uplinks it must carry, with room for the log lane's
/// send and the four beside it (`logs::lane`) sharing one such link (five sends on 40 kB/s still
/// clear it). The price is how long a request whose connection died half way through its
/// body holds its send: its body's bytes at this rate (1,024 s for a default 8 MiB part),
/// then the stall limit; such a send goes on beside the lane, so the node's other logs do
/// not wait for it, and the final flush's deadline bounds it at shutdown.
pub const MIN_BODY_RATE: u64 = 8 << 10;

/// How long a body of `bytes` may take at [`MIN_BODY_RATE`].
pub fn body_allowance(bytes: u64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / MIN_BODY_RATE as f64)
}

impl Progress {
    /// A send starting now.
    pub fn new() -> Progress {
        Progress {
            inner: Mutex::new(Moves {
                last: Instant::now(),
                body_until: None,
                body_done: false,
                taken: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Moves> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The send moved now (a request ended, a part was read): the allowance of the request
    /// that ended goes with it.
    pub fn moved(&self) {
        let mut m = self.lock();
        m.last = m.last.max(Instant::now());
        m.body_until = None;
        m.body_done = false;
    }

    /// The HTTP client took `bytes` more of the body of the request in flight (the log
    /// lane's client counts them, `storage::counted`): the send moved now. `done`: it took
    /// the whole body, and the request now waits for its answer.
    pub fn took(&self, bytes: u64, done: bool) {
        let mut m = self.lock();
        m.last = m.last.max(Instant::now());
        m.taken += bytes;
        m.body_done |= done;
    }

    /// The peer acknowledged more bytes of the connection of the request in flight (its
    /// body drains from the socket's send buffer after the client took it all,
    /// `storage::drain`): the send moved now.
    pub fn drained(&self) {
        let mut m = self.lock();
        m.last = m.last.max(Instant::now());
    }

    /// Bytes of request bodies the HTTP client took for this send, in all.
    pub fn taken(&self) -> u64 {
        self.lock().taken
    }

    /// The HTTP client took the whole body of the request in flight.
    pub fn body_taken(&self) -> bool {
        self.lock().body_done
    }

    fn moved_at(&self, at: Instant) {
        let mut m = self.lock();
        m.last = m.last.max(at);
    }

    /// A request carrying `bytes` of body begins now: the send counts as moving for the
    /// body's time at [`MIN_BODY_RATE`] ([`body_allowance`]), until it ends ([`Self::moved`]).
    pub fn sending(&self, bytes: u64) {
        let until = Instant::now() + body_allowance(bytes);
        let mut m = self.lock();
        m.body_until = Some(m.body_until.map_or(until, |u| u.max(until)));
        m.body_done = false;
    }

    /// When a request of the send last ended, or when its wait for the cap ends: not
    /// counting the time a request's body may still be on the wire, so a request the store
    /// holds unanswered after taking its body does not count as moving (the final flush's
    /// look at the sends it kept, `logs::shipper`).
    pub fn last_moved(&self) -> Instant {
        self.lock().last
    }

    /// A request carrying a body is in flight (begun with [`Self::sending`], not ended),
    /// and the HTTP client has not taken all of its body yet.
    pub fn body_in_flight(&self) -> bool {
        let m = self.lock();
        m.body_until.is_some() && !m.body_done
    }

    /// When the send last moved (or will, after its wait for the cap or while its request's
    /// body may still be on the wire).
    pub fn last(&self) -> Instant {
        let m = *self.lock();
        m.body_until.map_or(m.last, |u| u.max(m.last))
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// How one send's bytes flow: the lane's cap, if any, and the send's [`Progress`], if it is
/// watched. `Flow::default()`: neither.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flow<'a> {
    /// The cap shared by the lane's sends.
    pub pacer: Option<&'a Pacer>,
    /// This send's progress.
    pub progress: Option<&'a Progress>,
}

impl Flow<'_> {
    /// Waits until `bytes` more may pass the cap; the send counts as moving until then.
    ///
    /// The bytes are booked in slices of [`SLICE`] of the cap, each once the one before is
    /// paid: a big part never books the cap far ahead (review r42c D2: a 4 MB part booked 40 s
    /// at 100 kB/s, and the final flush's small, most valuable files waited behind it), the
    /// other sends' slices go in between, and a send cancelled mid-wait leaves at most one
    /// slice booked.
    pub async fn take(&self, bytes: u64) {
        let Some(pacer) = self.pacer else {
            self.moved();
            return;
        };
        let slice = ((pacer.rate as f64 * SLICE.as_secs_f64()) as u64).max(1);
        let mut left = bytes;
        loop {
            let now = Instant::now();
            let this = left.min(slice);
            left -= this;
            let wait = pacer.book(this, now);
            if let Some(p) = self.progress {
                p.moved_at(now + wait);
            }
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if left == 0 {
                return;
            }
        }
    }

    /// The send moved now (see [`Progress::moved`]).
    pub fn moved(&self) {
        if let Some(p) = self.progress {
            p.moved();
        }
    }

    /// A request carrying `bytes` of body begins now (see [`Progress::sending`]).
    pub fn sending(&self, bytes: u64) {
        if let Some(p) = self.progress {
            p.sending(bytes);
        }
    }
}

/// The time of the cap one booking takes at most (see [`Flow::take`]): short, so another
/// send waits at most this long behind a big one; long enough that a part is a few dozen
/// bookings, not millions.
const SLICE: Duration = Duration::from_millis(100);

/// One second before `now` (or `now` on a clock that young): the most credit idle time gives.
fn credit_start(now: Instant) -> Instant {
    now.checked_sub(Duration::from_secs(1)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiting_for_the_cap_is_progress() {
        let pacer = Pacer::new(1_000_000).unwrap();
        let progress = Progress::new();
        let flow = Flow {
            pacer: Some(&pacer),
            progress: Some(&progress),
        };
        let before = Instant::now();
        // One second of burst passes at once; the next 50 kB is booked 50 ms later.
        pacer.book(1_000_000, before);
        flow.take(50_000).await;
        assert!(progress.last() >= before + Duration::from_millis(45));
        let later = progress.last();
        flow.moved();
        assert!(progress.last() >= later);
    }

    #[test]
    fn a_body_in_flight_moves_at_the_floor_rate_until_its_request_ends() {
        let progress = Progress::new();
        let before = Instant::now();
        // 80 KiB: ten seconds at 8 KiB/s.
        progress.sending(80 << 10);
        assert!(progress.last() >= before + Duration::from_secs(10));
        assert!(progress.last() <= Instant::now() + Duration::from_secs(10));
        // The request ended: a hang of the next one gets no allowance from it.
        progress.moved();
        assert!(progress.last() <= Instant::now());
    }

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
