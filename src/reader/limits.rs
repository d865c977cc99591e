//! The reader's bounds: how many objects are listed or read at once, and how much of an
//! object, a line, a field or a message is kept. Each is what keeps memory bounded whatever the
//! bucket holds; a value over its bound is counted or shortened, never fatal.

/// Objects listed or read at once: enough to hide request latency, small enough to be polite
/// to the bucket and to bound memory.
pub(super) const READ_CONCURRENCY: usize = 8;
/// Decoder threads at most: one per core but the fold's, up to this (at least one).
/// The fold (the thread that calls `read::read_objects`) takes about two fifths of the work
/// on big sessions, so on two cores a second decoder only made three busy threads share two
/// cores: 0.1 to 0.3 s more CPU on 1,000,000 events (BENCHMARKS, "inspect on big
/// sessions") for no shorter read.
pub(super) const MAX_DECODERS: usize = 8;
/// Objects open at once at most: the fetches in flight and one queued per decoder.
pub(super) const MAX_OPEN_OBJECTS: usize = READ_CONCURRENCY + MAX_DECODERS;
/// Open files left to everything else under a low open-file limit: stdio, the runtime,
/// the bucket directory and a listing, connections.
pub(super) const FDS_KEPT_FREE: u64 = 16;
/// Fewest spill files of a big session's task attempts, all open while it is read.
pub(super) const MIN_SPILL_FILES: usize = 8;

/// Sessions this process may read at once: 1 for `inspect`; `serve` says how many it loads
/// at once ([`set_sessions_read_at_once`]). The open-file limit is shared among them.
static SESSIONS_READ_AT_ONCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Says how many sessions this process may read at once (at least 1).
pub(crate) fn set_sessions_read_at_once(n: u64) {
    SESSIONS_READ_AT_ONCE.store(n.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// How many sessions this process may read at once.
pub(super) fn sessions_read_at_once() -> u64 {
    SESSIONS_READ_AT_ONCE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The process's soft limit of open files (`ulimit -n`); unlimited when it cannot be read.
pub(super) fn open_file_limit() -> u64 {
    let mut limit = std::mem::MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: `limit` points to writable memory of the size of `struct rlimit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, limit.as_mut_ptr()) } == 0 {
        // SAFETY: getrlimit returned 0, so it filled `limit`. rlim_t is u64 on Linux.
        unsafe { limit.assume_init() }.rlim_cur
    } else {
        libc::RLIM_INFINITY
    }
}
/// How much of an object's content is accepted.
#[derive(Debug, Clone, Copy)]
pub(super) struct ContentLimits {
    /// Longest JSON line kept; longer lines are counted as bad.
    pub(super) line: usize,
    /// Largest legacy JSON-array document, which has to be parsed whole.
    pub(super) document: usize,
    /// Decompressed bytes read from one object before giving up on it (a gzip bomb guard).
    pub(super) decoded: u64,
}

/// KubeRay's reader allows 100 MiB lines; segments are 64 MiB by default.
pub(super) const CONTENT_LIMITS: ContentLimits = ContentLimits {
    line: 64 << 20,
    document: 256 << 20,
    decoded: 4 << 30,
};
/// Problem details kept in the report; the counts stay exact.
pub(super) const MAX_PROBLEM_DETAILS: usize = 200;
/// Error messages are tracebacks; this much of each is kept.
pub(super) const MAX_ERROR_MESSAGE_BYTES: usize = 16 << 10;
/// Longest id, name or state kept from an event.
pub(super) const MAX_FIELD_BYTES: usize = 512;
/// Longest text of a Ray Train run or attempt kept whole (its status detail, name, log
/// paths), in bytes. Ray Train V2 bounds none of them (its state schema defines
/// `MAX_ERROR_STACK_TRACE_LENGTH`, 50,000 characters, but only Train V1 applies it), and a
/// failed run's detail holds every worker's error: 75,975 characters for 64 workers lost
/// with their nodes. So this is only a safety bound, far above what Ray builds and far under
/// the 64 MiB line limit; a longer text keeps its start and its end (the final exception)
/// around a marker saying how much was cut (`values::bounded_middle`).
pub(super) const MAX_TRAIN_TEXT_BYTES: usize = 4 << 20;
