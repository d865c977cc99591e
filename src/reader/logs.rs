//! Finding a log in the bucket, as both faces do (`inspect --logs`, `serve`'s log routes):
//! the node directories of a session, a worker's log by its id or pid, a task's or actor's log
//! through the session's events (the byte range of an attempt's output when Ray reported
//! it), and where the last lines of a log begin, found with ranged reads from the end (64 KiB
//! at a time, at most [`MAX_TAIL_BYTES`] back), so a big log is not downloaded. Printing is
//! the faces' (`inspect`'s `logs.rs`).

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};

use crate::contract::endpoints::FETCHED_ENDPOINTS_DIR;
use crate::contract::logs::{node_logs_prefix, LogStream, WorkerLogName};
use crate::storage::StorageSpec;
use crate::util::escape::{escape_name, escape_text};

use super::discover::ClusterId;
use super::error::ReadError;
use super::filter::Filter;
use super::load::session_report;
use super::task::{AttemptKey, CompactId, LogInfo, TaskStore, NO_TIME};
use super::values::store_error;

/// Bytes read at a time from the end of a log for `--tail`.
const TAIL_BLOCK: u64 = 64 << 10;
/// Most bytes `--tail` reads back before printing what it has (a log without newlines).
pub(crate) const MAX_TAIL_BYTES: u64 = 64 << 20;
/// Logs named in a "several logs match" error; the rest are counted (a worker id can
/// match tens of thousands of objects in a hostile bucket).
const MAX_MATCHES_SHOWN: usize = 10;

/// Which log, and which part of it (shared with `serve`'s log routes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogTarget {
    /// The node directory (lower-case hex).
    pub(crate) node: String,
    /// The path below the node's `logs/`.
    pub(crate) file: String,
    /// Byte range of the object (`None` end: to its end).
    pub(crate) range: Option<(u64, Option<u64>)>,
    /// What it is, for messages.
    pub(crate) what: String,
}

/// The key `key` as listed: node and file names from the bucket are joined into keys as
/// they are (`ObjectPath::from` would percent-encode a name that is not ASCII, and miss it).
pub(crate) fn raw_key(key: &str) -> ObjectPath {
    ObjectPath::parse(key).unwrap_or_else(|_| ObjectPath::from(key))
}

/// The node directories of a session.
pub(crate) async fn list_nodes(
    store: &Arc<dyn ObjectStore>,
    history_prefix: &str,
    session: &str,
) -> anyhow::Result<Vec<String>> {
    let prefix = ObjectPath::from(format!("{history_prefix}/{session}"));
    let listed = store
        .list_with_delimiter(Some(&prefix))
        .await
        .map_err(|e| anyhow::anyhow!("listing {prefix}/: {}", store_error(&e)))?;
    Ok(listed
        .common_prefixes
        .iter()
        .filter_map(|p| p.filename().map(str::to_string))
        .filter(|n| n != FETCHED_ENDPOINTS_DIR)
        .collect())
}

