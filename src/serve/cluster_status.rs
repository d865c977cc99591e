//! `/api/cluster_status` and `/api/cluster_status?format=1`: the autoscaler's status of a
//! dead session, rebuilt from what its nodes left in the bucket, for the dashboard's Overview
//! and job pages (which ask only for `format=1`) and for clients of Ray's API.
//!
//! A live Ray answers from what its autoscaler wrote into the GCS; a dead cluster has no GCS,
//! so, as KubeRay's history server does, the status is rebuilt from each node's last
//! `P/<session>/<node>/logs/debug_state.txt` (the raylet rewrites it every few seconds; the
//! log collector uploads it with the other logs) and from the session's events:
//!
//! - **Node status.** A node whose debug state says `is_idle: 1` is idle, any other read
//!   node is active, counted by node type: its `ray.io/node-group` label (KubeRay's group
//!   name), else `node_<node id>` as Ray's autoscaler names a node of a cluster without
//!   node types. A node whose events say it died other than by an expected termination or
//!   an autoscaler's drain is a recent failure (newest first, at most
//!   [`MAX_FAILURES_SHOWN`], its IP from the events) and is not counted active or idle.
//!   Pending nodes and `request_resources()` are not recorded anywhere in the bucket: those
//!   sections say `(unavailable in history server)`, as KubeRay's do.
//! - **Resources.** Each node's total and available resources (the first `"total"` and
//!   `"available"` of the scheduler state's line, the node's own; Ray's fixed point of
//!   1/10,000, instances summed), used = total − available, summed over the counted nodes in
//!   fixed point and shown with Ray's own rules (`parse_usage` of Ray 2.60): sorted by name,
//!   `node:` resources and placement-group resources left out, a resource reserved by
//!   placement groups shown as Ray shows it (`1.25/2.0 CPU (0.25 used of 0.5 reserved in
//!   placement groups)`), `memory` and `object_store_memory` in Ray's units (`1.00GiB`),
//!   other amounts as Python prints a float, `accelerator_type:` left out.
//! - **Pending demands.** The index keeps no task's resource request, so the demands are not
//!   grouped by shape as Ray groups them: the attempts whose latest state is a pending one
//!   (`PENDING_ARGS_AVAIL`, `PENDING_NODE_ASSIGNMENT`, `PENDING_OBJ_STORE_MEM_AVAIL`,
//!   `PENDING_ARGS_FETCH`) and the actors `PENDING_CREATION` or `DEPENDENCIES_UNREADY` are
//!   counted in one line that says their shapes are unavailable.
//! - **Time.** The header's time is the latest one the session's events recorded (a task's
//!   latest transition, an actor's or a node's start or end), else the session name's, in
//!   UTC, as Python prints a `datetime`.
//!
//! The text has the sections and wording of Ray 2.60's autoscaler (v2's layout, with its
//! `Idle:` section); the plain answer has the shape of Ray's live `/api/cluster_status`
//! (`autoscalingStatus`, `autoscalingError`, `clusterStatus` with `autoscalerReport` and
//! `loadMetricsReport` and their keys camel-cased as Ray's dashboard does), holding only
//! what the bucket tells (KubeRay's server answers `null`s there).
//!
//! # What it guarantees
//!
//! - **Untrusted files, bounded cost.** At most [`MAX_NODES_READ`] nodes' files are read
//!   (first those of the nodes the events name, a node's, an actor's or a task's, then the
//!   other node directories: empty or stray directories cannot hide the real nodes), each
//!   only up to [`MAX_DEBUG_STATE_BYTES`], under the server's read permits
//!   ([`super::MAX_CONCURRENT_READS`]); a node may name at most [`MAX_RESOURCES_PER_NODE`]
//!   resources of at most [`MAX_RESOURCE_NAME_BYTES`] bytes, and a session at most
//!   [`MAX_RESOURCE_ENTRIES`] in all; at most [`CONCURRENT_BUILDS`] statuses are built at a
//!   time (requests for a status being built wait for it, [`super::kept`]) and
//!   [`CACHED_STATUSES`] kept. Nothing in a file can make the server panic: a file
//!   that is cut, garbled, too large or over a bound, or that gives a node a total below
//!   zero, is one unreadable node (an amount available may be below zero: Ray lets a
//!   worker that was blocked take its CPU back, and shows the used part over the total).
//! - **Says what it could not read.** Every answer has `data.debugStates`: how many nodes'
//!   files were read, which were missing, which could not be read and why (each list at most
//!   [`MAX_LISTED_NODES`] long), and how many nodes were past [`MAX_NODES_READ`]; and the
//!   header [`UNREADABLE_HEADER`] counts the unreadable files (plus the session's own
//!   unreadable objects). KubeRay's server skips such a node without a word.
//! - **Escaped.** Node types and resource names from the bucket are escaped
//!   ([`escape_untrusted`]) before they enter the text.
//! - **Read at most every [`STATUS_FRESH_FOR`].** A session's status is kept while its index
//!   is held and for [`STATUS_FRESH_FOR`] (the dashboard asks every few seconds), then built
//!   again from the files as they are: the raylets of a live session rewrite their
//!   `debug_state.txt` every few seconds, and no event says so (review r36k D5). At most
//!   [`CACHED_STATUSES`] sessions' statuses are kept (review r36k D6: with 2, three dashboards
//!   on three sessions rebuilt on every request).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::HeaderValue;
use axum::response::Response;
use futures::StreamExt as _;
use object_store::ObjectStoreExt as _;
use serde_json::{json, Map, Value};

