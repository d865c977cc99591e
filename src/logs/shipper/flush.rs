//! The final flush at SIGTERM: everything changed since the last round, most valuable first,
//! within the deadline; passes over the sessions until one finds nothing to send, and a
//! reserve of time is kept to abort the uploads left (see [`LogShipper::final_flush`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::node::session::ActiveSession;

use super::beside::KeptStall;
use super::{LogShipper, KEPT_STALL_SHARE_BARE, KEPT_STALL_SHARE_BODY};

/// Passes the final flush makes, after one that started a send with nothing left beside
/// it, to send what changed meanwhile (review r42g G3 and G4: Ray rotated, or rewrote, a file
/// during the last pass, and nothing looked at the session again: the rotated file's last
/// lines were in neither object). The flush ends at the first pass that starts no send; a
/// log Ray still writes goes as it is at the last of these passes.
const MAX_SETTLING_PASSES: usize = 3;

/// Of the shutdown budget, what is kept at the end of the final flush to abort the
/// multipart upload of an append the deadline cut short (at most this, at most a quarter).
const ABORT_RESERVE: Duration = Duration::from_secs(2);

impl LogShipper {
    /// The SIGTERM flush: everything changed since the last snapshot, most valuable first,
    /// until `deadline`; returns the files that did not make it, each with why.
    ///
    /// The appends still running beside the lane are cancelled first and their files sent
    /// whole in the flush (it was hanging, or slow: the flush has no round after it). The
    /// whole uploads still running beside it go on (a big log nearly uploaded is not thrown
    /// away), and so does the send the lane was waiting for when shutdown cut its round.
    /// The flush makes passes over every session (the active one, then the earlier ones):
    /// a send that outlasts its slot in a pass goes on beside it, files whose send is beside
    /// are skipped, and once a send beside ends, every session is listed again and what
    /// changed meanwhile (the file grew, Ray rotated it) is sent (appended where the store
    /// can, else whole); so every file ends equal to what the ledger records as uploaded
    /// for it, or is named (the flush compares the files with the ledger, not with the
    /// bucket: no HEAD per object; see `checks` for what the rounds check there). No
    /// pass waits for a send, so no session's files wait behind another's hung upload.
    /// A send beside that stops moving is abandoned and its file sent again (see
    /// [`KEPT_STALL_SHARE_BODY`]); a kept send that failed is named only if the flush's own send
    /// of its file fails too. A pass that started a send with nothing left beside is
    /// followed by another (at most [`MAX_SETTLING_PASSES`]), so a rotation or a rewrite
    /// during it is sent too: the flush ends at a pass that starts no send, or the deadline.
    pub async fn final_flush(
        &mut self,
        active: Option<ActiveSession>,
        deadline: Instant,
    ) -> Vec<(PathBuf, String)> {
        // The answers of the ledger checks that ended since the last round: an object found
        // lost or not the ledger's is sent by the flush (review r42v D2). No check is
        // started or waited for here (a HEAD per object could be thousands of requests).
        self.take_checks();
        let mut earlier = self.cancel_appends_beside().await;
        // Whatever failed there, the flush tries again.
        earlier.failed_files.clear();
        // A node id nobody knows still must not lose the logs: file them under the fallback.
        if let Some(s) = &active {
            if !self.knows_node(&s.dir) && self.remote_node.is_none() {
                self.remote_node = Some(crate::storage::append::UNKNOWN_NODE.into());
            }
        }
        // Keep the end of the budget to abort an append the deadline cuts short.
        let reserve = ABORT_RESERVE.min(deadline.saturating_duration_since(Instant::now()) / 4);
        let flush_deadline = deadline.checked_sub(reserve).unwrap_or(deadline);
        // Passes over every session until nothing is left beside the lane: each pass tries
        // every session's files (a send that outlasts its slot goes beside, so no file and no
        // session waits behind another), then the flush waits for the first send beside to
        // end and lists every session again, so what was rotated, created or grew during the
        // wait is sent too (review r42e E2, E5). A pass at the deadline names what is left.
        // A send beside that stops moving is abandoned and its file sent again in the next
        // pass (review r42g G1); a pass that sent something is followed by another, so what
        // was rotated or rewritten during it is sent too (r42g G3, G4).
        let left = flush_deadline.saturating_duration_since(Instant::now());
        let kept_stall = KeptStall {
            body: left / KEPT_STALL_SHARE_BODY,
            bare: left / KEPT_STALL_SHARE_BARE,
        };
        self.flush_named.clear();
        let mut reports = Vec::new();
        let mut settling = 0;
        loop {
            self.abandon_stalled_beside(kept_stall).await;
            let pass = self
                .snapshot_all(active.as_ref(), Some(flush_deadline), true)
                .await;
            let sends: usize = pass.iter().map(|r| r.sends).sum();
            for r in &pass {
                self.flush_named
                    .extend(r.failed_files.iter().map(|(p, _)| p.clone()));
            }
            reports.extend(pass);
            if Instant::now() >= flush_deadline {
                break;
            }
            if !self.beside.is_empty() {
                self.wait_any_beside(flush_deadline, kept_stall).await;
                continue;
            }
            if sends == 0 || settling >= MAX_SETTLING_PASSES {
                break;
            }
            settling += 1;
        }
        reports.push(self.collect_beside(Some(flush_deadline)).await);
        reports.push(earlier);
        let dropped = crate::storage::put::wait_dropped_aborts(deadline).await;
        if let Some(app) = &self.cfg.appender {
            let mut left = app.abort_pending(deadline).await + dropped;
            // What a cancelled creation may have left (its id never came back): the lane is
            // done, so any log upload under our node is an orphan now.
            for node in &self.prepared_nodes {
                match tokio::time::timeout_at(
                    deadline.into(),
                    app.abort_node_log_uploads(&self.prefix, node),
                )
                .await
                {
                    Ok((_, failed)) => left += failed,
                    Err(_) => {
                        left += 1;
                        break;
                    }
                }
            }
            if left > 0 {
                tracing::warn!(
                    left,
                    "incomplete multipart uploads left at exit; the next start aborts them"
                );
            }
        }
        let failed: usize = reports.iter().map(|r| r.failed).sum();
        let uploaded: usize = reports.iter().map(|r| r.uploaded).sum();
        let not_reached: usize = reports.iter().map(|r| r.not_reached.len()).sum();
        tracing::info!(uploaded, failed, not_reached, "final log flush done");
        let mut left: Vec<(PathBuf, String)> = reports
            .into_iter()
            .flat_map(|r| {
                r.failed_files.into_iter().chain(
                    r.not_reached
                        .into_iter()
                        .map(|p| (p, "not reached before the shutdown deadline".to_string())),
                )
            })
            .collect();
        left.sort();
        left.dedup_by(|a, b| a.0 == b.0);
        left
    }
}
