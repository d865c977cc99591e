//! Which Ray node this is, so logs land under `P/<session>/<node-hex>/logs/`, and which node
//! each log file belongs to when more than one raylet wrote into the same session.
//!
//! A raylet names its own id in its output ("Setting node ID node_id=<hex>"). Ray gives a
//! raylet started into a session folder that already has a `raylet.out` the next free name,
//! `raylet.1.out`, `raylet.2.out`, … (a worker's Ray container restarted with the emptyDir
//! kept, or two raylets sharing one `/tmp/ray`). So the session's node is the one named by the
//! newest of those, by Ray's own numbering; a newest one that has not named itself yet and is
//! younger than [`RAYLET_START_WAIT`] means a raylet is starting, and logs wait for it rather
//! than go under the previous raylet's id.
//!
//! In order: `--node-id`; the newest `raylet[.N].out` (the last id line wins, its rotated
//! backups `raylet[.N].out.K` are read when the live file no longer has the line);
//! `<ray tmp>/raylet_node_id` (KubeRay's old postStart hook); the node id carried by this
//! node's events; and, as a last resort like KubeRay, the dashboard's node list matched by pod
//! IP (wired in by the caller).
//!
//! A newest raylet output that has rotated (`raylet.out.1` exists) is not starting: a busy
//! raylet's id line can be rotated out of every backup, and then the fallbacks below decide,
//! rather than logs waiting forever.
//!
//! A file whose writer can be told is filed under that writer's node, whatever the newest
//! raylet is ([`NodeIdResolver::node_of_log`]): `raylet[.N].out|err` and the agents Ray starts
//! with that raylet and numbers alike (`dashboard_agent[.N].log`, `runtime_env_agent[.N].log`)
//! under the id of `raylet[.N].out`; a core worker's log (`<lang>-core-worker-<worker>_<pid>.log`)
//! under the node of its "Initializing worker" line, read from its oldest rotated backup once
//! Ray rotated it; a worker's output (`worker-<worker>-<job>-<pid>.out`) under the node of the
//! core worker log with the same worker id and pid. A core worker log whose line has not come
//! yet (or a worker output without its core worker log yet) is [`LogNode::Wait`], bounded by
//! [`WORKER_HEAD_BYTES`] and [`WORKER_START_WAIT`] (whichever comes first, also for a file that
//! never stops growing), so a starting worker never leaves a copy under another node; a
//! worker's file whose node cannot be told within that bound is [`LogNode::Unnamed`].
//! Everything else (GCS, monitor, dashboard: files that cannot name their writer) is
//! [`LogNode::Session`], filed under the node of the session's first raylet
//! ([`NodeIdResolver::first_raylet`]), which the log shipper pins for the whole session.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::future::BoxFuture;

use crate::contract::id_to_hex;

/// The node id seen in this node's events, shared with the ingest side.
pub type EventNodeHint = Arc<Mutex<Option<String>>>;

/// The answer of a remote lookup: `Ok(None)` when the source answered but knows no id yet.
pub type RemoteAnswer = Result<Option<String>, String>;

/// The last resort for the node id, wired in by the app: a source outside this node (the
/// head's dashboard, asked for the node at this pod's IP). Kept as a function so this module
/// needs nothing of the dashboard.
#[derive(Clone)]
pub struct RemoteNodeLookup {
    source: String,
    lookup: Arc<dyn Fn() -> BoxFuture<'static, RemoteAnswer> + Send + Sync>,
}

impl RemoteNodeLookup {
    /// `source` names it in logs (e.g. "the dashboard's node list, pod IP 10.0.0.7").
    pub fn new(
        source: impl Into<String>,
        lookup: impl Fn() -> BoxFuture<'static, RemoteAnswer> + Send + Sync + 'static,
    ) -> RemoteNodeLookup {
        RemoteNodeLookup {
            source: source.into(),
            lookup: Arc::new(lookup),
        }
    }

    /// Asks once.
    pub fn lookup(&self) -> BoxFuture<'static, RemoteAnswer> {
        (self.lookup)()
    }

    /// What it asks.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// Marker of the raylet line that names its own node id (Ray 2.60 `main.cc`).
