//! Reading a session's event objects, streamed and in parallel, in bounded memory.
//!
//! ```text
//! fetch (async, READ_CONCURRENCY objects at once) ──chunks──▶ decoder threads (gunzip, lines,
//!   typed scan) ──batches of facts──▶ the fold (this task: dedup window, TaskStore, model)
//! ```
//!
//! Every queue between the stages is bounded ([`CHUNKS_IN_FLIGHT`] chunks per object,
//! [`BATCHES_IN_FLIGHT`] batches of at most [`FACTS_PER_BATCH`] facts), so memory does not
//! depend on object sizes or on how fast the bucket answers.
//!
//! Objects are open (being fetched, queued for a decoder, or decoded) at most
//! [`open_objects_budget`] at a time, whatever the number of objects: a fetch takes a permit
//! that its object's decoder gives back when it is done with it, so 100,000 tiny objects
//! never hold 100,000 files or bodies at once, and the budget shrinks to fit the process's
//! open-file limit. A fetch that fails for a reason that can pass (too many open files, a
//! dropped connection, a body broken off mid-stream) is tried [`FETCH_ATTEMPTS`] times in
//! all before the object is counted as unreadable (issue 36). A body that breaks off is taken
//! up from the byte it reached (a ranged GET, `If-Match` the first answer's ETag) into the
//! same decoder, which sees one continuous byte stream; never from another version of the
//! object (replaced or grown meanwhile: unreadable, "changed while being read"), from an
//! answer that is not the range asked for (a server ignoring `Range`), or when the first
//! answer had no ETag. Each try is one `get` of object_store, whose client itself takes a
//! broken body up again, the same way, up to twice. An object counts as read only when it
//! was read to its end; one given up on counts as unreadable, with its error whole (how many
//! times it was tried, at which byte), however much of it was folded. Facts are folded as they
//! arrive, from whichever object; every merge of the model is order-free (see `model.rs`),
//! and Train status histories carry their own (time, object, position) order.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use object_store::{ObjectStore, ObjectStoreExt as _};

use super::decode::{gunzip, plain, ContentSink};
use super::extract::Fact;
use super::filter::TimeWindow;
use super::limits::{
    open_file_limit, CONTENT_LIMITS, FDS_KEPT_FREE, MAX_DECODERS, MAX_OPEN_OBJECTS,
    READ_CONCURRENCY,
};
use super::model::SessionModel;
use super::report::{ObjectStats, Problems};
use super::scan::restock;
use super::task::{CompactId, SpentDeltas};
use super::values::human_bytes;
use super::values::store_error;
use super::walk::EventObject;

/// Chunks of one object queued for its decoder.
const CHUNKS_IN_FLIGHT: usize = 8;
/// Facts sent from a decoder to the fold at once, and batches queued.
const FACTS_PER_BATCH: usize = 2048;
const BATCHES_IN_FLIGHT: usize = 8;
/// Tries of a fetch that fails for a passing reason, one budget for an object's first `get`
/// and the resumptions of its body, and the wait before the second (doubled each time):
/// about 1.5 s in all, long enough for descriptors or a connection to free up.
const FETCH_ATTEMPTS: u32 = 4;
const FETCH_RETRY_WAIT: Duration = Duration::from_millis(200);
/// A read that takes longer than this shows a progress line (on a terminal).
const PROGRESS_AFTER: Duration = Duration::from_secs(1);
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// An object for a decoder.
struct DecodeJob {
    index: usize,
    gzip: bool,
    source: Source,
    /// The object's place among the open ones, given back when the decoder drops the job.
    _open: tokio::sync::OwnedSemaphorePermit,
}

/// Where a decoder reads an object from.
enum Source {
    /// Chunks streamed by the fetch (an `Err` ends the object as unreadable).
    Chunks(tokio::sync::mpsc::Receiver<Result<Bytes, String>>),
    /// A local file (a `file://` bucket), read by the decoder itself in [`FILE_BLOCK`]s:
    /// the store's own stream would hand it over 8 KiB at a time, each through a thread
    /// hop.
    File(std::fs::File, std::ops::Range<u64>),
}

