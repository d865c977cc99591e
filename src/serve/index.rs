//! A session's compact in-memory index: what the task routes answer from.
//!
//! It is built by the reader's streaming fold ([`crate::reader::session_facts`]: bounded
//! parallel reads, bounded open files, big sessions spilled to `TMPDIR`), which lends each
//! task attempt once; the index keeps of it one fixed-size [`TaskRecord`] (the task id in
//! binary, strings as indexes into one table of distinct texts, times as integers) and
//! nothing else, so its memory is about [`RECORD_BYTES`] per attempt plus the distinct
//! strings, whatever the events said. Records are sorted once by (task id, attempt), the
//! order of KubeRay's and Ray's list, so a list answer walks them in order and stops at its
//! limit.
//!
//! What an attempt record does not hold (and the routes therefore do not answer): the
//! parent task, the language, the runtime env, the placement group, the log offsets, the
//! error message, the resources, every state transition (only the first RUNNING, the first
//! FAILED and the latest are kept), and profile events other than the task's execution.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::reader::{SessionFacts, TaskView};

/// No string.
const NONE: u32 = u32::MAX;
/// No time.
pub const NO_TIME: i64 = i64::MIN;

/// One task attempt (112 bytes).
#[derive(Debug, Clone)]
pub struct TaskRecord {
    /// The task id's bytes (Ray's are at most 28), and its length with the high bit set for
    /// a text that was not an id and is held as its hash.
    id: [u8; 31],
    id_len: u8,
    pub attempt: i32,
    pub state: u32,
    pub name: u32,
    pub task_type: u32,
    pub job: u32,
    pub node: u32,
    pub worker: u32,
    pub error_type: u32,
    /// 0: unknown.
    pub pid: u32,
    /// Unix nanoseconds, [`NO_TIME`] when unknown.
    pub running_ns: i64,
    pub failed_ns: i64,
    pub latest_ns: i64,
    pub exec_start_ns: i64,
    pub exec_end_ns: i64,
}

/// The size of a record, which the cache counts per attempt.
pub const RECORD_BYTES: usize = std::mem::size_of::<TaskRecord>();

const HASHED: u8 = 0x80;
/// Ray's id of an actor is bytes 8..24 of its tasks' ids; 12 bytes of `ff` there: no actor.
const ACTOR_ID_RANGE: std::ops::Range<usize> = 8..24;
const TASK_ID_BYTES: usize = 24;

impl TaskRecord {
    fn id_bytes(&self) -> &[u8] {
        &self.id[..usize::from(self.id_len & !HASHED).min(31)]
    }

    /// The sort key: ids that were ids first, by bytes (lower-case hex sorts the same),
    /// then those held as hashes (`invalid-…`), then the attempt.
    fn order(&self) -> (bool, &[u8], i32) {
        (self.id_len & HASHED != 0, self.id_bytes(), self.attempt)
    }

    /// Lower-case hex, `invalid-<hash>` for a text that was not an id.
    pub fn task_id(&self) -> String {
        let mut s = String::with_capacity(2 * self.id_bytes().len() + 8);
        if self.id_len & HASHED != 0 {
            s.push_str("invalid-");
        }
        push_hex(&mut s, self.id_bytes());
        s
    }

    /// True when `id` (bytes of an id given in hex) is this task's.
    fn has_id(&self, id: &[u8]) -> bool {
        self.id_len & HASHED == 0 && self.id_bytes() == id
    }

    /// The actor of an actor task or actor creation task, from its id as Ray builds it.
    pub fn actor_id(&self, index: &SessionIndex) -> Option<String> {
        let t = index.text(self.task_type)?;
        if t != "ACTOR_TASK" && t != "ACTOR_CREATION_TASK" {
            return None;
        }
        let b = self.id_bytes();
        if self.id_len & HASHED != 0 || b.len() != TASK_ID_BYTES {
            return None;
        }
        let actor = &b[ACTOR_ID_RANGE];
        if actor[..12].iter().all(|x| *x == 0xff) {
            return None;
        }
        let mut s = String::with_capacity(32);
        push_hex(&mut s, actor);
        Some(s)
    }
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
}

