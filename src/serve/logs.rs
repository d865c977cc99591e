//! `/api/v0/logs` and `/api/v0/logs/{file|stream}`: a dead session's log files, as Ray's
//! state API serves a live node's (`state_head.py`, `log_manager.py` and the log agent of
//! Ray 2.60), which the dashboard's Logs page and a task's or actor's log viewer read. The
//! logs are the bucket's `P/<session>/<node>/logs/<path>` objects (docs/bucket-layout.md);
//! they are found the way `inspect --logs` finds them (`crate::reader::logs`: one reader,
//! two faces).
//!
//! # `GET /api/v0/logs?node_id=|node_ip=[&glob=]`
//!
//! The node's log files whose path below `logs/` matches `glob` (default `*`: the top
//! directory), with Python's `pathlib` rules as Ray's agent applies them (`*`, `?`, `[...]`
//! within one path segment, `**` for any number of segments, a glob ending in `/` or `**`
//! matching directories only, a directory listed as `name/`, the logs directory itself as
//! `./`; consecutive `**` count as one and matching costs segments × depth, on a blocking
//! thread), grouped as Ray groups them (`worker_out`, `worker_err`, `core_worker`, `driver`,
//! `raylet`, `gcs_server`, `autoscaler`, `agent`, `dashboard`, `internal`; a group only when
//! it has a file), each sorted: `{"result": true, "msg": "", "data": {"result": {...}}}`.
//! `node_ip` is resolved through the session's node events. A node without any log object
//! is a `404`; a glob that is absolute or climbs (`..`) a `400`, as Ray refuses it. At most
//! [`MAX_LISTED`] objects of a node are listed; past it the answer carries
//! [`TRUNCATED_HEADER`].
//!
//! # `GET /api/v0/logs/file` and `/api/v0/logs/stream`
//!
//! One log, found as Ray's `resolve_filename` finds it, in its order: `actor_id` (the log of
//! the worker process the actor lived in, by its worker id, else its pid, on its node),
//! `task_id` with `attempt_number` (default 0: the attempt's own byte range of the file Ray
//! named in its `taskLogInfo`, else its worker's log found by id or pid; an actor task
//! without a range of its own is refused as Ray refuses it, its output being interleaved in
//! the actor's log), `submission_id` (a submitted job's driver log, `job-driver-<id>.log`
//! on the node its submission record names as the driver's, else its driver job's node; no
//! node need be given, and one given is not used), `pid` with a node
//! (`worker-*-<pid>.out|err`), or `filename` (a path below the node's `logs/`) with
//! `node_id` or `node_ip`. `suffix` is `out` (default) or
//! `err`. `lines` is Ray's: the last N lines (default 1,000, `0` too), `-1` (any negative
//! number) the whole file or range; `filter_ansi_code=true` drops the colour codes Ray's
//! filter drops (`ESC [ ... m`, also across the chunks of the answer); `download_filename`
//! names the attachment (default `file.txt`; characters a header cannot hold are replaced by
//! `_`).
//!
//! The answer is Ray's: `200`, `Content-Type: text/plain`, `Content-Disposition:
//! attachment; filename="..."`, the bytes as stored, streamed in chunks of [`CHUNK_BYTES`]
//! read from the bucket with ranged reads, so a log of any size costs one chunk of memory
//! per answer. `lines=N` finds its start by reading back from the end, at most
//! 64 MiB; when those hold fewer lines, the answer starts there,
//! mid-line, and carries [`TAIL_CUT_HEADER`]. A dead cluster has no live stream: `stream`
//! answers as `file` does and ends (Ray's agent would keep the connection and follow the
//! file; Ray's own dashboard only asks for `file`).
//!
//! Errors, with the reason as text: `400` for options Ray refuses (no node for a filename or
//! pid, both `node_id` and `node_ip`, no target, a bad `suffix`, `lines`, `pid` or
//! `attempt_number`, a filename that is absolute, climbs or holds a control character,
//! `media_type` not `file` or `stream`, a `submission_id` that cannot be a file name);
//! `404` when the task, attempt, actor, submitted job, its driver's node, node or log is
//! not in the session (Ray answers `500` for all of these); `409` when several worker logs
//! match; `502` when the bucket could not be read.
//!
//! Names from the bucket never become local paths (they are object keys, read through
//! `inspect`'s bucket, which refuses links and `..`), and every name from the request or the
//! bucket in a message is escaped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use serde_json::json;

use super::cookies::Entered;
use super::index::SessionIndex;
use super::session::{headers_for, index};
use super::Shared;
use crate::contract::logs::{node_logs_prefix, LogStream};
use crate::reader::{
    find_worker_log, raw_key, session_nodes, tail_start, task_log_target, LogTarget, ReadError,
};
use crate::util::escape::{escape_message, escape_untrusted};

