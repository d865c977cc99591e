//! Listing a bucket without reading objects: each session's footprint (for the list of
//! sessions), and a session's nodes, partitions and event objects, with delimiter listings
//! that never descend into logs.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;

use crate::contract::{self, Hour};
use crate::storage::StorageSpec;

use super::discover::{session_started, ClusterId, Discovered};
use super::filter::{Filter, NANOS_PER_HOUR};
use super::report::{ClusterEntry, ListReport, SessionEntry};
use super::values::format_time_json;
use super::{store_error, READ_CONCURRENCY};
use crate::contract::endpoints::FETCHED_ENDPOINTS_DIR;
use crate::contract::events::{EXPORT_EVENTS_DIR, JOB_EVENTS_DIR, NODE_EVENTS_DIR};
use crate::contract::logs::LOGS_DIR;

/// What one listing of `P/<session>/` tells without reading anything.
#[derive(Debug, Default)]
pub(super) struct SessionFootprint {
    pub(super) nodes: usize,
    pub(super) objects: u64,
    pub(super) bytes: u64,
    pub(super) event_objects: u64,
    pub(super) hours: Option<(Hour, Hour)>,
}

pub(super) async fn list_report(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    found: Discovered,
    filter: &Filter,
) -> ListReport {
    let mut problems = found.problems;
    let sessions: Vec<(ClusterId, String)> = found
        .clusters
        .iter()
        .flat_map(|(id, ss)| ss.iter().map(move |s| (id.clone(), s.clone())))
        .collect();
    let footprints: Vec<_> = futures::stream::iter(sessions)
        .map(|(id, session)| async move {
            let prefix = format!("{}/{session}", id.layout(&spec.root).history_prefix());
            let fp = session_footprint(store, &prefix).await;
            (id, session, fp)
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut clusters: BTreeMap<ClusterId, ClusterEntry> = BTreeMap::new();
    for (id, session, footprint) in footprints {
        let footprint = match footprint {
            Ok(f) => f,
            Err((key, e)) => {
                problems.unreadable(&key, &e);
                SessionFootprint::default()
            }
        };
        let (events_from, events_until) = match footprint.hours {
            Some((first, last)) => (
                // Names are untrusted: a year 9999 must not overflow.
                Some(first.0.saturating_mul(NANOS_PER_HOUR)),
                Some((last.0 + 1).saturating_mul(NANOS_PER_HOUR)),
            ),
            None => (None, None),
        };
        if !filter.window.is_open() {
            let keep = match (events_from, events_until) {
                (Some(f), Some(u)) => filter.window.overlaps(f, u),
                _ => false,
            };
            if !keep {
                continue;
            }
        }
        let entry = clusters.entry(id.clone()).or_insert_with(|| ClusterEntry {
            kind: id.kind.clone(),
            namespace: id.namespace.clone(),
            owner: id.owner.clone(),
            cluster: id.cluster.clone(),
            history_prefix: id.layout(&spec.root).history_prefix(),
            sessions: Vec::new(),
        });
        entry.sessions.push(SessionEntry {
            started: session_started(&session),
            session,
            nodes: footprint.nodes,
            objects: footprint.objects,
            bytes: footprint.bytes,
            event_objects: footprint.event_objects,
            events_from: events_from.map(format_time_json),
            events_until: events_until.map(format_time_json),
        });
    }
    ListReport {
        storage: spec.to_string(),
        clusters: clusters.into_values().collect(),
        problems,
    }
}

/// Lists everything under `P/<session>/` once (objects are not read).
pub(super) async fn session_footprint(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<SessionFootprint, (String, String)> {
    let mut listing = store.list(Some(&ObjectPath::from(prefix)));
    let mut fp = SessionFootprint::default();
    let mut nodes = HashSet::new();
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| {
            (
                format!("{prefix}/"),
                format!("listing failed: {}", store_error(&e)),
            )
        })?;
        fp.objects += 1;
        fp.bytes += meta.size;
        let key = meta.location.as_ref();
        let Some(rel) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) else {
            continue;
        };
        let parts: Vec<&str> = rel.split('/').collect();
        if parts.len() < 2 || parts[0] == FETCHED_ENDPOINTS_DIR {
            continue;
        }
        nodes.insert(parts[0].to_string());
        let is_event_dir = matches!(
            (parts[1], parts.len()),
            (NODE_EVENTS_DIR, 3) | (JOB_EVENTS_DIR, 4) | (EXPORT_EVENTS_DIR, 4)
        );
        if !is_event_dir {
            continue;
        }
        if let Some((hour, _)) = contract::events::parse_event_object_name(parts[parts.len() - 1]) {
            fp.event_objects += 1;
            fp.hours = Some(match fp.hours {
                None => (hour, hour),
                Some((a, b)) => (a.min(hour), b.max(hour)),
            });
        }
    }
    fp.nodes = nodes.len();
    Ok(fp)
}

