//! The command line, as clap types only: `ray-history-collector [FLAGS]` runs the collector,
//! `ray-history-collector inspect ...` reads a bucket back.
//!
//! Every collector flag also reads an environment variable, and the KubeRay collector's
//! variable names are accepted where they mean the same thing. Values are only parsed here;
//! `settings.rs` checks them against each other and against the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::events::http::EventKeys;
use crate::events::upload::Compression;
use crate::storage::gzip::GzipLevel;
use crate::util::units::{parse_bool, parse_duration, parse_size};

/// Role of the Ray node this sidecar runs beside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Head node: writes the session markers.
    Head,
    /// Worker node.
    Worker,
}

fn parse_role(s: &str) -> Result<Role, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "head" => Ok(Role::Head),
        "worker" => Ok(Role::Worker),
        _ => Err("expected head or worker".into()),
    }
}

fn parse_compression(s: &str) -> Result<Compression, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "gzip" | "gz" => Ok(Compression::Gzip),
        "none" | "off" => Ok(Compression::None),
        _ => Err("expected gzip or none".into()),
    }
}

fn parse_gzip_level(s: &str) -> Result<GzipLevel, String> {
    s.trim()
        .parse::<u8>()
        .ok()
        .and_then(GzipLevel::new)
        .ok_or_else(|| format!("expected a level from 1 to {}", GzipLevel::MAX))
}

pub use crate::util::dedup::MAX_DEDUP_WINDOW;

fn parse_gzip_ratio(s: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|e| format!("expected a whole number of times (0: no bound): {e}"))
}

fn parse_dedup_window(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|e| format!("expected a number of events: {e}"))?;
    if n > MAX_DEDUP_WINDOW {
        return Err(format!("at most {MAX_DEDUP_WINDOW} events"));
    }
    Ok(n)
}

fn parse_event_keys(s: &str) -> Result<EventKeys, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "camel" => Ok(EventKeys::Camel),
        "preserve" => Ok(EventKeys::Preserve),
        _ => Err("expected camel or preserve".into()),
    }
}

/// A value as given, parsed or not. A bad value of a flag stops the collector (exit 2); a bad
/// value of one of KubeRay's tuning variables is warned about and replaced by the default,
/// as KubeRay's collector does, so a manifest written for it cannot keep the pod from
/// starting (`settings.rs` decides, by whether the variable holds the value).
#[derive(Debug, Clone)]
pub struct Given<T> {
    /// The text as given.
    pub raw: String,
    /// The value, or why it is not one.
    pub parsed: Result<T, String>,
}

/// A clap value parser that never fails: the verdict travels in [`Given`].
fn given<T: Clone + Send + Sync + 'static>(
    parse: fn(&str) -> Result<T, String>,
) -> impl Fn(&str) -> Result<Given<T>, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        Ok(Given {
            raw: s.to_string(),
            parsed: parse(s),
        })
    }
}

fn parse_open_segments(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=65536).contains(&n) => Ok(n),
        _ => Err("expected a number from 1 to 65536".into()),
    }
}

fn parse_upload_concurrency(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(n),
        _ => Err("expected a number from 1 to 64".into()),
    }
}

fn parse_log_format(s: &str) -> Result<String, String> {
    match s.trim() {
        f @ ("text" | "json") => Ok(f.to_string()),
        _ => Err("expected text or json".into()),
    }
}

fn parse_port(s: &str) -> Result<u16, String> {
    s.trim()
        .parse::<u16>()
        .map_err(|e| format!("expected a port number: {e}"))
}

/// The command line: run the collector (the default), or a subcommand.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ray-history-collector",
    version,
    about = "Keeps a Ray node's events and logs on disk and uploads them for the Ray History Server",
    max_term_width = 100,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// A subcommand; without one, the collector runs.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The collector's settings.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