/// Bytes read from the bucket per chunk of a log answer: what one answer holds at a time.
pub const CHUNK_BYTES: u64 = 256 << 10;
/// Ray's `DEFAULT_LOG_LIMIT`: lines answered when `lines` is absent or `0`.
pub const DEFAULT_LINES: usize = 1000;
/// Objects of one node's `logs/` listed for `/api/v0/logs`; a hostile bucket's millions of
/// objects are not all held.
pub const MAX_LISTED: usize = 100_000;
/// Set on a listing cut at [`MAX_LISTED`] objects.
pub const TRUNCATED_HEADER: &str = "x-rhc-truncated-listing";
/// Set on a `lines=N` answer that starts mid-line because the bytes read back from the end
/// held fewer lines: how many bytes it starts before the end.
pub const TAIL_CUT_HEADER: &str = "x-rhc-tail-cut";
/// Longest `filename` or `glob` accepted.
const MAX_NAME_BYTES: usize = 4096;
/// Longest partial colour code held back between two chunks.
const MAX_PENDING_ESCAPE: usize = 64;

/// A request's query: the first value of each name, as aiohttp's `req.query.get` reads it.
struct Query(HashMap<String, String>);

impl Query {
    fn parse(raw: Option<&str>) -> Query {
        let mut m = HashMap::new();
        for (k, v) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            m.entry(k.into_owned()).or_insert_with(|| v.into_owned());
        }
        Query(m)
    }

    /// A non-empty value.
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// A failed log request: its status and reason (already escaped).
#[derive(Debug)]
struct Refusal(StatusCode, String);

/// A refusal of a task or actor log, and the headers of the session's index it was decided
/// on ([`headers_for`]: what could not be read, so "not found" may be "in an object that
/// could not be read"); empty headers before the index was loaded.
struct Refused(Refusal, HeaderMap);

impl From<Refusal> for Refused {
    fn from(r: Refusal) -> Refused {
        Refused(r, HeaderMap::new())
    }
}

/// The headers of an answer about `index`'s session that say what could not be read (not
/// its content type: a refusal is text).
fn session_headers(index: &SessionIndex) -> HeaderMap {
    let mut headers = headers_for(index);
    headers.remove(CONTENT_TYPE);
    headers
}

fn bad(msg: String) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, msg)
}

fn not_found(msg: String) -> Refusal {
    Refusal(StatusCode::NOT_FOUND, msg)
}

/// The status of a resolution error of the shared reader.
fn refusal_of(e: &anyhow::Error) -> Refusal {
    let msg = escape_message(&format!("{e:#}"));
    match e.downcast_ref::<ReadError>() {
        Some(
            ReadError::NoSuchLogTarget { .. }
            | ReadError::LogNotUploaded { .. }
            | ReadError::NoLogFor { .. },
        ) => Refusal(StatusCode::NOT_FOUND, msg),
        Some(ReadError::SeveralLogs { .. }) => Refusal(StatusCode::CONFLICT, msg),
        _ => Refusal(StatusCode::BAD_GATEWAY, msg),
    }
}

/// An id from the request in lower-case hex (Ray's ids are hex; base64 is taken too).
fn hex_id(name: &str, value: &str) -> Result<String, Refusal> {
    crate::contract::id_to_hex(value.trim())
        .map(|h| h.as_str().to_string())
        .map_err(|_| {
            bad(format!(
                "{name} {}: not an id in hex or base64",
                escape_untrusted(value)
            ))
        })
}

/// The node a request names by `node_id` or `node_ip` (`None`: neither given); a refusal in
/// the list route's JSON with `json`, else as text.
async fn node_of(
    state: &Shared,
    entered: &Entered,
    q: &Query,
    json: bool,
) -> Result<Option<String>, Response> {
    let text = |entered: &Entered, r: Refusal| {
        if json {
            json_refusal(entered, r)
        } else {
            text(entered, r)
        }
    };
    match (q.get("node_id"), q.get("node_ip")) {
        (Some(id), Some(ip)) => Err(text(
            entered,
            bad(format!(
                "Both node_id and node_ip are given. Only one of them can be provided. \
                 Given node id: {}, given node ip: {}",
                escape_untrusted(id),
                escape_untrusted(ip)
            )),
        )),
        (Some(id), None) => hex_id("node_id", id)
            .map(Some)
            .map_err(|r| text(entered, r)),
        (None, Some(ip)) => {
            let index = index(state, entered).await?;
            match index
                .facts
                .nodes
                .iter()
                .find(|n| n.ip.as_deref() == Some(ip))
            {
                Some(n) => Ok(Some(n.node_id.clone())),
                None => Err(text(
                    entered,
                    not_found(format!(
                        "Cannot find matching node_id for a given node ip {}",
                        escape_untrusted(ip)
                    )),
                )),
            }
        }
        (None, None) => Ok(None),
    }
}

/// A refusal as Ray's log route answers one: the reason as text.
fn text(entered: &Entered, r: Refusal) -> Response {
    text_with(entered, Refused::from(r))
}

/// A refusal as text, with the session's headers it carries.
fn text_with(entered: &Entered, Refused(r, mut headers): Refused) -> Response {
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    entered.refresh((r.0, headers, r.1))
}

/// A refusal as Ray's list route answers one: `{"result": false, "msg": ..., "data": {"result": null}}`.
fn json_refusal(entered: &Entered, r: Refusal) -> Response {
    let body = json!({"result": false, "msg": r.1, "data": {"result": null}});
    entered.refresh((r.0, [(CONTENT_TYPE, "application/json")], body.to_string()))
}

