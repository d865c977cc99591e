//! The memory budget of bodies in flight ([`BodyBudget`]) and the room one body holds in it
//! ([`Room`]): room taken in steps of [`RESERVE_STEP`] from a fair queue, the small bodies'
//! reserve ([`SMALL_BODIES_RESERVE`]), the turns to decode a gzip layer ([`DECODERS`] and the
//! small bodies' [`SMALL_DECODERS`]), and how a body that waits gets room back from others
//! (bodies behind their pace are cut; the largest waiting one gives way). Whatever clients
//! send, the room held stays within the budget, and [`BodyProblem`] says why a body got none.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::pace::Pace;

/// Room for ordinary bodies beside one body of the largest size.
pub(in crate::events::http) const SMALL_BODIES_ROOM: u64 = 32 << 20;
/// Room beside the budget that only small bodies ([`SMALL_BODY`] at most, Ray's batches of
/// tens of KB) may take, once the shared budget is full: whatever large bodies hold, and
/// for however long (two 49 KB gzip bodies of 48 MiB of `[0,0,…]` hold the whole budget
/// while they are parsed, neither behind their pace nor waiting; review r39h D2: Ray got
/// 503 after 10 s), Ray's batch finds room at once. A body that grows past [`SMALL_BODY`]
/// gives back what it took of it, so no large body ever holds any.
pub(super) const SMALL_BODIES_RESERVE: u64 = 4 << 20;
/// The largest room a body may take from [`SMALL_BODIES_RESERVE`]: four times Ray's
/// batches of about a quarter MB (a 1 MB batch takes the shared budget like any other).
pub(super) const SMALL_BODY: u64 = 1 << 20;
/// How long a body waits, in all, for room in the budget before it gets 503.
pub(in crate::events::http) const BUDGET_WAIT: Duration = Duration::from_secs(10);
/// The unit of room: a body's charge is its bytes rounded up to this, and a body waiting
/// for room queues for this much at a time, so it never stands in front of a small request
/// for megabytes. Small enough that rounding costs little (a small body holds one step),
/// large enough that a 64 MiB body takes room a thousand times, not once per frame.
pub(super) const RESERVE_STEP: u64 = 64 << 10;
/// Gzip bodies being decoded at once, each on a thread of its own: the others wait their
/// turn without holding a thread ([`BodyBudget::decode_turn`]), so however many clients send
/// gzip bodies at once, decoding takes at most this many CPUs and the runtime's workers
/// (every connection's reads and answers, the probes) still get theirs (review r39k D1:
/// about 300 bombs decoding at once on as many threads left `/healthz` unanswered for 3 s
/// on both listeners).
pub(in crate::events::http) const DECODERS: usize = 2;
/// A gzip body of at most this many bytes as received is small: Ray's batches (a few KiB to
/// tens of KiB compressed) are. Beside the [`DECODERS`] turns any body may take, small bodies
/// have [`SMALL_DECODERS`] of their own, so a small batch is never queued behind large
/// decodes (review r39m D1: ten to fifteen clients looping gzip bodies of about 1 MiB that
/// stay under the ratio but decode to tens of MiB each held Ray's batches of a few KiB for
/// their turn for 3 to 14 s, past Ray's 3 s).
pub(super) const SMALL_GZIP_BODY: u64 = 64 << 10;
/// Decoding turns only small bodies ([`SMALL_GZIP_BODY`]) may take, beside [`DECODERS`]:
/// decoding takes at most `DECODERS + SMALL_DECODERS` CPUs, and a turn of this lane at most
/// the time of [`SMALL_DECODED`] decoded twice (a few milliseconds).
pub(super) const SMALL_DECODERS: usize = 1;
/// What a layer may decode to in a small body's own turn: with its received bytes
/// ([`SMALL_GZIP_BODY`] at most) it stays within [`SMALL_BODY`], so it fits the small bodies'
/// reserve. A small body that decodes to more (only a ratio above 15, which Ray's JSON never
/// reaches) gives that turn back and takes one of the [`DECODERS`], as a large body does.
pub(super) const SMALL_DECODED: u64 = SMALL_BODY - SMALL_GZIP_BODY;
/// Decoding turns only bodies on a connection that delivered events before
/// ([`Pace::delivered`]: Ray's publisher, which keeps its connection) may take, beside the
/// others: whatever cheap clients queue for the other turns (hundreds of tiny gzip bodies,
/// each decoding to a MiB of whitespace, take every turn in the order they came; review
/// r39q D1: Ray's batch waited behind them until its connection gave way, 1 of 32 answered
/// 200), Ray's next batch is decoded at once. With an ingest token, only the token's
/// connections count as delivered ([`Pace::trusted`]): without one, any local client that
/// posts one valid event takes this turn too (review r39r D2). Decoding takes at most
/// `DECODERS + SMALL_DECODERS + DELIVERED_DECODERS` CPUs.
pub(super) const DELIVERED_DECODERS: usize = 1;
/// How often a body waiting for room looks again for bodies that fell behind their pace.
const RECLAIM_EVERY: Duration = Duration::from_millis(50);

