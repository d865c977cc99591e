//! Command line and environment: every flag has an environment variable, and the KubeRay
//! collector's variable names are accepted where they mean the same thing.
//!
//! A bad value is refused at start with one line naming the flag (or variable) and value.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::contract::{id_to_hex, is_dns1123_subdomain, is_safe_segment, ClusterLayout, Owner};
use crate::events::upload::Compression;
use crate::storage::StorageSpec;

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

/// Parses a byte size: `1048576`, `64MiB`, `64Mi`, `64M` (binary), `64MB` (decimal), `1GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err("expected a size such as 1048576, 512KiB, 64MiB or 1GiB".into());
    }
    let n: u64 = num.parse().map_err(|_| "number too large".to_string())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} (use KiB, MiB, GiB, or KB, MB, GB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| "size too large".to_string())
}

/// Parses a duration in Go's syntax (what KubeRay's variables use): `5m`, `30s`, `1h30m`,
/// `500ms`, `5m0s`, `1.5s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || format!("expected a duration such as 30s, 5m, 1h30m or 500ms, got {t:?}");
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(err());
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if n_end == 0 {
            return Err(err());
        }
        let n: f64 = rest[..n_end].parse().map_err(|_| err())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += n * unit;
        rest = &rest[u_end..];
    }
    if !total.is_finite() || total > 1e9 {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(total))
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Ok(true),
        "0" | "f" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".into()),
    }
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
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Read back what collectors wrote to a bucket: clusters, sessions, jobs, tasks, Train runs.
    Inspect(crate::inspect::InspectArgs),
}

