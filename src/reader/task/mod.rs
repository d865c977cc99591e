//! Task attempts, folded as events stream in, in memory bounded by named constants.
//!
//! Every task event (a pushed definition, lifecycle or profile event, or a file-based
//! `EXPORT_TASK`) becomes a [`TaskDelta`]; the fold turns it into a compact [`TaskState`]
//! (ids as bytes, repeated strings as [`Sym`]bols, times as integers) and merges it into
//! the state of its attempt. Merging is idempotent and does not depend on the order of
//! events: the latest transition wins (ties go to the later state in Ray's enum), the first
//! RUNNING and the first FAILED are minima, other values are filled once.
//!
//! Up to [`MAX_ATTEMPTS_IN_MEMORY`] attempts are kept in one hash map. A session with more
//! (a big one: every task has its own attempts) is spilled: the map and every later state
//! go to [`SpillFiles`], one of K files on local disk chosen by a hash of the attempt, and
//! at the end each file is folded alone. Memory is then one file's attempts, whatever the
//! session's size; the disk holds about 100 bytes per attempt for the time of the run.

use std::collections::HashMap;
use std::io::BufReader;

mod spill;

use self::spill::{read_record, SpillFiles, SPILL_BUFFER_BYTES};
use super::limits::{
    open_file_limit, sessions_read_at_once, FDS_KEPT_FREE, MAX_OPEN_OBJECTS, MIN_SPILL_FILES,
};
use super::values::{state_rank, Transition};
use crate::util::dedup::PassThrough;

/// Attempts kept in one in-memory map before the session is spilled to disk (about 128
/// bytes each: 32 MiB of map at most, 48 MiB while it grows).
pub(super) const MAX_ATTEMPTS_IN_MEMORY: usize = 200_000;
/// Attempts aimed at per spill file: folding one file stays well under the limit above even
/// when the session's size was underestimated several times over, and its table (about
/// 4 MiB) stays in the CPU's last-level cache while the file is read back, where a table of
/// 100,000 attempts missed it on nearly every record. 16,384 (2 MiB) was faster still but
/// took six times main's descriptors: two sessions loading at once in `serve` failed under
/// `ulimit -n` 128 to 192 where main's did not (review r56e F1).
const ATTEMPTS_PER_SPILL_FILE: u64 = 32_768;
/// Attempts per spill file before, when a table of 100,000 missed the caches: under a tight
/// open-file limit the files are never fewer than this gave, which fitted where it did.
const ATTEMPTS_PER_SPILL_FILE_BEFORE: u64 = 100_000;
/// Most spill files; each holds a write buffer while the session is read.
const MAX_SPILL_FILES: usize = 512;
/// Distinct strings (names, states, ids of jobs, nodes and workers) remembered; past this
/// a value reads as [`OVERFLOW_TEXT`]: hostile input cannot grow the table without bound.
const MAX_SYMBOLS: usize = 1 << 18;
const OVERFLOW_TEXT: &str = "(too many distinct values)";
/// Bytes of error messages held for failed attempts; past it, only the last line of a
/// message (its summary) is kept.
const MAX_ERROR_BYTES_HELD: usize = 32 << 20;

/// A hash map keyed by input from the bucket: a fast hash with a random seed (so that no
/// input can be built to collide).
pub(super) type FastMap<K, V> = HashMap<K, V, xxhash_rust::xxh3::Xxh3Builder>;

pub(super) fn fast_map<K, V>() -> FastMap<K, V> {
    HashMap::with_hasher(xxhash_rust::xxh3::Xxh3Builder::new().with_seed(rand::random()))
}

/// A Ray id held as bytes (Ray's ids are at most 28 bytes). An id that is not hex or base64,
/// or is longer, is held as a 16-byte hash of its text and shown as `invalid-<hash>`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CompactId {
    /// Length in bytes; the high bit marks a hash.
    len: u8,
    bytes: [u8; 31],
}

const HASHED: u8 = 0x80;

/// The seed of the hashes of ids: random per process, so that no input can be built to
/// collide in the maps.
fn id_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(rand::random)
}

impl std::hash::Hash for CompactId {
    /// One 64-bit hash of the bytes (the maps keyed by ids pass it through).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(xxhash_rust::xxh3::xxh3_64_with_seed(
            &self.bytes[..self.byte_len()],
            id_seed() ^ u64::from(self.len),
        ));
    }
}

impl CompactId {
    /// The id of an event field (base64 or hex, read as [`crate::contract::id_to_hex`]
    /// reads it), without allocating for Ray's own ids.
    pub(super) fn parse(raw: &str) -> CompactId {
        let b = raw.as_bytes();
        let looks_hex =
            !b.is_empty() && b.len().is_multiple_of(2) && b.iter().all(u8::is_ascii_hexdigit);
        if looks_hex {
            if let Some(id) = CompactId::from_hex(raw) {
                return id;
            }
        } else {
            if let Some(id) = CompactId::from_plain_base64(b) {
                return id;
            }
            use base64::Engine as _;
            let mut bytes = [0u8; 31];
            if let Ok(n) = base64::engine::general_purpose::STANDARD.decode_slice(b, &mut bytes) {
                return CompactId {
                    len: n as u8,
                    bytes,
                };
            }
        }
        if let Ok(hex) = crate::contract::id_to_hex(raw) {
            if let Some(id) = CompactId::from_hex(hex.as_str()) {
                return id;
            }
        }
        let h = xxhash_rust::xxh3::xxh3_128(raw.as_bytes()).to_be_bytes();
        let mut bytes = [0u8; 31];
        bytes[..16].copy_from_slice(&h);
        CompactId {
            len: HASHED | 16,
            bytes,
        }
    }