/// A path from the request below a node's `logs/`: relative, no `.`, `..` or empty
/// segment, no control character, at most [`MAX_NAME_BYTES`].
fn checked_rel<'a>(what: &str, value: &'a str) -> Result<&'a str, Refusal> {
    let refuse = |why: &str| Err(bad(format!("{what} {}: {why}", escape_untrusted(value))));
    if value.len() > MAX_NAME_BYTES {
        return refuse("too long");
    }
    if value.starts_with('/') {
        return refuse("must be a path relative to the node's log directory");
    }
    if value.chars().any(char::is_control) {
        return refuse("holds a control character");
    }
    if value
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return refuse("must not hold an empty, '.' or '..' segment");
    }
    Ok(value)
}

/// `GET /api/v0/logs`.
pub async fn list(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    let q = Query::parse(query.as_deref());
    let glob = q.0.get("glob").map_or("*", String::as_str);
    let pattern = match glob_pattern(glob) {
        Ok(p) => p,
        Err(r) => return json_refusal(&entered, r),
    };
    let node = match node_of(&state, &entered, &q, true).await {
        Ok(Some(n)) => n,
        Ok(None) => return json_refusal(
            &entered,
            bad(
                "Both node id and node ip are not provided. Please provide at least one of them."
                    .into(),
            ),
        ),
        Err(r) => return r,
    };
    let prefix = node_logs_prefix(
        &entered.session.history_prefix(&state.bucket.spec.root),
        &entered.session.session,
        &node,
    );
    let (files, truncated) = match list_files(&state.bucket.store, &prefix).await {
        Ok(l) => l,
        Err(e) => {
            return json_refusal(
                &entered,
                Refusal(
                    StatusCode::BAD_GATEWAY,
                    escape_message(&format!("listing {prefix}: {e}")),
                ),
            )
        }
    };
    if files.is_empty() {
        return json_refusal(
            &entered,
            not_found(format!(
                "no logs of node {} in session {}",
                escape_untrusted(&node),
                entered.session.session
            )),
        );
    }
    // Matching up to MAX_LISTED paths against a long glob is CPU work: off the async workers.
    let pattern: Vec<String> = pattern.iter().map(|s| (*s).to_string()).collect();
    let groups = match tokio::task::spawn_blocking(move || group_matches(&pattern, &files)).await {
        Ok(g) => g,
        Err(e) => {
            return json_refusal(
                &entered,
                Refusal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the listing stopped: {e}"),
                ),
            )
        }
    };
    let body = json!({"result": true, "msg": "", "data": {"result": groups}});
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if truncated {
        headers.insert(TRUNCATED_HEADER, HeaderValue::from(MAX_LISTED));
    }
    entered.refresh((headers, body.to_string()))
}

/// The files and their directories that match the glob, by Ray's group, each sorted.
fn group_matches(pattern: &[String], files: &[String]) -> BTreeMap<&'static str, Vec<String>> {
    let pattern: Vec<&str> = pattern.iter().map(String::as_str).collect();
    let mut dirs: BTreeSet<&str> = BTreeSet::new();
    for f in files {
        for (i, _) in f.match_indices('/') {
            dirs.insert(&f[..i]);
        }
    }
    let mut groups: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    // The logs directory itself (`""`, listed `./` as pathlib's `**` yields it), its
    // directories and its files.
    let entries = std::iter::once(("", true))
        .chain(files.iter().map(|f| (f.as_str(), false)))
        .chain(dirs.iter().map(|d| (*d, true)));
    for (path, is_dir) in entries {
        if !glob_matches(&pattern, path, is_dir) {
            continue;
        }
        let name = if path.is_empty() {
            "./".to_string()
        } else if is_dir {
            format!("{path}/")
        } else {
            path.to_string()
        };
        groups.entry(category(&name)).or_default().push(name);
    }
    for list in groups.values_mut() {
        list.sort();
    }
    groups
}

/// Every object below `prefix` (which ends in `/`), as paths relative to it, at most
/// [`MAX_LISTED`]; and whether there were more.
async fn list_files(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<(Vec<String>, bool), String> {
    let mut listing = store.list(Some(&raw_key(prefix.trim_end_matches('/'))));
    let mut files = Vec::new();
    while let Some(item) = listing.next().await {
        let meta = item.map_err(|e| e.to_string())?;
        let Some(rel) = meta.location.as_ref().strip_prefix(prefix) else {
            continue;
        };
        if files.len() == MAX_LISTED {
            return Ok((files, true));
        }
        files.push(rel.to_string());
    }
    Ok((files, false))
}

/// Ray's group of a log file (`LogsManager._categorize_log_files`, in its order).
fn category(name: &str) -> &'static str {
    let has = |s: &str| name.contains(s);
    if has("worker") && name.ends_with(".out") {
        "worker_out"
    } else if has("worker") && name.ends_with(".err") {
        "worker_err"
    } else if has("core-worker") && name.ends_with(".log") {
        "core_worker"
    } else if has("core-driver") && name.ends_with(".log") {
        "driver"
    } else if has("raylet.") {
        "raylet"
    } else if has("gcs_server.") {
        "gcs_server"
    } else if has("log_monitor") {
        "internal"
    } else if has("monitor") {
        "autoscaler"
    } else if has("agent.") {
        "agent"
    } else if has("dashboard.") {
        "dashboard"
    } else {
        "internal"
    }
}