/// The log of worker `worker` (or, with `worker` empty, of process `pid`) on `nodes`; an
/// error when several match.
pub(crate) async fn find_worker_log(
    store: &Arc<dyn ObjectStore>,
    history_prefix: &str,
    session: &str,
    nodes: &[String],
    worker: &str,
    pid: Option<u32>,
    stream: LogStream,
) -> anyhow::Result<Option<LogTarget>> {
    let mut found = Vec::new();
    let mut matched = 0usize;
    for node in nodes {
        let prefix = node_logs_prefix(history_prefix, session, node);
        // One node's listing that fails costs only that node.
        let listed = match store
            .list_with_delimiter(Some(&raw_key(prefix.trim_end_matches('/'))))
            .await
        {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "note: listing {} failed, its logs not searched: {}",
                    escape_name(&prefix),
                    escape_text(&store_error(&e))
                );
                continue;
            }
        };
        for meta in listed.objects {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            let Some(parsed) = WorkerLogName::parse(name) else {
                continue;
            };
            let matches = parsed.stream == stream
                && (parsed.worker == worker || (worker.is_empty() && Some(parsed.pid) == pid));
            if matches {
                matched += 1;
                if found.len() > MAX_MATCHES_SHOWN {
                    continue;
                }
                found.push(LogTarget {
                    node: node.clone(),
                    file: name.to_string(),
                    range: None,
                    what: format!("worker {}", parsed.worker),
                });
            }
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(ReadError::SeveralLogs {
            id: if worker.is_empty() {
                format!("pid {}", pid.unwrap_or(0))
            } else {
                worker.to_string()
            },
            matches: {
                let mut shown = found
                    .iter()
                    .take(MAX_MATCHES_SHOWN)
                    .map(|t| format!("{}/logs/{}", t.node, t.file))
                    .collect::<Vec<_>>()
                    .join(", ");
                if matched > MAX_MATCHES_SHOWN {
                    shown.push_str(&format!(
                        " and {} more ({matched} in all)",
                        matched - MAX_MATCHES_SHOWN
                    ));
                }
                shown
            },
        }
        .into()),
    }
}

/// A task or actor id: read the session's events to find its worker. A task's log is its
/// attempt `attempt`'s, or its last attempt's with `None`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn resolve_from_events(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    chosen: (ClusterId, String),
    filter: &Filter,
    id: &str,
    attempt: Option<i32>,
    nodes: &[String],
    stream: LogStream,
) -> anyhow::Result<LogTarget> {
    let history_prefix = chosen.0.layout(&spec.root).history_prefix();
    let session = chosen.1.clone();
    let compact = CompactId::from_hex(id);
    let mut last: Option<(AttemptKey, Attempt)> = None;
    let report = session_report(
        store,
        spec,
        chosen,
        filter,
        0,
        TaskStore::new(compact),
        &mut |key, t, symbols| {
            if Some(key.id) != compact
                || attempt.is_some_and(|a| a != key.attempt)
                || last.as_ref().is_some_and(|(k, _)| k >= key)
            {
                return;
            }
            let extra = t.extra.as_deref();
            last = Some((
                *key,
                Attempt {
                    node: symbols.owned(t.node),
                    worker: symbols
                        .owned(t.worker)
                        .or_else(|| symbols.owned(t.exec_worker)),
                    pid: (t.pid > 0).then_some(t.pid),
                    log: extra.and_then(|e| e.log.clone()),
                    ran: t.running_ns != NO_TIME || t.exec_start != NO_TIME,
                },
            ));
        },
    )
    .await?;
    if let Some((key, attempt)) = last {
        let what = format!("task {id} attempt {}", key.attempt);
        return attempt
            .target(
                store,
                &history_prefix,
                &session,
                nodes,
                stream,
                what.clone(),
            )
            .await?
            .ok_or_else(|| ReadError::NoLogFor { what }.into());
    }
    if let Some(actor) = report.actors.iter().find(|a| a.actor_id == id) {
        let what = format!("actor {id}");
        let pid = actor.pid.and_then(|p| u32::try_from(p).ok());
        let on: Vec<String> = match &actor.node_id {
            Some(n) if nodes.contains(n) => vec![n.clone()],
            _ => nodes.to_vec(),
        };
        if pid.is_some() {
            if let Some(mut t) =
                find_worker_log(store, &history_prefix, &session, &on, "", pid, stream).await?
            {
                t.what = what;
                return Ok(t);
            }
        }
        return Err(ReadError::NoLogFor { what }.into());
    }
    Err(ReadError::NoSuchLogTarget {
        id: id.to_string(),
        session,
    }
    .into())
}

/// What the events say about an attempt's worker.
#[derive(Debug)]
struct Attempt {
    node: Option<String>,
    worker: Option<String>,
    pid: Option<u32>,
    log: Option<LogInfo>,
    ran: bool,
}