use super::cookies::Entered;
use super::index::{SessionIndex, NO_TIME};
use super::session::{answer, index, unix_ms};
use super::{Shared, UNREADABLE_HEADER};
use crate::contract::logs::node_logs_prefix;
use crate::reader::{raw_key, session_nodes, session_start};
use crate::util::escape::escape_untrusted;

/// A node's debug state, below its `logs/`.
pub const DEBUG_STATE_FILE: &str = "debug_state.txt";
/// Bytes of a node's `debug_state.txt` read: Ray's are tens of KiB, the scheduler's line
/// among the first lines.
pub const MAX_DEBUG_STATE_BYTES: u64 = 1 << 20;
/// Nodes whose files are read for one session.
pub const MAX_NODES_READ: usize = 5_000;
/// Resources one node's line may name (of its total or of its available).
pub const MAX_RESOURCES_PER_NODE: usize = 256;
/// Longest resource name or node type.
pub const MAX_RESOURCE_NAME_BYTES: usize = 128;
/// (node, resource) pairs one session's status may hold.
pub const MAX_RESOURCE_ENTRIES: usize = 20_000;
/// Ray's `AUTOSCALER_MAX_FAILURES_DISPLAYED`.
pub const MAX_FAILURES_SHOWN: usize = 20;
/// Node ids in each list of `data.debugStates`.
pub const MAX_LISTED_NODES: usize = 100;
/// Statuses built at once.
pub const CONCURRENT_BUILDS: usize = 2;
/// Statuses kept (one per loaded session, the oldest dropped first). A status is a few KiB
/// of text, at most about 1 MiB ([`MAX_RESOURCE_ENTRIES`] resource lines).
pub const CACHED_STATUSES: usize = 32;
/// How long a status built is answered before it is built again.
pub const STATUS_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(15);
/// Ray's fixed point: an amount is held as amount × 10,000.
const FIXED_POINT: f64 = 10_000.0;
/// What the text says where the bucket holds nothing to say.
const UNAVAILABLE: &str = " (unavailable in history server)";

/// What one node's `debug_state.txt` says of its own resources.
#[derive(Debug, Default, PartialEq)]
struct NodeResources {
    /// Its `ray.io/node-group` label.
    group: Option<String>,
    idle: bool,
    /// Fixed point, instances summed.
    total: BTreeMap<String, i128>,
    available: BTreeMap<String, i128>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses a `debug_state.txt` (`complete`: the whole file, not a prefix of it).
fn parse_debug_state(text: &[u8], complete: bool) -> Result<NodeResources, String> {
    const MARK: &[u8] = b"cluster_resource_scheduler state:";
    let at = find(text, MARK).ok_or("no `cluster_resource_scheduler state:` line")?;
    let rest = &text[at + MARK.len()..];
    let cut = || {
        if complete {
            "the scheduler state's line is missing".to_string()
        } else {
            format!(
                "the scheduler state's line is not within the first {MAX_DEBUG_STATE_BYTES} bytes"
            )
        }
    };
    let next = rest.iter().position(|&b| b == b'\n').ok_or_else(cut)?;
    let line = &rest[next + 1..];
    let line = match line.iter().position(|&b| b == b'\n') {
        Some(end) => &line[..end],
        None if complete => line,
        None => return Err(cut()),
    };
    // The node's own part comes first; the cluster's view of every node follows.
    let local = find(line, b"Cluster resources").map_or(line, |end| &line[..end]);
    let local = std::str::from_utf8(local).map_err(|_| "the scheduler state is not UTF-8")?;
    let total = resource_block(local, "\"total\"", false)?;
    // A blocked worker's CPU taken back can leave an instance below zero available.
    let available = resource_block(local, "\"available\"", true)?;
    let group = label(local, "\"ray.io/node-group\"")?;
    Ok(NodeResources {
        group,
        idle: local.contains("is_idle: 1"),
        total,
        available,
    })
}

/// After `name` in `s`: `:`, then `{`; the rest from there.
fn after_opening<'a>(s: &'a str, name: &str, open: char) -> Option<&'a str> {
    let rest = &s[s.find(name)? + name.len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    rest.strip_prefix(open)
}