/// A glob's segments, or the refusal Ray's agent gives (absolute, `..`, empty).
fn glob_pattern(glob: &str) -> Result<Vec<&str>, Refusal> {
    if glob.is_empty() || glob.len() > MAX_NAME_BYTES {
        return Err(bad(format!(
            "Invalid glob filter: {}. It must not be empty or longer than {MAX_NAME_BYTES} bytes.",
            escape_untrusted(glob)
        )));
    }
    let mut segments: Vec<&str> = glob
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    // Consecutive `**` match what one does.
    segments.dedup_by(|a, b| *a == "**" && *b == "**");
    let dirs_only = glob.ends_with('/');
    if glob.starts_with('/') || segments.contains(&"..") || segments.is_empty() {
        return Err(bad(format!(
            "Invalid glob filter: {}. It must be a relative path and cannot contain '..'.",
            escape_untrusted(glob)
        )));
    }
    if dirs_only {
        // A trailing `/` matches directories only, as `pathlib` does.
        segments.push("");
    }
    Ok(segments)
}

/// Whether `path` (a file, or a directory with `is_dir`; `""` the logs directory itself)
/// matches the glob's segments; a glob ending in `**` or `/` matches directories only, as
/// `pathlib` does.
fn glob_matches(pattern: &[&str], path: &str, is_dir: bool) -> bool {
    let (pattern, dirs_only) = match pattern.split_last() {
        Some((&"", rest)) => (rest, true),
        _ => (pattern, pattern.last() == Some(&"**")),
    };
    if dirs_only && !is_dir {
        return false;
    }
    let parts: Vec<&str> = if path.is_empty() {
        Vec::new()
    } else {
        path.split('/').collect()
    };
    segments_match(pattern, &parts)
}

/// Whether the segments match the path's parts: `**` matches any number of parts (none
/// too). Dynamic programming over (segment, part) pairs, so a glob of many `**` costs
/// O(segments × depth) and never backtracks exponentially.
fn segments_match(pattern: &[&str], parts: &[&str]) -> bool {
    let n = parts.len();
    // `next[j]`: whether the pattern's remaining segments (after the current one) match
    // `parts[j..]`; computed from the last segment back to the first.
    let mut next = vec![false; n + 1];
    next[n] = true;
    for p in pattern.iter().rev() {
        let mut cur = vec![false; n + 1];
        if *p == "**" {
            // cur[j] = any k >= j with next[k]
            let mut any = false;
            for j in (0..=n).rev() {
                any |= next[j];
                cur[j] = any;
            }
        } else {
            for j in 0..n {
                cur[j] = next[j + 1] && name_matches(p.as_bytes(), parts[j].as_bytes());
            }
        }
        next = cur;
    }
    next[0]
}

/// `fnmatch` of one segment: `*`, `?`, `[...]` (`[!...]` negated, `a-z` ranges), case
/// sensitive (POSIX).
fn name_matches(p: &[u8], s: &[u8]) -> bool {
    // Iterative, with one backtrack point for the last `*`: linear in practice.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    star = Some((pi, si));
                    pi += 1;
                    continue;
                }
                b'?' => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                b'[' => {
                    if let Some((hit, next)) = class_matches(&p[pi..], s[si]) {
                        if hit {
                            pi += next;
                            si += 1;
                            continue;
                        }
                    } else if s[si] == b'[' {
                        pi += 1;
                        si += 1;
                        continue;
                    }
                }
                c if c == s[si] => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, ss)) => {
                pi = sp + 1;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at the start of `p` against byte `c`: whether it matches and the class's
/// length; `None` when the `[` opens no class (no closing `]`), and is then a plain `[`.
fn class_matches(p: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(p.get(i), Some(b'!'));
    if negate {
        i += 1;
    }
    let start = i;
    let mut hit = false;
    while i < p.len() {
        if p[i] == b']' && i > start {
            return Some((hit != negate, i + 1));
        }
        if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
            hit |= p[i] <= c && c <= p[i + 2];
            i += 3;
        } else {
            hit |= p[i] == c;
            i += 1;
        }
    }
    None
}

/// The options of a log request, checked as Ray's `GetLogOptions` checks them.
struct FileOptions {
    lines: Option<usize>,
    stream: LogStream,
    attempt: i32,
    pid: Option<u32>,
    filter_ansi: bool,
    download: String,
}