/// A body holding room, as the budget sees it.
pub(super) struct Holder {
    pub(super) pace: Arc<Pace>,
    /// KiB of room it holds.
    held_kib: AtomicU64,
    /// It waits for more room.
    waiting: AtomicBool,
}

/// Why a request body could not be read.
pub(in crate::events::http) enum BodyProblem<'a> {
    TooLarge,
    /// The bytes it really holds (raw and decoded, or with its camelCase form) together need
    /// more than the whole budget, this many bytes: no resend can change that.
    NeverFits(u64),
    NoRoom,
    TimedOut,
    /// The body fell behind its [`Pace`] while another body waited for the room it held.
    Stalled,
    /// A gzip layer decodes to more than `--max-gzip-ratio` times the bytes received (this
    /// many), past [`INFLATE_FREE`](super::gzip::INFLATE_FREE): the bound it passed.
    Inflates {
        received: u64,
        bound: u64,
    },
    /// No turn to decode it came within [`BUDGET_WAIT`]: other gzip bodies are decoded.
    Busy,
    /// The body waited for the collector (a turn to be decoded, or room) and its connection
    /// was chosen to give way to a new one ([`Pace::give_way`]): it is answered 503.
    GaveWay,
    Read(String),
    /// Not valid gzip: the bytes the failing layer was given, the decoder's error, the room
    /// they hold (boxed: it is the largest part), and the bytes received.
    BadGzip(Bytes, String, Box<Room<'a>>, u64),
}

/// The memory budget of bodies in flight, in KiB permits: the shared budget, and the
/// reserve of small bodies ([`SMALL_BODIES_RESERVE`]).
pub(in crate::events::http) struct BodyBudget {
    permits: Semaphore,
    /// KiB of the shared budget: the most one body may hold.
    total_kib: u64,
    /// Only for rooms that stay within [`SMALL_BODY`].
    reserve: Semaphore,
    /// The bodies that hold room, by room id.
    holders: Mutex<BTreeMap<u64, Arc<Holder>>>,
    next_id: AtomicU64,
    /// Turns to decode a gzip layer ([`DECODERS`]).
    decoders: Semaphore,
    /// Turns only small bodies may take ([`SMALL_DECODERS`]).
    small_decoders: Semaphore,
    /// Turns only bodies on a connection that delivered events may take
    /// ([`DELIVERED_DECODERS`]).
    delivered_decoders: Semaphore,
}

impl BodyBudget {
    /// Room for one body of `max_body_bytes` plus [`SMALL_BODIES_ROOM`], and beside it
    /// [`SMALL_BODIES_RESERVE`] for small bodies.
    pub(in crate::events::http) fn new(max_body_bytes: u64) -> BodyBudget {
        let total_kib = kib(max_body_bytes.saturating_add(SMALL_BODIES_ROOM));
        BodyBudget {
            permits: Semaphore::new(total_kib as usize),
            total_kib,
            reserve: Semaphore::new(kib(SMALL_BODIES_RESERVE) as usize),
            holders: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            decoders: Semaphore::new(DECODERS),
            small_decoders: Semaphore::new(SMALL_DECODERS),
            delivered_decoders: Semaphore::new(DELIVERED_DECODERS),
        }
    }