/// Bytes a decoder reads from a local file at a time.
const FILE_BLOCK: usize = 256 << 10;

/// What the fold is done with, for the decoders to reuse: emptied batches and the boxes of
/// task deltas, so that the fold does not free one by one what the decoder threads
/// allocated (glibc's allocator then takes the lock of the decoder's arena each time).
#[derive(Default)]
struct Spares {
    batches: Vec<Vec<Fact>>,
    deltas: SpentDeltas,
}

/// Emptied batches and delta boxes kept for reuse at most.
const SPARE_BATCHES: usize = MAX_DECODERS + BATCHES_IN_FLIGHT;
const SPARE_DELTAS: usize = 2 * FACTS_PER_BATCH;

impl Spares {
    /// Keeps an emptied batch and the boxes the fold is done with. A batch that grew past
    /// twice [`FACTS_PER_BATCH`] (one block of a highly compressible object decodes to
    /// millions of facts before the batch is looked at) is not kept: kept, its capacity would
    /// stay touched for the rest of the read (review r36z D1: a 1.5 GiB gzip bomb held 3.5 GB
    /// to the end, where freeing it held 2.1 GB at most).
    fn give(spares: &Mutex<Spares>, mut batch: Vec<Fact>, deltas: &mut SpentDeltas) {
        batch.clear();
        let Ok(mut s) = spares.lock() else {
            return;
        };
        if s.batches.len() < SPARE_BATCHES && batch.capacity() <= 2 * FACTS_PER_BATCH {
            s.batches.push(batch);
        }
        let room = SPARE_DELTAS
            .saturating_sub(s.deltas.len())
            .min(deltas.len());
        s.deltas.extend(deltas.drain(..room));
        deltas.clear();
    }

    /// A batch to fill (a spare one when there is one), and boxes for this thread.
    fn take(spares: &Mutex<Spares>) -> Vec<Fact> {
        let batch = match spares.lock() {
            Ok(mut s) => {
                restock(&mut s.deltas);
                s.batches.pop()
            }
            Err(_) => None,
        };
        batch.unwrap_or_else(|| Vec::with_capacity(FACTS_PER_BATCH))
    }
}

/// What a decoder tells the fold.
enum Message {
    Facts(usize, Vec<Fact>),
    Done(usize, ObjectSummary),
}

/// How an object's reading ended.
struct ObjectSummary {
    bad_lines: u64,
    first_bad_line: Option<String>,
    outside_window: u64,
    /// Bytes the decoder read itself (a local file).
    file_bytes: u64,
    /// Decoded bytes handed to the sink (of an object that failed, how far it was read).
    decoded: u64,
    failure: Option<String>,
}

