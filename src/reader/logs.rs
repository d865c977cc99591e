//! `inspect --session S --logs <task | actor | worker | node id> [--tail N] [--err]`: prints a
//! log object from the bucket.
//!
//! - A node id (a directory of the session): the node's `raylet.out` (`raylet.err` with
//!   `--err`).
//! - A worker id: `worker-<id>-<job>-<pid>.out|err` on whichever node holds it.
//! - A task id: its last attempt, folded from every event of the session like the report;
//!   the worker's log that Ray named for it (`taskLogInfo`), else the worker's log found by
//!   its id or pid on its node. When Ray reported the byte range of the attempt's output
//!   (`stdout_start..stdout_end`, `stderr_start..stderr_end`), only that range is printed,
//!   as `ray.util.state.get_log(task_id=…)` does on a live cluster.
//! - An actor id: the log of the worker process that ran it (its node and pid from its
//!   events).
//!
//! `--tail N` prints the last N lines, read with ranged reads from the end (64 KiB at a
//! time), so a big log is not downloaded; otherwise the object (or range) is streamed.
//! `--tail` reads back at most [`MAX_TAIL_BYTES`]: when they hold fewer lines than asked
//! for, the output starts there, mid-line, and a note on stderr says so.
//!
//! Bytes go to stdout as stored when stdout is not a terminal; on a terminal, control
//! characters other than newline and tab (terminal escapes and C1 controls included) and
//! the invisible characters that reorder text (`U+202E`) are dropped, and bytes that are
//! not UTF-8 are shown as `U+FFFD`. Names from the bucket in messages are escaped
//! (`escape.rs`); a `file://` bucket's skipped entries (links, FIFOs, bad names) are listed
//! on stderr after the log.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;

use anyhow::Context as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};

use crate::cli::InspectArgs;
use crate::contract::endpoints::FETCHED_ENDPOINTS_DIR;
use crate::contract::logs::{node_logs_prefix, LogStream, WorkerLogName, RAYLET_OUT};
use crate::storage::StorageSpec;

use super::discover::ClusterId;
use super::escape::{escape_name, escape_text, is_unsafe_char};
use super::filter::Filter;
use super::local::SkipLog;
use super::task::{AttemptKey, CompactId, LogInfo, TaskStore, NO_TIME};
use super::{session_report, store_error, InspectError};

/// Bytes read at a time from the end of a log for `--tail`.
const TAIL_BLOCK: u64 = 64 << 10;
/// Most bytes `--tail` reads back before printing what it has (a log without newlines).
pub(crate) const MAX_TAIL_BYTES: u64 = 64 << 20;
/// Bytes fetched per ranged read when printing a range.
const RANGE_BLOCK: u64 = 4 << 20;
/// Logs named in a "several logs match" error; the rest are counted (a worker id can
/// match tens of thousands of objects in a hostile bucket).
const MAX_MATCHES_SHOWN: usize = 10;
/// Skipped entries named on stderr after a log; the rest are counted.
const MAX_SKIPS_SHOWN: usize = 10;

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

/// Finds the log of `args.logs` in the session and prints it.
pub(super) async fn print_logs(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    chosen: (ClusterId, String),
    filter: &Filter,
    args: &InspectArgs,
    wanted: &str,
) -> anyhow::Result<()> {
    let stream = if args.err {
        LogStream::Err
    } else {
        LogStream::Out
    };
    let history_prefix = chosen.0.layout(&spec.root).history_prefix();
    let session = chosen.1.clone();
    let id = crate::contract::id_to_hex(wanted.trim())
        .map_err(|_| InspectError::BadArgument {
            flag: "--logs",
            value: wanted.to_string(),
            reason: "not an id in hex or base64",
        })?
        .as_str()
        .to_string();
    let nodes = list_nodes(store, &history_prefix, &session).await?;
    let target = if nodes.contains(&id) {
        let file = match stream {
            LogStream::Out => RAYLET_OUT.to_string(),
            LogStream::Err => "raylet.err".to_string(),
        };
        LogTarget {
            node: id.clone(),
            file,
            range: None,
            what: format!("node {id}"),
        }
    } else if let Some(t) =
        find_worker_log(store, &history_prefix, &session, &nodes, &id, None, stream).await?
    {
        t
    } else {
        resolve_from_events(store, spec, chosen, filter, &id, None, &nodes, stream).await?
    };
    let key = raw_key(&format!(
        "{}{}",
        node_logs_prefix(&history_prefix, &session, &target.node),
        target.file
    ));
    let size = match store.head(&key).await {
        Ok(meta) => meta.size,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(InspectError::LogNotUploaded {
                what: target.what,
                key: key.to_string(),
            }
            .into())
        }
        Err(e) => anyhow::bail!("reading {key}: {}", store_error(&e)),
    };
    let (start, end) = match target.range {
        None => (0, size),
        Some((s, e)) => (s.min(size), e.unwrap_or(size).clamp(s.min(size), size)),
    };
    let mut out = Output::new();
    match args.tail {
        Some(n) => print_tail(store, &key, start, end, n, &mut out).await?,
        None => {
            let mut at = start;
            while at < end {
                let next = (at + RANGE_BLOCK).min(end);
                let bytes = store
                    .get_range(&key, at..next)
                    .await
                    .map_err(|e| anyhow::anyhow!("reading {key}: {}", store_error(&e)))?;
                out.write(&bytes)?;
                at = next;
            }
        }
    }
    out.flush()
}

