//! Moves sealed spool files to the bucket, and deletes each only after its upload succeeded.
//!
//! A dispatcher owns the queue: session markers first, then event segments oldest first,
//! then quarantine. A few uploads run at once; a failed one goes back with exponential
//! backoff and jitter, without limit while the process runs, and without holding up the
//! others. Files are streamed by [`crate::storage::put`], gzip applied part by part.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use rand::Rng;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::events::object::{kind_label, upload_file};
pub use crate::events::object::{Compression, UploaderConfig};
use crate::events::publish::Publisher;
use crate::events::spool::{FileKind, SealedFile, SpoolStats};
use crate::metrics as m;
use crate::storage::gzip::MEMBER_INPUT;
use crate::storage::put::UploadError;

enum Control {
    Drain(oneshot::Sender<()>),
    /// Cancel the uploads in flight, wait for them to end, and stop.
    Stop(oneshot::Sender<()>),
}

/// Handle to the upload dispatcher.
#[derive(Clone)]
pub struct Uploader {
    control: mpsc::UnboundedSender<Control>,
}

struct Pending {
    file: SealedFile,
    attempt: u32,
}

fn rank(kind: FileKind) -> u8 {
    match kind {
        FileKind::Marker => 0,
        FileKind::Events => 1,
        FileKind::Quarantine => 2,
    }
}

/// Heap key: smallest (kind rank, creation time) first.
type QueueKey = Reverse<(u8, u64, u64)>;

impl Uploader {
    /// Starts the dispatcher; it takes sealed files from `files`.
    pub fn start(
        cfg: Arc<UploaderConfig>,
        store: Arc<dyn ObjectStore>,
        stats: Arc<SpoolStats>,
        files: mpsc::UnboundedReceiver<SealedFile>,
        publisher: Option<Arc<Publisher>>,
    ) -> Uploader {
        let (control, control_rx) = mpsc::unbounded_channel();
        let d = Dispatcher {
            cfg,
            store,
            stats,
            publisher,
        };
        tokio::spawn(d.run(files, control_rx));
        Uploader { control }
    }