fn file_options(q: &Query) -> Result<FileOptions, Refusal> {
    let int = |name: &str| -> Result<Option<i64>, Refusal> {
        q.get(name)
            .map(|v| {
                v.trim()
                    .parse::<i64>()
                    .map_err(|_| bad(format!("{name} {}: not an integer", escape_untrusted(v))))
            })
            .transpose()
    };
    let lines = match int("lines")? {
        None | Some(0) => Some(DEFAULT_LINES),
        Some(n) if n < 0 => None,
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let stream = match q.get("suffix").unwrap_or("out") {
        "out" => LogStream::Out,
        "err" => LogStream::Err,
        other => {
            return Err(bad(format!(
                "Invalid suffix: {}. Must be one of 'out' or 'err'.",
                escape_untrusted(other)
            )))
        }
    };
    let attempt = int("attempt_number")?
        .map(i32::try_from)
        .transpose()
        .map_err(|_| bad("attempt_number: out of range".into()))?
        .unwrap_or(0);
    let pid = int("pid")?
        .map(|p| u32::try_from(p).ok().filter(|p| *p > 0))
        .map(|p| p.ok_or_else(|| bad("pid: not a process id".into())))
        .transpose()?;
    let filter_ansi = q
        .get("filter_ansi_code")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let download: String = q
        .get("download_filename")
        .unwrap_or("file.txt")
        .chars()
        .take(255)
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Ok(FileOptions {
        lines,
        stream,
        attempt,
        pid,
        filter_ansi,
        download,
    })
}

/// `GET /api/v0/logs/{media_type}`.
pub async fn file(
    State(state): State<Shared>,
    entered: Entered,
    Path(media_type): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    if media_type != "file" && media_type != "stream" {
        return text(
            &entered,
            bad(format!(
                "Invalid media type: {}",
                escape_untrusted(&media_type)
            )),
        );
    }
    let q = Query::parse(query.as_deref());
    let opts = match file_options(&q) {
        Ok(o) => o,
        Err(r) => return text(&entered, r),
    };
    let (actor, task) = (q.get("actor_id"), q.get("task_id"));
    let (filename, submission) = (q.get("filename"), q.get("submission_id"));
    if actor.is_none()
        && task.is_none()
        && submission.is_none()
        && q.get("node_id").is_none()
        && q.get("node_ip").is_none()
    {
        return text(
            &entered,
            bad("node_id or node_ip must be provided when no actor_id or task_id is given".into()),
        );
    }
    if actor.is_none()
        && task.is_none()
        && opts.pid.is_none()
        && filename.is_none()
        && submission.is_none()
    {
        return text(
            &entered,
            bad(
                "None of actor_id, task_id, pid, submission_id or filename is provided. \
                 At least one of them is required to fetch logs."
                    .into(),
            ),
        );
    }
    let node = match node_of(&state, &entered, &q, false).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    let target = if let Some(actor) = actor {
        actor_target(&state, &entered, actor, opts.stream).await
    } else if let Some(task) = task {
        task_target(&state, &entered, task, opts.attempt, opts.stream).await
    } else if let Some(submission) = submission {
        submission_target(&state, &entered, submission).await
    } else {
        other_target(&state, &entered, node, filename, &opts)
            .await
            .map_err(Refused::from)
    };
    match target {
        Ok(t) => send(&state, &entered, t, &opts).await,
        Err(r) => text_with(&entered, r),
    }
}

/// The driver log of submitted job `submission` (Ray's `_resolve_job_filename`):
/// `job-driver-<submission id>.log` on its driver's node, the node its submission record
/// names, else the node of the driver job whose metadata names it (the request's node, if
/// any, is not used, as Ray does not).
async fn submission_target(
    state: &Shared,
    entered: &Entered,
    submission: &str,
) -> Result<LogTarget, Refused> {
    if submission.contains('/') {
        return Err(bad(format!(
            "submission_id {}: must not hold a '/'",
            escape_untrusted(submission)
        ))
        .into());
    }
    let file = format!("job-driver-{submission}.log");
    checked_rel("submission_id", &file)?;
    let index = index(state, entered).await.map_err(|_| {
        Refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the session is not loaded yet: ask again".into(),
        )
    })?;
    let headers = session_headers(&index);
    let facts = &index.facts;
    let driver = facts
        .jobs
        .iter()
        .find(|j| !j.superseded && j.submission_id.as_deref() == Some(submission));
    let record = driver.and_then(|j| j.submission.as_ref()).or_else(|| {
        facts
            .unmatched_submissions
            .iter()
            .find(|s| s.submission_id == submission)
    });
    let shown = escape_untrusted(submission);
    if driver.is_none() && record.is_none() {
        return Err(Refused(
            not_found(format!(
                "Job {shown} not found: no submitted job of this session has that submission id"
            )),
            headers,
        ));
    }
    let node = record
        .and_then(|s| s.driver_node_id.clone())
        .or_else(|| driver.and_then(|j| j.driver_node_id.clone()));
    let Some(node) = node else {
        return Err(Refused(
            not_found(format!(
                "Job {shown} has no driver node: the session's events do not say where its \
                 driver ran (it may never have started)"
            )),
            headers,
        ));
    };
    Ok(LogTarget {
        node,
        what: format!("the driver log of job {shown}"),
        file,
        range: None,
    })
}