/// A session as the task routes read it.
#[derive(Debug)]
pub struct SessionIndex {
    /// Jobs and the counts of what could not be read.
    pub facts: SessionFacts,
    /// Every attempt, sorted by (task id, attempt).
    pub tasks: Vec<TaskRecord>,
    texts: Vec<Box<str>>,
    /// The bound of this index's `/api/jobs/` answer, found once (a scan of every job's
    /// texts, off the async workers) and kept with the index (`serve::jobs::jobs`).
    pub jobs_bound: OnceLock<usize>,
}

/// The state an attempt has in Ray's `TaskState` (`protobuf_to_task_state_dict`): an attempt
/// whose state no transition said (only its definition was seen; the fold's `UNKNOWN`, which
/// `inspect` shows) is Ray's `NIL`, the default of its `TaskStatus`, which Ray's state client
/// takes (`UNKNOWN` makes it reject the whole list).
fn ray_state(state: &str) -> &str {
    match state {
        "UNKNOWN" | "" => "NIL",
        s => s,
    }
}

/// The type an attempt has in Ray's `TaskState`: one whose definition was not seen has Ray's
/// default, `NORMAL_TASK` (the first value of its `TaskType`), not an empty type Ray's state
/// client rejects.
fn ray_type(task_type: Option<&str>) -> &str {
    match task_type {
        None | Some("") => "NORMAL_TASK",
        Some(t) => t,
    }
}

/// Builds a [`SessionIndex`] from the attempts the fold lends.
#[derive(Default)]
pub struct IndexBuilder {
    tasks: Vec<TaskRecord>,
    texts: Vec<Box<str>>,
    index: HashMap<Box<str>, u32>,
}

impl IndexBuilder {
    /// The fold bounds the distinct strings it lends (its symbol table), so this table is
    /// bounded by the same number.
    fn intern(&mut self, s: Option<&str>) -> u32 {
        let Some(s) = s else { return NONE };
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.texts.len() as u32;
        self.texts.push(s.into());
        self.index.insert(s.into(), i);
        i
    }

    pub fn add(&mut self, t: &TaskView<'_>) {
        let mut id = [0u8; 31];
        let n = t.id_bytes.len().min(31);
        id[..n].copy_from_slice(&t.id_bytes[..n]);
        let (exec_start_ns, exec_end_ns) = t.exec_ns.unwrap_or((NO_TIME, NO_TIME));
        let rec = TaskRecord {
            id,
            id_len: t.id_len,
            attempt: t.attempt_number,
            state: self.intern(Some(ray_state(t.state))),
            name: self.intern(t.name),
            task_type: self.intern(Some(ray_type(t.task_type))),
            job: self.intern(t.job_id),
            node: self.intern(t.node_id),
            worker: self.intern(t.worker_id),
            error_type: self.intern(t.error_type),
            pid: t.worker_pid,
            running_ns: t.running_ns.unwrap_or(NO_TIME),
            failed_ns: t.failed_ns.unwrap_or(NO_TIME),
            latest_ns: t.latest_ns.unwrap_or(NO_TIME),
            exec_start_ns,
            exec_end_ns,
        };
        self.tasks.push(rec);
    }

    pub fn finish(mut self, facts: SessionFacts) -> SessionIndex {
        self.tasks
            .sort_unstable_by(|a, b| a.order().cmp(&b.order()));
        self.tasks.shrink_to_fit();
        self.texts.shrink_to_fit();
        SessionIndex {
            facts,
            tasks: self.tasks,
            texts: self.texts,
            jobs_bound: OnceLock::new(),
        }
    }
}

/// Bytes of one entry of a node's resources besides its name: the value, the string's
/// header and the map's share of a node.
const RESOURCE_ENTRY_BYTES: usize = 64;

/// What the allocator takes for a block of `n` bytes: rounded up to 16, plus 16 of its own.
fn alloc(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.div_ceil(16) * 16 + 16
    }
}

/// The heap a string holds.
fn heap(s: &str, capacity: usize) -> usize {
    alloc(capacity.max(s.len()))
}