/// Which stream of a node an event object belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stream {
    /// `node_events/`
    Node,
    /// `job_events/<job>/`
    Job(String),
    /// `export_events/<job or "node">/`
    Export(String),
}

/// An event object chosen for reading.
#[derive(Debug, Clone)]
pub(super) struct EventObject {
    pub(super) path: ObjectPath,
    pub(super) node: String,
    pub(super) stream: Stream,
    pub(super) hour: Hour,
    pub(super) n: Option<u64>,
    pub(super) size: u64,
}

/// What the walk of one node directory found: the event partitions to list, and the size
/// of its logs.
#[derive(Debug, Default)]
pub(super) struct NodeListing {
    pub(super) node: String,
    pub(super) partitions: Vec<(ObjectPath, Stream)>,
    pub(super) log_objects: u64,
    pub(super) log_bytes: u64,
    pub(super) problems: Vec<(String, String)>,
}

/// Walks `P/<session>/<node>/` with delimiter listings down to its event partitions; with a
/// job filter only the job's two partitions are named, nothing is listed.
pub(super) async fn walk_node(
    store: &Arc<dyn ObjectStore>,
    node_prefix: ObjectPath,
    node: String,
    job: Option<String>,
) -> NodeListing {
    let mut listing = NodeListing {
        node,
        ..Default::default()
    };
    if let Some(job) = job {
        listing.partitions.push((
            node_prefix.clone().join(JOB_EVENTS_DIR).join(job.as_str()),
            Stream::Job(job.clone()),
        ));
        listing.partitions.push((
            node_prefix
                .clone()
                .join(EXPORT_EVENTS_DIR)
                .join(job.as_str()),
            Stream::Export(job),
        ));
        return listing;
    }
    let top = match store.list_with_delimiter(Some(&node_prefix)).await {
        Ok(t) => t,
        Err(e) => {
            listing.problems.push((
                format!("{node_prefix}/"),
                format!("listing failed: {}", store_error(&e)),
            ));
            return listing;
        }
    };
    for sub in top.common_prefixes {
        match sub.filename().unwrap_or_default() {
            NODE_EVENTS_DIR => listing.partitions.push((sub.clone(), Stream::Node)),
            name @ (JOB_EVENTS_DIR | EXPORT_EVENTS_DIR) => {
                let export = name == EXPORT_EVENTS_DIR;
                match store.list_with_delimiter(Some(&sub)).await {
                    Ok(parts) => {
                        for part in parts.common_prefixes {
                            let id = part.filename().unwrap_or_default().to_string();
                            let stream = if export {
                                Stream::Export(id)
                            } else {
                                Stream::Job(id)
                            };
                            listing.partitions.push((part, stream));
                        }
                    }
                    Err(e) => listing.problems.push((
                        format!("{sub}/"),
                        format!("listing failed: {}", store_error(&e)),
                    )),
                }
            }
            LOGS_DIR => {
                let mut logs = store.list(Some(&sub));
                while let Some(meta) = logs.next().await {
                    match meta {
                        Ok(m) => {
                            listing.log_objects += 1;
                            listing.log_bytes += m.size;
                        }
                        Err(e) => {
                            listing.problems.push((
                                format!("{sub}/"),
                                format!("listing failed: {}", store_error(&e)),
                            ));
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    listing
}

/// The event objects of one partition.
#[derive(Debug, Default)]
pub(super) struct PartitionListing {
    pub(super) objects: Vec<EventObject>,
    /// Objects whose names the History Server would not read.
    pub(super) not_event_objects: u64,
    pub(super) problem: Option<(String, String)>,
}

/// Lists one partition directory (one level: its objects).
pub(super) async fn list_partition(
    store: &Arc<dyn ObjectStore>,
    dir: ObjectPath,
    stream: Stream,
    node: String,
) -> PartitionListing {
    let mut listing = PartitionListing::default();
    let listed = match store.list_with_delimiter(Some(&dir)).await {
        Ok(l) => l,
        Err(e) => {
            listing.problem = Some((
                format!("{dir}/"),
                format!("listing failed: {}", store_error(&e)),
            ));
            return listing;
        }
    };
    for meta in listed.objects {
        let name = meta.location.filename().unwrap_or_default();
        match contract::events::parse_event_object_name(name) {
            Some((hour, n)) => listing.objects.push(EventObject {
                path: meta.location.clone(),
                node: node.clone(),
                stream: stream.clone(),
                hour,
                n,
                size: meta.size,
            }),
            None => listing.not_event_objects += 1,
        }
    }
    listing
}