    /// Standard padded base64 of at most 31 bytes, with its unused bits zero (Ray's ids),
    /// decoded by hand: the bytes the `base64` crate's STANDARD engine gives for it. `None`
    /// for anything else (that engine then decides). A quarter of the cost of the engine.
    fn from_plain_base64(b: &[u8]) -> Option<CompactId> {
        /// Each byte's 6-bit value, 0xff for a byte outside the alphabet.
        const VALUES: [u8; 256] = {
            let mut t = [0xffu8; 256];
            let mut i = 0;
            while i < 64 {
                t[b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i]
                    as usize] = i as u8;
                i += 1;
            }
            t
        };
        fn value(c: u8) -> Option<u32> {
            let v = VALUES[usize::from(c)];
            (v != 0xff).then_some(u32::from(v))
        }
        if b.is_empty() || !b.len().is_multiple_of(4) {
            return None;
        }
        let pad = b.iter().rev().take(2).take_while(|c| **c == b'=').count();
        let n = b.len() / 4 * 3 - pad;
        if n > 31 {
            return None;
        }
        let mut bytes = [0u8; 31];
        let mut out = [0u8; 33];
        for (i, quad) in b.chunks_exact(4).enumerate() {
            let last = i == b.len() / 4 - 1;
            let mut word = 0u32;
            for (j, &c) in quad.iter().enumerate() {
                let v = if last && j >= 4 - pad { 0 } else { value(c)? };
                word = word << 6 | v;
            }
            out[i * 3..i * 3 + 3].copy_from_slice(&word.to_be_bytes()[1..]);
        }
        // The bits after the last byte must be zero (the engine refuses others).
        if out[n..n + pad].iter().any(|b| *b != 0) {
            return None;
        }
        bytes[..n].copy_from_slice(&out[..n]);
        Some(CompactId {
            len: n as u8,
            bytes,
        })
    }

    /// An id given in hex (as people type it), or `None` if it is not hex or too long.
    pub(super) fn from_hex(hex: &str) -> Option<CompactId> {
        let h = hex.as_bytes();
        if h.is_empty() || !h.len().is_multiple_of(2) || h.len() > 62 {
            return None;
        }
        let mut bytes = [0u8; 31];
        for (i, pair) in h.chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            bytes[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Some(CompactId {
            len: (h.len() / 2) as u8,
            bytes,
        })
    }

    pub(super) fn byte_len(&self) -> usize {
        (self.len & !HASHED) as usize
    }

    /// The stored form: the length byte (high bit: a hash) and the bytes.
    pub(super) fn raw(&self) -> (u8, &[u8]) {
        (self.len, &self.bytes[..self.byte_len()])
    }

    /// The inverse of [`CompactId::raw`].
    pub(super) fn from_raw(len: u8, bytes: &[u8]) -> CompactId {
        let mut id = CompactId {
            len,
            bytes: [0; 31],
        };
        let n = id.byte_len().min(31).min(bytes.len());
        id.bytes[..n].copy_from_slice(&bytes[..n]);
        id
    }

    /// True when the text was not an id and is held as its hash (`invalid-<hash>`).
    pub(super) fn is_hashed(&self) -> bool {
        self.len & HASHED != 0
    }

    /// Lower-case hex (or `invalid-<hash>`).
    pub(crate) fn hex(&self) -> String {
        let mut s = String::with_capacity(2 * self.byte_len() + 8);
        if self.len & HASHED != 0 {
            s.push_str("invalid-");
        }
        for b in &self.bytes[..self.byte_len()] {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

impl std::fmt::Debug for CompactId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

/// One task attempt: Ray's unit of task events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct AttemptKey {
    pub(crate) id: CompactId,
    pub(crate) attempt: i32,
}

impl std::hash::Hash for AttemptKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(
            xxhash_rust::xxh3::xxh3_64_with_seed(
                &self.id.bytes[..self.id.byte_len()],
                id_seed() ^ u64::from(self.id.len),
            ) ^ (self.attempt as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
    }
}

/// A map keyed by ids, hashed once by the key itself.
pub(super) type IdMap<K, V> = HashMap<K, V, PassThrough>;

/// Where a task's output sits in its worker's logs, as Ray reports it (`taskLogInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct LogInfo {
    /// File names (no directory) of the worker's `.out` and `.err`.
    pub(super) stdout_file: Option<String>,
    pub(super) stderr_file: Option<String>,
    pub(super) stdout: (Option<u64>, Option<u64>),
    pub(super) stderr: (Option<u64>, Option<u64>),
}

impl LogInfo {
    fn merge(&mut self, other: LogInfo) {
        fill(&mut self.stdout_file, other.stdout_file);
        fill(&mut self.stderr_file, other.stderr_file);
        // Export events print unset offsets as 0: the larger value is the one Ray set.
        let max = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        self.stdout = (
            max(self.stdout.0, other.stdout.0),
            max(self.stdout.1, other.stdout.1),
        );
        self.stderr = (
            max(self.stderr.0, other.stderr.0),
            max(self.stderr.1, other.stderr.1),
        );
    }
}

/// An event's state transitions, the first [`INLINE_TRANSITIONS`] held inline: a
/// lifecycle event rarely has more, so reading one allocates nothing for them.
#[derive(Debug, Clone, Default)]
pub(super) struct Transitions {
    inline: [Option<Transition>; INLINE_TRANSITIONS],
    more: Vec<Transition>,
}

const INLINE_TRANSITIONS: usize = 4;

impl Transitions {
    pub(super) fn push(&mut self, t: Transition) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(t),
            None => self.more.push(t),
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Transition> {
        self.inline.iter().flatten().chain(self.more.iter())
    }
}

impl FromIterator<Transition> for Transitions {
    fn from_iter<I: IntoIterator<Item = Transition>>(items: I) -> Transitions {
        let mut t = Transitions::default();
        for item in items {
            t.push(item);
        }
        t
    }
}

/// A short text held inline (task names, types and resource requests are short), a longer
/// one on the heap: a task event's texts cost no allocation that the fold, on another
/// thread, would have to free.
#[derive(Clone)]
pub(super) enum SmallText {
    Inline {
        len: u8,
        bytes: [u8; SMALL_TEXT_BYTES],
    },
    Heap(Box<str>),
}

const SMALL_TEXT_BYTES: usize = 38;

impl SmallText {
    pub(super) fn new(s: &str) -> SmallText {
        if s.len() <= SMALL_TEXT_BYTES {
            let mut bytes = [0u8; SMALL_TEXT_BYTES];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            SmallText::Inline {
                len: s.len() as u8,
                bytes,
            }
        } else {
            SmallText::Heap(s.into())
        }
    }
}

impl std::ops::Deref for SmallText {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            // The bytes are a copy of a `&str`'s, whole: valid UTF-8.
            SmallText::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..*len as usize]).unwrap_or_default()
            }
            SmallText::Heap(s) => s,
        }
    }
}