/// The log a request names by `pid` or `filename` (not by task, actor or submission).
async fn other_target(
    state: &Shared,
    entered: &Entered,
    node: Option<String>,
    filename: Option<&str>,
    opts: &FileOptions,
) -> Result<LogTarget, Refusal> {
    if let Some(pid) = opts.pid {
        pid_target(state, entered, node.as_deref(), pid, opts.stream).await
    } else {
        match (node, filename) {
            (Some(node), Some(f)) => checked_rel("filename", f).map(|f| LogTarget {
                node,
                file: f.to_string(),
                range: None,
                what: format!("file {}", escape_untrusted(f)),
            }),
            _ => Err(bad("node_id or node_ip is required with filename".into())),
        }
    }
}

/// The log of actor `actor`: its worker's, by worker id (else pid) on its node.
async fn actor_target(
    state: &Shared,
    entered: &Entered,
    actor: &str,
    stream: LogStream,
) -> Result<LogTarget, Refused> {
    let id = hex_id("actor_id", actor)?;
    let index = index(state, entered).await.map_err(|_| {
        Refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the session is not loaded yet: ask again".into(),
        )
    })?;
    let headers = session_headers(&index);
    let about = |r: Refusal| Refused(r, headers.clone());
    actor_log(state, entered, &index, &id, stream)
        .await
        .map_err(about)
}

/// [`actor_target`] once the session's index is loaded.
async fn actor_log(
    state: &Shared,
    entered: &Entered,
    index: &SessionIndex,
    id: &str,
    stream: LogStream,
) -> Result<LogTarget, Refusal> {
    let Some(a) = index.facts.actors.iter().find(|a| a.actor_id == id) else {
        return Err(not_found(format!("Actor ID {id} not found.")));
    };
    let worker = a.worker_id.clone().unwrap_or_default();
    let pid = a.pid.and_then(|p| u32::try_from(p).ok()).filter(|p| *p > 0);
    if worker.is_empty() && pid.is_none() {
        return Err(not_found(format!(
            "Worker ID for Actor ID {id} not found. Actor is not scheduled yet."
        )));
    }
    let nodes = nodes_to_search(state, entered, a.node_id.as_deref()).await?;
    let found = find_worker_log(
        &state.bucket.store,
        &entered.session.history_prefix(&state.bucket.spec.root),
        &entered.session.session,
        &nodes,
        &worker,
        if worker.is_empty() { pid } else { None },
        stream,
    )
    .await
    .map_err(|e| refusal_of(&e))?;
    found
        .map(|t| LogTarget {
            what: format!("actor {id}"),
            ..t
        })
        .ok_or_else(|| {
            not_found(format!(
                "the {} log of actor {id} (worker {}, pid {}) is not in the bucket",
                stream.suffix(),
                if worker.is_empty() { "?" } else { &worker },
                pid.map_or_else(|| "?".to_string(), |p| p.to_string()),
            ))
        })
}

/// `node` if the session has it, else every node of the session.
async fn nodes_to_search(
    state: &Shared,
    entered: &Entered,
    node: Option<&str>,
) -> Result<Vec<String>, Refusal> {
    let nodes = session_nodes(&state.bucket, &entered.session)
        .await
        .map_err(|e| Refusal(StatusCode::BAD_GATEWAY, escape_message(&format!("{e:#}"))))?;
    Ok(match node {
        Some(n) if nodes.iter().any(|x| x == n) => vec![n.to_string()],
        _ => nodes,
    })
}

/// The log of task `task` attempt `attempt`.
async fn task_target(
    state: &Shared,
    entered: &Entered,
    task: &str,
    attempt: i32,
    stream: LogStream,
) -> Result<LogTarget, Refused> {
    let id = hex_id("task_id", task)?;
    let index = index(state, entered).await.map_err(|_| {
        Refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the session is not loaded yet: ask again".into(),
        )
    })?;
    let headers = session_headers(&index);
    task_log(state, entered, index, id, attempt, stream)
        .await
        .map_err(|r| Refused(r, headers))
}

/// [`task_target`] once the session's index is loaded.
async fn task_log(
    state: &Shared,
    entered: &Entered,
    index: Arc<SessionIndex>,
    id: String,
    attempt: i32,
    stream: LogStream,
) -> Result<LogTarget, Refusal> {
    let attempts = index.attempts(&id);
    if attempts.is_empty() {
        return Err(not_found(format!(
            "Could not find log file for task: {id} (attempt {attempt}) with suffix: {}",
            stream.suffix()
        )));
    }
    let Some(record) = attempts.iter().find(|r| r.attempt == attempt) else {
        return Err(not_found(format!(
            "Could not find log file for task attempt: {id}({attempt})"
        )));
    };
    if index.text(record.node).is_none() {
        return Err(not_found(format!(
            "Could not find log file for task attempt {id}({attempt}) due to missing node info."
        )));
    }
    let actor = record.actor_id(&index);
    drop(index);
    // The fold reads the whole session again (keeping this task's log offsets only): on a
    // blocking thread of its own, like a session's load, at most MAX_TASK_LOG_FOLDS at once.
    // The permit moves into the blocking closure: a client that hangs up drops this future,
    // not the fold, so the permit must live as long as the fold does.
    let permit = state
        .task_log_folds
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Refusal(StatusCode::SERVICE_UNAVAILABLE, "shutting down".into()))?;
    let (bucket, marker, task_hex) = (state.bucket.clone(), entered.session.clone(), id.clone());
    let runtime = tokio::runtime::Handle::current();
    let target = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        runtime.block_on(task_log_target(
            &bucket, &marker, &task_hex, attempt, stream,
        ))
    })
    .await
    .map_err(|e| {
        Refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the search stopped: {e}"),
        )
    })?
    .map_err(|e| refusal_of(&e))?;
    if let (Some(actor), None) = (actor, target.range) {
        return Err(not_found(format!(
            "For actor task, please query actor log for actor({actor}): e.g. ray logs actor \
             --id {actor} . Or set RAY_ENABLE_RECORD_ACTOR_TASK_LOGGING=1 in actor's runtime \
             env or when starting the cluster."
        )));
    }
    Ok(target)
}