/// The collector's settings. Each flag also reads the environment variable shown.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Address to listen on for Ray's events [default: 127.0.0.1:8084, or port EVENTS_PORT].
    #[arg(long, env = "RHC_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Port on 127.0.0.1 when --listen is not given (KubeRay's variable).
    #[arg(long, env = "EVENTS_PORT", value_name = "PORT", hide = true)]
    pub events_port: Option<u16>,

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

    /// head writes the session markers that make sessions visible; worker does not.
    #[arg(long, env = "RAY_ROLE", value_name = "ROLE", default_value = "head", value_parser = parse_role)]
    pub role: Role,

    /// Local spool directory (keep it on a volume that outlives the container).
    #[arg(
        long,
        env = "RAY_COLLECTOR_EVENT_DATA_DIR",
        value_name = "DIR",
        default_value = "/tmp/ray/event-data"
    )]
    pub spool_dir: PathBuf,

    /// Seal and upload a segment this long after it was opened.
    #[arg(long, env = "RAY_COLLECTOR_EVENT_ROTATION_INTERVAL", value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub rotation_interval: Duration,

    /// Seal and upload a segment once it holds this many bytes [default: 64MiB; or RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB].
    #[arg(long, env = "RHC_MAX_SEGMENT_BYTES", value_name = "SIZE", value_parser = parse_size)]
    pub max_segment_bytes: Option<u64>,

    /// Disk budget of the spool; new requests get 503 above 90% of it [default: 1GiB; or RAY_COLLECTOR_EVENT_MAX_DISK_MB].
    #[arg(long, env = "RHC_MAX_SPOOL_BYTES", value_name = "SIZE", value_parser = parse_size)]
    pub max_spool_bytes: Option<u64>,

    /// Compression of uploaded event objects: gzip or none [default: gzip; or RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED].
    #[arg(long, env = "RHC_COMPRESSION", value_name = "ALGO", value_parser = parse_compression)]
    pub compression: Option<Compression>,

    /// On SIGTERM, seal and upload everything within this time, then exit.
    #[arg(long, env = "RHC_SHUTDOWN_TIMEOUT", value_name = "DURATION", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// Largest request body accepted (after gzip decoding); larger gets 413.
    #[arg(long, env = "RHC_MAX_BODY_BYTES", value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub max_body_bytes: u64,

    /// How many recent event ids are remembered to drop Ray's resent duplicates (0: off).
    #[arg(
        long,
        env = "RHC_DEDUP_WINDOW",
        value_name = "EVENTS",
        default_value_t = 262_144
    )]
    pub dedup_window: usize,

    /// Most segment files kept open at once; the least recently written are closed first.
    #[arg(long, env = "RHC_MAX_OPEN_SEGMENTS", value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_open_segments: u32,

    /// Event uploads in flight at once; each holds up to one part in memory.
    #[arg(long, env = "RHC_UPLOAD_CONCURRENCY", value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub upload_concurrency: u32,

    /// Multipart part size; objects larger than one part use multipart upload (at least 5MiB).
    #[arg(long, env = "RHC_UPLOAD_PART_BYTES", value_name = "SIZE", default_value = "8MiB", value_parser = parse_size)]
    pub upload_part_bytes: u64,

    /// Ray's temp root, holding `session_latest` and the session directories.
    #[arg(
        long,
        env = "RAY_TMP_ROOT",
        value_name = "DIR",
        default_value = "/tmp/ray"
    )]
    pub ray_tmp_dir: PathBuf,

    /// Upload the session logs (live snapshots, rotations, earlier sessions, final flush).
    #[arg(long, env = "ENABLE_LOG_COLLECTOR", value_name = "BOOL", default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_log_collector: bool,

    /// Accept Ray's pushed events on --listen.
    #[arg(long, env = "ENABLE_EVENT_COLLECTOR", value_name = "BOOL", default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_event_collector: bool,

    /// Tail Ray's export event files (`logs/export_events/event_EXPORT_*.log`) into the spool.
    #[arg(long, env = "RHC_ENABLE_EXPORT_EVENTS", value_name = "BOOL", default_value = "true", value_parser = parse_bool, action = clap::ArgAction::Set)]
    pub enable_export_events: bool,

    /// Time between log snapshots (files changed since their last upload).
    #[arg(long, env = "RHC_LOG_UPLOAD_INTERVAL", value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub log_upload_interval: Duration,

    /// Ray dashboard of the head, for endpoint snapshots and (last resort) the node id
    /// [default: http://localhost:8265, or KubeRay's FQ_RAY_IP and RAY_DASHBOARD_PORT].
    #[arg(long, env = "RAY_DASHBOARD_ADDRESS", value_name = "URL")]
    pub dashboard_address: Option<String>,

    /// Time between dashboard endpoint snapshots (head role).
    #[arg(long, env = "RAY_COLLECTOR_POLL_INTERVAL", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub endpoint_poll_interval: Duration,

    /// Log format: text or json (level from RUST_LOG, default info).
    #[arg(long, env = "RHC_LOG_FORMAT", value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// Everything the collector needs, resolved and checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bucket and root.
    pub storage: StorageSpec,
    /// Key layout.
    pub layout: ClusterLayout,
    /// This node's id in hex, if known.
    pub node_id: Option<String>,
    /// Head or worker.
    pub role: Role,
    /// Spool directory.
    pub spool_dir: PathBuf,
    /// Segment age limit.
    pub rotation_interval: Duration,
    /// Segment size limit.
    pub max_segment_bytes: u64,
    /// Spool disk budget.
    pub max_spool_bytes: u64,
    /// Upload compression.
    pub compression: Compression,
    /// Shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Body limit.
    pub max_body_bytes: u64,
    /// Dedup window size.
    pub dedup_window: usize,
    /// Open file limit of the spool.
    pub max_open_segments: usize,
    /// Parallel uploads.
    pub upload_concurrency: usize,
    /// Multipart part size.
    pub upload_part_bytes: usize,
    /// `json` or `text`.
    pub log_format: String,
    /// Ray's temp root.
    pub ray_tmp_dir: PathBuf,
    /// Log shipping on.
    pub enable_log_collector: bool,
    /// Event ingest on.
    pub enable_event_collector: bool,
    /// Export event tailing on.
    pub enable_export_events: bool,
    /// Log snapshot period.
    pub log_upload_interval: Duration,
    /// Dashboard URL.
    pub dashboard_address: String,
    /// Dashboard snapshot period.
    pub endpoint_poll_interval: Duration,
}