const SETTING_NODE_ID: &[u8] = b"Setting node ID node_id=";
/// Older raylets: "Raylet of id, <hex> started."
const RAYLET_OF_ID: &[u8] = b"Raylet of id, ";
/// A core worker's first lines: "Initializing worker at address: <ip>:<port> worker_id=<hex>
/// node_id=<hex>" (older Ray: "…, worker ID <hex>, raylet <hex>").
const INITIALIZING_WORKER: &[u8] = b"Initializing worker at address";
const NODE_ID_FIELD: &[u8] = b"node_id=";
const OLD_RAYLET_FIELD: &[u8] = b", raylet ";

/// Most `raylet[.N].out` names probed per session. Ray takes the first free index, so the
/// names have no gaps and probing stops at the first missing one; the bound caps what a
/// hostile tree can cost per round.
const MAX_RAYLET_FILES: usize = 1024;
/// Most rotated backups (`raylet.out.1` …, `<core worker log>.1` …) read for the id line
/// when the live file lost it; Ray keeps 5 by default.
const MAX_BACKUPS: usize = 64;
/// A newest `raylet[.N].out` without its id line and modified this recently belongs to a
/// raylet that is starting (it names itself within its first milliseconds): logs wait for
/// it. Older than this, it is a raylet that died before naming itself, and is passed over.
pub const RAYLET_START_WAIT: Duration = Duration::from_secs(30);
/// Bytes read from the start of a core worker log for its "Initializing worker" line, which
/// is among its first lines; a file past this size without it is not read again.
const WORKER_HEAD_BYTES: u64 = 64 * 1024;
/// How long a core worker log without its "Initializing worker" line (or a worker's output
/// without a core worker log) is held: at most this long after this process first saw it,
/// and no longer once it has been quiet this long. A worker names its node within seconds of
/// starting; one that has not by then crashed first or logs to stderr only
/// (`RAY_LOG_TO_STDERR=1`), and its files are [`LogNode::Unnamed`]. With
/// [`WORKER_HEAD_BYTES`] this is the README's "at most 64 KiB or 30 s".
pub const WORKER_START_WAIT: Duration = Duration::from_secs(30);
/// Read buffer of the incremental raylet scan.
const SCAN_BUF: usize = 256 * 1024;
/// Core worker logs whose node is remembered (one per worker a node ever started); past
/// this they are forgotten and read again as needed (a cost, never a wrong answer). Raylet
/// scans are few (one per raylet start and rotated backup) and are kept.
const MAX_REMEMBERED_WORKERS: usize = 100_000;

/// Per-file scan state of a raylet output, so each round reads only what was appended.
#[derive(Debug, Default, Clone)]
struct RayletScan {
    offset: u64,
    found: Option<String>,
}

/// What the raylet outputs of a session say about its node.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Newest {
    /// The newest raylet that named itself.
    Found(String),
    /// The newest raylet output is young and has no id yet: wait.
    Starting,
    /// No raylet output names an id.
    Nothing,
}

/// What was read of the files of one or more sessions.
#[derive(Debug, Default)]
struct Memory {
    /// Raylet outputs (and their backups), by path.
    raylets: HashMap<PathBuf, RayletScan>,
    /// Core worker logs whose answer is final (found, or not within their first bytes).
    workers: HashMap<PathBuf, Option<String>>,
    /// When a held worker file was first seen (see [`WORKER_START_WAIT`]).
    held_since: HashMap<PathBuf, Instant>,
}

/// Resolves and remembers node ids per session.
///
/// Clones share what they have read of each file, so the log shipper and the export tailer
/// read it once between them.
#[derive(Debug, Clone)]
pub struct NodeIdResolver {
    configured: Option<String>,
    ray_tmp: PathBuf,
    events: EventNodeHint,
    memory: Arc<Mutex<Memory>>,
}

impl NodeIdResolver {
    /// A resolver; `configured` is `--node-id` in hex.
    pub fn new(configured: Option<String>, ray_tmp: PathBuf, events: EventNodeHint) -> Self {
        NodeIdResolver {
            configured,
            ray_tmp,
            events,
            memory: Arc::default(),
        }
    }

    /// The node id for logs of the session in `session_dir`, from local sources only.
    /// `None` also while the newest raylet is starting (see [`RAYLET_START_WAIT`]).
    pub fn resolve_local(&mut self, session_dir: &Path) -> Option<String> {
        if let Some(id) = &self.configured {
            return Some(id.clone());
        }
        match self.newest_raylet(&session_dir.join("logs")) {
            Newest::Found(id) => return Some(id),
            Newest::Starting => return None,
            // No raylet output names its node any more (rotated away): the fallbacks.
            Newest::Nothing => {}
        }
        if let Ok(text) = std::fs::read_to_string(self.ray_tmp.join("raylet_node_id")) {
            if let Some(id) = valid_hex_id(text.trim()) {
                return Some(id);
            }
        }
        self.events.lock().ok().and_then(|g| g.clone())
    }

