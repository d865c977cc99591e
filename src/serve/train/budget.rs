//! The budget Train snapshots are read under ([`Budget`]): room, in KiB, that a snapshot
//! holds from before it is read until its build is done with its bytes. tokio's semaphore
//! does not fit it: a read queued there is given the room free at once and holds it, unused,
//! while it waits for the rest, so every read that would fit waits behind it (review r37q
//! D1: a 60 MiB read queued behind stalled ones held the 56 MiB free, and a 3 KiB snapshot
//! waited 35 s). What this one guarantees:
//!
//! - **The room free is anyone's who fits in it.** A read that fits in the room free takes
//!   it at once, whether or not others wait: a big read waiting does not hold back small
//!   ones the room left covers (review r37o D1).
//! - **The room given back goes to those waiting, in order.** A read that does not fit waits
//!   in line, taking nothing of the room free; the room given back after it started waiting
//!   is set aside for the first in line until, with the room free, it has what it needs
//!   (it then takes the rest of the room free), then for the next. So a big read is not
//!   starved by a stream of smaller ones (review r37p: a 60 MiB snapshot waited 80 s behind
//!   a steady stream of 20 MiB ones): the room free does not grow while it waits, and all
//!   the room held when it started waiting (at least what it lacked) is set aside for it as
//!   it is given back.
//! - **Nothing is lost.** A wait dropped (its build abandoned) gives back what was set aside
//!   for it, granted or not, as room given back (to the next in line, else free); a [`Held`]
//!   gives back its room when dropped. No wait polls: each is woken when it is granted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Room of `capacity` KiB shared by snapshot reads (see the module doc for its order).
pub(crate) struct Budget {
    capacity: u64,
    state: Mutex<State>,
}

struct State {
    /// Room nobody holds and nothing is set aside from.
    free: u64,
    /// The reads waiting, first come first; a granted one stays until it picks its room up.
    line: VecDeque<Waiter>,
    next_id: u64,
}

struct Waiter {
    id: u64,
    need: u64,
    /// Room given back since it waited, kept for it (all of `need` once granted).
    set_aside: u64,
    granted: bool,
    wake: Arc<Notify>,
}

/// Room taken from a [`Budget`], given back when dropped.
pub(crate) struct Held<'a> {
    budget: &'a Budget,
    kib: u64,
}

impl Budget {
    /// Whether a read waits in line for room (one not granted yet).
    pub(crate) fn someone_waits(&self) -> bool {
        self.lock().line.iter().any(|w| !w.granted)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget.give_back(self.kib);
    }
}

/// A read waiting in line: dropped before it picked up its room, it gives back what was set
/// aside for it.
struct Waiting<'a> {
    budget: &'a Budget,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.budget.lock();
        if let Some(at) = state.line.iter().position(|w| w.id == self.id) {
            if let Some(w) = state.line.remove(at) {
                Budget::give_back_locked(&mut state, w.set_aside);
            }
        }
    }
}