impl std::fmt::Debug for SmallText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl From<&str> for SmallText {
    fn from(s: &str) -> SmallText {
        SmallText::new(s)
    }
}

/// What one event says about one task attempt.
#[derive(Debug, Clone, Default)]
pub(super) struct TaskDelta {
    pub(super) key: Option<AttemptKey>,
    pub(super) job: Option<CompactId>,
    pub(super) name: Option<SmallText>,
    pub(super) task_type: Option<SmallText>,
    pub(super) transitions: Transitions,
    /// (error type, error message) of `rayErrorInfo`.
    pub(super) error: Option<(Option<String>, Option<String>)>,
    pub(super) node: Option<CompactId>,
    pub(super) worker: Option<CompactId>,
    pub(super) pid: Option<i64>,
    /// The resources it asked for, as text (`CPU: 1, GPU: 1`, keys sorted).
    pub(super) resources: Option<SmallText>,
    /// The execution as the worker profiled it (`task::<name>`): start, end (ns) and worker.
    pub(super) exec: Option<(i64, i64, Option<CompactId>)>,
    pub(super) log: Option<Box<LogInfo>>,
    /// A profile event: alone, it does not make an attempt known.
    pub(super) from_profile: bool,
}

impl TaskDelta {
    /// Drops what the delta holds on the heap (texts, transitions past the inline ones or
    /// with states of their own, the error, the log), so that a box kept for reuse holds
    /// nothing but itself: review r36z D2, boxes kept with 400 unknown 500-byte states each
    /// took 1.4 GB where main took 0.9 GB. Real Ray events hold almost nothing there.
    fn release(&mut self) {
        self.name = None;
        self.task_type = None;
        self.resources = None;
        self.transitions = Transitions::default();
        self.error = None;
        self.log = None;
    }
}

/// An index into [`Symbols`]; [`Sym::NONE`] is no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Sym(pub(super) u32);

impl Sym {
    pub(crate) const NONE: Sym = Sym(u32::MAX);
    const OVERFLOW: Sym = Sym(u32::MAX - 1);

    pub(crate) fn is_none(self) -> bool {
        self == Sym::NONE
    }
}

/// Interned strings, at most [`MAX_SYMBOLS`], and the node of each worker seen with one.
#[derive(Debug)]
pub(crate) struct Symbols {
    texts: Vec<Box<str>>,
    index: FastMap<Box<str>, u32>,
    /// Ids (jobs, nodes, workers) by their bytes; their text is their hex.
    ids: IdMap<CompactId, Sym>,
    /// Worker → node, from events that name both (the owner's); an executor's own events
    /// name only the worker.
    worker_nodes: FastMap<Sym, Sym>,
    /// The one node all known workers ran on, if there is exactly one.
    sole_node: Sym,
    /// Symbols of static texts (Ray's task states) by address: a static text never moves or
    /// changes, so its address and length name it, and a transition's state costs no hash.
    statics: Vec<(usize, usize, Sym)>,
    /// The last texts [`Symbols::intern`] gave a symbol, compared before any hash: a task's
    /// name, type and resources mostly repeat those of the task before it.
    recent: [Sym; RECENT_SYMBOLS],
    /// Where in `recent` the next symbol looked up by hash goes.
    recent_next: usize,
}

/// How many of the last interned texts [`Symbols::recent`] holds.
const RECENT_SYMBOLS: usize = 4;

/// The most static texts [`Symbols`] finds by address (Ray has 13 task states).
const MAX_STATIC_SYMBOLS: usize = 32;

impl Default for Symbols {
    fn default() -> Symbols {
        Symbols {
            texts: Vec::new(),
            index: fast_map(),
            ids: IdMap::default(),
            worker_nodes: fast_map(),
            sole_node: Sym::NONE,
            statics: Vec::new(),
            recent: [Sym::NONE; RECENT_SYMBOLS],
            recent_next: 0,
        }
    }
}

impl Symbols {
    pub(super) fn intern(&mut self, s: Option<&str>) -> Sym {
        let Some(s) = s else {
            return Sym::NONE;
        };
        for sym in self.recent {
            if self.texts.get(sym.0 as usize).is_some_and(|t| **t == *s) {
                return sym;
            }
        }
        let sym = match self.index.get(s) {
            Some(&i) => Sym(i),
            None => {
                if self.texts.len() >= MAX_SYMBOLS {
                    return Sym::OVERFLOW;
                }
                let i = self.texts.len() as u32;
                self.texts.push(s.into());
                self.index.insert(s.into(), i);
                Sym(i)
            }
        };
        self.recent[self.recent_next] = sym;
        self.recent_next = (self.recent_next + 1) % RECENT_SYMBOLS;
        sym
    }

