//! One session read whole: its node directories and partitions listed (`walk.rs`), its event
//! objects read `READ_CONCURRENCY` at a time and folded (`read.rs`, `model.rs`), the
//! placement-group snapshot the head's collector took, and the report shaped from the fold
//! (`report.rs`). Both faces read a session here: `inspect` for its reports and logs, `serve`
//! through `session.rs`. What the bucket gets wrong is a problem in the report, never an error.

use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};

use crate::storage::StorageSpec;

use super::discover::{session_started, ClusterId};
use super::filter::Filter;
use super::limits::READ_CONCURRENCY;
use super::model::SessionModel;
use super::read;
use super::report::{
    shape_report, ClusterIdentity, EventStats, FilterEcho, ObjectStats, Problems, SessionReport,
    TaskCounts,
};
use super::task::{AttemptKey, Symbols, TaskState, TaskStore};
use super::values::format_time_json;
use super::values::store_error;
use super::walk::{list_partition, walk_node, NodeListing, PartitionListing, Stream};

/// The dashboard endpoint of placement groups, as the head's poller fetches it
/// (`dashboard::PERIODIC_ENDPOINTS`; a test checks it is there).
const PLACEMENT_GROUPS_URI: &str = "/api/v0/placement_groups?detail=1&limit=10000";

/// Largest placement-group snapshot read (the dashboard answers with at most 10,000 groups).
const MAX_PLACEMENT_GROUP_SNAPSHOT: u64 = 64 << 20;

/// The snapshot of `/api/v0/placement_groups?detail=1` under `fetched_endpoints/`, if any:
/// (its key, its JSON). One that cannot be read or parsed is a problem, not an error.
async fn read_placement_groups(
    store: &Arc<dyn ObjectStore>,
    history_prefix: &str,
    session: &str,
    problems: &mut Problems,
) -> Option<(String, serde_json::Value)> {
    // Listed, not named: the listing gives the key as this backend spells it ('?' and '&'
    // in a name are escaped differently by each).
    let name = crate::contract::endpoints::endpoint_object_name(PLACEMENT_GROUPS_URI);
    let dir = ObjectPath::from(format!(
        "{history_prefix}/{session}/{}",
        crate::contract::endpoints::FETCHED_ENDPOINTS_DIR
    ));
    let listed = match store.list_with_delimiter(Some(&dir)).await {
        Ok(l) => l,
        Err(e) => {
            problems.unlisted(
                &format!("{dir}/"),
                &format!("listing failed: {}", store_error(&e)),
            );
            return None;
        }
    };
    let meta = listed
        .objects
        .into_iter()
        .find(|o| o.location.filename() == Some(name.as_str()))?;
    let key = meta.location.to_string();
    let result = if meta.size > MAX_PLACEMENT_GROUP_SNAPSHOT {
        Err(format!(
            "{} bytes: larger than the {MAX_PLACEMENT_GROUP_SNAPSHOT} read",
            meta.size
        ))
    } else {
        match store.get(&meta.location).await {
            Err(e) => Err(store_error(&e)),
            Ok(got) => match got.bytes().await {
                Err(e) => Err(store_error(&e)),
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}")),
            },
        }
    };
    match result {
        Ok(v) => {
            problems.read(&key);
            Some((key, v))
        }
        Err(e) => {
            problems.unreadable(&key, &e);
            None
        }
    }
}

