//! The sends beside the lane: a send that outlasts its slot (an interval) goes on beside the
//! lane within its own deadline, so a stuck file never holds up the others; its result is
//! taken at a later round, and at the final flush one that stopped moving for its stall limit
//! ([`KeptStall`]) is cancelled and named as not reached.

use std::time::{Duration, Instant};

use crate::logs::lane::InFlight;

use super::{LogShipper, RoundReport};

/// How often the final flush looks whether a send beside the lane has ended (its result is
/// left in the task for the next pass to take): a few wake-ups a second, for a flush
/// that lasts seconds.
const BESIDE_POLL: Duration = Duration::from_millis(50);

impl LogShipper {
    /// Takes the results of the sends beside the lane that ended; with `until`, waits for
    /// the others until then and cancels those still running (named as not reached).
    pub(super) async fn collect_beside(&mut self, until: Option<Instant>) -> RoundReport {
        let mut report = RoundReport::default();
        let mut running = Vec::new();
        for mut b in std::mem::take(&mut self.beside) {
            let limit = match until {
                _ if b.finished() => Some(Duration::ZERO),
                Some(u) => Some(u.saturating_duration_since(Instant::now())),
                None => {
                    running.push(b);
                    continue;
                }
            };
            match b.wait(limit).await {
                Some(result) => {
                    let (key, path) = (b.key.clone(), b.path.clone());
                    self.settle(&key, &path, result, &mut report);
                }
                None if until.is_some() => {
                    if b.append_running() {
                        // Hanging or slow: the final flush sends it whole.
                        self.whole_only.insert(b.key.clone());
                    }
                    report.not_reached.push(b.path.clone());
                    b.cancel().await;
                }
                None => running.push(b),
            }
        }
        self.beside = running;
        report
    }

    /// Waits until one of the sends beside the lane has ended or has not moved for its
    /// stall limit (see [`Self::abandon_stalled_beside`]), or `until`.
    pub(super) async fn wait_any_beside(&self, until: Instant, stall: KeptStall) {
        let ready =
            |b: &InFlight| b.finished() || Instant::now() >= b.last_moved() + stall.limit(b);
        while !self.beside.iter().any(ready) && Instant::now() < until {
            let next = (Instant::now() + BESIDE_POLL).min(until);
            tokio::time::sleep_until(next.into()).await;
        }
    }

    /// At the final flush: cancels the sends beside the lane that have not moved for their
    /// stall limit (see `KEPT_STALL_SHARE_BODY`); their files are sent again by the next
    /// pass, and are not counted as failed. An abandoned append does not make its file
    /// whole-only: the next pass appends again if the object is still the one the ledger
    /// recorded (the append's copy names it; an object that changed is sent whole).
    pub(super) async fn abandon_stalled_beside(&mut self, stall: KeptStall) {
        let mut running = Vec::new();
        for b in std::mem::take(&mut self.beside) {
            let idle = Instant::now().saturating_duration_since(b.last_moved());
            let limit = stall.limit(&b);
            if b.finished() || idle < limit {
                running.push(b);
                continue;
            }
            tracing::warn!(path = %b.path.display(), key = %b.key, idle_s = idle.as_secs_f64(),
                limit_s = limit.as_secs_f64(), appending = b.appending,
                body_in_flight = b.body_in_flight(),
                "a log upload beside the final flush has not moved (no request ended) for its \
                 share of the flush's budget; abandoned, the file is sent again");
            b.cancel().await;
        }
        self.beside = running;
    }

    /// At SIGTERM: takes the results of the sends beside the lane that ended, and cancels
    /// the appends still running (hanging, or slow: the final flush sends those files whole,
    /// it has no round after it). Whole uploads still running go on: each is bounded by its
    /// own deadline, and the final flush waits for it (see [`Self::final_flush`]).
    pub(super) async fn cancel_appends_beside(&mut self) -> RoundReport {
        let mut report = RoundReport::default();
        let mut running = Vec::new();
        for mut b in std::mem::take(&mut self.beside) {
            if b.finished() {
                if let Some(result) = b.wait(Some(Duration::ZERO)).await {
                    let (key, path) = (b.key.clone(), b.path.clone());
                    self.settle(&key, &path, result, &mut report);
                }
            } else if b.append_running() {
                self.whole_only.insert(b.key.clone());
                tracing::info!(path = %b.path.display(), "a log append still running at SIGTERM was cancelled; the final flush sends the file whole");
                b.cancel().await;
            } else if b.appending {
                tracing::info!(path = %b.path.display(), "a log append the store completed is being checked against the file at SIGTERM; the final flush waits for the check, then sends what the file grew since");
                running.push(b);
            } else {
                tracing::info!(path = %b.path.display(), "a log upload still running at SIGTERM goes on; the final flush waits for it, then sends what the file grew since");
                running.push(b);
            }
        }
        self.beside = running;
        report
    }
}

/// The final flush's stall limits for a send beside it (see `KEPT_STALL_SHARE_BODY`).
#[derive(Debug, Clone, Copy)]
pub(super) struct KeptStall {
    /// While a request carrying a body is in flight.
    pub(super) body: Duration,
    /// Otherwise (waiting for the answer of a request without a body, or between requests).
    pub(super) bare: Duration,
}

impl KeptStall {
    fn limit(&self, b: &InFlight) -> Duration {
        if b.body_in_flight() {
            self.body
        } else {
            self.bare
        }
    }
}