/// The key `key` as listed: node and file names from the bucket are joined into keys as
/// they are (`ObjectPath::from` would percent-encode a name that is not ASCII, and miss it).
pub(crate) fn raw_key(key: &str) -> ObjectPath {
    ObjectPath::parse(key).unwrap_or_else(|_| ObjectPath::from(key))
}

/// Tells on stderr which entries of a `file://` bucket were skipped while looking for the
/// log (their keys are escaped).
pub(super) fn tell_skips(skips: &SkipLog) {
    let (skipped, more) = skips.take();
    let total = skipped.len() as u64 + more;
    if total == 0 {
        return;
    }
    eprintln!(
        "note: {total} entr{} of the bucket skipped:",
        if total == 1 { "y" } else { "ies" }
    );
    for (key, reason) in skipped.iter().take(MAX_SKIPS_SHOWN) {
        eprintln!("  {key}: {reason}");
    }
    if total > MAX_SKIPS_SHOWN as u64 {
        eprintln!("  and {} more", total - MAX_SKIPS_SHOWN as u64);
    }
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
        _ => Err(InspectError::SeveralLogs {
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
pub(super) async fn resolve_from_events(
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
            .ok_or_else(|| InspectError::NoLogFor { what }.into());
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
        return Err(InspectError::NoLogFor { what }.into());
    }
    Err(InspectError::NoSuchLogTarget {
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
                return Err(InspectError::LogNotUploaded {
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
                Err(InspectError::LogNotUploaded {
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

/// Prints the last `lines` lines of `key[start..end]`.
async fn print_tail(
    store: &Arc<dyn ObjectStore>,
    key: &ObjectPath,
    start: u64,
    end: u64,
    lines: usize,
    out: &mut Output,
) -> anyhow::Result<()> {
    let (pieces, cut_short) = tail(store, key, start, end, lines).await?;
    for piece in pieces {
        out.write(&piece)?;
    }
    if cut_short {
        out.flush()?;
        eprintln!(
            "note: --tail {lines}: the last {} MiB of the log hold fewer lines; printed from \
             there, so the first line starts mid-line",
            MAX_TAIL_BYTES >> 20
        );
    }
    Ok(())
}

/// The last `lines` lines of `key[start..end]`, in order (read from [`tail_start`] on), and
/// whether [`MAX_TAIL_BYTES`] cut them short (the first piece then starts mid-line).
async fn tail(
    store: &Arc<dyn ObjectStore>,
    key: &ObjectPath,
    start: u64,
    end: u64,
    lines: usize,
) -> anyhow::Result<(Vec<bytes::Bytes>, bool)> {
    let (mut at, cut_short) = tail_start(store, key, start, end, lines).await?;
    let mut pieces = Vec::new();
    while at < end {
        let next = (at + RANGE_BLOCK).min(end);
        pieces.push(
            store
                .get_range(key, at..next)
                .await
                .map_err(|e| anyhow::anyhow!("reading {key}: {}", store_error(&e)))?,
        );
        at = next;
    }
    Ok((pieces, cut_short))
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

/// stdout, raw into a pipe or file, cleaned for a terminal.
struct Output {
    terminal: bool,
    out: std::io::BufWriter<std::io::Stdout>,
    /// The start of a UTF-8 character cut by the end of the last write (a terminal only).
    pending: Vec<u8>,
}

impl Output {
    fn new() -> Output {
        Output {
            terminal: std::io::stdout().is_terminal(),
            out: std::io::BufWriter::new(std::io::stdout()),
            pending: Vec::new(),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let written = if self.terminal {
            let mut input = std::mem::take(&mut self.pending);
            input.extend_from_slice(bytes);
            let cleaned = terminal_safe(&input, &mut self.pending);
            self.out.write_all(cleaned.as_bytes())
        } else {
            self.out.write_all(bytes)
        };
        match written {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other.context("writing the log to stdout"),
        }
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if !self.pending.is_empty() {
            self.pending.clear();
            if let Err(e) = self.out.write_all("\u{fffd}".as_bytes()) {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    return Err(e).context("writing the log to stdout");
                }
            }
        }
        match self.out.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other.context("writing the log to stdout"),
        }
    }
}

/// `input` as text a terminal only prints: newline and tab kept, other controls (C0, DEL,
/// C1) and the characters that reorder text dropped, bytes that are not UTF-8 shown as
/// `U+FFFD`; a character cut at the end of `input` is left in `rest` for the next write.
fn terminal_safe(input: &[u8], rest: &mut Vec<u8>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut chunks = input.utf8_chunks().peekable();
    while let Some(chunk) = chunks.next() {
        out.extend(
            chunk
                .valid()
                .chars()
                .filter(|&c| c == '\n' || c == '\t' || !is_unsafe_char(c)),
        );
        let invalid = chunk.invalid();
        if invalid.is_empty() {
            continue;
        }
        // At the very end, a lead byte and what follows it may be a character cut in two.
        let at_end = chunks.peek().is_none();
        if at_end && invalid.len() < 4 && invalid[0] >= 0xc2 {
            rest.extend_from_slice(invalid);
        } else {
            out.push('\u{fffd}');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[test]
    fn terminal_output_drops_what_a_terminal_acts_on() {
        let mut rest = Vec::new();
        let text = "ok\u{1b}]0;TITLE\u{7}\u{9b}31m a\u{202e}b\tc\r\n日本\n";
        assert_eq!(
            terminal_safe(text.as_bytes(), &mut rest),
            "ok]0;TITLE31m ab\tc\n日本\n"
        );
        assert!(rest.is_empty());
        // A character cut between two writes is kept whole; a stray byte is shown.
        let bytes = "é".as_bytes();
        assert_eq!(terminal_safe(&bytes[..1], &mut rest), "");
        let mut next = std::mem::take(&mut rest);
        next.extend_from_slice(&bytes[1..]);
        assert_eq!(terminal_safe(&next, &mut rest), "é");
        assert_eq!(terminal_safe(b"a\xffb", &mut rest), "a\u{fffd}b");
        assert!(rest.is_empty());
    }
    use object_store::PutPayload;

    async fn tail_text(store: &Arc<dyn ObjectStore>, start: u64, end: u64, n: usize) -> String {
        let key = ObjectPath::from("log");
        let (pieces, _) = tail(store, &key, start, end, n).await.unwrap();
        String::from_utf8(pieces.concat()).unwrap()
    }

    #[tokio::test]
    async fn tail_reads_lines_across_blocks_from_the_end() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        // 40,000 numbered lines: about 5 blocks of TAIL_BLOCK.
        let text: String = (0..40_000).map(|i| format!("line {i}\n")).collect();
        let size = text.len() as u64;
        store
            .put(
                &ObjectPath::from("log"),
                PutPayload::from(text.clone().into_bytes()),
            )
            .await
            .unwrap();
        assert_eq!(
            tail_text(&store, 0, size, 2).await,
            "line 39998\nline 39999\n"
        );
        // More lines than one block holds.
        let many = tail_text(&store, 0, size, 20_000).await;
        assert_eq!(many.lines().count(), 20_000);
        assert!(many.starts_with("line 20000\n"), "{}", &many[..20]);
        // More lines than there are: everything.
        assert_eq!(tail_text(&store, 0, size, 50_000).await, text);
        // A range (an attempt's own output), whose last line has no newline.
        let start = text.find("line 100\n").unwrap() as u64;
        let end = text.find("line 105\n").unwrap() as u64 - 1;
        assert_eq!(tail_text(&store, start, end, 2).await, "line 103\nline 104");
        assert_eq!(tail_text(&store, start, end, 0).await, "");
    }

    #[tokio::test]
    async fn a_window_starting_after_a_newline_is_not_cut() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let key = ObjectPath::from("log");
        let m = MAX_TAIL_BYTES as usize;
        // A newline just outside the window, then one line filling it.
        let mut whole = vec![b'\n'];
        whole.extend(std::iter::repeat_n(b'B', m - 1));
        whole.push(b'\n');
        let size = whole.len() as u64;
        store.put(&key, PutPayload::from(whole)).await.unwrap();
        assert_eq!(
            tail_start(&store, &key, 0, size, 1).await.unwrap(),
            (1, false)
        );
        // Without that newline the window starts mid-line.
        let mut mid = vec![b'x'];
        mid.extend(std::iter::repeat_n(b'B', m - 1));
        mid.push(b'\n');
        store.put(&key, PutPayload::from(mid)).await.unwrap();
        assert_eq!(
            tail_start(&store, &key, 0, size, 1).await.unwrap(),
            (1, true)
        );
    }
}