/// Reads `objects` into `model`; returns the number of events outside the time window.
pub(super) async fn read_objects(
    store: &Arc<dyn ObjectStore>,
    objects: &[EventObject],
    window: TimeWindow,
    model: &mut SessionModel,
    stats: &mut ObjectStats,
    problems: &mut Problems,
) -> u64 {
    if objects.is_empty() {
        return 0;
    }
    let logs_of = model.tasks.logs_of();
    let total_bytes: u64 = objects.iter().map(|o| o.size).sum::<u64>().max(1);
    let decoders = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .saturating_sub(1)
        .clamp(1, MAX_DECODERS)
        .min(objects.len());
    let (job_tx, job_rx) = std::sync::mpsc::channel::<DecodeJob>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let fetched = Arc::new(AtomicU64::new(0));
    let spares = Arc::new(Mutex::new(Spares::default()));
    let (msg_tx, mut msg_rx) = tokio::sync::mpsc::channel::<Message>(BATCHES_IN_FLIGHT);
    let mut threads = Vec::new();
    for n in 0..decoders {
        let jobs = Arc::clone(&job_rx);
        let out = msg_tx.clone();
        let fetched = Arc::clone(&fetched);
        let spares = Arc::clone(&spares);
        let spawned = std::thread::Builder::new()
            .name(format!("inspect-decode-{n}"))
            .spawn(move || decode_loop(&jobs, &out, window, logs_of, &fetched, &spares));
        match spawned {
            Ok(handle) => threads.push(handle),
            Err(e) => problems.note("(local)", &format!("could not start a decoder thread: {e}")),
        }
    }
    drop(msg_tx);

    let open = Arc::new(tokio::sync::Semaphore::new(open_objects_budget()));
    let mut fetches = futures::stream::iter(objects.iter().enumerate())
        .map(|(index, object)| fetch(store, object, index, &job_tx, &fetched, &open))
        .buffer_unordered(READ_CONCURRENCY);
    let started = Instant::now();
    let mut progress = Progress::new();
    let (mut done, mut fetches_done, mut outside_window) = (0usize, false, 0u64);
    if threads.is_empty() {
        return 0;
    }
    while done < objects.len() {
        tokio::select! {
            message = msg_rx.recv() => match message {
                Some(Message::Facts(index, mut facts)) => {
                    let read = fetched.load(Ordering::Relaxed).max(1);
                    model.growth = total_bytes.saturating_sub(read) as f64 / read as f64;
                    model.absorb_all(index, &mut facts);
                    Spares::give(&spares, facts, &mut model.tasks.spent);
                }
                Some(Message::Done(index, summary)) => {
                    done += 1;
                    let object = &objects[index];
                    stats.bytes_read += summary.file_bytes;
                    let node = model.nodes.entry(object.node.clone()).or_default();
                    node.objects += 1;
                    node.bytes += object.size;
                    match &summary.failure {
                        Some(failure) => {
                            stats.unreadable += 1;
                            problems.partly_read(object.path.as_ref(), summary.decoded, failure);
                        }
                        None => {
                            stats.read += 1;
                            problems.read(object.path.as_ref());
                        }
                    }
                    if summary.bad_lines > 0 {
                        problems.bad_lines += summary.bad_lines;
                        problems.note(
                            object.path.as_ref(),
                            &format!(
                                "{} bad line(s); first: {}",
                                summary.bad_lines,
                                summary.first_bad_line.as_deref().unwrap_or("?")
                            ),
                        );
                    }
                    outside_window += summary.outside_window;
                }
                None => break,
            },
            fetch = fetches.next(), if !fetches_done => match fetch {
                Some(bytes) => stats.bytes_read += bytes,
                None => fetches_done = true,
            },
        }
        if started.elapsed() >= PROGRESS_AFTER {
            progress.show(
                done,
                objects.len(),
                fetched.load(Ordering::Relaxed),
                model.total,
            );
        }
    }
    // Every object ended; the decoders stop when the job queue closes.
    drop(fetches);
    drop(job_tx);
    for t in threads {
        let _ = t.join();
    }
    progress.clear();
    outside_window
}

/// How many objects may be open at once: [`MAX_OPEN_OBJECTS`], fewer under a low
/// open-file limit (at least one: a limit too low for that fails with its own error).
/// Leaving room for the fewest spill files too made `ulimit -n 20` read one object at a
/// time beside them and give up on most after minutes of retries, where failing at once
/// with "too many open files" is the better answer (review r56e F2).
fn open_objects_budget() -> usize {
    let spare = open_file_limit().saturating_sub(FDS_KEPT_FREE);
    usize::try_from(spare)
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_OPEN_OBJECTS)
}