/// Walks, reads and merges one session, then shapes the report; `visit` sees every task
/// attempt once. Fails only when the local spill files fail (the bucket's problems are in
/// the report).
pub(crate) async fn session_report(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    (cluster, session): (ClusterId, String),
    filter: &Filter,
    failed_limit: usize,
    tasks: TaskStore,
    visit: &mut dyn FnMut(&AttemptKey, &TaskState, &Symbols),
) -> anyhow::Result<SessionReport> {
    let storage_arg = &filter.storage_arg;
    let history_prefix = cluster.layout(&spec.root).history_prefix();
    let session_prefix = ObjectPath::from(format!("{history_prefix}/{session}"));
    let mut problems = Problems::default();
    let mut stats = ObjectStats::default();

    // 1. Node directories.
    let node_dirs: Vec<(ObjectPath, String)> =
        match store.list_with_delimiter(Some(&session_prefix)).await {
            Ok(l) => l
                .common_prefixes
                .into_iter()
                .filter_map(|p| {
                    let name = p.filename().unwrap_or_default().to_string();
                    (name != crate::contract::endpoints::FETCHED_ENDPOINTS_DIR).then_some((p, name))
                })
                .collect(),
            Err(e) => {
                problems.unlisted(
                    &format!("{session_prefix}/"),
                    &format!("listing failed: {}", store_error(&e)),
                );
                Vec::new()
            }
        };

    // 2. Partitions of each node.
    let listings: Vec<NodeListing> = futures::stream::iter(node_dirs)
        .map(|(path, node)| walk_node(store, path, node, filter.job.clone()))
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut model = SessionModel::new(filter.job.clone(), tasks);
    let mut partitions = Vec::new();
    for listing in listings {
        for (key, error) in &listing.problems {
            problems.unlisted(key, error);
        }
        let n = model.nodes.entry(listing.node.clone()).or_default();
        n.log_objects += listing.log_objects;
        n.log_bytes += listing.log_bytes;
        for (dir, stream) in listing.partitions {
            partitions.push((dir, stream, listing.node.clone()));
        }
    }
    let partition_listings: Vec<PartitionListing> = futures::stream::iter(partitions)
        .map(|(dir, stream, node)| list_partition(store, dir, stream, node))
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    let mut objects = Vec::new();
    for listing in partition_listings {
        if let Some((key, error)) = &listing.problem {
            problems.unlisted(key, error);
        }
        stats.not_event_objects += listing.not_event_objects;
        for object in listing.objects {
            stats.event_objects_listed += 1;
            if let Stream::Job(job) | Stream::Export(job) = &object.stream {
                if job != crate::contract::events::EXPORT_NODE_GROUP
                    && filter.job.as_ref().is_none_or(|j| j == job)
                {
                    model.jobs.entry(job.clone()).or_default();
                }
            }
            if filter.window.selects_hour(object.hour) {
                objects.push(object);
            } else {
                stats.skipped_by_time += 1;
            }
        }
    }
    // Oldest first, so that events of the same second keep their written order.
    objects.sort_by(|a, b| (a.hour, a.n, a.path.as_ref()).cmp(&(b.hour, b.n, b.path.as_ref())));

    // 3. Read and merge.
    let outside_window = read::read_objects(
        store,
        &objects,
        filter.window,
        &mut model,
        &mut stats,
        &mut problems,
    )
    .await;
    if let Some(e) = model.spill_error.take() {
        // The advice fits the error: files or space (review r56a D1: too many open files
        // was blamed on the disk).
        let advice = match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE) => "raise the open-file limit, `ulimit -n`",
            _ => "set TMPDIR to a directory with space",
        };
        return Err(anyhow::Error::new(e).context(format!(
            "writing the task attempts of a big session to temporary files ({advice})"
        )));
    }
    // 4. The dashboard's placement groups, as the head's collector snapshotted them.
    let placement_groups =
        read_placement_groups(store, &history_prefix, &session, &mut problems).await;
    let shortened = model.tasks.errors_shortened();
    if shortened > 0 {
        problems.note(
            "(error messages)",
            &format!("{shortened} error message(s) cut to their last line: too many bytes of them"),
        );
    }

    let mut report = SessionReport {
        storage: spec.to_string(),
        storage_arg: storage_arg.to_string(),
        cluster: ClusterIdentity {
            kind: cluster.kind.clone(),
            namespace: cluster.namespace.clone(),
            owner: cluster.owner.clone(),
            cluster: cluster.cluster.clone(),
            history_prefix,
        },
        started: session_started(&session),
        session,
        filter: FilterEcho {
            job: filter.job.clone(),
            since: filter.window.since_ns.map(format_time_json),
            until: filter.until_shown.map(format_time_json),
        },
        objects: stats,
        events: EventStats {
            total: model.total,
            duplicates: model.duplicates,
            outside_time_window: outside_window,
            other_job: model.other_job,
            by_type: std::mem::take(&mut model.by_type),
        },
        nodes: Vec::new(),
        jobs: Vec::new(),
        tasks: TaskCounts::default(),
        failed_tasks_total: 0,
        failed_tasks: Vec::new(),
        failure_causes: Vec::new(),
        failure_causes_other: Default::default(),
        worker_deaths_total: 0,
        worker_deaths: Vec::new(),
        session_end: Default::default(),
        hangs: Default::default(),
        actors: Vec::new(),
        train_runs: Vec::new(),
        submissions: Vec::new(),
        problems,
        placement_groups,
        pending_after_ns: filter.pending_after_ns,
    };
    shape_report(&mut report, model, failed_limit, visit)
        .context("reading back the task attempts of a big session from temporary files")?;
    Ok(report)
}