    /// A turn to decode a gzip layer: one of [`DECODERS`], or for a `small` body one of
    /// [`SMALL_DECODERS`] first, and for a body on a connection that delivered events
    /// ([`Pace::delivered`]) one of [`DELIVERED_DECODERS`] before either (whichever comes
    /// first once it must wait). While it waits
    /// the body counts as queued ([`Pace::is_queued`]); it waits at most [`BUDGET_WAIT`] and
    /// never past `deadline` ([`BodyProblem::Busy`]), and stops waiting when its connection
    /// gives way ([`BodyProblem::GaveWay`]).
    pub(super) async fn decode_turn<'a>(
        &'a self,
        pace: &Pace,
        small: bool,
        deadline: Instant,
    ) -> Result<Turn<'a>, BodyProblem<'a>> {
        let delivered = pace.delivered();
        if delivered {
            if let Ok(permit) = self.delivered_decoders.try_acquire() {
                return Ok(Turn {
                    _permit: permit,
                    small: false,
                });
            }
        }
        if small {
            if let Ok(permit) = self.small_decoders.try_acquire() {
                return Ok(Turn {
                    _permit: permit,
                    small: true,
                });
            }
        }
        if let Ok(permit) = self.decoders.try_acquire() {
            return Ok(Turn {
                _permit: permit,
                small: false,
            });
        }
        pace.set_queued(true);
        let until = deadline.min(Instant::now() + BUDGET_WAIT);
        let own = async {
            if small {
                self.small_decoders.acquire().await
            } else {
                std::future::pending().await
            }
        };
        let first = async {
            if delivered {
                self.delivered_decoders.acquire().await
            } else {
                std::future::pending().await
            }
        };
        let got = tokio::select! {
            biased;
            _ = pace.was_cut() => Err(BodyProblem::GaveWay),
            got = first => got.map(|permit| Turn { _permit: permit, small: false }).map_err(|_| BodyProblem::Busy),
            got = own => got.map(|permit| Turn { _permit: permit, small: true }).map_err(|_| BodyProblem::Busy),
            got = self.decoders.acquire() => got.map(|permit| Turn { _permit: permit, small: false }).map_err(|_| BodyProblem::Busy),
            _ = tokio::time::sleep_until(until) => Err(BodyProblem::Busy),
        };
        pace.set_queued(false);
        got
    }

    /// A body's share of the budget, empty until it grows; `pace` is the body's, which says
    /// whether it may be cut when another body waits for room.
    pub(in crate::events::http) fn room(&self, pace: Arc<Pace>) -> Room<'_> {
        Room {
            budget: self,
            held: None,
            reserved: None,
            waited: Duration::ZERO,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            registered: false,
            holder: Arc::new(Holder {
                pace,
                held_kib: AtomicU64::new(0),
                waiting: AtomicBool::new(false),
            }),
        }
    }

    /// Cuts every body but `except` that holds room and has fallen behind its pace; how many.
    fn cut_behind(&self, except: u64) -> usize {
        let now = Instant::now();
        let holders = lock(&self.holders);
        let mut cut = 0;
        for (_, h) in holders.iter().filter(|(id, _)| **id != except) {
            if h.pace.behind(now) && h.pace.cut() {
                cut += 1;
            }
        }
        cut
    }

    /// Tells the body that waits for room and holds the most of it, if it holds more than
    /// `want_kib` (all that the body `except`, which waits too, would hold), to give its
    /// room back (it is answered 503): a small body never waits behind large ones that wait
    /// for room, such as gzip bombs decoding to 64 MiB each. Only a body holding more than
    /// another wants in all gives way to it, so two bodies never push each other out.
    fn give_way_to(&self, except: u64, want_kib: u64) -> bool {
        let holders = lock(&self.holders);
        let largest = holders
            .iter()
            .filter(|(id, h)| **id != except && h.waiting.load(Ordering::Acquire))
            .max_by_key(|(_, h)| h.held_kib.load(Ordering::Relaxed));
        match largest {
            Some((_, h)) if h.held_kib.load(Ordering::Relaxed) > want_kib => h.pace.cut(),
            _ => false,
        }
    }

    /// KiB not held by any body.
    #[cfg(test)]
    fn free_kib(&self) -> usize {
        self.permits.available_permits()
    }
}