/// A configuration problem, printed as one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Settings {
    /// Resolves the command line against the environment (`env` is `std::env::var` in
    /// production, a map in tests).
    pub fn resolve(
        cli: RunArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let bad = |what: &str, value: &str, why: &str| {
            ConfigError(format!("invalid value {value:?} for {what}: {why}"))
        };
        let listen = cli.listen.unwrap_or_else(|| {
            SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                cli.events_port.unwrap_or(8084),
            )
        });

        let storage = match &cli.storage {
            Some(s) => StorageSpec::parse(s).map_err(|e| bad("--storage", s, &e.to_string()))?,
            None => {
                match StorageSpec::from_kuberay_env(env).map_err(|e| ConfigError(e.to_string()))? {
                    Some(s) => s,
                    None => StorageSpec::parse("./ray-history")
                        .map_err(|e| ConfigError(e.to_string()))?,
                }
            }
        };
        let storage = storage
            .with_extra_root(&cli.storage_root_dir)
            .map_err(|e| bad("--storage-root-dir", &cli.storage_root_dir, &e.to_string()))?;

        let cluster = cli.cluster_name.trim().to_string();
        if !is_dns1123_subdomain(&cluster) {
            return Err(bad(
                "--cluster-name",
                &cluster,
                "not a Kubernetes (DNS-1123) name",
            ));
        }
        let namespace = cli.cluster_namespace.trim().to_string();
        if !is_dns1123_subdomain(&namespace) {
            return Err(bad(
                "--cluster-namespace",
                &namespace,
                "not a Kubernetes (DNS-1123) name",
            ));
        }
        let owner_name = cli.owner_name.trim().to_string();
        let owner = match cli.owner_kind.trim().to_ascii_lowercase().as_str() {
            "" | "raycluster" => {
                if !owner_name.is_empty() {
                    return Err(ConfigError(format!(
                        "--owner-name {owner_name:?} needs --owner-kind rayjob or rayservice"
                    )));
                }
                Owner::RayCluster
            }
            kind @ ("rayjob" | "rayservice") => {
                if !is_dns1123_subdomain(&owner_name) {
                    return Err(bad(
                        "--owner-name",
                        &owner_name,
                        &format!(
                            "--owner-kind {kind} needs the owner's Kubernetes (DNS-1123) name"
                        ),
                    ));
                }
                if kind == "rayjob" {
                    Owner::RayJob(owner_name)
                } else {
                    Owner::RayService(owner_name)
                }
            }
            _ => {
                return Err(bad(
                    "--owner-kind",
                    &cli.owner_kind,
                    "expected rayjob, rayservice or empty",
                ))
            }
        };

        let node_id = match cli.node_id.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(id) => {
                let hex = id_to_hex(id).map_err(|e| bad("--node-id", id, &e.to_string()))?;
                Some(hex.as_str().to_string())
            }
        };

        let mb_env = |name: &str| -> Result<Option<u64>, ConfigError> {
            match env(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
            {
                None => Ok(None),
                Some(v) => match v.parse::<u64>() {
                    Ok(mb) if mb > 0 => Ok(Some(mb << 20)),
                    _ => Err(bad(name, &v, "expected a positive number of MB")),
                },
            }
        };
        let max_segment_bytes = match cli.max_segment_bytes {
            Some(v) => v,
            None => mb_env("RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB")?.unwrap_or(64 << 20),
        };
        let max_spool_bytes = match cli.max_spool_bytes {
            Some(v) => v,
            None => mb_env("RAY_COLLECTOR_EVENT_MAX_DISK_MB")?.unwrap_or(1 << 30),
        };
        let compression = match cli.compression {
            Some(c) => c,
            None => match env("RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED") {
                Some(v) if !v.trim().is_empty() => {
                    if parse_bool(&v)
                        .map_err(|e| bad("RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED", &v, &e))?
                    {
                        Compression::Gzip
                    } else {
                        Compression::None
                    }
                }
                _ => Compression::Gzip,
            },
        };
        if max_segment_bytes < 4096 {
            return Err(bad(
                "--max-segment-bytes",
                &max_segment_bytes.to_string(),
                "must be at least 4KiB",
            ));
        }
        if max_spool_bytes < 1 << 20 {
            return Err(bad(
                "--max-spool-bytes",
                &max_spool_bytes.to_string(),
                "must be at least 1MiB",
            ));
        }
        if cli.rotation_interval < Duration::from_secs(1) {
            return Err(bad(
                "--rotation-interval",
                &format!("{:?}", cli.rotation_interval),
                "must be at least 1s",
            ));
        }
        if cli.max_body_bytes < 1024 {
            return Err(bad(
                "--max-body-bytes",
                &cli.max_body_bytes.to_string(),
                "must be at least 1KiB",
            ));
        }
        if cli.upload_part_bytes < 5 << 20 || cli.upload_part_bytes > 1 << 30 {
            return Err(bad(
                "--upload-part-bytes",
                &cli.upload_part_bytes.to_string(),
                "must be between 5MiB (the S3 minimum) and 1GiB",
            ));
        }
        if !cli.enable_log_collector && !cli.enable_event_collector {
            return Err(ConfigError(
                "--enable-log-collector and --enable-event-collector are both false: nothing to do"
                    .into(),
            ));
        }
        if cli.log_upload_interval < Duration::from_secs(1) {
            return Err(bad(
                "--log-upload-interval",
                &format!("{:?}", cli.log_upload_interval),
                "must be at least 1s",
            ));
        }
        if cli.endpoint_poll_interval < Duration::from_secs(1) {
            return Err(bad(
                "--endpoint-poll-interval",
                &format!("{:?}", cli.endpoint_poll_interval),
                "must be at least 1s",
            ));
        }
        // KubeRay's workers reach the head's dashboard through FQ_RAY_IP.
        let dashboard_raw = match &cli.dashboard_address {
            Some(a) => a.clone(),
            None => match env("FQ_RAY_IP")
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
            {
                Some(host) => {
                    let with_scheme = if host.contains("://") {
                        host
                    } else {
                        format!("http://{host}")
                    };
                    let after_scheme = with_scheme.split("://").nth(1).unwrap_or_default();
                    if after_scheme.contains(':') {
                        with_scheme
                    } else {
                        let port = env("RAY_DASHBOARD_PORT").unwrap_or_else(|| "8265".into());
                        format!("{with_scheme}:{}", port.trim())
                    }
                }
                None => "http://localhost:8265".into(),
            },
        };
        let dashboard_address = dashboard_raw.trim().trim_end_matches('/').to_string();
        if !(dashboard_address.starts_with("http://") || dashboard_address.starts_with("https://"))
        {
            return Err(bad(
                "--dashboard-address",
                &dashboard_raw,
                "expected an http:// or https:// URL",
            ));
        }
        if cli.spool_dir.as_os_str().is_empty() {
            return Err(bad("--spool-dir", "", "must not be empty"));
        }

        Ok(Settings {
            listen,
            storage,
            layout: ClusterLayout {
                root: String::new(),
                namespace,
                cluster,
                owner,
            },
            node_id,
            role: cli.role,
            spool_dir: cli.spool_dir,
            rotation_interval: cli.rotation_interval,
            max_segment_bytes,
            max_spool_bytes,
            compression,
            shutdown_timeout: cli.shutdown_timeout,
            max_body_bytes: cli.max_body_bytes,
            dedup_window: cli.dedup_window,
            max_open_segments: cli.max_open_segments as usize,
            upload_concurrency: cli.upload_concurrency as usize,
            upload_part_bytes: cli.upload_part_bytes as usize,
            log_format: cli.log_format,
            ray_tmp_dir: cli.ray_tmp_dir,
            enable_log_collector: cli.enable_log_collector,
            enable_event_collector: cli.enable_event_collector,
            enable_export_events: cli.enable_export_events,
            log_upload_interval: cli.log_upload_interval,
            dashboard_address,
            endpoint_poll_interval: cli.endpoint_poll_interval,
        })
        .map(|mut s| {
            s.layout.root = s.storage.root.clone();
            s
        })
    }

    /// Name of this collector's quarantine directory: the node id, else the pod name.
    pub fn quarantine_node(&self, env: &dyn Fn(&str) -> Option<String>) -> String {
        if let Some(n) = &self.node_id {
            return n.clone();
        }
        env("HOSTNAME")
            .filter(|h| is_safe_segment(h))
            .unwrap_or_else(|| "unknown-node".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, String> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut argv = vec!["ray-history-collector"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        Settings::resolve(cli.run, &|k| env.get(k).cloned()).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_run_locally() {
        let s = resolve(&[], &[]).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:8084");
        assert_eq!(s.storage.to_string(), "file://./ray-history");
        assert_eq!(s.compression, Compression::Gzip);
        assert_eq!(s.max_segment_bytes, 64 << 20);
        assert_eq!(s.max_spool_bytes, 1 << 30);
        assert_eq!(s.role, Role::Head);
        assert_eq!(s.rotation_interval, Duration::from_secs(300));
        assert_eq!(s.shutdown_timeout, Duration::from_secs(25));
    }

    #[test]
    fn kuberay_variables_carry_over() {
        let s = resolve(
            &["--events-port", "9999"],
            &[
                ("RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB", "100"),
                ("RAY_COLLECTOR_EVENT_MAX_DISK_MB", "200"),
                ("RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED", "false"),
                ("STORAGE_BACKEND", "s3"),
                ("S3_BUCKET", "hist"),
            ],
        )
        .unwrap();
        assert_eq!(s.listen.port(), 9999);
        assert_eq!(s.max_segment_bytes, 100 << 20);
        assert_eq!(s.max_spool_bytes, 200 << 20);
        assert_eq!(s.compression, Compression::None);
        assert_eq!(s.storage.to_string(), "s3://hist");
        let s = resolve(
            &[
                "--owner-kind",
                "RayJob",
                "--owner-name",
                "job-a",
                "--storage-root-dir",
                "r",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(s.layout.owner, Owner::RayJob("job-a".into()));
        assert_eq!(s.layout.root, "r");
        assert_eq!(s.storage.root, "r");
    }

    #[test]
    fn dashboard_address_from_kuberay_variables() {
        let s = resolve(&[], &[("FQ_RAY_IP", "rc-head-svc.ns.svc.cluster.local")]).unwrap();
        assert_eq!(
            s.dashboard_address,
            "http://rc-head-svc.ns.svc.cluster.local:8265"
        );
        let s = resolve(
            &[],
            &[("FQ_RAY_IP", "https://h"), ("RAY_DASHBOARD_PORT", "9000")],
        )
        .unwrap();
        assert_eq!(s.dashboard_address, "https://h:9000");
        let s = resolve(
            &["--dashboard-address", "http://x:1/"],
            &[("FQ_RAY_IP", "h")],
        )
        .unwrap();
        assert_eq!(s.dashboard_address, "http://x:1");
        assert_eq!(
            resolve(&[], &[]).unwrap().dashboard_address,
            "http://localhost:8265"
        );
    }

    #[test]
    fn bad_values_are_named() {
        for (args, needle) in [
            (vec!["--max-spool-bytes", "12x"], "--max-spool-bytes"),
            (vec!["--rotation-interval", "soon"], "--rotation-interval"),
            (vec!["--role", "boss"], "--role"),
            (vec!["--compression", "zstd"], "--compression"),
            (vec!["--cluster-name", "Bad_Name"], "--cluster-name"),
            (vec!["--owner-kind", "rayjob"], "--owner-name"),
            (vec!["--owner-name", "x"], "--owner-name"),
            (
                vec!["--owner-kind", "deployment", "--owner-name", "x"],
                "--owner-kind",
            ),
            (vec!["--node-id", "../x"], "--node-id"),
            (vec!["--storage", "ftp://x"], "--storage"),
            (vec!["--upload-part-bytes", "1MiB"], "--upload-part-bytes"),
            (
                vec!["--enable-log-collector", "maybe"],
                "--enable-log-collector",
            ),
            (
                vec![
                    "--enable-log-collector",
                    "false",
                    "--enable-event-collector",
                    "false",
                ],
                "both false",
            ),
            (
                vec!["--dashboard-address", "localhost:8265"],
                "--dashboard-address",
            ),
        ] {
            let e = resolve(&args, &[]).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
        let e = resolve(&[], &[("RAY_COLLECTOR_EVENT_MAX_DISK_MB", "lots")]).unwrap_err();
        assert!(
            e.contains("RAY_COLLECTOR_EVENT_MAX_DISK_MB") && e.contains("lots"),
            "{e}"
        );
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_size("5MB").unwrap(), 5_000_000);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert!(
            parse_size("MiB").is_err()
                && parse_size("1 parsec").is_err()
                && parse_size("-1").is_err()
        );
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("5m0s").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        for bad in ["", "m", "5x", "-5s", "5 m", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