/// True when a failed fetch may succeed if tried again: too many open files, a dropped
/// connection, a server error; not a missing object, a refused one or a denied access.
fn is_transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    match e {
        E::Generic { source, .. } => match source.downcast_ref::<super::local::LocalError>() {
            Some(local) => local.io().is_some_and(|io| {
                matches!(
                    io.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::EINTR | libc::ENOMEM)
                ) || matches!(
                    io.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::TimedOut
                )
            }),
            // A remote client's error that is none of the below: a connection or a server.
            None => true,
        },
        E::NotFound { .. }
        | E::InvalidPath { .. }
        | E::NotSupported { .. }
        | E::AlreadyExists { .. }
        | E::Precondition { .. }
        | E::NotModified { .. }
        | E::NotImplemented { .. }
        | E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::UnknownConfigurationKey { .. } => false,
        _ => true,
    }
}

/// Streams one object's bytes to a decoder (or hands it a local file); returns the bytes
/// fetched. Waits for a place among the open objects first.
async fn fetch(
    store: &Arc<dyn ObjectStore>,
    object: &EventObject,
    index: usize,
    jobs: &std::sync::mpsc::Sender<DecodeJob>,
    fetched: &AtomicU64,
    open: &Arc<tokio::sync::Semaphore>,
) -> u64 {
    let Ok(permit) = Arc::clone(open).acquire_owned().await else {
        return 0;
    };
    let gzip = object.path.as_ref().ends_with(".gz");
    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
    let mut attempt = 1;
    let got = loop {
        match store.get(&object.path).await {
            Ok(got) => break got,
            Err(e) if attempt < FETCH_ATTEMPTS && is_transient(&e) => {
                tokio::time::sleep(FETCH_RETRY_WAIT * 2u32.pow(attempt - 1)).await;
                attempt += 1;
            }
            Err(e) => {
                let tries = if attempt > 1 {
                    format!(" (tried {attempt} times)")
                } else {
                    String::new()
                };
                let _ = tx
                    .send(Err(format!(
                        "could not be fetched{tries}: {}",
                        store_error(&e)
                    )))
                    .await;
                let _ = jobs.send(DecodeJob {
                    index,
                    gzip,
                    source: Source::Chunks(rx),
                    _open: permit,
                });
                return 0;
            }
        }
    };
    if let object_store::GetResultPayload::File(file, _) = got.payload {
        // The decoder reads it and counts its bytes.
        let _ = jobs.send(DecodeJob {
            index,
            gzip,
            source: Source::File(file, got.range),
            _open: permit,
        });
        return 0;
    }
    if jobs
        .send(DecodeJob {
            index,
            gzip,
            source: Source::Chunks(rx),
            _open: permit,
        })
        .is_err()
    {
        return 0;
    }
    // One budget of tries for the whole object: a body that breaks off is taken up again
    // from the byte it reached, only from the same version of the object (If-Match on the
    // first answer's ETag), so the decoder sees one continuous byte stream.
    let (size, etag) = (got.meta.size, got.meta.e_tag.clone());
    let mut bytes = 0u64;
    let mut body = got.into_stream();
    let failure = 'object: loop {
        let mut error = loop {
            match body.next().await {
                // A body that ends short of the object's size ended early, however cleanly
                // (review r54t D1: a 206 shorter than its Content-Range counted as read).
                None if bytes != size => {
                    break 'object Some(format!(
                        "reading failed: the body ended at byte {bytes} of {size}"
                    ))
                }
                None => break 'object None,
                Some(Ok(chunk)) if bytes + chunk.len() as u64 > size => {
                    // Never fed to the decoder (review r54t D1: a 206 carrying more than its
                    // Content-Range added an event).
                    break 'object Some(format!(
                        "reading failed: the store sent more than the object's {size} bytes \
                         (at byte {bytes}, a piece of {})",
                        chunk.len()
                    ));
                }
                Some(Ok(chunk)) => {
                    bytes += chunk.len() as u64;
                    fetched.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    // The decoder stops listening when the object's content hit a limit.
                    if tx.send(Ok(chunk)).await.is_err() {
                        return bytes;
                    }
                }
                Some(Err(e)) => break e,
            }
        };
        if bytes >= size {
            // Every byte of the first answer came; nothing to take up again.
            break None;
        }
        loop {
            let Some(etag) = etag.as_deref() else {
                break 'object Some(format!(
                    "reading failed at byte {bytes} of {size} (the store gave no ETag to \
                     resume it with): {}",
                    store_error(&error)
                ));
            };
            if attempt >= FETCH_ATTEMPTS || !is_transient(&error) || is_range_refusal(&error) {
                let tries = if attempt > 1 {
                    format!(", tried {attempt} times")
                } else {
                    String::new()
                };
                break 'object Some(format!(
                    "reading failed at byte {bytes} of {size}{tries}: {}",
                    store_error(&error)
                ));
            }
            tokio::time::sleep(FETCH_RETRY_WAIT * 2u32.pow(attempt - 1)).await;
            attempt += 1;
            let options = object_store::GetOptions {
                range: Some(object_store::GetRange::Offset(bytes)),
                if_match: Some(etag.to_string()),
                ..Default::default()
            };
            match store.get_opts(&object.path, options).await {
                // object_store checks that a ranged answer is a 206 of the range asked.
                Ok(got) if got.range.start == bytes && got.meta.e_tag.as_deref() == Some(etag) => {
                    body = got.into_stream();
                    continue 'object;
                }
                Ok(got) => {
                    break 'object Some(format!(
                        "reading failed at byte {bytes} of {size}: the store answered the \
                         resumption with bytes {}..{} of version {}, not from byte {bytes} \
                         of version {etag}",
                        got.range.start,
                        got.range.end,
                        got.meta.e_tag.as_deref().unwrap_or("(none)")
                    ));
                }
                Err(object_store::Error::Precondition { .. }) => {
                    break 'object Some(format!(
                        "the object changed while being read (replaced or grown after byte \
                         {bytes} of {size}, tried {attempt} times); not stitched from two versions"
                    ));
                }
                Err(e) => error = e,
            }
        }
    };
    if let Some(failure) = failure {
        let _ = tx.send(Err(failure)).await;
    }
    bytes
}