    /// `--node-id`, when given.
    pub fn configured(&self) -> Option<&str> {
        self.configured.as_deref()
    }

    /// The node of the session's first raylet: the lowest-numbered `raylet[.N].out` (or its
    /// backups) that names its node, `--node-id` when given. The owner of the files no writer
    /// can be told for ([`LogNode::Session`]): on the head, the GCS, the monitor and the
    /// dashboard start with the first raylet. `None` while no raylet output names a node.
    pub fn first_raylet(&mut self, session_dir: &Path) -> Option<String> {
        if let Some(id) = &self.configured {
            return Some(id.clone());
        }
        let logs = session_dir.join("logs");
        for i in 0..MAX_RAYLET_FILES {
            let name = raylet_out_name(i);
            if !logs.join(&name).is_file() && i > 0 {
                break;
            }
            if let Some(id) = self.raylet_id(&logs, &name) {
                return Some(id);
            }
        }
        None
    }

    /// The node whose raylet wrote the log at `rel` (relative to the session's `logs/`, the
    /// live name for a rotated backup), when the file or its siblings tell; see [`LogNode`].
    /// `--node-id` wins over everything, as for the session.
    pub fn node_of_log(&mut self, session_dir: &Path, rel: &str) -> LogNode {
        match self.writer_of_log(session_dir, rel) {
            // One raylet: the session's node is the only writer there can be.
            LogNode::Wait | LogNode::Unnamed if !several_raylets(&session_dir.join("logs")) => {
                LogNode::Session
            }
            other => other,
        }
    }

    fn writer_of_log(&mut self, session_dir: &Path, rel: &str) -> LogNode {
        if self.configured.is_some() || rel.contains('/') {
            return LogNode::Session;
        }
        let logs = session_dir.join("logs");
        if let Some(out) = raylet_output_of(rel) {
            return self
                .raylet_id(&logs, &out)
                .map_or(LogNode::Session, LogNode::Writer);
        }
        if core_worker_log(rel).is_some() {
            return self.worker_node(&logs.join(rel));
        }
        let Some((worker, pid)) = worker_output(rel) else {
            return LogNode::Session;
        };
        let core = ["python", "java", "cpp"]
            .iter()
            .map(|lang| logs.join(format!("{lang}-core-worker-{worker}_{pid}.log")))
            .find(|p| p.is_file());
        match core {
            Some(p) => self.worker_node(&p),
            // Ray opens a worker's output before the worker writes its core worker log.
            None if self.still_held(&logs.join(rel)) => LogNode::Wait,
            None => LogNode::Unnamed,
        }
    }

    /// True while a worker file whose node is not known yet may still learn it: under
    /// [`WORKER_HEAD_BYTES`], changed within [`WORKER_START_WAIT`], and first seen less than
    /// [`WORKER_START_WAIT`] ago (a file that keeps growing is not held for ever).
    fn still_held(&mut self, path: &Path) -> bool {
        let small = std::fs::metadata(path).is_ok_and(|m| m.len() < WORKER_HEAD_BYTES);
        let first = *self
            .memory()
            .held_since
            .entry(path.to_path_buf())
            .or_insert_with(Instant::now);
        small && is_young(path, WORKER_START_WAIT) && first.elapsed() < WORKER_START_WAIT
    }