// Parsed once at start and matched at once: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Read back what collectors wrote to a bucket: clusters, sessions, jobs, tasks, Train runs.
    Inspect(InspectArgs),
    /// Serve a bucket over HTTP with KubeRay's history-server API and Ray's dashboard (read-only).
    Serve(ServeArgs),
}

/// The collector's settings. Each flag also reads the environment variable shown.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Address to listen on for Ray's events [default: 127.0.0.1:8084, or port EVENTS_PORT].
    #[arg(long, env = "RHC_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Address of a second, read-only listener: GET /healthz, /readyz and /metrics only, never
    /// events; for kubelet's probes and Prometheus on the pod IP while --listen stays on
    /// 127.0.0.1 [default: none: everything is served on --listen].
    #[arg(long, env = "RHC_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Port on 127.0.0.1 when --listen is not given (KubeRay's variable).
    #[arg(long, env = "EVENTS_PORT", value_name = "PORT", hide = true, value_parser = given(parse_port))]
    pub events_port: Option<Given<u16>>,

    /// Where to upload: file:///dir, s3://bucket[/root], gs://bucket[/root], az://container[/root],
    /// or a local path [default: ./ray-history, or KubeRay's STORAGE_BACKEND variables].
    #[arg(long, env = "RHC_STORAGE", value_name = "URL")]
    pub storage: Option<String>,

    /// Extra key prefix inside the bucket, below the URL's own path.
    #[arg(
        long,
        env = "STORAGE_ROOT_DIR",
        value_name = "PREFIX",
        default_value = ""
    )]
    pub storage_root_dir: String,

    /// Name of the RayCluster.
    #[arg(
        long,
        env = "RAY_CLUSTER_NAME",
        value_name = "NAME",
        default_value = "local"
    )]
    pub cluster_name: String,

    /// Namespace of the RayCluster.
    #[arg(
        long,
        env = "RAY_CLUSTER_NAMESPACE",
        value_name = "NAMESPACE",
        default_value = "default"
    )]
    pub cluster_namespace: String,

    /// Kind of the object that owns the cluster: rayjob or rayservice (empty: a bare RayCluster).
    #[arg(long, env = "OWNER_KIND", value_name = "KIND", default_value = "")]
    pub owner_kind: String,

    /// Name of the owning RayJob or RayService.
    #[arg(long, env = "OWNER_NAME", value_name = "NAME", default_value = "")]
    pub owner_name: String,

    /// This node's Ray node id (hex or base64); used for events that carry none.
    #[arg(long, env = "RHC_NODE_ID", value_name = "ID")]
    pub node_id: Option<String>,

    /// head writes the session markers that make sessions visible; worker does not
    /// [default: head, with a warning].
    #[arg(long, env = "RAY_ROLE", value_name = "ROLE", value_parser = parse_role)]
    pub role: Option<Role>,

    /// Local spool directory (keep it on a volume that outlives the container).
    #[arg(
        long,
        env = "RAY_COLLECTOR_EVENT_DATA_DIR",
        value_name = "DIR",
        default_value = "/tmp/ray/event-data"
    )]
    pub spool_dir: PathBuf,

    /// Seal and upload a segment this long after it was opened.
    #[arg(long, env = "RAY_COLLECTOR_EVENT_ROTATION_INTERVAL", value_name = "DURATION", default_value = "5m", value_parser = given(parse_duration))]
    pub rotation_interval: Given<Duration>,

    /// An acknowledged event is in the bucket within this time: the open segment's object grows in place, 1s to the rotation interval [default: 10s, or the rotation interval if shorter].
    #[arg(long, env = "RHC_UPLOAD_WINDOW", value_name = "DURATION", value_parser = given(parse_duration))]
    pub upload_window: Option<Given<Duration>>,

    /// Seal and upload a segment once it holds this many bytes [default: 64MiB; or RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB].
    #[arg(long, env = "RHC_MAX_SEGMENT_BYTES", value_name = "SIZE", value_parser = given(parse_size))]
    pub max_segment_bytes: Option<Given<u64>>,

    /// Disk budget of the spool; new requests get 503 above 90% of it [default: 1GiB; or RAY_COLLECTOR_EVENT_MAX_DISK_MB].
    #[arg(long, env = "RHC_MAX_SPOOL_BYTES", value_name = "SIZE", value_parser = given(parse_size))]
    pub max_spool_bytes: Option<Given<u64>>,

    /// Compression of uploaded event objects: gzip or none [default: gzip; or RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED].
    #[arg(long, env = "RHC_COMPRESSION", value_name = "ALGO", value_parser = given(parse_compression))]
    pub compression: Option<Given<Compression>>,

    /// gzip level of uploads, 1 (fastest) to 9 (smallest): 1 and 2 libdeflate, or igzip in a build with the `igzip` feature (least CPU); 3 to 9 libdeflate (smaller objects, more CPU) [default: 1].
    #[arg(long, env = "RHC_GZIP_LEVEL", value_name = "N", value_parser = given(parse_gzip_level))]
    pub gzip_level: Option<Given<GzipLevel>>,

    /// On SIGTERM, seal and upload everything within this time, then exit.
    #[arg(long, env = "RHC_SHUTDOWN_TIMEOUT", value_name = "DURATION", default_value = "25s", value_parser = given(parse_duration))]
    pub shutdown_timeout: Given<Duration>,

    /// Largest request body accepted (after gzip decoding); larger gets 413.
    #[arg(long, env = "RHC_MAX_BODY_BYTES", value_name = "SIZE", default_value = "64MiB", value_parser = given(parse_size))]
    pub max_body_bytes: Given<u64>,

    /// Past its first MiB, a gzip body may decode to at most this many times its size as
    /// sent; more gets 413 (a decompression bomb). 0: no bound but `--max-body-bytes`.
    #[arg(long, env = "RHC_MAX_GZIP_RATIO", value_name = "TIMES", default_value = "100", value_parser = given(parse_gzip_ratio))]
    pub max_gzip_ratio: Given<u64>,

    /// How many recent event ids are remembered to drop Ray's resent duplicates, across
    /// restarts too (a journal in `<spool-dir>/dedup/`, 8 to 24 bytes per id; 0: off).
    #[arg(
        long,
        env = "RHC_DEDUP_WINDOW",
        value_name = "EVENTS",
        default_value = "262144",
        value_parser = given(parse_dedup_window)
    )]
    pub dedup_window: Given<usize>,

    /// Most segment files kept open at once; the least recently written are closed first.
    #[arg(long, env = "RHC_MAX_OPEN_SEGMENTS", value_name = "N", default_value = "512", value_parser = given(parse_open_segments))]
    pub max_open_segments: Given<u32>,

    /// Event uploads in flight at once; each holds up to one part in memory.
    #[arg(long, env = "RHC_UPLOAD_CONCURRENCY", value_name = "N", default_value = "2", value_parser = given(parse_upload_concurrency))]
    pub upload_concurrency: Given<u32>,

    /// Multipart part size; objects larger than one part use multipart upload (at least 5MiB).
    #[arg(long, env = "RHC_UPLOAD_PART_BYTES", value_name = "SIZE", default_value = "8MiB", value_parser = given(parse_size))]
    pub upload_part_bytes: Given<u64>,

    /// Ray's temp root, holding `session_latest` and the session directories.
    #[arg(
        long,
        env = "RAY_TMP_ROOT",
        value_name = "DIR",
        default_value = "/tmp/ray"
    )]
    pub ray_tmp_dir: PathBuf,

    /// Upload the session logs (live snapshots, rotations, earlier sessions, final flush).
    #[arg(long, env = "ENABLE_LOG_COLLECTOR", value_name = "BOOL", default_value = "true", value_parser = given(parse_bool), action = clap::ArgAction::Set)]
    pub enable_log_collector: Given<bool>,

    /// Accept Ray's pushed events on --listen.
    #[arg(long, env = "ENABLE_EVENT_COLLECTOR", value_name = "BOOL", default_value = "true", value_parser = given(parse_bool), action = clap::ArgAction::Set)]
    pub enable_event_collector: Given<bool>,

    /// Tail Ray's export event files (`logs/export_events/event_EXPORT_*.log`) into the spool.
    #[arg(long, env = "RHC_ENABLE_EXPORT_EVENTS", value_name = "BOOL", default_value = "true", value_parser = given(parse_bool), action = clap::ArgAction::Set)]
    pub enable_export_events: Given<bool>,

    /// Time between log snapshots (files changed since their last upload).
    #[arg(long, env = "RHC_LOG_UPLOAD_INTERVAL", value_name = "DURATION", default_value = "60s", value_parser = given(parse_duration))]
    pub log_upload_interval: Given<Duration>,

    /// Cap on the bandwidth of log uploads, in bytes per second (0: no cap), so the sidecar
    /// never saturates the node's network; events are not counted against it.
    #[arg(long, env = "RHC_LOG_UPLOAD_MAX_BYTES_PER_SECOND", value_name = "SIZE", default_value = "0", value_parser = given(parse_size))]
    pub log_upload_max_bytes_per_second: Given<u64>,

    /// Append only the new bytes of a growing log where the store can (S3 and S3-compatible
    /// from 5 MiB, file://); false uploads whole files on the size-aware schedule everywhere.
    #[arg(long, env = "RHC_LOG_APPENDS", value_name = "BOOL", default_value = "true", value_parser = given(parse_bool), action = clap::ArgAction::Set)]
    pub log_appends: Given<bool>,

    /// A file holding the ingest token (16 to 256 of A-Z a-z 0-9 - . _ ~): Ray then posts to
    /// /v1/events/<token>, and every other events post is refused (403) before its body is
    /// read. The token may instead be given as RHC_INGEST_TOKEN.
    #[arg(long, env = "RHC_INGEST_TOKEN_FILE", value_name = "PATH")]
    pub ingest_token_file: Option<PathBuf>,

    /// Ray dashboard of the head, for endpoint snapshots and (last resort) the node id
    /// [default: http://localhost:8265, or KubeRay's FQ_RAY_IP and RAY_DASHBOARD_PORT].
    #[arg(long, env = "RAY_DASHBOARD_ADDRESS", value_name = "URL")]
    pub dashboard_address: Option<String>,

    /// Time between dashboard endpoint snapshots (head role).
    #[arg(long, env = "RAY_COLLECTOR_POLL_INTERVAL", value_name = "DURATION", default_value = "30s", value_parser = given(parse_duration))]
    pub endpoint_poll_interval: Given<Duration>,

    /// How events Ray sent with snake_case keys are stored: camel (protobuf's camelCase JSON of
    /// the same message, the only form KubeRay's history server reads) or preserve (as sent).
    #[arg(long, env = "RHC_EVENT_KEYS", value_name = "STYLE", default_value = "camel", value_parser = given(parse_event_keys))]
    pub event_keys: Given<EventKeys>,

    /// Log format: text or json (level from RUST_LOG, default info).
    #[arg(long, env = "RHC_LOG_FORMAT", value_name = "FORMAT", default_value = "text", value_parser = given(parse_log_format))]
    pub log_format: Given<String>,
}