    /// [`Symbols::intern`] of a static text, found by its address after its first time.
    fn intern_static(&mut self, s: &'static str) -> Sym {
        let key = (s.as_ptr() as usize, s.len());
        if let Some(&(_, _, sym)) = self.statics.iter().find(|(p, l, _)| (*p, *l) == key) {
            return sym;
        }
        let sym = self.intern(Some(s));
        if sym != Sym::OVERFLOW && self.statics.len() < MAX_STATIC_SYMBOLS {
            self.statics.push((key.0, key.1, sym));
        }
        sym
    }

    /// The symbol of an id (its hex text).
    pub(super) fn intern_id(&mut self, id: Option<CompactId>) -> Sym {
        let Some(id) = id else {
            return Sym::NONE;
        };
        if let Some(&sym) = self.ids.get(&id) {
            return sym;
        }
        let sym = self.intern(Some(&id.hex()));
        if sym != Sym::OVERFLOW {
            self.ids.insert(id, sym);
        }
        sym
    }

    pub(crate) fn get(&self, sym: Sym) -> Option<&str> {
        match sym {
            Sym::NONE => None,
            Sym::OVERFLOW => Some(OVERFLOW_TEXT),
            Sym(i) => self.texts.get(i as usize).map(|s| &**s),
        }
    }

    pub(crate) fn owned(&self, sym: Sym) -> Option<String> {
        self.get(sym).map(str::to_string)
    }

    /// The node of `worker`, if an event named both; else the session's only node, if it
    /// has one.
    pub(crate) fn node_of(&self, worker: Sym) -> Sym {
        self.worker_nodes
            .get(&worker)
            .copied()
            .unwrap_or(self.sole_node)
    }

    fn settle_sole_node(&mut self) {
        let mut nodes = self.worker_nodes.values().copied();
        let first = nodes.next().unwrap_or(Sym::NONE);
        self.sole_node = if nodes.all(|n| n == first) {
            first
        } else {
            Sym::NONE
        };
    }
}

/// Rarely present parts of an attempt, boxed so that the common attempt stays small.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskExtra {
    pub(crate) error_type: Option<String>,
    pub(crate) error_message: Option<String>,
    /// The error came from an event with a FAILED transition (it wins over others).
    pub(super) error_from_failed: bool,
    pub(super) log: Option<LogInfo>,
}

/// Time not known.
pub(crate) const NO_TIME: i64 = i64::MIN;

/// The merged state of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskState {
    /// Time and state of the latest transition (`latest_state` NONE: none seen).
    pub(crate) latest_ns: i64,
    pub(super) latest_state: Sym,
    pub(super) latest_rank: u8,
    /// First RUNNING, first FAILED ([`NO_TIME`]: none).
    pub(crate) running_ns: i64,
    pub(crate) failed_ns: i64,
    /// The profiled execution ([`NO_TIME`]: none).
    pub(crate) exec_start: i64,
    pub(crate) exec_end: i64,
    pub(crate) exec_worker: Sym,
    pub(crate) job: Sym,
    pub(crate) name: Sym,
    pub(crate) task_type: Sym,
    pub(crate) node: Sym,
    pub(crate) worker: Sym,
    /// The resources it asked for (interned: a session has few distinct sets).
    pub(super) resources: Sym,
    /// 0: unknown.
    pub(super) pid: u32,
    /// Seen in a definition, lifecycle or export event, not only in a profile: an attempt
    /// known only from its profile is not counted (a profile event in a time window does
    /// not make its task part of the window).
    pub(crate) known: bool,
    pub(crate) extra: Option<Box<TaskExtra>>,
}

impl Default for TaskState {
    fn default() -> Self {
        TaskState {
            latest_ns: NO_TIME,
            latest_state: Sym::NONE,
            latest_rank: 0,
            running_ns: NO_TIME,
            failed_ns: NO_TIME,
            exec_start: NO_TIME,
            exec_end: NO_TIME,
            exec_worker: Sym::NONE,
            job: Sym::NONE,
            name: Sym::NONE,
            task_type: Sym::NONE,
            node: Sym::NONE,
            worker: Sym::NONE,
            resources: Sym::NONE,
            pid: 0,
            known: false,
            extra: None,
        }
    }
}

/// Keeps in `slot` the least of itself and `value`, an absent value counting as none:
/// events of one attempt that disagree (an inconsistent or hostile bucket) then give the
/// same state in whatever order they are read (review r56b D1).
fn fill<T: Ord>(slot: &mut Option<T>, value: Option<T>) {
    if let Some(v) = value {
        if slot.as_ref().is_none_or(|cur| v < *cur) {
            *slot = Some(v);
        }
    }
}

/// [`fill`] for symbols, by their texts (symbols are numbered in the order they were read).
fn fill_sym(slot: &mut Sym, value: Sym, symbols: &Symbols) {
    if value.is_none() || *slot == value {
        return;
    }
    if slot.is_none() || symbols.get(value) < symbols.get(*slot) {
        *slot = value;
    }
}