    /// [`LogNode`] of the core worker log at `path`: its "Initializing worker" line's node;
    /// while the line may still come, wait.
    fn worker_node(&mut self, path: &Path) -> LogNode {
        match self.worker_id(path) {
            WorkerHead::Found(id) => LogNode::Writer(id),
            WorkerHead::Never => LogNode::Unnamed,
            WorkerHead::NotYet if self.still_held(path) => LogNode::Wait,
            WorkerHead::NotYet => LogNode::Unnamed,
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        if m.workers.len() > MAX_REMEMBERED_WORKERS {
            m.workers.clear();
        }
        if m.held_since.len() > MAX_REMEMBERED_WORKERS {
            // Forgotten: a held file's clock starts again (held at most once more as long).
            m.held_since.clear();
        }
        m
    }

    /// The newest `raylet[.N].out` of `logs` that names a node, by Ray's numbering.
    fn newest_raylet(&mut self, logs: &Path) -> Newest {
        let mut names = Vec::new();
        for i in 0..MAX_RAYLET_FILES {
            let name = raylet_out_name(i);
            if logs.join(&name).is_file() {
                names.push(name);
            } else if i > 0 {
                break;
            }
        }
        for name in names.iter().rev() {
            if let Some(id) = self.raylet_id(logs, name) {
                return Newest::Found(id);
            }
            // A raylet that has rotated its output is long past starting: its id line was
            // rotated away, and a busy one keeps the file young.
            let rotated = logs.join(format!("{name}.1")).is_file();
            if !rotated && is_young(&logs.join(name), RAYLET_START_WAIT) {
                return Newest::Starting;
            }
            if rotated {
                // The newest raylet lost its id line: an older output's id would be another
                // raylet's, so the fallbacks decide.
                return Newest::Nothing;
            }
        }
        Newest::Nothing
    }

    /// The id named by `logs/<name>` (a raylet output), else by its rotated backups, newest
    /// backup first.
    fn raylet_id(&mut self, logs: &Path, name: &str) -> Option<String> {
        if let Some(id) = self.scan_raylet(&logs.join(name)) {
            return Some(id);
        }
        for k in 1..=MAX_BACKUPS {
            let backup = logs.join(format!("{name}.{k}"));
            if !backup.is_file() {
                break;
            }
            if let Some(id) = self.scan_raylet(&backup) {
                return Some(id);
            }
        }
        None
    }

    /// The id named by the last id line of the raylet output at `path`, read from where the
    /// last call stopped. What was found stays known when the file is rotated away.
    fn scan_raylet(&mut self, path: &Path) -> Option<String> {
        // Held while reading, so two clones never read the same bytes twice.
        let mut memory = self.memory();
        let scan = memory.raylets.entry(path.to_path_buf()).or_default();
        let Ok(mut f) = File::open(path) else {
            return scan.found.clone();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < scan.offset {
            // Truncated or replaced (rotation): start over.
            scan.offset = 0;
        }
        if f.seek(SeekFrom::Start(scan.offset)).is_err() {
            return scan.found.clone();
        }
        let mut buf = vec![0u8; SCAN_BUF];
        let mut carry: Vec<u8> = Vec::new();
        let mut pos = scan.offset;
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            carry.extend_from_slice(&buf[..n]);
            // Only complete lines are examined; the rest waits for the next round.
            let Some(last_nl) = carry.iter().rposition(|&c| c == b'\n') else {
                continue;
            };
            for line in carry[..last_nl].split(|&c| c == b'\n') {
                if let Some(id) = node_id_in_line(line) {
                    scan.found = Some(id);
                }
            }
            pos += last_nl as u64 + 1;
            carry.drain(..=last_nl);
        }
        scan.offset = pos;
        scan.found.clone()
    }

    /// The node named by the "Initializing worker" line among the first
    /// [`WORKER_HEAD_BYTES`] of the core worker log at `path`, or of its oldest rotated
    /// backup (`<path>.1` … `<path>.N`: Ray renames the file, so the line moves to the backups
    /// and ends in the oldest one).
    fn worker_id(&mut self, path: &Path) -> WorkerHead {
        if let Some(known) = self.memory().workers.get(path) {
            return known.clone().map_or(WorkerHead::Never, WorkerHead::Found);
        }
        let mut answer = read_worker_head(path);
        if !matches!(answer, WorkerHead::Found(_)) {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            for k in 1..=MAX_BACKUPS {
                let backup = path.with_file_name(format!("{name}.{k}"));
                if !backup.is_file() {
                    break;
                }
                if let WorkerHead::Found(id) = read_worker_head(&backup) {
                    answer = WorkerHead::Found(id);
                    break;
                }
                // A backup exists, so the live file is not the log's beginning any more.
                answer = WorkerHead::Never;
            }
        }
        // Final once found, or once the head of the log's beginning is full without it.
        match &answer {
            WorkerHead::Found(id) => {
                self.memory()
                    .workers
                    .insert(path.to_path_buf(), Some(id.clone()));
            }
            WorkerHead::Never => {
                self.memory().workers.insert(path.to_path_buf(), None);
            }
            WorkerHead::NotYet => {}
        }
        answer
    }
}

/// Where a log file goes, by its writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogNode {
    /// Under this node: the raylet (or the core worker) that wrote it named it.
    Writer(String),
    /// Under the session's owner, the node of its first raylet
    /// ([`NodeIdResolver::first_raylet`]): a file no writer can be told for (GCS, monitor,
    /// dashboard, `events/`, anything with `--node-id`), whichever raylets came later.
    Session,
    /// A worker's file (core worker log, or output without one) whose node was not told
    /// within [`WORKER_HEAD_BYTES`] or [`WORKER_START_WAIT`], in a session more than one
    /// raylet wrote into: the shipper files it under the best node it knows (the newest
    /// raylet's, the live one after a restart) and keeps it there.
    Unnamed,
    /// Not yet: a core worker log (or a worker's output) whose worker has not written its
    /// "Initializing worker" line yet, in a session more than one raylet wrote into (with one,
    /// the session's node is the only writer). Bounded by [`WORKER_HEAD_BYTES`] and
    /// [`WORKER_START_WAIT`]; then, and at the final flush, it is [`LogNode::Unnamed`].
    Wait,
}