/// A turn to decode ([`BodyBudget::decode_turn`]); given back when dropped.
pub(super) struct Turn<'a> {
    _permit: SemaphorePermit<'a>,
    /// One of [`SMALL_DECODERS`]: the layer may decode to [`SMALL_DECODED`] in it.
    pub(super) small: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The map stays consistent whatever panicked while holding it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The room one body holds; given back when dropped.
pub(in crate::events::http) struct Room<'a> {
    pub(super) budget: &'a BodyBudget,
    /// Of the shared budget.
    held: Option<SemaphorePermit<'a>>,
    /// Of the small bodies' reserve: only while the room wants [`SMALL_BODY`] at most.
    reserved: Option<SemaphorePermit<'a>>,
    /// Time spent waiting for room so far, against [`BUDGET_WAIT`].
    waited: Duration,
    id: u64,
    /// Listed among the budget's holders (once it holds room).
    registered: bool,
    pub(super) holder: Arc<Holder>,
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        if self.registered {
            lock(&self.budget.holders).remove(&self.id);
        }
    }
}

impl<'a> Room<'a> {
    fn hold(&mut self, permit: SemaphorePermit<'a>, from_reserve: bool) {
        let held = if from_reserve {
            &mut self.reserved
        } else {
            &mut self.held
        };
        match held {
            Some(h) => h.merge(permit),
            None => *held = Some(permit),
        }
        self.holder
            .held_kib
            .store(self.held_kib(), Ordering::Relaxed);
        if !self.registered {
            lock(&self.budget.holders).insert(self.id, self.holder.clone());
            self.registered = true;
        }
    }

    fn held_kib(&self) -> u64 {
        self.shared_kib() + self.reserved.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// KiB held of the shared budget.
    fn shared_kib(&self) -> u64 {
        self.held.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// A room growing past [`SMALL_BODY`] holds none of the reserve: what it holds of the
    /// reserve goes back once the shared budget holds all of `want_kib` (before that it is
    /// part of what it holds, so the sum never goes above what the body needs plus a step).
    fn leave_reserve(&mut self, want_kib: u64) {
        if self.reserved.is_some() && self.shared_kib() >= want_kib {
            self.reserved = None;
            self.holder
                .held_kib
                .store(self.held_kib(), Ordering::Relaxed);
        }
    }

    /// The bytes of room held.
    pub(in crate::events::http) fn held_bytes(&self) -> u64 {
        self.held_kib() * 1024
    }

    /// Grows the room to hold `bytes` (rounded up to [`RESERVE_STEP`]), waiting (in all, over
    /// the body's life) at most [`BUDGET_WAIT`] and never past `deadline`. More than the
    /// whole budget is refused at once with [`BodyProblem::NeverFits`].
    pub(in crate::events::http) async fn grow_to(
        &mut self,
        bytes: u64,
        deadline: Instant,
    ) -> Result<(), BodyProblem<'a>> {
        if kib(bytes) > self.budget.total_kib {
            return Err(BodyProblem::NeverFits(self.budget.total_kib * 1024));
        }
        let want = kib(stepped(bytes)).min(self.budget.total_kib);
        let small = want <= kib(SMALL_BODY);
        let step = kib(RESERVE_STEP);
        // A large room counts only the shared budget (what it took of the reserve goes
        // back once that holds it all).
        let held = |r: &Self| if small { r.held_kib() } else { r.shared_kib() };
        while held(self) < want {
            let n = (want - held(self)).min(step) as u32;
            let (permit, from_reserve) = self.wait_for(n, want, small, deadline).await?;
            self.hold(permit, from_reserve);
        }
        if !small {
            self.leave_reserve(want);
        }
        Ok(())
    }

    /// Grows the room to hold `bytes` if the budget has that room free now, without waiting:
    /// `Ok(false)` when it has not (what could be taken is kept; [`Room::grow_to`] waits
    /// for the rest).
    pub(in crate::events::http) fn try_grow_to(
        &mut self,
        bytes: u64,
    ) -> Result<bool, BodyProblem<'a>> {
        if kib(bytes) > self.budget.total_kib {
            return Err(BodyProblem::NeverFits(self.budget.total_kib * 1024));
        }
        let want = kib(stepped(bytes)).min(self.budget.total_kib);
        let small = want <= kib(SMALL_BODY);
        let held = |r: &Self| if small { r.held_kib() } else { r.shared_kib() };
        while held(self) < want {
            let n = (want - held(self)).min(kib(RESERVE_STEP)) as u32;
            let (permit, from_reserve) = match self.budget.permits.try_acquire_many(n) {
                Ok(p) => (p, false),
                Err(_) if small => match self.budget.reserve.try_acquire_many(n) {
                    Ok(p) => (p, true),
                    Err(_) => return Ok(false),
                },
                Err(_) => return Ok(false),
            };
            self.hold(permit, from_reserve);
        }
        if !small {
            self.leave_reserve(want);
        }
        Ok(true)
    }