impl Budget {
    /// A budget of `capacity` KiB, all free.
    pub(crate) const fn new(capacity: u64) -> Self {
        Budget {
            capacity,
            state: Mutex::new(State {
                free: capacity,
                line: VecDeque::new(),
                next_id: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `kib` of room (at least 1, at most the whole budget): at once when it fits in the
    /// room free, else when its turn in line has set aside enough. Dropping the future gives
    /// back whatever was set aside for it.
    pub(crate) async fn take(&self, kib: u64) -> Held<'_> {
        let need = kib.clamp(1, self.capacity.max(1));
        let (waiting, wake) = {
            let mut state = self.lock();
            if state.free >= need {
                state.free -= need;
                return Held {
                    budget: self,
                    kib: need,
                };
            }
            let id = state.next_id;
            state.next_id += 1;
            let wake = Arc::new(Notify::new());
            state.line.push_back(Waiter {
                id,
                need,
                set_aside: 0,
                granted: false,
                wake: wake.clone(),
            });
            (Waiting { budget: self, id }, wake)
        };
        loop {
            {
                let mut state = self.lock();
                let at = state
                    .line
                    .iter()
                    .position(|w| w.id == waiting.id && w.granted);
                if let Some(at) = at {
                    state.line.remove(at);
                    drop(state);
                    std::mem::forget(waiting);
                    return Held {
                        budget: self,
                        kib: need,
                    };
                }
            }
            // `notify_one` keeps its wake-up when nobody waits yet: none is lost between
            // the look above and this wait.
            wake.notified().await;
        }
    }

    fn give_back(&self, kib: u64) {
        Self::give_back_locked(&mut self.lock(), kib);
    }

    /// `kib` given back: set aside for those in line, first come first, each up to what it
    /// needs; the rest is free. Then every one whose room set aside and the room free cover
    /// is granted (taking from the room free what it still lacks) and woken.
    fn give_back_locked(state: &mut State, kib: u64) {
        let mut left = kib;
        for w in state.line.iter_mut().filter(|w| !w.granted) {
            let given = left.min(w.need - w.set_aside);
            w.set_aside += given;
            left -= given;
        }
        state.free += left;
        let State { free, line, .. } = state;
        for w in line.iter_mut().filter(|w| !w.granted) {
            let lacks = w.need - w.set_aside;
            if *free >= lacks {
                *free -= lacks;
                w.set_aside = w.need;
                w.granted = true;
                w.wake.notify_one();
            }
        }
    }

    /// The room free.
    #[cfg(test)]
    fn free(&self) -> u64 {
        self.lock().free
    }

    /// The room set aside for each read in line, first come first.
    #[cfg(test)]
    fn set_aside(&self) -> Vec<u64> {
        self.lock().line.iter().map(|w| w.set_aside).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// One poll of a wait, with no waker: the tests drive the budget step by step.
    fn poll<F: Future>(f: &mut Pin<Box<F>>) -> Poll<F::Output> {
        f.as_mut()
            .poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
    }

    fn ready<'a>(b: &'a Budget, kib: u64) -> Held<'a> {
        match poll(&mut Box::pin(b.take(kib))) {
            Poll::Ready(held) => held,
            Poll::Pending => panic!("{kib} KiB did not fit in {} free", b.free()),
        }
    }

    #[test]
    fn the_room_free_is_taken_by_a_read_that_fits_while_a_big_one_waits() {
        let b = Budget::new(100);
        let stalled = ready(&b, 80);
        let mut big = Box::pin(b.take(60));
        assert!(poll(&mut big).is_pending());
        assert_eq!(b.free(), 20, "the waiting read holds none of the room free");
        let small = ready(&b, 3);
        let other = ready(&b, 17);
        assert_eq!(b.free(), 0);
        assert!(poll(&mut Box::pin(b.take(1))).is_pending(), "nothing free");
        drop((small, other));
        assert_eq!(
            b.set_aside(),
            vec![20],
            "the room given back is the big read's"
        );
        assert_eq!(b.free(), 0);
        drop(stalled);
        let held = match poll(&mut big) {
            Poll::Ready(h) => h,
            Poll::Pending => panic!("granted"),
        };
        assert_eq!(held.kib, 60);
        assert_eq!(b.free(), 40, "the rest of what was given back is free");
        drop(held);
        assert_eq!(b.free(), 100);
    }

    #[test]
    fn a_big_read_is_not_starved_by_a_stream_of_small_ones() {
        let b = Budget::new(100);
        let mut held: VecDeque<Held<'_>> = (0..5).map(|_| ready(&b, 20)).collect();
        let mut big = Box::pin(b.take(60));
        assert!(poll(&mut big).is_pending());
        // Each 20 KiB read that ends is followed by another that asks: none fits now, the
        // room given back is set aside for the big read, which is granted by the third.
        let mut later = Vec::new();
        for round in 1..=3u64 {
            drop(held.pop_front());
            let mut next = Box::pin(b.take(20));
            assert!(poll(&mut next).is_pending(), "round {round}");
            later.push(next);
            if round < 3 {
                assert!(poll(&mut big).is_pending(), "round {round}");
                assert_eq!(b.set_aside()[0], 20 * round);
            }
        }
        let big = match poll(&mut big) {
            Poll::Ready(h) => h,
            Poll::Pending => panic!("granted by the third"),
        };
        assert_eq!(big.kib, 60);
        // Those that came after wait their turn behind it, and get the room given back next.
        drop(held.pop_front());
        let first_after = poll(&mut later[0]);
        assert!(first_after.is_ready());
        assert!(poll(&mut later[1]).is_pending());
    }

    #[test]
    fn a_wait_dropped_gives_back_what_was_set_aside_for_it() {
        let b = Budget::new(100);
        let first = ready(&b, 50);
        let second = ready(&b, 40);
        let mut big = Box::pin(b.take(70));
        let mut next = Box::pin(b.take(30));
        assert!(poll(&mut big).is_pending() && poll(&mut next).is_pending());
        drop(second);
        assert_eq!(b.set_aside(), vec![40, 0]);
        drop(big);
        assert_eq!(b.set_aside(), vec![30], "passed on to the next in line");
        let next = poll(&mut next);
        assert!(next.is_ready());
        assert_eq!(b.free(), 20);
        drop(first);
        drop(next);
        assert_eq!(b.free(), 100);
    }

    #[test]
    fn a_grant_never_picked_up_is_given_back() {
        let b = Budget::new(10);
        let all = ready(&b, 10);
        let mut waiting = Box::pin(b.take(4));
        assert!(poll(&mut waiting).is_pending());
        drop(all);
        assert_eq!(b.free(), 6, "granted");
        drop(waiting);
        assert_eq!(b.free(), 10);
        assert!(b.set_aside().is_empty());
    }

    #[test]
    fn a_read_larger_than_the_budget_takes_the_whole_budget() {
        let b = Budget::new(10);
        let mut huge = Box::pin(b.take(25));
        let held = match poll(&mut huge) {
            Poll::Ready(h) => h,
            Poll::Pending => panic!("the whole budget was free"),
        };
        assert_eq!((held.kib, b.free()), (10, 0));
    }

    #[tokio::test]
    async fn a_waiting_read_is_woken_when_granted() {
        static B: Budget = Budget::new(8);
        let held = B.take(8).await;
        let waiting = tokio::spawn(async { B.take(5).await.kib });
        while B.set_aside().is_empty() {
            tokio::task::yield_now().await;
        }
        drop(held);
        assert_eq!(waiting.await.ok(), Some(5));
        assert_eq!(B.free(), 8);
    }
}