/// The log of process `pid` on `node`.
async fn pid_target(
    state: &Shared,
    entered: &Entered,
    node: Option<&str>,
    pid: u32,
    stream: LogStream,
) -> Result<LogTarget, Refusal> {
    let Some(node) = node else {
        return Err(bad(format!(
            "Node id needs to be specified for resolving filenames of pid {pid}"
        )));
    };
    find_worker_log(
        &state.bucket.store,
        &entered.session.history_prefix(&state.bucket.spec.root),
        &entered.session.session,
        &[node.to_string()],
        "",
        Some(pid),
        stream,
    )
    .await
    .map_err(|e| refusal_of(&e))?
    .ok_or_else(|| {
        not_found(format!(
            "no {} log of pid {pid} on node {} (worker-*-{pid}.{}) in the bucket",
            stream.suffix(),
            escape_untrusted(node),
            stream.suffix()
        ))
    })
}

/// The answer for `t`: its bytes (or its last lines), streamed.
async fn send(state: &Shared, entered: &Entered, t: LogTarget, opts: &FileOptions) -> Response {
    let key: ObjectPath = raw_key(&format!(
        "{}{}",
        node_logs_prefix(
            &entered.session.history_prefix(&state.bucket.spec.root),
            &entered.session.session,
            &t.node
        ),
        t.file
    ));
    let store = state.bucket.store.clone();
    let size = match store.head(&key).await {
        Ok(m) => m.size,
        Err(object_store::Error::NotFound { .. }) => {
            return text(
                entered,
                not_found(format!(
                    "the log of {} is not in the bucket: {}/logs/{}",
                    t.what,
                    escape_untrusted(&t.node),
                    escape_untrusted(&t.file)
                )),
            )
        }
        Err(e) => {
            return text(
                entered,
                Refusal(
                    StatusCode::BAD_GATEWAY,
                    escape_message(&format!("reading {key}: {e}")),
                ),
            )
        }
    };
    let (start, end) = match t.range {
        None => (0, size),
        Some((s, e)) => (s.min(size), e.unwrap_or(size).clamp(s.min(size), size)),
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{}\"", opts.download)) {
        headers.insert(CONTENT_DISPOSITION, v);
    }
    let from = match opts.lines {
        None => start,
        Some(n) => match tail_start(&store, &key, start, end, n).await {
            Ok((from, cut)) => {
                if cut {
                    headers.insert(TAIL_CUT_HEADER, HeaderValue::from(end - from));
                }
                from
            }
            Err(e) => {
                return text(
                    entered,
                    Refusal(StatusCode::BAD_GATEWAY, escape_message(&format!("{e:#}"))),
                )
            }
        },
    };
    let filter = opts.filter_ansi.then(AnsiFilter::default);
    let body = futures::stream::try_unfold(
        (store, key, from, filter, false),
        move |(store, key, at, mut filter, done)| async move {
            if done {
                return Ok(None);
            }
            if at >= end {
                // The last chunk: what a colour-code filter held back.
                let rest = filter.as_mut().map(AnsiFilter::finish).unwrap_or_default();
                return Ok(Some((Bytes::from(rest), (store, key, at, filter, true))));
            }
            let next = (at + CHUNK_BYTES).min(end);
            let bytes = store.get_range(&key, at..next).await.map_err(|e| {
                tracing::warn!(key = %escape_untrusted(key.as_ref()), error = %e, "reading a log failed mid-answer");
                std::io::Error::other(e.to_string())
            })?;
            let out = match filter.as_mut() {
                Some(f) => Bytes::from(f.feed(&bytes)),
                None => bytes,
            };
            Ok::<_, std::io::Error>(Some((out, (store, key, next, filter, false))))
        },
    );
    entered.refresh((StatusCode::OK, headers, Body::from_stream(body)))
}

/// Drops the colour codes Ray's `filter_ansi_code` drops: `ESC [`, then one or more of
/// `0-9 ; ( )` (the class Ray's pattern spells), then `m`. A code cut by the end of a chunk
/// is held back (up to [`MAX_PENDING_ESCAPE`] bytes) for the next one.
#[derive(Default)]
struct AnsiFilter {
    pending: Vec<u8>,
}