/// Whether the error `a` holds is kept over the one `b` holds: one of a FAILED event's
/// before one seen elsewhere, any before none, then the least by type and message.
fn error_before(a: &TaskExtra, b: &TaskExtra) -> bool {
    let has = |e: &TaskExtra| e.error_type.is_some() || e.error_message.is_some();
    if !has(a) {
        return false;
    }
    let rank = |e: &TaskExtra| (e.error_from_failed, has(e));
    match rank(a).cmp(&rank(b)) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => {
            (a.error_type.as_deref(), a.error_message.as_deref())
                < (b.error_type.as_deref(), b.error_message.as_deref())
        }
    }
}

fn min_time(a: i64, b: i64) -> i64 {
    match (a, b) {
        (NO_TIME, x) | (x, NO_TIME) => x,
        (x, y) => x.min(y),
    }
}

impl TaskState {
    /// The state of one delta. `keep_log` says whether its log offsets are kept.
    /// The delta is left without its error and log (taken), so that the fold can give its
    /// allocation back to the decoders.
    pub(super) fn from_delta(
        d: &mut TaskDelta,
        symbols: &mut Symbols,
        keep_log: bool,
        error_budget: &mut ErrorBudget,
    ) -> TaskState {
        let mut s = TaskState {
            known: !d.from_profile,
            job: symbols.intern_id(d.job),
            name: symbols.intern(d.name.as_deref()),
            task_type: symbols.intern(d.task_type.as_deref()),
            node: symbols.intern_id(d.node),
            worker: symbols.intern_id(d.worker),
            resources: symbols.intern(d.resources.as_deref()),
            pid: d
                .pid
                .filter(|p| *p > 0)
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(0),
            ..TaskState::default()
        };
        if !s.worker.is_none() && !s.node.is_none() {
            // The least node by text when events name two (review r56d D1: the first read).
            let node = s.node;
            match symbols.worker_nodes.get(&s.worker).copied() {
                Some(cur) if cur == node || symbols.get(cur) < symbols.get(node) => {}
                _ => {
                    symbols.worker_nodes.insert(s.worker, node);
                }
            }
        }
        let mut failed_here = false;
        for t in d.transitions.iter() {
            let time = t.time_ns.unwrap_or(NO_TIME);
            let rank = state_rank(&t.state);
            let later = s.latest_state.is_none()
                || (time, rank) > (s.latest_ns, s.latest_rank)
                || ((time, rank) == (s.latest_ns, s.latest_rank)
                    && Some(&*t.state) < symbols.get(s.latest_state));
            if later {
                s.latest_ns = time;
                s.latest_rank = rank;
                s.latest_state = match &t.state {
                    std::borrow::Cow::Borrowed(state) => symbols.intern_static(state),
                    std::borrow::Cow::Owned(state) => symbols.intern(Some(state)),
                };
            }
            match &*t.state {
                "RUNNING" => s.running_ns = min_time(s.running_ns, time),
                "FAILED" => {
                    failed_here = true;
                    s.failed_ns = min_time(s.failed_ns, time);
                }
                _ => {}
            }
        }
        if let Some((start, end, worker)) = d.exec {
            s.exec_start = start;
            s.exec_end = end;
            s.exec_worker = symbols.intern_id(worker);
        }
        let log = d.log.take().filter(|_| keep_log).map(|l| *l);
        let error = d.error.take();
        if error.is_some() || log.is_some() {
            let (error_type, error_message) = error.unwrap_or((None, None));
            let error_message = error_message.map(|m| error_budget.take(m));
            s.extra = Some(Box::new(TaskExtra {
                error_type,
                error_message,
                error_from_failed: failed_here,
                log,
            }));
        }
        s
    }

    /// Merges `other` into `self`. The result does not depend on the order states are
    /// merged in (review r56b D1: an attempt failed three times with three messages showed
    /// whichever was read last): the latest transition (ties by rank, then by the state's
    /// text), the first times, the least of two different texts, ids and pids, the earliest
    /// profiled execution, and the error of a FAILED event before any other (the least by
    /// type and message between two of one kind), its type and message kept together.
    pub(super) fn merge(&mut self, other: TaskState, symbols: &Symbols) {
        if !other.latest_state.is_none()
            && (self.latest_state.is_none()
                || (other.latest_ns, other.latest_rank) > (self.latest_ns, self.latest_rank)
                || ((other.latest_ns, other.latest_rank) == (self.latest_ns, self.latest_rank)
                    && other.latest_state != self.latest_state
                    && symbols.get(other.latest_state) < symbols.get(self.latest_state)))
        {
            self.latest_ns = other.latest_ns;
            self.latest_rank = other.latest_rank;
            self.latest_state = other.latest_state;
        }
        self.running_ns = min_time(self.running_ns, other.running_ns);
        self.failed_ns = min_time(self.failed_ns, other.failed_ns);
        if other.exec_start != NO_TIME
            && (self.exec_start == NO_TIME
                || (
                    other.exec_start,
                    other.exec_end,
                    symbols.get(other.exec_worker),
                ) < (
                    self.exec_start,
                    self.exec_end,
                    symbols.get(self.exec_worker),
                ))
        {
            self.exec_start = other.exec_start;
            self.exec_end = other.exec_end;
            self.exec_worker = other.exec_worker;
        }
        fill_sym(&mut self.job, other.job, symbols);
        fill_sym(&mut self.name, other.name, symbols);
        fill_sym(&mut self.task_type, other.task_type, symbols);
        fill_sym(&mut self.node, other.node, symbols);
        fill_sym(&mut self.worker, other.worker, symbols);
        fill_sym(&mut self.resources, other.resources, symbols);
        if other.pid != 0 && (self.pid == 0 || other.pid < self.pid) {
            self.pid = other.pid;
        }
        self.known |= other.known;
        match (&mut self.extra, other.extra) {
            (_, None) => {}
            (slot @ None, Some(o)) => *slot = Some(o),
            (Some(mine), Some(o)) => {
                let o = *o;
                if error_before(&o, mine) {
                    mine.error_type = o.error_type;
                    mine.error_message = o.error_message;
                    mine.error_from_failed = o.error_from_failed;
                }
                match (&mut mine.log, o.log) {
                    (_, None) => {}
                    (slot @ None, Some(l)) => *slot = Some(l),
                    (Some(m), Some(l)) => m.merge(l),
                }
            }
        }
    }