    /// Gives back what is held beyond `bytes`.
    pub(super) fn shrink_to(&mut self, bytes: u64) {
        let keep = kib(bytes);
        let mut extra = self.held_kib().saturating_sub(keep);
        // The reserve goes back first.
        for h in [&mut self.reserved, &mut self.held].into_iter().flatten() {
            let n = extra.min(h.num_permits() as u64);
            drop(h.split(n as usize));
            extra -= n;
        }
        self.holder
            .held_kib
            .store(self.held_kib(), Ordering::Relaxed);
    }

    /// Takes `n` KiB of the shared budget, or of the reserve when `small`, for a room
    /// growing to `want_kib` in all, waiting as the module docs say: bodies that fell behind
    /// their pace are cut, and the waiting body holding the most gives way when it holds
    /// more than `want_kib`; this body gives way in turn ([`BodyProblem::NoRoom`]) when
    /// told to. Whether the permit is of the reserve comes with it.
    async fn wait_for(
        &mut self,
        n: u32,
        want_kib: u64,
        small: bool,
        deadline: Instant,
    ) -> Result<(SemaphorePermit<'a>, bool), BodyProblem<'a>> {
        let budget: &'a BodyBudget = self.budget;
        if let Ok(p) = budget.permits.try_acquire_many(n) {
            return Ok((p, false));
        }
        if small {
            if let Ok(p) = budget.reserve.try_acquire_many(n) {
                return Ok((p, true));
            }
        }
        let left = BUDGET_WAIT.saturating_sub(self.waited);
        let until = deadline.min(Instant::now() + left);
        let started = Instant::now();
        // While it waits, bodies that hold room and fell behind their pace give it back; one
        // that falls behind later is cut at the next look.
        let acquire = budget.permits.acquire_many(n);
        tokio::pin!(acquire);
        // A large room never waits on the reserve: this one never resolves for it.
        let from_reserve = async {
            if small {
                budget.reserve.acquire_many(n).await
            } else {
                std::future::pending().await
            }
        };
        tokio::pin!(from_reserve);
        self.holder.waiting.store(true, Ordering::Release);
        let pace = self.holder.pace.clone();
        let got = loop {
            let cut = self.budget.cut_behind(self.id);
            if cut > 0 {
                crate::metrics::stalled_bodies_cut(cut as u64);
                tracing::debug!(
                    bodies = cut,
                    "cut bodies that fell behind their pace: a body waits for the room they held"
                );
            }
            if self.budget.give_way_to(self.id, want_kib) {
                tracing::debug!(
                    want_kib,
                    "told the waiting body holding the most room to give it back: a smaller body waits"
                );
            }
            let look_again = (Instant::now() + RECLAIM_EVERY).min(until);
            tokio::select! {
                biased;
                _ = pace.was_cut() => break Err(true),
                got = &mut acquire => break Ok(got.map(|p| (p, false))),
                got = &mut from_reserve => break Ok(got.map(|p| (p, true))),
                _ = tokio::time::sleep_until(look_again) => {
                    if Instant::now() >= until {
                        break Err(false);
                    }
                }
            }
        };
        self.holder.waiting.store(false, Ordering::Release);
        self.waited += started.elapsed();
        match got {
            Ok(Ok(p)) => Ok(p),
            // The semaphores are never closed; treat it as no room.
            Ok(Err(_)) => Err(BodyProblem::NoRoom),
            // Told to give way to a smaller body.
            Err(true) => Err(BodyProblem::NoRoom),
            Err(false) if Instant::now() >= deadline => Err(BodyProblem::TimedOut),
            Err(false) => Err(BodyProblem::NoRoom),
        }
    }
}

fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024).min(u64::from(u32::MAX))
}