fn opt(s: &Option<String>) -> usize {
    s.as_ref().map_or(0, |s| heap(s, s.capacity()))
}

/// The heap of a map of strings (a job's metadata).
fn map(m: Option<&std::collections::BTreeMap<String, String>>) -> usize {
    m.map_or(0, |m| {
        m.iter()
            .map(|(k, v)| heap(k, k.capacity()) + heap(v, v.capacity()) + MAP_ENTRY_BYTES)
            .sum()
    })
}

/// The heap of a submitted job's record besides its own slot.
fn submission(s: &crate::reader::SubmissionFacts) -> usize {
    heap(&s.submission_id, s.submission_id.capacity())
        + opt(&s.status)
        + opt(&s.entrypoint)
        + opt(&s.message)
        + opt(&s.error_type)
        + map(s.metadata.as_ref())
        + opt(&s.runtime_env)
        + opt(&s.driver_node_id)
        + opt(&s.driver_agent_http_address)
}

/// A map entry's share of a `BTreeMap` node besides its key and value (nodes of up to 11
/// entries, half full at worst, with their edges and headers).
const MAP_ENTRY_BYTES: usize = 64;

/// The heap a JSON value holds besides its own slot (`size_of::<Value>()`, 32 bytes):
/// serde_json's tree, as the Train runs are held (an element of an array costs its 32-byte
/// slot, whatever its text: `0,` is 2 bytes of JSON and 32 held).
pub(crate) fn json_heap(v: &serde_json::Value) -> usize {
    use serde_json::Value;
    let slot = std::mem::size_of::<Value>();
    match v {
        Value::String(s) => heap(s, s.capacity()),
        Value::Array(a) => alloc(a.capacity() * slot) + a.iter().map(json_heap).sum::<usize>(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                std::mem::size_of::<String>()
                    + heap(k, k.capacity())
                    + slot
                    + MAP_ENTRY_BYTES
                    + json_heap(v)
            })
            .sum(),
        _ => 0,
    }
}

impl SessionIndex {
    pub fn text(&self, sym: u32) -> Option<&str> {
        self.texts.get(sym as usize).map(|s| &**s)
    }

    /// The attempts of task `task_hex` (its id in hex, any case), in attempt order: a binary
    /// search of the sorted records, so a log request does not walk a million of them.
    pub fn attempts(&self, task_hex: &str) -> &[TaskRecord] {
        let Some(id) = hex_bytes(&task_hex.to_ascii_lowercase()) else {
            return &[];
        };
        let from = self
            .tasks
            .partition_point(|r| r.order() < (false, id.as_slice(), i32::MIN));
        let to = self
            .tasks
            .partition_point(|r| r.order() <= (false, id.as_slice(), i32::MAX));
        &self.tasks[from..to.max(from)]
    }