/// `name: {key: [n, n], key: [n], ...}`: the amounts by key, instances summed; an amount
/// below zero refused unless `negative_ok` (a node has no negative total: review r36k).
fn resource_block(
    s: &str,
    name: &str,
    negative_ok: bool,
) -> Result<BTreeMap<String, i128>, String> {
    let mut rest =
        after_opening(s, name, '{').ok_or_else(|| format!("no {name} resources in the line"))?;
    let mut out = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.starts_with('}') {
            return Ok(out);
        }
        let open = rest
            .find('[')
            .ok_or_else(|| format!("the {name} resources are cut"))?;
        let key = rest[..open].trim_end();
        let key = key
            .strip_suffix(':')
            .ok_or_else(|| format!("a {name} resource without `name: [...]`"))?
            .trim();
        if key.is_empty() || key.contains(['{', '}', ']']) {
            return Err(format!("a {name} resource without a name"));
        }
        if key.len() > MAX_RESOURCE_NAME_BYTES {
            return Err(format!(
                "a {name} resource name longer than {MAX_RESOURCE_NAME_BYTES} bytes"
            ));
        }
        let close = rest[open..]
            .find(']')
            .ok_or_else(|| format!("the {name} resources are cut"))?
            + open;
        let mut amount: i128 = 0;
        for part in rest[open + 1..close].split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let v: i64 = part
                .parse()
                .map_err(|_| format!("{name} resource {key}: {part:?} is not an amount"))?;
            if v < 0 && !negative_ok {
                return Err(format!("{name} resource {key}: {part} is below zero"));
            }
            amount = amount.saturating_add(i128::from(v));
        }
        if !out.contains_key(key) && out.len() >= MAX_RESOURCES_PER_NODE {
            return Err(format!(
                "more than {MAX_RESOURCES_PER_NODE} {name} resources"
            ));
        }
        *out.entry(key.to_string()).or_insert(0) += amount;
        rest = &rest[close + 1..];
    }
}

/// The value of label `name` (`"name":"value"`), if the line has it.
fn label(s: &str, name: &str) -> Result<Option<String>, String> {
    let Some(rest) = after_opening(s, name, '"') else {
        return Ok(None);
    };
    let end = rest.find('"').ok_or("a node-group label is cut")?;
    let value = &rest[..end];
    if value.len() > MAX_RESOURCE_NAME_BYTES {
        return Err(format!(
            "a node-group label longer than {MAX_RESOURCE_NAME_BYTES} bytes"
        ));
    }
    Ok((!value.is_empty()).then(|| value.to_string()))
}

/// The status of one session, as far as the bucket tells it.
#[derive(Debug, Default)]
pub(crate) struct Status {
    /// Unix nanoseconds.
    time_ns: Option<i64>,
    /// By node type (escaped).
    active: BTreeMap<String, u64>,
    idle: BTreeMap<String, u64>,
    /// Fixed point (used, total), summed over the counted nodes, by resource (escaped).
    usage: BTreeMap<String, (i128, i128)>,
    by_node: BTreeMap<String, BTreeMap<String, (i128, i128)>>,
    /// (node type, IP), newest first.
    failures: Vec<(String, String)>,
    pending: u64,
    read: u64,
    missing: Vec<String>,
    missing_total: u64,
    unreadable: Vec<(String, String)>,
    unreadable_total: u64,
    past_cap: u64,
}

/// The statuses built, and the permits to build one.
pub(crate) type StatusCache = super::kept::Kept<Status>;

/// A new [`StatusCache`]: [`CONCURRENT_BUILDS`] at once, [`CACHED_STATUSES`] kept, each for
/// [`STATUS_FRESH_FOR`].
pub(crate) fn status_cache() -> Arc<StatusCache> {
    Arc::new(super::kept::Kept::new(
        CONCURRENT_BUILDS,
        CACHED_STATUSES,
        Some(STATUS_FRESH_FOR),
    ))
}

/// The session's status: kept, or built now (once for the requests that want it meanwhile).
async fn status_of(
    state: &Shared,
    entered: &Entered,
    index: &Arc<SessionIndex>,
) -> Result<Arc<Status>, String> {
    let key = entered.session.marker_key(&state.bucket.spec.root);
    let (for_build, entered, index_for_build) = (state.clone(), entered.clone(), index.clone());
    state
        .cluster_status
        .get_or_build(key, 0, index, move |_| async move {
            Ok(build(&for_build, &entered, &index_for_build).await)
        })
        .await
}