/// What the head of a core worker log says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum WorkerHead {
    Found(String),
    /// Not in the first [`WORKER_HEAD_BYTES`], or the file is not the log's beginning.
    Never,
    /// Not yet, and the head is not full: the line may still come.
    NotYet,
}

/// Reads the first [`WORKER_HEAD_BYTES`] of a core worker log for its node.
fn read_worker_head(path: &Path) -> WorkerHead {
    let mut head = Vec::new();
    let Ok(f) = File::open(path) else {
        return WorkerHead::NotYet;
    };
    if f.take(WORKER_HEAD_BYTES).read_to_end(&mut head).is_err() {
        return WorkerHead::NotYet;
    }
    let complete = head.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
    let found = head[..complete]
        .split(|&c| c == b'\n')
        .find(|line| find_after(line, INITIALIZING_WORKER).is_some())
        .and_then(|line| {
            hex_id_after(line, NODE_ID_FIELD).or_else(|| hex_id_after(line, OLD_RAYLET_FIELD))
        });
    match found {
        Some(id) => WorkerHead::Found(id),
        None if head.len() as u64 >= WORKER_HEAD_BYTES => WorkerHead::Never,
        None => WorkerHead::NotYet,
    }
}

/// True when more than one raylet wrote into the session (`raylet.1.out` exists): only then
/// can a log go under the wrong node, so only then is a log held for its writer.
fn several_raylets(logs: &Path) -> bool {
    logs.join(raylet_out_name(1)).is_file()
}

/// True when `path` was modified within `wait` (or its time cannot be read).
fn is_young(path: &Path, wait: Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_none_or(|age| age < wait)
}

/// `raylet.out`, `raylet.1.out`, `raylet.2.out`, …: Ray's names for successive raylets.
fn raylet_out_name(i: usize) -> String {
    if i == 0 {
        "raylet.out".into()
    } else {
        format!("raylet.{i}.out")
    }
}

/// Processes Ray starts with each raylet, whose files get the raylet's `.N` (Ray's `node.py`
/// numbers them together, `unique=True`): `dashboard_agent.1.log` belongs to `raylet.1.out`.
const RAYLET_COMPANIONS: [&str; 3] = ["raylet", "dashboard_agent", "runtime_env_agent"];

/// For `raylet[.N].out|err` and its agents' `dashboard_agent[.N].log|out|err`,
/// `runtime_env_agent[.N].log|out|err`: the output `raylet[.N].out` that names their node.
fn raylet_output_of(name: &str) -> Option<String> {
    let stem = name
        .strip_suffix(".out")
        .or_else(|| name.strip_suffix(".err"))
        .or_else(|| {
            name.strip_suffix(".log")
                .filter(|s| !s.starts_with("raylet"))
        })?;
    let rest = RAYLET_COMPANIONS
        .iter()
        .find_map(|p| stem.strip_prefix(p))?;
    if rest.is_empty() {
        return Some("raylet.out".into());
    }
    let n = rest.strip_prefix('.')?;
    (!n.is_empty() && n.len() <= 6 && n.bytes().all(|c| c.is_ascii_digit()))
        .then(|| format!("raylet.{n}.out"))
}