/// True when a resumption's answer was refused for its range (not the 206 of the range
/// asked, as from a server that ignores `Range` and answers the whole object): trying again
/// would get the same answer. object_store's error type for it is private; its messages are
/// matched.
fn is_range_refusal(e: &object_store::Error) -> bool {
    let text = e.to_string();
    ["non-partial response", "Content-Range", "CONTENT_RANGE"]
        .iter()
        .any(|m| text.contains(m))
        || (text.contains("Requested ") && text.contains(", got "))
}

/// An object's chunks as one byte stream, for the gzip decoder to pull from. A chunk that
/// is an error (the fetch failed) ends the stream with an I/O error, its text kept in
/// `failure`.
struct ChunkReader<'a> {
    next: Box<dyn FnMut() -> Option<Result<Bytes, String>> + 'a>,
    chunk: Bytes,
    failure: Option<String>,
}

impl std::io::Read for ChunkReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let data = std::io::BufRead::fill_buf(self)?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        std::io::BufRead::consume(self, n);
        Ok(n)
    }
}

impl std::io::BufRead for ChunkReader<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.chunk.is_empty() {
            if let Some(f) = &self.failure {
                return Err(std::io::Error::other(f.clone()));
            }
            match (self.next)() {
                None => break,
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(e)) => self.failure = Some(e),
            }
        }
        Ok(&self.chunk)
    }

    fn consume(&mut self, n: usize) {
        bytes::Buf::advance(&mut self.chunk, n);
    }
}

/// A decoder thread: takes objects off the queue until it closes.
fn decode_loop(
    jobs: &Mutex<std::sync::mpsc::Receiver<DecodeJob>>,
    out: &tokio::sync::mpsc::Sender<Message>,
    window: TimeWindow,
    logs_of: Option<CompactId>,
    fetched: &AtomicU64,
    spares: &Mutex<Spares>,
) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else {
            return;
        };
        if !decode(job, out, window, logs_of, fetched, spares) {
            return;
        }
    }
}