impl Attempt {
    async fn target(
        self,
        store: &Arc<dyn ObjectStore>,
        history_prefix: &str,
        session: &str,
        nodes: &[String],
        stream: LogStream,
        what: String,
    ) -> anyhow::Result<Option<LogTarget>> {
        let log = self.log.unwrap_or_default();
        let (file, range) = match stream {
            LogStream::Out => (log.stdout_file, log.stdout),
            LogStream::Err => (log.stderr_file, log.stderr),
        };
        let range = range.0.map(|start| (start, range.1));
        let on: Vec<String> = match &self.node {
            Some(n) if nodes.contains(n) => vec![n.clone()],
            _ => nodes.to_vec(),
        };
        if let Some(file) = file {
            // Ray named the file; find the node that holds it.
            let mut holders = Vec::new();
            for node in &on {
                let key = raw_key(&format!(
                    "{}{file}",
                    node_logs_prefix(history_prefix, session, node)
                ));
                if store.head(&key).await.is_ok() {
                    holders.push(node.clone());
                }
            }
            if let [node] = holders.as_slice() {
                return Ok(Some(LogTarget {
                    node: node.clone(),
                    file,
                    range,
                    what,
                }));
            }
            if holders.is_empty() {
                return Err(ReadError::LogNotUploaded {
                    what,
                    key: format!(
                        "{}{file}",
                        node_logs_prefix(history_prefix, session, "<node>")
                    ),
                }
                .into());
            }
        }
        if !self.ran && self.worker.is_none() {
            return Ok(None);
        }
        let worker = self.worker.unwrap_or_default();
        let found = find_worker_log(
            store,
            history_prefix,
            session,
            &on,
            &worker,
            self.pid,
            stream,
        )
        .await?;
        match found {
            Some(t) => Ok(Some(LogTarget { range, what, ..t })),
            None => {
                let node = match on.as_slice() {
                    [one] => one.as_str(),
                    _ => "<node>",
                };
                let name = if worker.is_empty() {
                    format!("worker-*-*-{}", self.pid.unwrap_or(0))
                } else {
                    format!("worker-{worker}-*-*")
                };
                Err(ReadError::LogNotUploaded {
                    what,
                    key: format!(
                        "{}{name}.{}",
                        node_logs_prefix(history_prefix, session, node),
                        stream.suffix()
                    ),
                }
                .into())
            }
        }
    }
}

/// Where the last `lines` lines of `key[start..end]` begin (a last line without its newline
/// counts as a line, as Ray's log agent counts it), found with ranged reads of
/// [`TAIL_BLOCK`] from the end, one block held at a time, at most [`MAX_TAIL_BYTES`] back;
/// and whether that bound cut them short (the offset is then mid-line). `end` for none.
pub(crate) async fn tail_start(
    store: &Arc<dyn ObjectStore>,
    key: &ObjectPath,
    start: u64,
    end: u64,
    lines: usize,
) -> anyhow::Result<(u64, bool)> {
    if lines == 0 || start >= end {
        return Ok((end.max(start), false));
    }
    let mut from = end;
    let mut newlines = 0usize;
    while from > start && end - from < MAX_TAIL_BYTES {
        let to = from;
        from = from.saturating_sub(TAIL_BLOCK).max(start);
        let block = store
            .get_range(key, from..to)
            .await
            .map_err(|e| anyhow::anyhow!("reading {key}: {}", store_error(&e)))?;
        // A last line ending in a newline does not start a line of its own.
        let skip_final = to == end && block.last() == Some(&b'\n');
        let body = if skip_final {
            &block[..block.len() - 1]
        } else {
            &block[..]
        };
        for (i, &c) in body.iter().enumerate().rev() {
            if c == b'\n' {
                newlines += 1;
                if newlines == lines {
                    return Ok((from + i as u64 + 1, false));
                }
            }
        }
    }
    if from == start {
        return Ok((from, false));
    }
    // The window ended: the answer starts mid-line unless a newline ends the byte before it.
    let before = store
        .get_range(key, from - 1..from)
        .await
        .map_err(|e| anyhow::anyhow!("reading {key}: {}", store_error(&e)))?;
    Ok((from, before.first() != Some(&b'\n')))
}