/// `<lang>-core-worker-<worker hex>_<pid>.log` (or `-core-driver-`): (worker, pid).
fn core_worker_log(name: &str) -> Option<(&str, &str)> {
    let stem = name.strip_suffix(".log")?;
    let rest = ["-core-worker-", "-core-driver-"]
        .iter()
        .find_map(|m| stem.find(m).map(|i| &stem[i + m.len()..]))?;
    let (worker, pid) = rest.split_once('_')?;
    (is_hex(worker) && is_digits(pid)).then_some((worker, pid))
}

/// `worker-<worker hex>-<job hex>-<pid>.out|err`: (worker, pid).
fn worker_output(name: &str) -> Option<(&str, &str)> {
    let stem = name
        .strip_suffix(".out")
        .or_else(|| name.strip_suffix(".err"))?
        .strip_prefix("worker-")?;
    let mut parts = stem.split('-');
    let (worker, job, pid) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && is_hex(worker) && is_hex(job) && is_digits(pid))
        .then_some((worker, pid))
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.len() <= 10 && s.bytes().all(|c| c.is_ascii_digit())
}

/// Where `needle` ends in `line`.
fn find_after(line: &[u8], needle: &[u8]) -> Option<usize> {
    line.windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + needle.len())
}

/// The 56-hex id right after `marker` in `line`.
fn hex_id_after(line: &[u8], marker: &[u8]) -> Option<String> {
    let rest = &line[find_after(line, marker)?..];
    let end = rest
        .iter()
        .position(|c| !c.is_ascii_hexdigit())
        .unwrap_or(rest.len());
    valid_hex_id(std::str::from_utf8(&rest[..end]).ok()?)
}

fn node_id_in_line(line: &[u8]) -> Option<String> {
    hex_id_after(line, SETTING_NODE_ID).or_else(|| hex_id_after(line, RAYLET_OF_ID))
}