    /// What the index holds, counted for the cache's budget: each record, string, job,
    /// actor, node and Train run by its struct's size and the heap blocks it owns (rounded
    /// as the allocator rounds them), so that what the cache holds stays within a small
    /// factor of what it counts whatever the session says (review r36d: node resources;
    /// r36e: actors at 512-byte texts, Train runs of big arrays).
    pub fn bytes(&self) -> u64 {
        use std::mem::size_of;
        let texts: usize = self
            .texts
            .iter()
            .map(|t| heap(t, t.len()) + size_of::<Box<str>>())
            .sum::<usize>()
            + self.texts.capacity() * size_of::<Box<str>>();
        let f = &self.facts;
        let jobs: usize = f.jobs.capacity() * size_of::<crate::reader::JobFacts>()
            + f.jobs
                .iter()
                .map(|j| {
                    heap(&j.job_id, j.job_id.capacity())
                        + heap(&j.state, j.state.capacity())
                        + opt(&j.entrypoint)
                        + opt(&j.driver_node_id)
                        + opt(&j.started)
                        + opt(&j.ended)
                        + map(j.metadata.as_ref())
                        + opt(&j.runtime_env)
                        + opt(&j.submission_id)
                        + j.submission.as_ref().map_or(0, |s| {
                            size_of::<crate::reader::SubmissionFacts>() + submission(s)
                        })
                })
                .sum::<usize>()
            + f.unmatched_submissions.capacity() * size_of::<crate::reader::SubmissionFacts>()
            + f.unmatched_submissions
                .iter()
                .map(submission)
                .sum::<usize>();
        let actors: usize = f.actors.capacity() * size_of::<crate::reader::ActorFacts>()
            + f.actors
                .iter()
                .map(|a| {
                    heap(&a.actor_id, a.actor_id.capacity())
                        + opt(&a.class_name)
                        + opt(&a.name)
                        + opt(&a.job_id)
                        + opt(&a.state)
                        + opt(&a.node_id)
                        + opt(&a.worker_id)
                        + opt(&a.death_reason)
                        + opt(&a.death_message)
                })
                .sum::<usize>();
        // A node's resources are counted each (a bucket's node may report 20,000 of them:
        // counted flat at 1 KiB a node, four such sessions held 240 MiB against an 8 MiB
        // budget, review r36d).
        let nodes: usize = f.nodes.capacity() * size_of::<crate::reader::NodeFacts>()
            + f.nodes
                .iter()
                .map(|n| {
                    heap(&n.node_id, n.node_id.capacity())
                        + opt(&n.ip)
                        + opt(&n.hostname)
                        + opt(&n.state)
                        + opt(&n.started)
                        + opt(&n.ended)
                        + opt(&n.death_reason)
                        + opt(&n.death_message)
                        + n.resources
                            .keys()
                            .map(|k| heap(k, k.capacity()) + RESOURCE_ENTRY_BYTES)
                            .sum::<usize>()
                })
                .sum::<usize>();
        let train_runs: usize = f.train_runs.capacity() * size_of::<serde_json::Value>()
            + f.train_runs.iter().map(json_heap).sum::<usize>();
        let unread = f.coverage.bytes();
        (self.tasks.capacity() * RECORD_BYTES + texts + jobs + actors + nodes + train_runs + 4096)
            as u64
            + unread
    }

    /// The symbols whose text equals `value` (ASCII case-insensitively, as Ray's state API
    /// compares strings), as a table indexed by symbol; the last entry is "no value", which
    /// matches the empty text when the row shows it as `""` (KubeRay's empty field), and
    /// nothing when the row shows it as `null` (`null_when_none`: in Ray `None` equals no
    /// string).
    fn matching(&self, value: &str, null_when_none: bool) -> Vec<bool> {
        let mut m: Vec<bool> = self
            .texts
            .iter()
            .map(|t| t.eq_ignore_ascii_case(value))
            .collect();
        m.push(value.is_empty() && !null_when_none);
        m
    }
}

/// The task fields a filter may name: those of Ray's `TaskState` the index holds. KubeRay
/// also takes `task_name` and `task_type`, its own names for `name` and `type`. A key is
/// read lower-cased, as Ray reads it.
pub const FILTER_KEYS: &[&str] = &[
    "task_id",
    "attempt_number",
    "name",
    "task_name",
    "func_or_class_name",
    "state",
    "job_id",
    "actor_id",
    "type",
    "task_type",
    "node_id",
    "worker_id",
    "worker_pid",
    "error_type",
];

/// Columns Ray's state API filters tasks on that the index does not hold: a filter on one is
/// a `400` that says so (the rows show them empty, so matching would be a guess).
pub const UNHELD_FILTER_KEYS: &[&str] = &[
    "parent_task_id",
    "language",
    "placement_group_id",
    "is_debugger_paused",
];

/// One `filter_keys[i] filter_predicates[i] filter_values[i]`.
pub struct TaskFilter {
    equal: bool,
    test: Test,
}

enum Test {
    /// A field held as a symbol: which field, and which symbols match.
    Sym(fn(&TaskRecord) -> u32, Vec<bool>),
    /// The task id, as bytes (`None`: no id can match).
    TaskId(Option<Vec<u8>>),
    /// The actor id, lower-case hex.
    ActorId(String),
    Int(fn(&TaskRecord) -> i64, i64),
}

