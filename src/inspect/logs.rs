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
use crate::contract::logs::{node_logs_prefix, LogStream, RAYLET_OUT};
use crate::reader::discover::ClusterId;
use crate::reader::filter::Filter;
use crate::reader::local::SkipLog;
use crate::reader::logs::{
    find_worker_log, list_nodes, raw_key, resolve_from_events, tail_start, LogTarget,
    MAX_TAIL_BYTES,
};
use crate::reader::{store_error, ReadError};
use crate::storage::StorageSpec;
use crate::util::escape::is_unsafe_char;

use super::error::InspectError;

/// Bytes fetched per ranged read when printing a range.
const RANGE_BLOCK: u64 = 4 << 20;
/// Skipped entries named on stderr after a log; the rest are counted.
const MAX_SKIPS_SHOWN: usize = 10;

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
            return Err(ReadError::LogNotUploaded {
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