/// A 56-hex-digit (28-byte) Ray node id, lower-cased.
fn valid_hex_id(s: &str) -> Option<String> {
    if s.len() == 56 && s.bytes().all(|c| c.is_ascii_hexdigit()) {
        id_to_hex(s).ok().map(|h| h.as_str().to_string())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const A: &str = "2d184b8cc7e6aae25636a1bf12eada74ea0d2f00375e110222b14708";
    const B: &str = "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5";

    #[test]
    fn raylet_out_last_setting_line_wins_and_is_read_incrementally() {
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("session_x");
        std::fs::create_dir_all(session.join("logs")).unwrap();
        let hint: EventNodeHint = Arc::new(Mutex::new(Some(B.to_string())));
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), hint);
        // Nothing local yet: the events' node id.
        assert_eq!(r.resolve_local(&session).as_deref(), Some(B));
        let mut f = std::fs::File::create(session.join("logs/raylet.out")).unwrap();
        writeln!(
            f,
            "[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={}",
            A.to_uppercase()
        )
        .unwrap();
        writeln!(
            f,
            "[..] (raylet) accessor.cc:475: Received address for node, IsAlive = 1 node_id={B}"
        )
        .unwrap();
        write!(f, "[..] (raylet) main.cc:711: Setting node ID node_id={B}").unwrap(); // incomplete line
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
        writeln!(f).unwrap();
        // A clone (the other reader of the same node) shares what was read.
        let mut other = r.clone();
        assert_eq!(other.resolve_local(&session).as_deref(), Some(B));
        let out = session.join("logs/raylet.out");
        let offset = |r: &NodeIdResolver| r.memory.lock().unwrap().raylets[&out].offset;
        assert_eq!(
            offset(&r),
            std::fs::metadata(session.join("logs/raylet.out"))
                .unwrap()
                .len()
        );
        writeln!(f, "[..] (raylet) main.cc:711: Setting node ID node_id={A}").unwrap();
        assert_eq!(other.resolve_local(&session).as_deref(), Some(A));
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
        assert_eq!(offset(&r), offset(&other));
        let mut cfg =
            NodeIdResolver::new(Some("ab".into()), tmp.path().to_path_buf(), Arc::default());
        assert_eq!(cfg.resolve_local(&session).as_deref(), Some("ab"));
    }

    #[test]
    fn old_raylet_line_and_node_id_file() {
        assert_eq!(
            node_id_in_line(
                format!("(raylet) node_manager.cc:355: Raylet of id, {A} started.").as_bytes()
            )
            .as_deref(),
            Some(A)
        );
        assert_eq!(node_id_in_line(b"Setting node ID node_id=../../etc"), None);
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("raylet_node_id"), format!("{A}\n")).unwrap();
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), Arc::default());
        assert_eq!(
            r.resolve_local(&tmp.path().join("session_y")).as_deref(),
            Some(A)
        );
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn setting(node: &str) -> String {
        format!("[2026-11-22 02:56:15,477 I 1 1] (raylet) main.cc:711: Setting node ID node_id={node}\n")
    }

    /// Ages a file past the raylet start wait.
    fn age(path: &Path) {
        let old = SystemTime::now() - RAYLET_START_WAIT - Duration::from_secs(5);
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }

    #[test]
    fn newest_raylet_by_ray_numbering_and_each_log_under_its_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("session_x");
        let logs = session.join("logs");
        let hint: EventNodeHint = Arc::new(Mutex::new(Some(A.to_string())));
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), hint);
        write(&logs.join("raylet.out"), &setting(A));
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
        // A second raylet starts into the same session: not named yet, so logs wait.
        write(&logs.join("raylet.1.out"), "[..] (raylet) starting\n");
        assert_eq!(r.resolve_local(&session), None);
        // One that died before naming itself is passed over once old.
        age(&logs.join("raylet.1.out"));
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
        write(&logs.join("raylet.2.out"), &setting(B));
        assert_eq!(r.resolve_local(&session).as_deref(), Some(B));
        assert_eq!(
            r.node_of_log(&session, "raylet.out"),
            LogNode::Writer(A.into())
        );
        assert_eq!(
            r.node_of_log(&session, "raylet.err"),
            LogNode::Writer(A.into())
        );
        assert_eq!(
            r.node_of_log(&session, "raylet.2.err"),
            LogNode::Writer(B.into())
        );
        assert_eq!(r.node_of_log(&session, "raylet.1.out"), LogNode::Session);

        let w_a = "ab".repeat(28);
        let w_b = "cd".repeat(28);
        write(
            &logs.join(format!("python-core-worker-{w_a}_101.log")),
            &format!("[..] core_worker.cc:1: Initializing worker at address: 10.0.0.1:1 worker_id={w_a} node_id={A}\n"),
        );
        write(
            &logs.join(format!("python-core-worker-{w_b}_202.log")),
            &format!("[..] core_worker.cc:1: Initializing worker at address: 10.0.0.1:2, worker ID {w_b}, raylet {B}\n"),
        );
        let out_a = format!("worker-{w_a}-01000000-101.out");
        let err_b = format!("worker-{w_b}-ffffffff-202.err");
        write(&logs.join(&out_a), "hello\n");
        write(&logs.join(&err_b), "oops\n");
        assert_eq!(r.node_of_log(&session, &out_a), LogNode::Writer(A.into()));
        assert_eq!(r.node_of_log(&session, &err_b), LogNode::Writer(B.into()));
        assert_eq!(
            r.node_of_log(&session, &format!("python-core-worker-{w_b}_202.log")),
            LogNode::Writer(B.into())
        );
        // No core worker log of that pid: held while young, then unnamed (the shipper's
        // best node).
        let orphan = format!("worker-{w_a}-01000000-7.out");
        write(&logs.join(&orphan), "x\n");
        assert_eq!(r.node_of_log(&session, &orphan), LogNode::Wait);
        age(&logs.join(&orphan));
        assert_eq!(r.node_of_log(&session, &orphan), LogNode::Unnamed);
        // One that keeps growing is held only until its first 64 KiB are written.
        let busy = format!("worker-{w_a}-01000000-8.out");
        write(&logs.join(&busy), "y\n");
        assert_eq!(r.node_of_log(&session, &busy), LogNode::Wait);
        write(&logs.join(&busy), &"y".repeat(WORKER_HEAD_BYTES as usize));
        assert_eq!(r.node_of_log(&session, &busy), LogNode::Unnamed);
        // Or until it was first seen WORKER_START_WAIT ago, however small and busy.
        let slow = format!("worker-{w_a}-01000000-9.out");
        write(&logs.join(&slow), "z\n");
        assert_eq!(r.node_of_log(&session, &slow), LogNode::Wait);
        r.memory().held_since.insert(
            logs.join(&slow),
            Instant::now().checked_sub(WORKER_START_WAIT).unwrap(),
        );
        assert_eq!(r.node_of_log(&session, &slow), LogNode::Unnamed);
        // The session's first raylet: raylet.out's node, whatever came later.
        assert_eq!(r.first_raylet(&session).as_deref(), Some(A));
        for other in ["gcs_server.out", "events/event_GCS.log", "log_monitor.log"] {
            assert_eq!(r.node_of_log(&session, other), LogNode::Session, "{other}");
        }
        // --node-id wins over everything.
        let mut cfg =
            NodeIdResolver::new(Some("ab".into()), tmp.path().to_path_buf(), Arc::default());
        assert_eq!(cfg.node_of_log(&session, "raylet.out"), LogNode::Session);
    }

    #[test]
    fn a_rotated_raylet_output_keeps_its_id_through_the_backups() {
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("session_y");
        let logs = session.join("logs");
        write(&logs.join("raylet.out.1"), &setting(A));
        write(&logs.join("raylet.out"), "[..] later lines\n");
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), Arc::default());
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
    }

    #[test]
    fn agents_follow_their_raylets_number_and_worker_ids_come_from_backups() {
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("session_z");
        let logs = session.join("logs");
        write(&logs.join("raylet.out"), &setting(A));
        write(&logs.join("raylet.1.out"), &setting(B));
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), Arc::default());
        for (name, node) in [
            ("dashboard_agent.log", A),
            ("runtime_env_agent.log", A),
            ("dashboard_agent.1.log", B),
            ("runtime_env_agent.1.err", B),
        ] {
            assert_eq!(
                r.node_of_log(&session, name),
                LogNode::Writer(node.into()),
                "{name}"
            );
        }
        let w = "ef".repeat(28);
        let cw = format!("python-core-worker-{w}_9.log");
        write(
            &logs.join(format!("{cw}.2")),
            &format!("[..] Initializing worker at address: 10.0.0.1:1 worker_id={w} node_id={A}\n"),
        );
        write(&logs.join(format!("{cw}.1")), "[..] middle\n");
        write(&logs.join(&cw), "[..] later\n");
        assert_eq!(r.node_of_log(&session, &cw), LogNode::Writer(A.into()));
        // A worker still starting: held until its line comes.
        let slow = format!("python-core-worker-{}_10.log", "12".repeat(28));
        write(&logs.join(&slow), "[..] Constructing CoreWorkerProcess\n");
        assert_eq!(r.node_of_log(&session, &slow), LogNode::Wait);
        write(
            &logs.join(&slow),
            &format!("[..] Constructing\n[..] Initializing worker at address: 1 node_id={A}\n"),
        );
        assert_eq!(r.node_of_log(&session, &slow), LogNode::Writer(A.into()));
    }

    #[test]
    fn a_busy_raylet_whose_id_rotated_away_uses_the_fallbacks() {
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("session_w");
        let logs = session.join("logs");
        write(&logs.join("raylet.out"), "[..] busy\n");
        write(&logs.join("raylet.out.1"), "[..] busy\n");
        let hint: EventNodeHint = Arc::new(Mutex::new(Some(B.to_string())));
        let mut r = NodeIdResolver::new(None, tmp.path().to_path_buf(), hint);
        assert_eq!(r.resolve_local(&session).as_deref(), Some(B));
        std::fs::write(tmp.path().join("raylet_node_id"), format!("{A}\n")).unwrap();
        assert_eq!(r.resolve_local(&session).as_deref(), Some(A));
    }

    #[test]
    fn names() {
        assert_eq!(
            raylet_output_of("raylet.err").as_deref(),
            Some("raylet.out")
        );
        assert_eq!(
            raylet_output_of("raylet.12.out").as_deref(),
            Some("raylet.12.out")
        );
        assert_eq!(raylet_output_of("raylet.x.out"), None);
        assert_eq!(raylet_output_of("raylet.log"), None);
        assert_eq!(raylet_output_of("raylet_.out"), None);
        assert_eq!(
            core_worker_log("java-core-driver-0a_5.log"),
            Some(("0a", "5"))
        );
        assert_eq!(core_worker_log("python-core-worker-0a_x.log"), None);
        assert_eq!(worker_output("worker-0a-01000000-5.out"), Some(("0a", "5")));
        assert_eq!(worker_output("worker-0a-01000000-5-6.out"), None);
        assert_eq!(worker_output("worker-../x-01-5.out"), None);
    }
}