    /// Resolves once every file handed over so far is uploaded.
    pub async fn drain(&self) {
        let (tx, rx) = oneshot::channel();
        if self.control.send(Control::Drain(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Cancels the uploads in flight and resolves once each has ended (an upload that
    /// finished has its file deleted, as always) and the dispatcher has stopped: after it,
    /// nothing deletes spool files any more, so what is left can be listed.
    pub async fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.control.send(Control::Stop(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

struct Dispatcher {
    cfg: Arc<UploaderConfig>,
    store: Arc<dyn ObjectStore>,
    stats: Arc<SpoolStats>,
    publisher: Option<Arc<Publisher>>,
}

/// Uploads in flight at most, small ones included: thousands of small objects (one per
/// partition, at a shutdown) go many at a time, within the byte budget of
/// `--upload-concurrency` × `--upload-part-bytes` ([`memory_estimate`]).
const MAX_IN_FLIGHT: usize = 64;

/// What an upload of `f` holds in memory at most: one part of it (or all of a smaller
/// file) and its compressed copy, and the compressor's scratch.
fn memory_estimate(cfg: &UploaderConfig, f: &SealedFile) -> u64 {
    let part = f.bytes.min(cfg.part_size as u64);
    let member = f.bytes.min(MEMBER_INPUT as u64);
    part + 2 * member + (64 << 10)
}

/// The queued files, addressed by the heap's indexes; a freed place is reused from a list,
/// so queueing 50,000 files at a shutdown costs no scan for a free place per file.
#[derive(Default)]
struct Slots {
    items: Vec<Option<Pending>>,
    free: Vec<usize>,
}

impl Slots {
    fn put(&mut self, p: Pending) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.items[i] = Some(p);
                i
            }
            None => {
                self.items.push(Some(p));
                self.items.len() - 1
            }
        }
    }

    fn get(&self, i: usize) -> Option<&Pending> {
        self.items.get(i).and_then(Option::as_ref)
    }

    fn take(&mut self, i: usize) -> Option<Pending> {
        let p = self.items.get_mut(i).and_then(Option::take)?;
        self.free.push(i);
        Some(p)
    }
}

fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(200).saturating_mul(1u32 << attempt.min(8));
    let capped = base.min(Duration::from_secs(30));
    // Full jitter between half and all of the step, so many nodes do not retry in lockstep.
    let f = rand::rng().random_range(0.5..=1.0);
    capped.mul_f64(f)
}

impl Dispatcher {
    async fn run(
        self,
        mut files: mpsc::UnboundedReceiver<SealedFile>,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) {
        let mut seq = 0u64;
        let mut queue: BinaryHeap<(QueueKey, u64)> = BinaryHeap::new();
        let mut slots = Slots::default();
        let mut delayed: Vec<(Instant, Pending)> = Vec::new();
        let mut inflight: JoinSet<(Pending, Result<u64, UploadError>, Duration, u64)> =
            JoinSet::new();
        let budget = (self.cfg.concurrency.max(1) as u64).saturating_mul(self.cfg.part_size as u64);
        let mut held = 0u64;
        let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
        let mut files_open = true;
        let mut control_open = true;
        let mut stopping: Option<oneshot::Sender<()>> = None;

        let mut enqueue =
            |queue: &mut BinaryHeap<(QueueKey, u64)>, slots: &mut Slots, p: Pending| {
                seq += 1;
                let key = Reverse((rank(p.file.kind), p.file.created_unix_nanos, seq));
                let idx = slots.put(p);
                queue.push((key, idx as u64));
            };

        loop {
            // Up to `concurrency` uploads whatever their size; more while the memory they
            // hold stays within the budget (many small objects).
            while stopping.is_none() && inflight.len() < MAX_IN_FLIGHT.max(self.cfg.concurrency) {
                let Some(&(_, idx)) = queue.peek() else { break };
                let Some(need) = slots
                    .get(idx as usize)
                    .map(|p| memory_estimate(&self.cfg, &p.file))
                else {
                    queue.pop();
                    continue;
                };
                if inflight.len() >= self.cfg.concurrency.max(1) && held + need > budget {
                    break;
                }
                queue.pop();
                let Some(p) = slots.take(idx as usize) else {
                    continue;
                };
                held += need;
                let cfg = self.cfg.clone();
                let store = self.store.clone();
                let publisher = self.publisher.clone();
                inflight.spawn(async move {
                    let started = Instant::now();
                    let r = match publisher.as_ref() {
                        Some(pb) => match pb.seal(&p.file).await {
                            Some(r) => r,
                            None => upload_file(&cfg, &store, &p.file).await,
                        },
                        None => upload_file(&cfg, &store, &p.file).await,
                    };
                    (p, r, started.elapsed(), need)
                });
            }
            if queue.is_empty() && delayed.is_empty() && inflight.is_empty() {
                for w in waiters.drain(..) {
                    let _ = w.send(());
                }
                if !files_open && !control_open {
                    return;
                }
            }
            if stopping.is_some() && inflight.is_empty() {
                if let Some(w) = stopping.take() {
                    let _ = w.send(());
                }
                return;
            }
            let next_due = delayed
                .iter()
                .map(|(t, _)| *t)
                .min()
                .filter(|_| stopping.is_none());
            tokio::select! {
                f = files.recv(), if files_open => match f {
                    Some(file) => enqueue(&mut queue, &mut slots, Pending { file, attempt: 0 }),
                    None => files_open = false,
                },
                c = control.recv(), if control_open => match c {
                    Some(Control::Drain(w)) => {
                        // Everything sealed before the drain request is already in the channel.
                        while let Ok(file) = files.try_recv() {
                            enqueue(&mut queue, &mut slots, Pending { file, attempt: 0 });
                        }
                        waiters.push(w);
                    }
                    Some(Control::Stop(w)) => {
                        inflight.abort_all();
                        stopping = Some(w);
                    }
                    None => control_open = false,
                },
                Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                    let (p, result, took, need) = match joined {
                        Ok(j) => j,
                        Err(e) if e.is_cancelled() => {
                            tracing::warn!("an upload was cancelled; its file stays in the spool");
                            continue;
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "an upload task panicked; its file stays in the spool");
                            continue;
                        }
                    };
                    held = held.saturating_sub(need);
                    let kind = kind_label(p.file.kind);
                    match result {
                        Ok(uploaded) => {
                            m::upload_success(kind, uploaded, took);
                            let mut gone = true;
                            if !p.file.path.as_os_str().is_empty() {
                                if let Err(e) = std::fs::remove_file(&p.file.path) {
                                    if e.kind() != io::ErrorKind::NotFound {
                                        gone = false;
                                        tracing::error!(path = %p.file.path.display(), error = %e, "uploaded but could not delete the local file");
                                    }
                                }
                            }
                            if let (Some(pb), true) = (&self.publisher, gone) {
                                // Its record named the object's key until the segment left.
                                pb.uploaded(&p.file);
                            }
                            self.stats.file_done(&p.file);
                            tracing::debug!(path = %p.file.path.display(), bytes = uploaded, "uploaded");
                            // The store answers again: what waits in backoff goes now, so a
                            // drain after an outage does not lag it by a whole backoff step.
                            for (_, waiting) in delayed.drain(..) {
                                enqueue(&mut queue, &mut slots, waiting);
                            }
                        }
                        Err(UploadError::Read { path, source }) if source.kind() == io::ErrorKind::NotFound => {
                            tracing::error!(path = %path.display(), "spool file vanished before upload; someone else removed it");
                            self.stats.file_done(&p.file);
                        }
                        Err(e) => {
                            m::upload_failure(kind);
                            let delay = backoff(p.attempt);
                            if p.attempt == 0 || p.attempt % 10 == 9 {
                                tracing::warn!(error = %e, attempt = p.attempt + 1, retry_in_ms = delay.as_millis() as u64, "upload failed; will retry");
                            }
                            delayed.push((Instant::now() + delay, Pending { file: p.file, attempt: p.attempt + 1 }));
                        }
                    }
                },
                _ = tokio::time::sleep_until(next_due.unwrap_or_else(Instant::now).into()), if next_due.is_some() => {
                    let now = Instant::now();
                    let (due, later): (Vec<_>, Vec<_>) = delayed.drain(..).partition(|(t, _)| *t <= now);
                    delayed = later;
                    for (_, p) in due {
                        enqueue(&mut queue, &mut slots, p);
                    }
                },
            }
        }
    }
}