/// An id as hex: hex stays, anything else is read as Ray's base64 (KubeRay's docs filter
/// with base64 ids); what is neither is compared as typed.
fn id_as_hex(value: &str) -> String {
    let v = value.trim();
    if !v.is_empty() && v.len().is_multiple_of(2) && v.bytes().all(|b| b.is_ascii_hexdigit()) {
        return v.to_ascii_lowercase();
    }
    crate::contract::id_to_hex(v)
        .map(|h| h.as_str().to_string())
        .unwrap_or_else(|_| v.to_string())
}

fn hex_bytes(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

impl TaskFilter {
    /// The filter, or the `400` message that says why not.
    pub fn parse(
        index: &SessionIndex,
        key: &str,
        predicate: &str,
        value: &str,
    ) -> Result<TaskFilter, String> {
        let equal = match predicate {
            "=" => true,
            "!=" => false,
            p => {
                return Err(format!(
                    "invalid filters parameter: invalid predicate: {}",
                    crate::util::escape::escape_untrusted(p)
                ))
            }
        };
        let sym = |f: fn(&TaskRecord) -> u32, v: &str| Test::Sym(f, index.matching(v, false));
        let key = key.to_ascii_lowercase();
        let key = key.as_str();
        let int = |f: fn(&TaskRecord) -> i64| {
            value
                .trim()
                .parse::<i64>()
                .map(|v| Test::Int(f, v))
                .map_err(|_| {
                    format!(
                        "invalid filter value for {key}: {} is not an integer",
                        crate::util::escape::escape_untrusted(value)
                    )
                })
        };
        let test = match key {
            "task_id" => Test::TaskId(hex_bytes(&id_as_hex(value))),
            "attempt_number" => int(|r| i64::from(r.attempt))?,
            "name" | "task_name" | "func_or_class_name" => sym(|r| r.name, value),
            "state" => sym(|r| r.state, value),
            "job_id" => sym(|r| r.job, &id_as_hex(value)),
            "actor_id" => Test::ActorId(id_as_hex(value)),
            "type" | "task_type" => sym(|r| r.task_type, value),
            "node_id" => sym(|r| r.node, &id_as_hex(value)),
            "worker_id" => sym(|r| r.worker, &id_as_hex(value)),
            "worker_pid" => int(|r| i64::from(r.pid))?,
            // The row shows no error type as `null`.
            "error_type" => Test::Sym(|r| r.error_type, index.matching(value, true)),
            other if UNHELD_FILTER_KEYS.contains(&other) => {
                return Err(format!(
                    "The filter column {other} is one Ray filters on, but this server's index \
                     does not hold it (the rows show it empty). Enter filters with supported \
                     columns: {}",
                    FILTER_KEYS.join(", ")
                ))
            }
            other => {
                return Err(format!(
                    "The given filter column {} is not supported. Enter filters with supported columns: {}",
                    crate::util::escape::escape_untrusted(other),
                    FILTER_KEYS.join(", ")
                ))
            }
        };
        Ok(TaskFilter { equal, test })
    }

    pub fn keeps(&self, index: &SessionIndex, r: &TaskRecord) -> bool {
        let hit = match &self.test {
            Test::Sym(field, table) => {
                let s = field(r);
                let i = if s == NONE {
                    table.len() - 1
                } else {
                    s as usize
                };
                table.get(i).copied().unwrap_or(false)
            }
            Test::TaskId(id) => id.as_deref().is_some_and(|id| r.has_id(id)),
            Test::ActorId(a) => r.actor_id(index).as_deref().unwrap_or("") == a,
            Test::Int(field, v) => field(r) == *v,
        };
        hit == self.equal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(id: &'a [u8], state: &'a str, name: Option<&'a str>) -> TaskView<'a> {
        TaskView {
            id_len: id.len() as u8,
            id_bytes: id,
            attempt_number: 0,
            name,
            state,
            job_id: Some("01000000"),
            task_type: Some("ACTOR_TASK"),
            node_id: None,
            worker_id: None,
            worker_pid: 7,
            error_type: None,
            running_ns: None,
            failed_ns: None,
            latest_ns: None,
            exec_ns: None,
        }
    }

    /// Review r36e: actors were counted 512 bytes each whatever their texts, and a Train
    /// run twice its JSON text where serde_json holds 32 bytes an element. Now the count is
    /// at least what their heap blocks and structs take (and within a small factor of it).
    #[test]
    fn actors_and_train_runs_count_what_they_hold() {
        let long = |c: char| Some(c.to_string().repeat(512));
        let actors: Vec<crate::reader::ActorFacts> = (0..1000)
            .map(|i| crate::reader::ActorFacts {
                actor_id: format!("{i:032x}"),
                class_name: long('C'),
                name: long('N'),
                job_id: Some("01000000".into()),
                state: Some("DEAD".into()),
                node_id: long('X'),
                pid: Some(7),
                worker_id: None,
                death_reason: long('R'),
                death_message: long('M'),
                alive_ns: None,
                dead_ns: None,
            })
            .collect();
        let held_actors = actors.len() * (5 * 512 + 32);
        let facts = SessionFacts {
            actors,
            ..SessionFacts::default()
        };
        let index = IndexBuilder::default().finish(facts);
        let counted = index.bytes() as usize;
        assert!(
            counted >= held_actors && counted < held_actors * 2,
            "{counted} counted for {held_actors} of texts"
        );

        let zeros = 1_000_000;
        let run: serde_json::Value =
            serde_json::from_str(&format!("{{\"pad\":[{}0]}}", "0,".repeat(zeros - 1))).unwrap();
        let facts = SessionFacts {
            train_runs: vec![run],
            ..SessionFacts::default()
        };
        let index = IndexBuilder::default().finish(facts);
        let counted = index.bytes() as usize;
        let held = zeros * std::mem::size_of::<serde_json::Value>();
        assert!(
            counted >= held && counted < held * 2,
            "{counted} counted for {held} held"
        );
    }

    #[test]
    fn records_are_small_sorted_and_filtered() {
        const { assert!(RECORD_BYTES <= 112) };
        let mut b = IndexBuilder::default();
        let a: Vec<u8> = (0..24).collect();
        let mut z = a.clone();
        z[0] = 0xff;
        b.add(&view(&z, "FINISHED", Some("f")));
        b.add(&view(&a, "FAILED", None));
        let index = b.finish(SessionFacts::default());
        assert_eq!(
            index.tasks[0].task_id(),
            "000102030405060708090a0b0c0d0e0f1011121314151617"
        );
        assert_eq!(
            index.tasks[0].actor_id(&index).as_deref(),
            Some("08090a0b0c0d0e0f1011121314151617")
        );
        let f = TaskFilter::parse(&index, "state", "=", "failed").unwrap();
        assert!(f.keeps(&index, &index.tasks[0]) && !f.keeps(&index, &index.tasks[1]));
        let f = TaskFilter::parse(&index, "name", "=", "").unwrap();
        assert!(f.keeps(&index, &index.tasks[0]) && !f.keeps(&index, &index.tasks[1]));
        let f = TaskFilter::parse(&index, "job_id", "!=", "AQAAAA==").unwrap();
        assert!(!f.keeps(&index, &index.tasks[0]));
        let f = TaskFilter::parse(&index, "task_id", "=", &index.tasks[1].task_id()).unwrap();
        assert!(!f.keeps(&index, &index.tasks[0]) && f.keeps(&index, &index.tasks[1]));
        let first = index.tasks[0].task_id();
        assert_eq!(index.attempts(&first.to_ascii_uppercase()).len(), 1);
        assert_eq!(index.attempts(&first)[0].task_id(), first);
        assert!(index.attempts("00").is_empty() && index.attempts("zz").is_empty());
        let f = TaskFilter::parse(&index, "worker_pid", "=", "7").unwrap();
        assert!(f.keeps(&index, &index.tasks[0]));
        assert!(TaskFilter::parse(&index, "bogus", "=", "x").is_err());
        assert!(TaskFilter::parse(&index, "state", "<", "x").is_err());
        assert!(TaskFilter::parse(&index, "worker_pid", "=", "x").is_err());
    }
}