impl AnsiFilter {
    fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut input = std::mem::take(&mut self.pending);
        input.extend_from_slice(chunk);
        let in_code = |c: u8| c.is_ascii_digit() || matches!(c, b';' | b'(' | b')');
        let mut out = Vec::with_capacity(input.len());
        let mut i = 0;
        while i < input.len() {
            if input[i] != 0x1b {
                out.push(input[i]);
                i += 1;
                continue;
            }
            let mut j = i + 1;
            if j < input.len() && input[j] == b'[' {
                j += 1;
                let body = j;
                while j < input.len() && in_code(input[j]) {
                    j += 1;
                }
                if j == input.len() {
                    if j - i <= MAX_PENDING_ESCAPE {
                        self.pending = input[i..].to_vec();
                        return out;
                    }
                } else if input[j] == b'm' && j > body {
                    i = j + 1;
                    continue;
                }
            } else if j == input.len() {
                self.pending = input[i..].to_vec();
                return out;
            }
            out.push(0x1b);
            i += 1;
        }
        out
    }

    fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_rays() {
        for (name, group) in [
            ("worker-ab-01000000-7.out", "worker_out"),
            ("worker-ab-01000000-7.err", "worker_err"),
            ("python-core-worker-ab_7.log", "core_worker"),
            ("python-core-driver-01000000_7.log", "driver"),
            ("raylet.out", "raylet"),
            ("gcs_server.err", "gcs_server"),
            ("log_monitor.log", "internal"),
            ("monitor.log", "autoscaler"),
            ("dashboard_agent.log", "agent"),
            ("runtime_env_agent.out", "agent"),
            ("dashboard.log", "dashboard"),
            ("events/", "internal"),
            ("debug_state.txt", "internal"),
        ] {
            assert_eq!(category(name), group, "{name}");
        }
    }

    #[test]
    fn globs_match_as_pathlib_does() {
        let m = |g: &str, p: &str, d: bool| glob_matches(&glob_pattern(g).unwrap(), p, d);
        assert!(m("*", "raylet.out", false));
        assert!(m("*", "events", true));
        assert!(!m("*", "events/event_GCS.log", false));
        assert!(m("events/*", "events/event_GCS.log", false));
        assert!(m("*raylet*", "raylet.out", false));
        assert!(m("worker-*-*-1?.out", "worker-ab-01-12.out", false));
        assert!(!m("worker-*-*-1?.out", "worker-ab-01-123.out", false));
        assert!(m("**/*.log", "events/event_GCS.log", false));
        assert!(m("**/*.log", "monitor.log", false));
        assert!(m("**", "events", true) && !m("**", "raylet.out", false));
        assert!(m("**", "", true) && m("**/", "", true) && !m("*", "", true));
        assert!(m("events/", "events", true) && !m("raylet.out/", "raylet.out", false));
        assert!(m("*/", "events", true) && !m("*/", "raylet.out", false));
        assert!(m("[rg]*.out", "raylet.out", false) && !m("[!rg]*.out", "raylet.out", false));
        assert!(m("a[.out", "a[.out", false));
        assert!(!m("*.OUT", "raylet.out", false));
        for g in ["/etc/*", "../x", "a/../b", ""] {
            assert!(glob_pattern(g).is_err(), "{g}");
        }
    }

    #[test]
    fn many_double_stars_cost_little() {
        // Before: every `**` backtracked over every part, exponentially.
        let glob = format!("{}zzz", "**/".repeat(1_000));
        let pattern = glob_pattern(&glob).unwrap();
        assert_eq!(pattern, ["**", "zzz"]);
        let many: Vec<&str> = std::iter::repeat_n("**", 1_000).chain(["zzz"]).collect();
        let path = vec!["a"; 64].join("/");
        let started = std::time::Instant::now();
        assert!(!glob_matches(&many, &path, false));
        assert!(!glob_matches(&pattern, &path, false));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert!(glob_matches(&many, "a/b/zzz", false));
    }

    #[test]
    fn colour_codes_are_dropped_across_chunks() {
        let mut f = AnsiFilter::default();
        let mut out = f.feed(b"a\x1b[31mred\x1b[0m b\x1b");
        out.extend(f.feed(b"[1;3"));
        out.extend(f.feed(b"2mX\x1b[xm\x1bZ"));
        out.extend(f.finish());
        assert_eq!(
            out,
            b"ared b"
                .iter()
                .chain(b"X\x1b[xm\x1bZ")
                .copied()
                .collect::<Vec<_>>()
        );
        let mut f = AnsiFilter::default();
        let mut out = f.feed(b"end\x1b[12");
        out.extend(f.finish());
        assert_eq!(out, b"end\x1b[12");
    }

    #[test]
    fn relative_names_only() {
        assert!(checked_rel("filename", "events/event_GCS.log").is_ok());
        for bad in ["/etc/passwd", "../x", "a//b", "a/./b", "a\nb", ""] {
            assert!(checked_rel("filename", bad).is_err(), "{bad:?}");
        }
    }
}
