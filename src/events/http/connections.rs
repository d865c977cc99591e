//! The connection cap, and which connection gives way when it is reached.
//!
//! Ray's publisher keeps one connection per node and sends a request head as soon as it has
//! connected. A client that connects and then sends nothing, or a header byte now and then,
//! would otherwise hold one of the capped slots until its header timeout; with enough of
//! them every new connection, Ray's included, waited that whole timeout (10 s in the chaos
//! suite). At the cap, a new connection therefore closes the oldest one that has not sent a
//! whole request head within [`STALLED_AFTER`]. Such a connection has no request in flight,
//! so closing it loses nothing; connections that have sent a request are never chosen.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A connection that has not sent a whole request head after this long may be closed to
/// make room (a real client sends its head within milliseconds of connecting).
const STALLED_AFTER: Duration = Duration::from_secs(2);
/// How often a new connection waiting at the cap looks again for a stalled one.
const RECHECK: Duration = Duration::from_millis(200);

/// The open connections, oldest first, and the permits that cap them.
pub(super) struct Connections {
    permits: Arc<Semaphore>,
    live: Mutex<BTreeMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
}

/// What the accept loop and the connection's task share about one connection.
pub(super) struct Slot {
    opened: Instant,
    /// A whole request head has arrived on this connection.
    served: AtomicBool,
    /// Chosen to be closed; it is not chosen twice.
    closing: AtomicBool,
    close: Notify,
}

impl Slot {
    /// Records that the connection sent a request head: it is never closed to make room.
    pub(super) fn mark_served(&self) {
        self.served.store(true, Ordering::Relaxed);
    }

    /// Whether a request head has arrived on this connection.
    pub(super) fn is_served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    /// Resolves when the connection was chosen to be closed.
    pub(super) async fn closed_to_make_room(&self) {
        self.close.notified().await;
    }
}

/// A connection's place under the cap; dropping it frees the place.
pub(super) struct Admitted {
    pub(super) slot: Arc<Slot>,
    id: u64,
    connections: Arc<Connections>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.lock_live().remove(&self.id);
    }
}

impl Connections {
    pub(super) fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            permits: Arc::new(Semaphore::new(max)),
            live: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
        })
    }

    fn lock_live(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Slot>>> {
        // The map stays consistent whatever panicked while holding it.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a just-accepted connection: at once if the cap allows, else after a
    /// stalled connection was closed or another one ended.
    pub(super) async fn admit(self: &Arc<Self>) -> Admitted {
        loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                return self.register(permit);
            }
            self.close_oldest_stalled();
            tokio::select! {
                permit = self.permits.clone().acquire_owned() => {
                    if let Ok(permit) = permit {
                        return self.register(permit);
                    }
                    // The semaphore is never closed; if it were, waiting again is all we can do.
                    tokio::time::sleep(RECHECK).await;
                }
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    fn register(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Admitted {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            opened: Instant::now(),
            served: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            close: Notify::new(),
        });
        self.lock_live().insert(id, slot.clone());
        Admitted {
            slot,
            id,
            connections: self.clone(),
            _permit: permit,
        }
    }

    /// Asks the oldest stalled connection to close; false if there is none.
    fn close_oldest_stalled(&self) -> bool {
        let live = self.lock_live();
        let now = Instant::now();
        for slot in live.values() {
            if now.duration_since(slot.opened) < STALLED_AFTER {
                // Ids grow with time: every later connection is younger still.
                return false;
            }
            if slot.is_served() || slot.closing.swap(true, Ordering::Relaxed) {
                continue;
            }
            // notify_one keeps the wake-up if the task is not waiting yet.
            slot.close.notify_one();
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_oldest_stalled_connection_makes_room() {
        let conns = Connections::new(3);
        let served = conns.admit().await;
        served.slot.mark_served();
        let stalled_old = conns.admit().await;
        tokio::time::advance(Duration::from_millis(500)).await;
        let stalled_young = conns.admit().await;

        // Under STALLED_AFTER nothing is chosen: the newcomer waits.
        let waiting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.admit().await }
        });
        tokio::time::advance(Duration::from_millis(1000)).await;
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert!(!stalled_old.slot.closing.load(Ordering::Relaxed));

        // Past it, the oldest stalled one (not the served one, not the younger) is asked
        // to close; the newcomer gets its place once it has gone.
        tokio::time::advance(Duration::from_millis(1200)).await;
        tokio::task::yield_now().await;
        assert!(stalled_old.slot.closing.load(Ordering::Relaxed));
        assert!(!stalled_young.slot.closing.load(Ordering::Relaxed));
        assert!(!served.slot.closing.load(Ordering::Relaxed));
        tokio::time::timeout(
            Duration::from_secs(1),
            stalled_old.slot.closed_to_make_room(),
        )
        .await
        .expect("the stalled connection was told to close");
        assert!(!waiting.is_finished());
        drop(stalled_old);
        let newcomer = waiting.await.unwrap();
        assert_eq!(conns.lock_live().len(), 3);
        drop((newcomer, served, stalled_young));
        assert!(conns.lock_live().is_empty());
    }
}