/// A node id from the events that can name a directory of the bucket.
fn plain_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// One node's file: `Ok(None)` when it is not in the bucket.
async fn read_debug_state(
    state: &Shared,
    entered: &Entered,
    node: &str,
) -> Result<Option<NodeResources>, String> {
    let key = raw_key(&format!(
        "{}{DEBUG_STATE_FILE}",
        node_logs_prefix(
            &entered.session.history_prefix(&state.bucket.spec.root),
            &entered.session.session,
            node
        )
    ));
    let _permit = state.reads.acquire().await.ok();
    let store = &state.bucket.store;
    let size = match store.head(&key).await {
        Ok(m) => m.size,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(format!("reading it failed: {e}")),
    };
    let end = size.min(MAX_DEBUG_STATE_BYTES);
    let bytes = if end == 0 {
        bytes::Bytes::new()
    } else {
        store
            .get_range(&key, 0..end)
            .await
            .map_err(|e| format!("reading it failed: {e}"))?
    };
    parse_debug_state(&bytes, end == size).map(Some)
}

/// Latest time the session's events recorded, Unix nanoseconds.
fn last_time(index: &SessionIndex) -> Option<i64> {
    let tasks = index
        .tasks
        .iter()
        .flat_map(|r| [r.latest_ns, r.running_ns, r.failed_ns, r.exec_end_ns])
        .filter(|t| *t != NO_TIME);
    let actors = index
        .facts
        .actors
        .iter()
        .flat_map(|a| [a.alive_ns, a.dead_ns])
        .flatten();
    let nodes = index
        .facts
        .nodes
        .iter()
        .flat_map(|n| [n.started.as_deref(), n.ended.as_deref()])
        .flatten()
        .filter_map(unix_ms)
        .map(|ms| ms.saturating_mul(1_000_000));
    tasks.chain(actors).chain(nodes).max()
}

/// The session name's start (`session_2026-12-02_17-22-09_535466_…`), read as UTC.
fn session_time(session: &str) -> Option<i64> {
    let start = session_start(session)?;
    let secs = crate::util::time::parse_rfc3339_seconds(&format!("{}Z", start.split('.').next()?))?;
    let micros: i64 = start
        .split_once('.')
        .and_then(|(_, f)| f.parse().ok())
        .unwrap_or(0);
    Some(secs.saturating_mul(1_000_000_000) + micros * 1_000)
}

