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
use super::limits::READ_CONCURRENCY;
use super::report::{ClusterEntry, ListReport, SessionEntry};
use super::values::format_time_json;
use super::values::store_error;
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

pub(crate) async fn list_report(
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

/// What a session's event objects and snapshots are at one moment: how many, their bytes,
/// and a hash of every key with its size and version (ETag, else its modification time).
/// Two signatures differ when an object was added, removed, replaced or grew (our
/// collector's objects grow in place within its upload window); logs are not part of it
/// (`serve` reads them from the bucket on each request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventsSignature {
    /// Event objects and snapshots listed.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    hash: u64,
}

/// One delimiter listing of `dir`, its failure said with the directory.
async fn list_dir(
    store: &Arc<dyn ObjectStore>,
    dir: ObjectPath,
) -> Result<object_store::ListResult, String> {
    store
        .list_with_delimiter(Some(&dir))
        .await
        .map_err(|e| format!("listing {dir}/ failed: {}", store_error(&e)))
}

/// [`list_dir`] of each of `dirs`, [`READ_CONCURRENCY`] at a time, in any order.
async fn list_dirs(
    store: &Arc<dyn ObjectStore>,
    dirs: Vec<ObjectPath>,
) -> Vec<Result<object_store::ListResult, String>> {
    futures::stream::iter(dirs)
        .map(|dir| list_dir(store, dir))
        .buffer_unordered(READ_CONCURRENCY)
        .collect()
        .await
}

/// Lists what [`EventsSignature`] covers under `session_prefix` (`P/<session>`): the node
/// directories, each node's `node_events/` and the partitions of its `job_events/` and
/// `export_events/`, and `fetched_endpoints/`, with delimiter listings (a node's logs are
/// never listed), [`READ_CONCURRENCY`] at a time. Any listing that fails fails the whole:
/// the caller cannot tell then whether the session changed.
pub(super) async fn events_signature(
    store: &Arc<dyn ObjectStore>,
    session_prefix: &ObjectPath,
) -> Result<EventsSignature, String> {
    let top = list_dir(store, session_prefix.clone()).await?;
    // Directories whose objects count, and directories of partitions whose objects count.
    let mut object_dirs = Vec::new();
    let mut node_dirs = Vec::new();
    for dir in top.common_prefixes {
        if dir.filename() == Some(FETCHED_ENDPOINTS_DIR) {
            object_dirs.push(dir);
        } else {
            node_dirs.push(dir);
        }
    }
    let nodes = list_dirs(store, node_dirs).await;
    let mut partition_parents = Vec::new();
    for node in nodes {
        for sub in node?.common_prefixes {
            match sub.filename().unwrap_or_default() {
                NODE_EVENTS_DIR => object_dirs.push(sub),
                JOB_EVENTS_DIR | EXPORT_EVENTS_DIR => partition_parents.push(sub),
                _ => {}
            }
        }
    }
    let parents = list_dirs(store, partition_parents).await;
    for parent in parents {
        object_dirs.extend(parent?.common_prefixes);
    }
    let listings = list_dirs(store, object_dirs).await;
    let mut entries = Vec::new();
    for listing in listings {
        for meta in listing?.objects {
            let version = match meta.e_tag {
                Some(tag) => tag,
                None => meta
                    .last_modified
                    .timestamp_nanos_opt()
                    .unwrap_or(0)
                    .to_string(),
            };
            entries.push((meta.location.to_string(), meta.size, version));
        }
    }
    entries.sort_unstable();
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    let mut bytes = 0u64;
    for (key, size, version) in &entries {
        bytes += size;
        for part in [key.as_bytes(), &size.to_le_bytes(), version.as_bytes()] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    }
    Ok(EventsSignature {
        objects: entries.len() as u64,
        bytes,
        hash: hasher.digest(),
    })
}