/// Decodes one object; false when the fold has gone away.
fn decode(
    job: DecodeJob,
    out: &tokio::sync::mpsc::Sender<Message>,
    window: TimeWindow,
    logs_of: Option<CompactId>,
    fetched: &AtomicU64,
    spares: &Mutex<Spares>,
) -> bool {
    let mut sink = ContentSink::new(window, CONTENT_LIMITS);
    sink.logs_of = logs_of;
    sink.out.facts = Spares::take(spares);
    let mut file_bytes = 0u64;
    let mut chunks = None;
    let next: Box<dyn FnMut() -> Option<Result<Bytes, String>>> = match job.source {
        Source::Chunks(rx) => {
            let rx = chunks.insert(rx);
            Box::new(move || rx.blocking_recv())
        }
        Source::File(mut file, range) => {
            let mut left = range.end.saturating_sub(range.start);
            let seek = std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(range.start));
            let mut seek = Some(seek);
            let file_bytes = &mut file_bytes;
            Box::new(move || {
                if let Some(Err(e)) = seek.take() {
                    return Some(Err(format!("reading failed: {e}")));
                }
                if left == 0 {
                    return None;
                }
                let mut buf = vec![0u8; (left as usize).min(FILE_BLOCK)];
                match std::io::Read::read(&mut file, &mut buf) {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        left -= n as u64;
                        *file_bytes += n as u64;
                        fetched.fetch_add(n as u64, Ordering::Relaxed);
                        Some(Ok(Bytes::from(buf)))
                    }
                    Err(e) => Some(Err(format!("reading failed: {e}"))),
                }
            })
        }
    };
    let mut input = ChunkReader {
        next,
        chunk: Bytes::new(),
        failure: None,
    };
    // Facts are sent on as soon as a batch is full; `gone` when the fold went away.
    let mut gone = false;
    let mut decoded = 0u64;
    let mut pushed = |data: &[u8]| -> Result<(), String> {
        decoded += data.len() as u64;
        sink.push(data)?;
        if sink.out.facts.len() >= FACTS_PER_BATCH {
            let facts = sink.take_facts(Spares::take(spares));
            if out.blocking_send(Message::Facts(job.index, facts)).is_err() {
                gone = true;
                return Err("the fold went away".into());
            }
        }
        Ok(())
    };
    let read = if job.gzip {
        gunzip(&mut input, &mut pushed)
    } else {
        plain(&mut input, &mut pushed)
    };
    if gone {
        return false;
    }
    let mut failure = read.err();
    // A failure of the fetch itself (not of the content) is told as such.
    if let Some(f) = input.failure.take() {
        failure = Some(f);
    }
    drop(input);
    // Stop the fetch of an object given up on.
    drop(chunks);
    sink.finish(failure.is_none());
    let facts = sink.take_facts(Vec::new());
    if !facts.is_empty() && out.blocking_send(Message::Facts(job.index, facts)).is_err() {
        return false;
    }
    let summary = ObjectSummary {
        bad_lines: sink.out.bad_lines,
        first_bad_line: sink.out.first_bad_line.take(),
        outside_window: sink.out.outside_window,
        file_bytes,
        decoded,
        failure,
    };
    out.blocking_send(Message::Done(job.index, summary)).is_ok()
}

/// The progress line on stderr, only when it is a terminal.
struct Progress {
    terminal: bool,
    last: Option<Instant>,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            last: None,
        }
    }

    fn show(&mut self, done: usize, total: usize, bytes: u64, events: u64) {
        if !self.terminal || self.last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        eprint!(
            "\r\x1b[Kreading: {done}/{total} objects, {} fetched, {events} events",
            human_bytes(bytes)
        );
    }

    fn clear(&self) {
        if self.terminal && self.last.is_some() {
            eprint!("\r\x1b[K");
        }
    }
}