async fn build(state: &Shared, entered: &Entered, index: &SessionIndex) -> Status {
    let mut status = Status {
        time_ns: last_time(index).or_else(|| session_time(&entered.session.session)),
        ..Status::default()
    };
    // The nodes: those the events name (a node's, an actor's or a task's), then every other
    // node directory of the session, so directories without a node behind them cannot push
    // the nodes that ran the session past the cap (review r36k).
    let task_nodes: std::collections::HashSet<u32> = index.tasks.iter().map(|r| r.node).collect();
    let named: BTreeSet<String> = index
        .facts
        .nodes
        .iter()
        // The fold lists every node directory too: those its events say nothing of are not
        // named by them.
        .filter(|n| n.state.is_some() || n.started.is_some() || n.ip.is_some())
        .map(|n| n.node_id.as_str())
        .chain(
            index
                .facts
                .actors
                .iter()
                .filter_map(|a| a.node_id.as_deref()),
        )
        .chain(task_nodes.into_iter().filter_map(|sym| index.text(sym)))
        .filter(|n| plain_id(n))
        .map(str::to_string)
        .collect();
    let mut listed = BTreeSet::new();
    match session_nodes(&state.bucket, &entered.session).await {
        Ok(dirs) => listed.extend(dirs.into_iter().filter(|d| !named.contains(d))),
        Err(e) => {
            status.unreadable_total += 1;
            status.unreadable.push((
                "(session listing)".into(),
                escape_untrusted(&format!("{e:#}")),
            ));
        }
    }
    status.past_cap = (named.len() + listed.len()).saturating_sub(MAX_NODES_READ) as u64;
    let nodes = named.into_iter().chain(listed);
    // A node that failed is not part of the cluster any more.
    let mut failed: Vec<(i64, &crate::reader::NodeFacts)> = index
        .facts
        .nodes
        .iter()
        .filter(|n| n.state.as_deref() == Some("DEAD"))
        .filter(|n| {
            !matches!(
                n.death_reason.as_deref(),
                Some("EXPECTED_TERMINATION" | "AUTOSCALER_DRAIN_IDLE")
            )
        })
        .map(|n| (n.ended.as_deref().and_then(unix_ms).unwrap_or(0), n))
        .collect();
    failed.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.node_id.cmp(&b.1.node_id)));
    let failed_ids: BTreeSet<&str> = failed.iter().map(|(_, n)| n.node_id.as_str()).collect();
    // Each file is folded in as it is read: at most the reads in flight are held parsed.
    let mut reads = futures::stream::iter(nodes.take(MAX_NODES_READ))
        .map(|node| async move {
            let r = read_debug_state(state, entered, &node).await;
            (node, r)
        })
        // In that order, so the lists of the answer are.
        .buffered(super::MAX_CONCURRENT_READS);
    let mut groups: BTreeMap<String, String> = BTreeMap::new();
    let mut entries = 0usize;
    while let Some((node, read)) = reads.next().await {
        let shown = escape_untrusted(&node);
        let r = match read {
            Ok(Some(r)) => r,
            Ok(None) => {
                status.missing_total += 1;
                if status.missing.len() < MAX_LISTED_NODES {
                    status.missing.push(shown);
                }
                continue;
            }
            Err(why) => {
                status.unreadable_total += 1;
                if status.unreadable.len() < MAX_LISTED_NODES {
                    status.unreadable.push((shown, escape_untrusted(&why)));
                }
                continue;
            }
        };
        if entries + r.total.len() > MAX_RESOURCE_ENTRIES {
            status.unreadable_total += 1;
            if status.unreadable.len() < MAX_LISTED_NODES {
                status.unreadable.push((
                    shown,
                    format!("the session's files name more than {MAX_RESOURCE_ENTRIES} resources"),
                ));
            }
            continue;
        }
        entries += r.total.len();
        status.read += 1;
        let node_type = r
            .group
            .as_deref()
            .map_or_else(|| format!("node_{node}"), str::to_string);
        let node_type = escape_untrusted(&node_type);
        groups.insert(node.clone(), node_type.clone());
        if failed_ids.contains(node.as_str()) {
            continue;
        }
        *if r.idle {
            &mut status.idle
        } else {
            &mut status.active
        }
        .entry(node_type)
        .or_insert(0) += 1;
        let mut mine = BTreeMap::new();
        for (name, total) in &r.total {
            let used = (total - r.available.get(name).copied().unwrap_or(0)).max(0);
            let name = escape_untrusted(name);
            let sum = status.usage.entry(name.clone()).or_insert((0, 0));
            sum.0 = sum.0.saturating_add(used);
            sum.1 = sum.1.saturating_add(*total);
            mine.insert(name, (used, *total));
        }
        status.by_node.insert(shown, mine);
    }
    status.failures = failed
        .iter()
        .take(MAX_FAILURES_SHOWN)
        .map(|(_, n)| {
            let node_type = groups
                .get(&n.node_id)
                .cloned()
                .unwrap_or_else(|| escape_untrusted(&format!("node_{}", n.node_id)));
            (node_type, escape_untrusted(n.ip.as_deref().unwrap_or("")))
        })
        .collect();
    let pending_tasks = index
        .tasks
        .iter()
        .filter(|r| {
            matches!(
                index.text(r.state),
                Some(
                    "PENDING_ARGS_AVAIL"
                        | "PENDING_NODE_ASSIGNMENT"
                        | "PENDING_OBJ_STORE_MEM_AVAIL"
                        | "PENDING_ARGS_FETCH"
                )
            )
        })
        .count() as u64;
    let pending_actors = index
        .facts
        .actors
        .iter()
        .filter(|a| {
            matches!(
                a.state.as_deref(),
                Some("PENDING_CREATION" | "DEPENDENCIES_UNREADY")
            )
        })
        .count() as u64;
    status.pending = pending_tasks + pending_actors;
    status
}