    /// The final state's name (`UNKNOWN` when only a definition was seen).
    pub(crate) fn state<'a>(&self, symbols: &'a Symbols) -> &'a str {
        symbols.get(self.latest_state).unwrap_or("UNKNOWN")
    }
}

/// Bytes of error messages held so far ([`MAX_ERROR_BYTES_HELD`]).
#[derive(Debug, Default)]
pub(super) struct ErrorBudget {
    held: usize,
    /// Messages cut to their last line because the budget was spent.
    pub(super) shortened: u64,
}

impl ErrorBudget {
    fn take(&mut self, message: String) -> String {
        if self.held + message.len() <= MAX_ERROR_BYTES_HELD {
            self.held += message.len();
            return message;
        }
        self.shortened += 1;
        let last = message
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("");
        super::values::bounded(last, 512)
    }
}

/// Every attempt of a session: in memory, or spilled to files by hash.
#[derive(Debug)]
pub(crate) struct TaskStore {
    pub(super) symbols: Symbols,
    map: IdMap<AttemptKey, TaskState>,
    spill: Option<SpillFiles>,
    errors: ErrorBudget,
    /// Log offsets are kept only for the attempts of this task (`--logs`).
    keep_logs_of: Option<CompactId>,
    /// States written to the spill files after the spill began.
    pub(super) spilled_attempts: u64,
    /// Boxes of deltas folded, for the reader to give back to the decoder threads, which
    /// reuse them: the fold does not free, one by one, what the decoders allocated.
    pub(super) spent: SpentDeltas,
}

/// Boxes of deltas kept to be reused. A task fact carries its delta boxed
/// ([`super::extract::Body::Task`]), so the boxes are what is recycled.
#[allow(clippy::vec_box)]
pub(super) type SpentDeltas = Vec<Box<TaskDelta>>;

/// Boxes of folded deltas kept in [`TaskStore::spent`] at most.
const MAX_SPENT_DELTAS: usize = 8192;

/// How many spill files for `expected` attempts, between [`MIN_SPILL_FILES`] and
/// [`MAX_SPILL_FILES`] (all are open while the session is read). Read alone (`inspect`,
/// `reads` 1): one per [`ATTEMPTS_PER_SPILL_FILE`] with half as many again of room, as many
/// as half the open-file limit `nofile` leaves room for once the objects being read and the
/// files kept for everything else have theirs (review r56a D1: 81 files at 1,000,000 events
/// failed where `ulimit -n` was 64), and never fewer than one per
/// [`ATTEMPTS_PER_SPILL_FILE_BEFORE`], the count that fitted before: fewer files only make
/// each one's table larger. Among several sessions read at once (`serve`), that count
/// (reviews r56e F1, r56h F1, r56i N1).
fn spill_files(expected: f64, nofile: u64, reads: u64) -> usize {
    let per = |attempts: u64| ((expected * 1.5) as u64 / attempts).saturating_add(1);
    let files = if reads > 1 {
        // Several sessions at once (`serve`): the count that fitted before, so that no mix
        // of loads and connections needs more descriptors than it did (review r56i N1: at
        // `ulimit -n 256`, 145 idle connections and three loads failed one).
        per(ATTEMPTS_PER_SPILL_FILE_BEFORE)
    } else {
        // Half the limit is left to everything else: connections and listings take
        // descriptors this cannot count (review r56h F1).
        let share = (nofile / 2).saturating_sub(FDS_KEPT_FREE + MAX_OPEN_OBJECTS as u64);
        per(ATTEMPTS_PER_SPILL_FILE).min(share.max(per(ATTEMPTS_PER_SPILL_FILE_BEFORE)))
    };
    files.clamp(MIN_SPILL_FILES as u64, MAX_SPILL_FILES as u64) as usize
}

impl TaskStore {
    pub(crate) fn new(keep_logs_of: Option<CompactId>) -> TaskStore {
        TaskStore {
            symbols: Symbols::default(),
            map: IdMap::default(),
            spill: None,
            errors: ErrorBudget::default(),
            keep_logs_of,
            spilled_attempts: 0,
            spent: Vec::new(),
        }
    }

    /// Folds one delta. `growth` estimates how many times more input is still to come than
    /// was read (it sizes the spill files when the map overflows).
    /// The delta's box is kept for the reader to give back to the decoders
    /// ([`TaskStore::spent`]).
    pub(super) fn add(&mut self, mut d: Box<TaskDelta>, growth: f64) -> std::io::Result<()> {
        let Some(key) = d.key else {
            return Ok(());
        };
        let keep_log = self.keep_logs_of.is_some_and(|id| id == key.id);
        let state = TaskState::from_delta(&mut d, &mut self.symbols, keep_log, &mut self.errors);
        if self.spent.len() < MAX_SPENT_DELTAS {
            d.release();
            self.spent.push(d);
        }
        if let Some(spill) = &mut self.spill {
            self.spilled_attempts += 1;
            return spill.write(&key, &state);
        }
        match self.map.get_mut(&key) {
            Some(cur) => cur.merge(state, &self.symbols),
            None => {
                self.map.insert(key, state);
                if self.map.len() >= MAX_ATTEMPTS_IN_MEMORY {
                    let expected = self.map.len() as f64 * (1.0 + growth.max(0.0));
                    let files = spill_files(expected, open_file_limit(), sessions_read_at_once());
                    let mut spill = SpillFiles::create(files)?;
                    for (k, s) in std::mem::take(&mut self.map) {
                        spill.write(&k, &s)?;
                    }
                    self.spill = Some(spill);
                }
            }
        }
        Ok(())
    }