/// `bytes` rounded up to a whole [`RESERVE_STEP`].
fn stepped(bytes: u64) -> u64 {
    bytes.div_ceil(RESERVE_STEP).saturating_mul(RESERVE_STEP)
}

#[cfg(test)]
mod tests {
    use super::super::pace::{BODY_GRACE, BODY_TIMEOUT, MIN_BODY_RATE};
    use super::*;

    /// A room whose body is not being read: never cut.
    fn room(b: &BodyBudget) -> Room<'_> {
        b.room(Arc::new(Pace::new()))
    }

    /// The small bodies' reserve, all taken (by other small bodies): a small body then waits
    /// for the shared budget like any other.
    fn take_the_reserve(b: &BodyBudget) -> SemaphorePermit<'_> {
        b.reserve
            .try_acquire_many(kib(SMALL_BODIES_RESERVE) as u32)
            .unwrap()
    }

    fn later() -> Instant {
        Instant::now() + BODY_TIMEOUT
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_holds_one_largest_body_and_room_for_small_ones() {
        let b = BodyBudget::new(64 << 20);
        let mut big = room(&b);
        assert!(big.grow_to(64 << 20, later()).await.is_ok());
        // Ordinary batches still pass beside it.
        let mut small: Vec<Room> = (0..20).map(|_| room(&b)).collect();
        for r in &mut small {
            assert!(r.grow_to(1 << 20, later()).await.is_ok());
        }
        drop(small);
        // A body that does not fit beside it waits, then gives up.
        let mut second = room(&b);
        let t = Instant::now();
        assert!(matches!(
            second.grow_to(33 << 20, later()).await,
            Err(BodyProblem::NoRoom)
        ));
        assert!(t.elapsed() >= BUDGET_WAIT);
        drop((big, second));
        let mut third = room(&b);
        assert!(third.grow_to(64 << 20, later()).await.is_ok());
        // A body that could never fit is told so at once.
        drop(third);
        assert!(matches!(
            room(&b).grow_to(97 << 20, later()).await,
            Err(BodyProblem::NeverFits(_))
        ));
        // Exactly the whole budget fits: sizes are compared, not rounded capacities.
        assert!(room(&b).grow_to(96 << 20, later()).await.is_ok());
    }

    /// Large bodies holding the whole budget leave small ones the reserve, and never take it.
    #[tokio::test(start_paused = true)]
    async fn small_bodies_find_room_in_their_reserve_and_large_ones_never_hold_it() {
        let b = BodyBudget::new(64 << 20);
        let reserve = || b.reserve.available_permits() as u64;
        let all = reserve();
        // A small body that took the reserve and then grows past SMALL_BODY gives it back.
        let mut full = room(&b);
        assert!(full.grow_to(96 << 20, later()).await.is_ok());
        let mut growing = room(&b);
        assert!(growing.grow_to(RESERVE_STEP, later()).await.is_ok());
        assert_eq!(reserve(), all - kib(RESERVE_STEP));
        full.shrink_to(64 << 20);
        assert!(growing.grow_to(SMALL_BODY + 1, later()).await.is_ok());
        assert_eq!(reserve(), all);
        assert_eq!(growing.shared_kib(), kib(SMALL_BODY + RESERVE_STEP));
        drop(growing);
        // The budget full: a large body does not touch the reserve, small ones use it at once.
        assert!(full.grow_to(96 << 20, later()).await.is_ok());
        let t = Instant::now();
        let mut small: Vec<Room> = (0..4).map(|_| room(&b)).collect();
        for r in &mut small {
            assert!(r.grow_to(SMALL_BODY, later()).await.is_ok());
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
        assert_eq!(reserve(), 0);
        drop(small);
        assert_eq!(reserve(), all);
        let mut large = room(&b);
        assert!(matches!(large.try_grow_to(SMALL_BODY + 1), Ok(false)));
        assert_eq!(reserve(), all);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_large_body_holds_only_its_bytes() {
        let b = BodyBudget::new(64 << 20);
        // One body just over 8 MiB that stops sending holds its bytes, nothing more: a
        // 9 MB body and twelve of 4 MiB pass beside it at once.
        let mut stalled = room(&b);
        assert!(stalled.grow_to((8 << 20) + 1, later()).await.is_ok());
        assert_eq!(stalled.held_bytes(), (8 << 20) + RESERVE_STEP);
        let t = Instant::now();
        let mut other = room(&b);
        assert!(other.grow_to(9_000_000, later()).await.is_ok());
        let mut many: Vec<Room> = (0..12).map(|_| room(&b)).collect();
        for r in &mut many {
            assert!(r.grow_to((4 << 20) + 1, later()).await.is_ok());
        }
        assert_eq!(t.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn room_is_only_what_is_held_and_goes_back_when_dropped() {
        let b = BodyBudget::new(64 << 20);
        let all = b.free_kib();
        // A room that has not grown, whatever its header declared, holds nothing.
        let idle: Vec<Room> = (0..100).map(|_| room(&b)).collect();
        assert_eq!(b.free_kib(), all);
        let mut r = room(&b);
        assert!(r.grow_to(10 << 20, later()).await.is_ok());
        assert_eq!(b.free_kib(), all - 10 * 1024);
        r.shrink_to(1 << 20);
        assert_eq!(b.free_kib(), all - 1024);
        drop((r, idle));
        assert_eq!(b.free_kib(), all);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_for_room_does_not_stand_in_front_of_small_ones() {
        // 'static: the large body waits in a task of its own.
        let b: &'static BodyBudget = Box::leak(Box::new(BodyBudget::new(64 << 20)));
        let _reserve_taken = take_the_reserve(b);
        // A large body and small ones fill the budget to the last KiB.
        let mut big = room(b);
        assert!(big.grow_to(40 << 20, later()).await.is_ok());
        let mut small: Vec<Room> = (0..56).map(|_| room(b)).collect();
        for r in &mut small {
            assert!(r.grow_to(1 << 20, later()).await.is_ok());
        }
        assert_eq!(b.free_kib(), 0);
        // The large body wants 24 MiB more and queues; then a small request queues.
        let big = tokio::spawn(async move {
            let r = big.grow_to(64 << 20, later()).await.is_ok();
            (r, big.held_kib())
        });
        tokio::task::yield_now().await;
        // One small body ends: the request behind the large one gets its room at once,
        // though the large one is still far from what it wants.
        let mut newcomer = room(b);
        let waiting = newcomer.grow_to(16 << 10, later());
        tokio::pin!(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        small.pop();
        let got = tokio::time::timeout(Duration::from_millis(1), &mut waiting).await;
        assert!(
            matches!(got, Ok(Ok(()))),
            "the small request waited for the large one"
        );
        drop(small);
        // And the large body, which waited while a smaller one did, was told to give its
        // room back (its client gets 503 and resends): it is not left holding 40 MiB
        // while small requests queue behind it.
        let (ok, _) = big.await.unwrap();
        assert!(
            !ok,
            "the large waiting body kept its room while a small one waited"
        );
        assert_eq!(b.free_kib() as u64, b.total_kib - kib(RESERVE_STEP));
    }

    /// Review r39q D1: every other turn held (and bodies queued for them), a body on a
    /// connection that delivered events gets one of its own at once; a cheap one waits.
    #[tokio::test(start_paused = true)]
    async fn a_delivering_connection_has_a_decoding_turn_of_its_own() {
        let b: &'static BodyBudget = Box::leak(Box::new(BodyBudget::new(64 << 20)));
        let p: &'static Pace = Box::leak(Box::new(Pace::new()));
        let mut held = Vec::new();
        for _ in 0..DECODERS {
            held.push(b.decode_turn(p, false, later()).await.ok().unwrap());
        }
        held.push(b.decode_turn(p, true, later()).await.ok().unwrap());
        let cheap = b.decode_turn(p, true, later());
        tokio::pin!(cheap);
        assert!(futures::poll!(&mut cheap).is_pending());
        let ray = Pace::new();
        ray.set_delivered();
        let got =
            tokio::time::timeout(Duration::from_millis(1), b.decode_turn(&ray, true, later()))
                .await;
        assert!(matches!(got, Ok(Ok(_))), "the delivering connection waited");
        assert!(futures::poll!(&mut cheap).is_pending());
        drop(held);
    }

    /// Review r39m D1: the turns any body may take all held, a small body still gets one of
    /// its own at once, a large one waits; a waiting body told to give way stops waiting.
    #[tokio::test(start_paused = true)]
    async fn a_small_body_has_a_decoding_turn_of_its_own() {
        let b: &'static BodyBudget = Box::leak(Box::new(BodyBudget::new(64 << 20)));
        let p: &'static Pace = Box::leak(Box::new(Pace::new()));
        let mut held = Vec::new();
        for _ in 0..DECODERS {
            held.push(b.decode_turn(p, false, later()).await.ok().unwrap());
        }
        assert!(held.iter().all(|t| !t.small));
        let small = b.decode_turn(p, true, later()).await.ok().unwrap();
        assert!(small.small);
        // A large body waits, queued, until told to give way.
        let large = tokio::spawn(async move {
            matches!(
                b.decode_turn(p, false, later()).await,
                Err(BodyProblem::GaveWay)
            )
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(p.is_queued());
        p.give_way();
        assert!(large.await.unwrap());
        assert!(!p.is_queued());
        // Its own turn held too, a small body takes one any body may take once it is free.
        drop(held.pop());
        assert!(!b.decode_turn(p, true, later()).await.ok().unwrap().small);
        drop(small);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_fell_behind_gives_its_room_to_one_that_waits() {
        let b: &'static BodyBudget = Box::leak(Box::new(BodyBudget::new(64 << 20)));
        let _reserve_taken = take_the_reserve(b);
        // One body sent 64 MiB and stopped; one sends on; one waits for room of its own.
        let stopped = Arc::new(Pace::new());
        let arriving = Arc::new(Pace::new());
        let mut a = b.room(stopped.clone());
        let mut c = b.room(arriving.clone());
        stopped.start();
        arriving.start();
        assert!(a.grow_to(64 << 20, later()).await.is_ok());
        stopped.received(64 << 20);
        assert!(c.grow_to(32 << 20, later()).await.is_ok());
        assert_eq!(b.free_kib(), 0);
        let t = Instant::now();
        // Each reader gives its room back once told (as read_body does).
        let reader = |pace: Arc<Pace>, room: Room<'static>| {
            tokio::spawn(async move {
                pace.was_cut().await;
                drop(room);
            })
        };
        let a_cut = reader(stopped.clone(), a);
        let c_cut = reader(arriving.clone(), c);
        let feeding = {
            let arriving = arriving.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    arriving.received((MIN_BODY_RATE / 50) as usize);
                }
            })
        };
        let mut ray = room(b);
        assert!(ray.grow_to(64 << 10, later()).await.is_ok());
        // The stopped body gave way once it fell behind, within a look of it; the one still
        // arriving kept its room.
        assert!(t.elapsed() >= BODY_GRACE);
        assert!(t.elapsed() <= BODY_GRACE + RECLAIM_EVERY);
        assert!(a_cut.await.is_ok());
        assert!(!arriving.cut.load(Ordering::Acquire));
        feeding.abort();
        c_cut.abort();
    }
}