/// A float as Python's `repr` prints it: `2.0`, `0.25`, `1e-05`, `1.5e+16`.
fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` has the shortest digits that read back the same, as Python's repr.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let point = exp + 1; // digits before the decimal point
    let (int, frac) = if point <= 0 {
        (
            "0".to_string(),
            format!("{}{digits}", "0".repeat(point.unsigned_abs() as usize)),
        )
    } else {
        let point = point as usize;
        if digits.len() <= point {
            (
                format!("{digits}{}", "0".repeat(point - digits.len())),
                String::new(),
            )
        } else {
            (digits[..point].to_string(), digits[point..].to_string())
        }
    };
    let frac = frac.trim_end_matches('0');
    let frac = if frac.is_empty() { "0" } else { frac };
    format!("{sign}{int}.{frac}")
}

/// Bytes as Ray's `format_memory` prints them: `16.16GiB`, `0B`.
fn format_memory(bytes: f64) -> String {
    for (suffix, unit) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= unit as f64 {
            return format!("{:.2}{suffix}", bytes / unit as f64);
        }
    }
    format!("{}B", bytes.trunc() as i64)
}

/// A placement group's resource (`CPU_group_<pg>` or `CPU_group_<i>_<pg>`), as Ray's
/// `parse_placement_group_resource_str` reads it: (the resource, countable), where only the
/// wildcard form is countable (the indexed one repeats it).
fn placement_group_resource(name: &str) -> Option<(&str, bool)> {
    const GROUP: &str = "_group_";
    let alnum = |s: &str| s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric());
    let indexed = |s: &str| {
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && s[digits..].strip_prefix('_').is_some_and(alnum)
    };
    // Ray's patterns start with a greedy `(.+)`: the last `_group_` that fits wins.
    let at: Vec<usize> = name
        .match_indices(GROUP)
        .map(|(i, _)| i)
        .filter(|i| *i > 0)
        .collect();
    for &i in at.iter().rev() {
        if indexed(&name[i + GROUP.len()..]) {
            return Some((&name[..i], false));
        }
    }
    for &i in at.iter().rev() {
        if alnum(&name[i + GROUP.len()..]) {
            return Some((&name[..i], true));
        }
    }
    None
}

/// The `Total Usage:` lines, as Ray's `parse_usage` makes them (not verbose).
fn usage_lines(usage: &BTreeMap<String, (f64, f64)>) -> Vec<String> {
    let mut in_groups: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for (name, (used, total)) in usage {
        if let Some((resource, countable)) = placement_group_resource(name) {
            let e = in_groups.entry(resource).or_insert((0.0, 0.0));
            if countable {
                e.0 += used;
                e.1 += total;
            }
        }
    }
    let mut lines = Vec::new();
    for (name, (used, total)) in usage {
        if name.contains("node:") || placement_group_resource(name).is_some() {
            continue;
        }
        let group = in_groups.get(name.as_str());
        let used = group.map_or(*used, |(pu, pt)| used - pt + pu);
        let memory = name == "memory" || name == "object_store_memory";
        let amount = |v: f64| {
            if memory {
                format_memory(v)
            } else {
                py_float(v)
            }
        };
        if !memory && name.starts_with("accelerator_type:") {
            continue;
        }
        let mut line = format!("{}/{} {name}", amount(used), amount(*total));
        if let Some((pu, pt)) = group {
            line.push_str(&format!(
                " ({} used of {} reserved in placement groups)",
                amount(*pu),
                amount(*pt)
            ));
        }
        lines.push(line);
    }
    lines
}

fn amounts(fixed: &BTreeMap<String, (i128, i128)>) -> BTreeMap<String, (f64, f64)> {
    fixed
        .iter()
        .map(|(k, (u, t))| {
            (
                k.clone(),
                (*u as f64 / FIXED_POINT, *t as f64 / FIXED_POINT),
            )
        })
        .collect()
}

/// A time as Python prints a `datetime` (`2026-12-02 17:22:20.270001`, no fraction when it
/// is zero), in UTC.
fn py_datetime(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let micros = ns.rem_euclid(1_000_000_000) / 1_000;
    let text = crate::util::time::format_rfc3339(secs).replace('T', " ");
    let text = text.trim_end_matches('Z');
    if micros == 0 {
        text.to_string()
    } else {
        format!("{text}.{micros:06}")
    }
}

/// The text Ray's `ray status` prints, for what the status holds.
fn format_status(s: &Status) -> String {
    let time = s
        .time_ns
        .map_or_else(|| "time unknown".to_string(), py_datetime);
    let header = format!("======== Autoscaler status: {time} ========");
    let separator = "-".repeat(header.chars().count());
    let counts = |m: &BTreeMap<String, u64>, none: &str| {
        if m.is_empty() {
            none.to_string()
        } else {
            m.iter()
                .map(|(t, n)| format!(" {n} {t}"))
                .collect::<Vec<_>>()
                .join("\n")
        }
    };
    let failures = if s.failures.is_empty() {
        " (no failures)".to_string()
    } else {
        s.failures
            .iter()
            .map(|(t, ip)| format!(" {t}: NodeTerminated (ip: {ip})"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let usage: String = usage_lines(&amounts(&s.usage))
        .iter()
        .map(|l| format!(" {l}\n"))
        .collect();
    let demands = if s.pending == 0 {
        " (no resource demands)".to_string()
    } else {
        format!(
            " {}+ pending tasks/actors (their resource shapes are unavailable in history server)",
            s.pending
        )
    };
    [
        header,
        "Node status".into(),
        separator.clone(),
        "Active:".into(),
        counts(&s.active, " (no active nodes)"),
        "Idle:".into(),
        counts(&s.idle, " (no idle nodes)"),
        "Pending:".into(),
        UNAVAILABLE.into(),
        "Recent failures:".into(),
        failures,
        String::new(),
        "Resources".into(),
        separator,
        "Total Usage:".into(),
        format!("{usage}\nFrom request_resources:"),
        UNAVAILABLE.into(),
        "Pending Demands:".into(),
        demands,
    ]
    .join("\n")
}

/// Python's `str.title()` of an ASCII-ish word: a letter after a letter is lower-cased,
/// any other letter upper-cased.
fn py_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut after_letter = false;
    for c in s.chars() {
        if c.is_alphabetic() {
            if after_letter {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
            after_letter = true;
        } else {
            out.push(c);
            after_letter = false;
        }
    }
    out
}

/// A key as Ray's dashboard camel-cases it (`to_camel_case`): `object_store_memory` →
/// `objectStoreMemory`, `node:__internal_head__` → `node:InternalHead`.
fn camel(key: &str) -> String {
    let mut parts = key.split('_');
    let mut out = parts.next().unwrap_or("").to_string();
    for p in parts {
        out.push_str(&py_title(p));
    }
    out
}

fn usage_json(fixed: &BTreeMap<String, (i128, i128)>) -> Value {
    Value::Object(
        amounts(fixed)
            .into_iter()
            .map(|(k, (u, t))| (camel(&k), json!([u, t])))
            .collect(),
    )
}

fn counts_json(m: &BTreeMap<String, u64>) -> Value {
    Value::Object(m.iter().map(|(k, n)| (camel(k), json!(n))).collect())
}

/// What was read and what was not: `data.debugStates`.
fn reads_json(s: &Status) -> Value {
    json!({
        "read": s.read,
        "missing": s.missing,
        "missingTotal": s.missing_total,
        "unreadable": s.unreadable.iter().map(|(n, why)| json!({"nodeId": n, "reason": why})).collect::<Vec<_>>(),
        "unreadableTotal": s.unreadable_total,
        "notRead": s.past_cap,
    })
}

/// The plain answer's `clusterStatus`, in the shape of Ray's live answer.
fn plain_status(s: &Status) -> Value {
    let mut report = Map::new();
    if let Some(ns) = s.time_ns {
        report.insert("time".into(), json!(ns as f64 / 1e9));
    }
    report.insert(
        "autoscalerReport".into(),
        json!({
            "activeNodes": counts_json(&s.active),
            "idleNodes": counts_json(&s.idle),
            "failedNodes": s.failures.iter().map(|(t, ip)| json!([ip, t])).collect::<Vec<_>>(),
            "legacy": false,
        }),
    );
    report.insert(
        "loadMetricsReport".into(),
        json!({
            "usage": usage_json(&s.usage),
            "usageByNode": Value::Object(
                s.by_node.iter().map(|(n, u)| (n.clone(), usage_json(u))).collect()
            ),
        }),
    );
    Value::Object(report)
}

/// `GET /api/cluster_status[?format=1]`.
pub async fn cluster_status(
    State(state): State<Shared>,
    entered: Entered,
    RawQuery(query): RawQuery,
) -> Response {
    // Ray's `req.query.get("format", "0") == "1"`: the first value.
    let formatted = url::form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "format")
        .is_some_and(|(_, v)| v == "1");
    let index = match index(&state, &entered).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let status = match status_of(&state, &entered, &index).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "building the cluster status failed");
            return entered.refresh((
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "building the cluster status failed",
            ));
        }
    };
    let body = if formatted {
        json!({
            "result": true,
            "msg": "Got formatted cluster status.",
            "data": {
                "clusterStatus": format_status(&status),
                "debugStates": reads_json(&status),
            },
        })
    } else {
        json!({
            "result": true,
            "msg": "Got cluster status.",
            "data": {
                "autoscalingStatus": null,
                "autoscalingError": null,
                "clusterStatus": plain_status(&status),
                "debugStates": reads_json(&status),
            },
        })
    };
    let mut r = answer(&entered, &index, body.to_string());
    if status.unreadable_total > 0 {
        let already: u64 = r
            .headers()
            .get(UNREADABLE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        r.headers_mut().insert(
            UNREADABLE_HEADER,
            HeaderValue::from(already.saturating_add(status.unreadable_total)),
        );
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ray 2.60's head with a task and a placement group holding resources (captured from
    /// `ray start --head` in tests/data/cluster_status/; read at run time, so the library's
    /// sources name no file outside `src/`, as the container's build context requires).
    fn busy() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/cluster_status/ray-2.60-busy-debug_state.txt"
        ))
        .unwrap()
    }

    #[test]
    fn reads_ray_2_60s_debug_state() {
        let r = parse_debug_state(busy().as_bytes(), true).unwrap();
        assert!(!r.idle);
        assert_eq!(r.group, None);
        assert_eq!(r.total["CPU"], 20_000);
        assert_eq!(r.available["CPU"], 5_000);
        assert_eq!(r.total["memory"], 173_548_978_180_000);
        assert_eq!(r.available["custom_a"], 10_000);
        assert_eq!(r.total.len(), 10);
    }

    #[test]
    fn reads_kuberay_shaped_lines() {
        let line = "cluster_resource_scheduler state:\nLocal id: 1 Local resources: {\"total\":{CPU: [10000, 10000, 10000, 10000], GPU: [10000, 10000], node:10.0.0.1: [10000]}}, \"available\": {CPU: [10000, 10000, 5000, 0], GPU: [10000, 0], node:10.0.0.1: [10000]}}, \"labels\":{\"ray.io/node-group\":\"worker-group\",} is_draining: 0 is_idle: 0 Cluster resources";
        let r = parse_debug_state(line.as_bytes(), true).unwrap();
        assert_eq!(r.group.as_deref(), Some("worker-group"));
        assert_eq!(r.total["CPU"], 40_000);
        assert_eq!(r.available["CPU"], 25_000);
        assert_eq!(r.available["GPU"], 10_000);
    }

    #[test]
    fn refuses_what_is_not_a_debug_state() {
        for (text, complete) in [
            (&b"garbage"[..], true),
            (
                b"cluster_resource_scheduler state:\nLocal resources: {\"total\":{CPU: [1",
                false,
            ),
            (
                b"cluster_resource_scheduler state:\nLocal resources: {\"total\":{CPU: [1",
                true,
            ),
            (
                b"cluster_resource_scheduler state:\n{\"total\":{CPU: [x]}, \"available\": {}}",
                true,
            ),
            (
                b"cluster_resource_scheduler state:\n{\"total\":{: [1]}, \"available\": {}}",
                true,
            ),
            (
                b"cluster_resource_scheduler state:\n{\"total\":{CPU: [99999999999999999999]}}",
                true,
            ),
            (b"cluster_resource_scheduler state:\n\xff\xfe", true),
        ] {
            assert!(parse_debug_state(text, complete).is_err(), "{text:?}");
        }
        let many: String = (0..=MAX_RESOURCES_PER_NODE)
            .map(|i| format!("r{i}: [1], "))
            .collect();
        let text = format!(
            "cluster_resource_scheduler state:\n{{\"total\":{{{many}}}, \"available\": {{}}}}"
        );
        assert!(parse_debug_state(text.as_bytes(), true).is_err());
    }

    #[test]
    fn floats_and_memory_as_python_prints_them() {
        for (x, s) in [
            (2.0, "2.0"),
            (0.25, "0.25"),
            (1.25, "1.25"),
            (0.0, "0.0"),
            (1000.0, "1000.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.0, "123456789012345.0"),
            (-0.5, "-0.5"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(py_float(x), s, "{x}");
        }
        assert_eq!(format_memory(17_354_897_818.0), "16.16GiB");
        assert_eq!(format_memory(1_073_741_824.0), "1.00GiB");
        assert_eq!(format_memory(0.0), "0B");
        assert_eq!(format_memory(1023.0), "1023B");
    }

    #[test]
    fn placement_group_resources_as_ray_reads_them() {
        assert_eq!(
            placement_group_resource("CPU_group_0_abc"),
            Some(("CPU", false))
        );
        assert_eq!(
            placement_group_resource("CPU_group_abc"),
            Some(("CPU", true))
        );
        assert_eq!(placement_group_resource("CPU"), None);
        assert_eq!(placement_group_resource("_group_abc"), None);
        assert_eq!(camel("node:__internal_head__"), "node:InternalHead");
        assert_eq!(camel("object_store_memory"), "objectStoreMemory");
        assert_eq!(
            camel("node_04226509752c2e1bd07ed9719e74e0bf3d1e0855158394d92c98c263"),
            "node04226509752C2E1Bd07Ed9719E74E0Bf3D1E0855158394D92C98C263"
        );
        assert_eq!(
            py_datetime(1_796_232_275_514_754_000),
            "2026-12-02 17:24:35.514754"
        );
        assert_eq!(
            py_datetime(1_796_232_275_000_000_000),
            "2026-12-02 17:24:35"
        );
    }
}