    /// The task whose log offsets are kept (`--logs`).
    pub(super) fn logs_of(&self) -> Option<CompactId> {
        self.keep_logs_of
    }

    /// Error messages shortened because too many bytes of them were held.
    pub(super) fn errors_shortened(&self) -> u64 {
        self.errors.shortened
    }

    /// Calls `visit` once per attempt with its merged state (in no particular order).
    pub(super) fn drain(
        mut self,
        mut visit: impl FnMut(&AttemptKey, &TaskState, &Symbols),
    ) -> std::io::Result<()> {
        self.symbols.settle_sole_node();
        match self.spill.take() {
            None => {
                for (k, s) in &self.map {
                    visit(k, s, &self.symbols);
                }
            }
            Some(spill) => {
                // Each file (already unlinked: closed, it is gone) is read into a table of
                // its own, sized for every record of the file a new attempt (up to four
                // times the attempts aimed at per file: records of one attempt many times
                // over must not size a table) so that it seldom grows while it is filled,
                // and small enough ([`ATTEMPTS_PER_SPILL_FILE`]) to stay in the CPU's caches.
                for (file, records) in spill.finish()? {
                    let room = records.min(4 * ATTEMPTS_PER_SPILL_FILE) as usize;
                    let mut map: IdMap<AttemptKey, TaskState> =
                        IdMap::with_capacity_and_hasher(room, Default::default());
                    let mut reader = BufReader::with_capacity(SPILL_BUFFER_BYTES, file);
                    while let Some((k, s)) = read_record(&mut reader)? {
                        match map.get_mut(&k) {
                            Some(cur) => cur.merge(s, &self.symbols),
                            None => {
                                map.insert(k, s);
                            }
                        }
                    }
                    drop(reader);
                    for (k, s) in &map {
                        visit(k, s, &self.symbols);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::spill::{read_record, write_record};
    use super::*;

    /// The hand-written base64 reading of ids gives what the `base64` engine gives, on
    /// strings of its alphabet and padding (and a few others), whenever it answers.
    #[test]
    fn plain_base64_ids_read_as_the_engine_reads_them() {
        use base64::Engine as _;
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as usize
        };
        let mut answered = 0;
        for _ in 0..50_000 {
            let len = 4 * (next() % 12);
            let mut s: Vec<u8> = (0..len).map(|_| ALPHABET[next() % 64]).collect();
            // Padding (sometimes too much), and sometimes a stray byte or a cut.
            for p in 0..next() % 4 {
                if let Some(c) = s.len().checked_sub(p + 1).and_then(|i| s.get_mut(i)) {
                    *c = b'=';
                }
            }
            match next() % 6 {
                0 if !s.is_empty() => {
                    let at = next() % s.len();
                    s[at] = b"=-_. A"[next() % 6];
                }
                1 => {
                    s.pop();
                }
                _ => {}
            }
            let mut bytes = [0u8; 31];
            let engine = base64::engine::general_purpose::STANDARD.decode_slice(&s, &mut bytes);
            if let Some(id) = CompactId::from_plain_base64(&s) {
                answered += 1;
                let n = engine.unwrap_or_else(|e| panic!("{e}: {s:?}"));
                assert_eq!((id.len as usize, &id.bytes[..]), (n, &bytes[..]), "{s:?}");
            }
        }
        for id in [
            "AQID",
            "AgAAAA==",
            "uc3KUwAAAAAJAAAAAAAAAA==",
            "OuZZXCSK197xxyBr/VCxjoYNXrFn5OBoxkgjpQ==",
        ] {
            let mut bytes = [0u8; 31];
            let n = base64::engine::general_purpose::STANDARD
                .decode_slice(id, &mut bytes)
                .unwrap();
            let got = CompactId::from_plain_base64(id.as_bytes()).unwrap();
            assert_eq!((got.len as usize, got.bytes), (n, bytes));
        }
        assert!(answered > 1000, "{answered}");
    }

    fn t(state: &str, ns: i64) -> Transition {
        Transition {
            state: state.to_string().into(),
            time_ns: Some(ns),
        }
    }

    fn delta(id: &str, transitions: Vec<Transition>) -> TaskDelta {
        // (A delta without `exec` is a known attempt.)
        TaskDelta {
            key: Some(AttemptKey {
                id: CompactId::parse(id),
                attempt: 0,
            }),
            transitions: transitions.into_iter().collect(),
            ..TaskDelta::default()
        }
    }

    #[test]
    fn ids_are_compact_and_print_as_hex() {
        let id = CompactId::parse("yO9FzNARJXH///////////////8BAAAA");
        assert_eq!(id.hex(), "c8ef45ccd0112571ffffffffffffffffffffffff01000000");
        assert_eq!(CompactId::from_hex(&id.hex()), Some(id));
        assert!(CompactId::parse("../etc").hex().starts_with("invalid-"));
        assert_eq!(CompactId::from_hex("zz"), None);
    }

    /// Three events of one attempt that disagree on everything give one state whatever the
    /// order they are merged in (review r56b D1: the error message read last won).
    #[test]
    fn conflicting_events_merge_to_one_state_in_any_order() {
        let mut symbols = Symbols::default();
        let mut budget = ErrorBudget::default();
        let mut states = Vec::new();
        for (i, (node, worker, message, ns)) in [
            ("AQID", "BAUG", "version 2", 9),
            ("AAAA", "BwgJ", "version 0", 9),
            ("AQID", "BwgJ", "version 1", 7),
        ]
        .into_iter()
        .enumerate()
        {
            let mut d = delta("AQID", vec![t("FAILED", ns)]);
            d.name = Some(format!("name-{i}").as_str().into());
            d.node = Some(CompactId::parse(node));
            d.worker = Some(CompactId::parse(worker));
            d.pid = Some(100 - i as i64);
            d.exec = Some((ns, ns + 1, Some(CompactId::parse(worker))));
            d.error = Some((
                Some("TASK_EXECUTION_EXCEPTION".into()),
                Some(message.into()),
            ));
            states.push(TaskState::from_delta(
                &mut d,
                &mut symbols,
                false,
                &mut budget,
            ));
        }
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        let merged: Vec<String> = orders
            .iter()
            .map(|order| {
                let mut s = states[order[0]].clone();
                for &i in &order[1..] {
                    s.merge(states[i].clone(), &symbols);
                }
                format!("{s:?}")
            })
            .collect();
        assert!(merged.iter().all(|m| *m == merged[0]), "{merged:#?}");
        assert!(merged[0].contains("version 0"), "{}", merged[0]);
    }

    #[test]
    fn merge_is_order_free_and_survives_the_spill_format() {
        let mut symbols = Symbols::default();
        let mut budget = ErrorBudget::default();
        let mut a = delta("AQID", vec![t("RUNNING", 5), t("PENDING_ARGS_AVAIL", 1)]);
        a.name = Some("f".into());
        let mut b = delta("AQID", vec![t("FAILED", 9)]);
        b.error = Some((Some("TASK_EXECUTION_EXCEPTION".into()), Some("boom".into())));
        b.log = Some(Box::new(LogInfo {
            stderr_file: Some("worker-ab-01000000-3.err".into()),
            stderr: (Some(0), Some(79)),
            ..LogInfo::default()
        }));
        let sa = TaskState::from_delta(&mut a, &mut symbols, true, &mut budget);
        let sb = TaskState::from_delta(&mut b, &mut symbols, true, &mut budget);
        let mut ab = sa.clone();
        ab.merge(sb.clone(), &symbols);
        let mut ba = sb.clone();
        ba.merge(sa.clone(), &symbols);
        for s in [&ab, &ba] {
            assert_eq!(s.state(&symbols), "FAILED");
            assert_eq!((s.running_ns, s.failed_ns), (5, 9));
            assert_eq!(symbols.get(s.name), Some("f"));
        }
        let key = AttemptKey {
            id: CompactId::parse("AQID"),
            attempt: 3,
        };
        let mut buf = Vec::new();
        write_record(&mut buf, &key, &ab).unwrap();
        write_record(&mut buf, &key, &TaskState::default()).unwrap();
        let mut r = &buf[..];
        assert_eq!(read_record(&mut r).unwrap(), Some((key, ab)));
        assert_eq!(
            read_record(&mut r).unwrap(),
            Some((key, TaskState::default()))
        );
        assert_eq!(read_record(&mut r).unwrap(), None);
    }

    #[test]
    fn spill_files_stay_within_the_open_file_limit() {
        // 1,000,000 events' attempts: 35 files when the limit allows (32,768 attempts each).
        assert_eq!(spill_files(743_000.0, 1024, 1), 35);
        // `ulimit -n 64`: half of it is left to everything else, and of the rest the objects
        // and the spare files take theirs: 100,000 attempts per file (review r56a D1).
        assert_eq!(spill_files(743_000.0, 64, 1), 12);
        assert_eq!(spill_files(743_000.0, 128, 1), 32);
        // Several sessions at once (serve): the count 100,000 attempts per file gave, which
        // fitted before, whatever the limit (reviews r56e F1, r56h F1, r56i N1).
        assert_eq!(spill_files(743_000.0, 128, 3), 12);
        assert_eq!(spill_files(743_000.0, 256, 3), 12);
        assert_eq!(spill_files(743_000.0, 20_000, 3), 12);
        // Never fewer than the minimum, nor more than the maximum.
        assert_eq!(spill_files(743_000.0, 20, 1), 12);
        assert_eq!(spill_files(100_000.0, 20, 1), MIN_SPILL_FILES);
        assert_eq!(spill_files(200_000.0, 1024, 1), 10);
        assert_eq!(spill_files(1e12, u64::MAX, 1), MAX_SPILL_FILES);
        assert_eq!(spill_files(0.0, 1024, 0), MIN_SPILL_FILES);
    }

    #[test]
    fn a_spilled_store_reports_what_a_memory_store_does() {
        let mut store = TaskStore::new(None);
        let n = MAX_ATTEMPTS_IN_MEMORY as u32 + 1000;
        for i in 0..n {
            let id = format!("{i:08x}");
            let mut d = delta(&id, vec![t("RUNNING", 1)]);
            d.key = Some(AttemptKey {
                id: CompactId::from_hex(&id).unwrap(),
                attempt: 0,
            });
            store.add(Box::new(d.clone()), 0.0).unwrap();
            if i % 2 == 0 {
                d.transitions = [t("FINISHED", 2)].into_iter().collect();
                store.add(Box::new(d), 0.0).unwrap();
            }
        }
        assert!(store.spill.is_some());
        let (mut total, mut finished) = (0u32, 0u32);
        store
            .drain(|_, s, symbols| {
                total += 1;
                finished += u32::from(s.state(symbols) == "FINISHED");
            })
            .unwrap();
        assert_eq!((total, finished), (n, n.div_ceil(2)));
    }
}