/// Arguments of `inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// The bucket to read: a path, file:///dir, s3://bucket[/root], gs://bucket[/root] or
    /// az://container[/root] (credentials as for --storage).
    #[arg(value_name = "STORAGE")]
    pub storage: String,

    /// Extra key prefix inside the bucket, below the URL's path (KubeRay's STORAGE_ROOT_DIR).
    #[arg(
        long,
        env = "STORAGE_ROOT_DIR",
        value_name = "PREFIX",
        default_value = ""
    )]
    pub storage_root_dir: String,

    /// Only this RayCluster name.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,

    /// Only this Kubernetes namespace.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,

    /// Report on this session (`latest`: the newest by the time in its name).
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,

    /// Only this job (hex like 01000000, or Ray's base64 like AQAAAA==); needs --session.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,

    /// Only events at or after this time (RFC 3339, or YYYY-MM-DD[THH] in UTC).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,

    /// Only events before the end of this time (RFC 3339, or YYYY-MM-DD[THH] in UTC: the
    /// whole day or hour is included).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,

    /// One JSON document for scripts instead of tables.
    #[arg(long)]
    pub json: bool,

    /// Failed task attempts listed in the session report.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub failed_limit: usize,

    /// A task still pending this long before the session's events stop is reported as hung,
    /// with what it asked for against what the nodes offered.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub pending_after: std::time::Duration,

    /// Print a log from the bucket instead of the report: of a task (its last attempt's
    /// worker, only the attempt's own output when Ray reported where it is), an actor, a
    /// worker, or a node (its raylet.out). Needs --session.
    #[arg(long, value_name = "ID", requires = "session", conflicts_with_all = ["json", "timeline", "html"])]
    pub logs: Option<String>,

    /// With --logs: only the last N lines (read from the end of the object, not downloaded whole).
    #[arg(long, value_name = "N", requires = "logs")]
    pub tail: Option<usize>,

    /// With --logs: the stderr log (.err, raylet.err) instead of stdout (.out).
    #[arg(long, requires = "logs")]
    pub err: bool,

    /// Also write the session as a Chrome trace (JSON for Perfetto or chrome://tracing) to FILE.
    #[arg(long, value_name = "FILE", requires = "session")]
    pub timeline: Option<std::path::PathBuf>,

    /// Also write a self-contained HTML page (summary, failed tasks, Gantt chart) to FILE.
    #[arg(long, value_name = "FILE", requires = "session")]
    pub html: Option<std::path::PathBuf>,

    /// Print one Ray Train run in full instead of the report (by run id or name): every
    /// field of its settings, its status history, attempts and workers. Needs --session.
    #[arg(long, value_name = "RUN", requires = "session", conflicts_with_all = ["logs", "timeline", "html"])]
    pub train_run: Option<String>,

    /// Compare two Ray Train runs, each `[SESSION:]RUN` (a run id or name; the session as
    /// for --session, else --session's): the settings that differ, then the outcome. Exit 0
    /// when the settings are equal, 1 when they differ, 2 when they cannot be compared.
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with_all = ["logs", "timeline", "html", "train_run"])]
    pub compare_runs: Option<Vec<String>>,

    /// With --compare-runs: read B from this bucket instead (same forms, credentials and
    /// --storage-root-dir as STORAGE).
    #[arg(long, value_name = "STORAGE", requires = "compare_runs")]
    pub compare_storage: Option<String>,
}

/// `ray-history-collector serve`: the bucket over HTTP, with KubeRay's history-server API.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The bucket to serve: a path, file:///dir, s3://bucket[/root], gs://bucket[/root] or
    /// az://container[/root] (credentials as for the collector's --storage).
    #[arg(long, value_name = "URL")]
    pub storage: String,

    /// Extra key prefix inside the bucket, below the URL's path (KubeRay's STORAGE_ROOT_DIR).
    #[arg(
        long,
        env = "STORAGE_ROOT_DIR",
        value_name = "PREFIX",
        default_value = ""
    )]
    pub storage_root_dir: String,

    /// Address to listen on (KubeRay's history server port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Memory budget of the loaded sessions' indexes; the least recently used are dropped
    /// above it (about 110 bytes per task attempt: 1M attempts take about 110 MiB).
    #[arg(long, value_name = "SIZE", default_value = "512MiB", value_parser = crate::util::units::parse_size)]
    pub cache_bytes: u64,

    /// Ray's built dashboard frontend to serve beside the API (the ray wheel's
    /// ray/dashboard/client/build); it must hold index.html [default: none: API only].
    #[arg(long, value_name = "DIR")]
    pub dashboard_dir: Option<std::path::PathBuf>,
}
