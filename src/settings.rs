//! Flags + environment → [`Settings`]: everything the collector will use, read and checked
//! before anything binds, opens or spawns.
//!
//! This is the only place that reads the process environment for the running collector
//! (through the `env` function it is given, so tests pass a map): the KubeRay variables that
//! stand in for flags, the storage variables and client, the dashboard address, token and
//! extra endpoints, `POD_IP` and `HOSTNAME`. A bad value is refused with one line naming the
//! flag or variable and the value; `main` prints it and exits 2 with nothing started.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{Given, Role, RunArgs};
use crate::contract::{id_to_hex, is_dns1123_subdomain, is_safe_segment, ClusterLayout, Owner};
use crate::dashboard::DashboardConfig;
use crate::events::http::IngestToken;
use crate::events::upload::Compression;
use crate::storage::gzip::GzipLevel;
use crate::storage::{self, StorageSpec};
use crate::util::units::parse_bool;

/// The largest `--max-body-bytes`: a body, with its events converted to camelCase beside it,
/// must stay addressable by the spool's compact spans (`events::spool::MAX_SPAN_BODY`).
const MAX_BODY_LIMIT: u64 = 512 << 20;

/// Everything the collector needs, resolved and checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Listen address: events, and the read-only endpoints.
    pub listen: SocketAddr,
    /// `--metrics-listen`: the read-only listener (health, readiness, metrics), if any.
    pub metrics_listen: Option<SocketAddr>,
    /// Bucket and root.
    pub storage: StorageSpec,
    /// The storage client, configured from `storage` and its variables; not opened yet.
    pub store: storage::Configured,
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
    /// `--upload-window`: an acknowledged event is in the bucket within this time.
    pub upload_window: Duration,
    /// Segment size limit.
    pub max_segment_bytes: u64,
    /// Spool disk budget.
    pub max_spool_bytes: u64,
    /// Upload compression.
    pub compression: Compression,
    /// gzip level, when `compression` is gzip.
    pub gzip_level: GzipLevel,
    /// Shutdown deadline.
    pub shutdown_timeout: Duration,
    /// Body limit.
    pub max_body_bytes: u64,
    /// Most times a gzip body may decode to its size as sent, past its first MiB (0: no bound).
    pub max_gzip_ratio: u64,
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
    /// How snake_case events are stored.
    pub event_keys: crate::events::http::EventKeys,
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
    /// Log lane bandwidth cap, bytes per second (0: none).
    pub log_upload_max_bytes_per_second: u64,
    /// Appends to log objects where the store can.
    pub log_appends: bool,
    /// `--ingest-token-file` / `RHC_INGEST_TOKEN`: the token that tells Ray's event posts
    /// from any other client's (never printed: its `Debug` is redacted).
    pub ingest_token: Option<IngestToken>,
    /// The head's dashboard: address, snapshot period, token, extra endpoints.
    pub dashboard: DashboardConfig,
    /// `POD_IP`: this pod's address, to find the node id in the dashboard's node list.
    pub pod_ip: Option<String>,
    /// Name of this collector's quarantine directory: the node id, else the pod name.
    pub quarantine_node: String,
    /// Things worth a warning once logging is up (the settings are usable as they are).
    pub warnings: Vec<String>,
}

/// A configuration problem, printed as one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// `--upload-window`'s default: an acknowledged event is in the bucket within 10 s (or the
/// rotation interval, if that is shorter).
pub const DEFAULT_UPLOAD_WINDOW: Duration = Duration::from_secs(10);

/// Which bad values stop the collector. A value that would send data to the wrong place or
/// leave nothing working (storage, cluster identity, node id, listen address, spool dir,
/// tokens named explicitly, both collectors off) is refused: exit 2, one line. A tuning value
/// from a variable (intervals, sizes, compression, limits, switches, formats: KubeRay's
/// `RAY_COLLECTOR_*`, `EVENTS_PORT`, `ENABLE_*` and our `RHC_*` alike) is replaced by its
/// default with a warning naming the variable, as KubeRay's collector does, so a manifest
/// cannot keep the Ray pod from starting behind the sidecar's startup probe for a value that
/// has a safe default. The same value given as a flag is refused: it was typed on purpose.
struct Tolerant<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    warnings: Vec<String>,
}

/// Any value the parser accepted will do.
fn any<T>(_: &T) -> Result<(), String> {
    Ok(())
}

/// `Ok` when `v` is at least `min` (shown as `shown`).
fn at_least(v: u64, min: u64, shown: &str) -> Result<(), String> {
    if v < min {
        Err(format!("must be at least {shown}"))
    } else {
        Ok(())
    }
}

impl Tolerant<'_> {
    /// `given` (flag `flag` or variable `var`) if it parses and passes `check`; else the
    /// default when `var` holds the bad value, an error naming the flag otherwise.
    fn value<T>(
        &mut self,
        flag: &str,
        var: &str,
        given: Given<T>,
        check: impl Fn(&T) -> Result<(), String>,
        default: T,
        shown: &str,
    ) -> Result<T, ConfigError> {
        let why = match given.parsed {
            Ok(v) => match check(&v) {
                Ok(()) => return Ok(v),
                Err(why) => why,
            },
            Err(why) => why,
        };
        if (self.env)(var).is_some_and(|v| v.trim() == given.raw.trim()) {
            self.warn(var, &given.raw, &why, shown);
            Ok(default)
        } else {
            Err(ConfigError(format!(
                "invalid value {:?} for {flag}: {why}",
                given.raw
            )))
        }
    }

    /// A variable with no flag of its own: `parse`d when set, the default with a warning
    /// when bad, the default when unset or empty.
    fn var<T>(
        &mut self,
        var: &str,
        parse: impl Fn(&str) -> Result<T, String>,
        default: T,
        shown: &str,
    ) -> T {
        let Some(raw) = (self.env)(var).filter(|v| !v.trim().is_empty()) else {
            return default;
        };
        match parse(raw.trim()) {
            Ok(v) => v,
            Err(why) => {
                self.warn(var, &raw, &why, shown);
                default
            }
        }
    }

    fn warn(&mut self, var: &str, raw: &str, why: &str, shown: &str) {
        self.warnings.push(format!(
            "{var}={raw:?} is not usable ({why}): using the default, {shown}"
        ));
    }
}

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
        let mut tolerant = Tolerant {
            env,
            warnings: Vec::new(),
        };
        let events_port = match cli.events_port {
            Some(p) => {
                tolerant.value("--events-port", "EVENTS_PORT", p, |_| Ok(()), 8084, "8084")?
            }
            None => 8084,
        };
        let listen = cli
            .listen
            .unwrap_or_else(|| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), events_port));
        if let Some(m) = cli.metrics_listen {
            if m == listen
                || (m.port() == listen.port()
                    && (m.ip().is_unspecified() || listen.ip().is_unspecified()))
            {
                return Err(bad(
                    "--metrics-listen",
                    &m.to_string(),
                    &format!("the read-only listener needs a port of its own; events listen on {listen} (--listen)"),
                ));
            }
        }

        // KubeRay's JSON storage configuration stands in for the storage variables it names.
        let storage_env =
            storage::with_kuberay_config_file(env).map_err(|e| ConfigError(e.to_string()))?;
        let storage_env: &dyn Fn(&str) -> Option<String> = &*storage_env;
        let mut early_warnings = Vec::new();
        let storage = match &cli.storage {
            Some(s) => {
                if env("STORAGE_BACKEND").is_some_and(|v| !v.trim().is_empty()) {
                    early_warnings.push(format!(
                        "--storage {s} is given: STORAGE_BACKEND and the bucket it names are not used"
                    ));
                }
                StorageSpec::parse(s).map_err(|e| bad("--storage", s, &e.to_string()))?
            }
            None => {
                match StorageSpec::from_kuberay_env(storage_env)
                    .map_err(|e| ConfigError(e.to_string()))?
                {
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

        let mb = |v: &str| match v.parse::<u64>() {
            Ok(mb) if mb > 0 && mb <= 1 << 30 => Ok(mb << 20),
            _ => Err("expected a positive number of MB".to_string()),
        };
        let at_least_1s = |d: &Duration| {
            if *d < Duration::from_secs(1) {
                Err("must be at least 1s".to_string())
            } else {
                Ok(())
            }
        };
        let max_segment_bytes = match cli.max_segment_bytes {
            Some(g) => tolerant.value(
                "--max-segment-bytes",
                "RHC_MAX_SEGMENT_BYTES",
                g,
                |v: &u64| at_least(*v, 4096, "4KiB"),
                64 << 20,
                "64MiB",
            )?,
            None => tolerant.var(
                "RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB",
                mb,
                64 << 20,
                "64MiB",
            ),
        };
        let max_spool_bytes = match cli.max_spool_bytes {
            Some(g) => tolerant.value(
                "--max-spool-bytes",
                "RHC_MAX_SPOOL_BYTES",
                g,
                |v: &u64| at_least(*v, 1 << 20, "1MiB"),
                1 << 30,
                "1GiB",
            )?,
            None => tolerant.var("RAY_COLLECTOR_EVENT_MAX_DISK_MB", mb, 1 << 30, "1GiB"),
        };
        let compression = match cli.compression {
            Some(g) => tolerant.value(
                "--compression",
                "RHC_COMPRESSION",
                g,
                any,
                Compression::Gzip,
                "gzip",
            )?,
            None => tolerant.var(
                "RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED",
                |v| {
                    parse_bool(v).map(|on| {
                        if on {
                            Compression::Gzip
                        } else {
                            Compression::None
                        }
                    })
                },
                Compression::Gzip,
                "gzip",
            ),
        };
        let gzip_level = match cli.gzip_level {
            Some(g) => Some(tolerant.value(
                "--gzip-level",
                "RHC_GZIP_LEVEL",
                g,
                any,
                GzipLevel::default(),
                "1",
            )?),
            None => None,
        };
        let gzip_level = match (compression, gzip_level) {
            (Compression::None, Some(level)) => {
                let why = "applies only to gzip, but compression is none";
                match env("RHC_GZIP_LEVEL") {
                    Some(raw) => {
                        tolerant.warn("RHC_GZIP_LEVEL", &raw, why, "not used");
                        GzipLevel::default()
                    }
                    None => return Err(bad("--gzip-level", &level.to_string(), why)),
                }
            }
            (_, level) => level.unwrap_or_default(),
        };
        let rotation_interval = tolerant.value(
            "--rotation-interval",
            "RAY_COLLECTOR_EVENT_ROTATION_INTERVAL",
            cli.rotation_interval,
            at_least_1s,
            Duration::from_secs(300),
            "5m",
        )?;
        // Strict, flag or variable alike: a window the operator set and we did not keep would
        // promise a loss bound the collector does not give.
        let upload_window = match cli.upload_window {
            None => DEFAULT_UPLOAD_WINDOW.min(rotation_interval),
            Some(given) => match given.parsed {
                Ok(v) if v >= Duration::from_secs(1) && v <= rotation_interval => v,
                Ok(_) => {
                    return Err(ConfigError(format!(
                        "invalid value {:?} for --upload-window (RHC_UPLOAD_WINDOW): must be between 1s and the rotation interval ({}s)",
                        given.raw,
                        rotation_interval.as_secs_f64()
                    )))
                }
                Err(why) => {
                    return Err(ConfigError(format!(
                        "invalid value {:?} for --upload-window (RHC_UPLOAD_WINDOW): {why}",
                        given.raw
                    )))
                }
            },
        };
        let shutdown_timeout = tolerant.value(
            "--shutdown-timeout",
            "RHC_SHUTDOWN_TIMEOUT",
            cli.shutdown_timeout,
            any,
            Duration::from_secs(25),
            "25s",
        )?;
        let max_body_bytes = tolerant.value(
            "--max-body-bytes",
            "RHC_MAX_BODY_BYTES",
            cli.max_body_bytes,
            |v: &u64| {
                if *v < 1024 || *v > MAX_BODY_LIMIT {
                    Err("must be between 1KiB and 512MiB".to_string())
                } else {
                    Ok(())
                }
            },
            64 << 20,
            "64MiB",
        )?;
        let upload_part_bytes = tolerant.value(
            "--upload-part-bytes",
            "RHC_UPLOAD_PART_BYTES",
            cli.upload_part_bytes,
            |v: &u64| {
                if *v < 5 << 20 || *v > 1 << 30 {
                    Err("must be between 5MiB (the S3 minimum) and 1GiB".to_string())
                } else {
                    Ok(())
                }
            },
            8 << 20,
            "8MiB",
        )?;
        let max_gzip_ratio = tolerant.value(
            "--max-gzip-ratio",
            "RHC_MAX_GZIP_RATIO",
            cli.max_gzip_ratio,
            any,
            crate::events::http::DEFAULT_MAX_GZIP_RATIO,
            "100",
        )?;
        let dedup_window = tolerant.value(
            "--dedup-window",
            "RHC_DEDUP_WINDOW",
            cli.dedup_window,
            any,
            262_144,
            "262144",
        )?;
        let max_open_segments = tolerant.value(
            "--max-open-segments",
            "RHC_MAX_OPEN_SEGMENTS",
            cli.max_open_segments,
            any,
            512,
            "512",
        )?;
        let upload_concurrency = tolerant.value(
            "--upload-concurrency",
            "RHC_UPLOAD_CONCURRENCY",
            cli.upload_concurrency,
            any,
            2,
            "2",
        )?;
        let enable_export_events = tolerant.value(
            "--enable-export-events",
            "RHC_ENABLE_EXPORT_EVENTS",
            cli.enable_export_events,
            any,
            true,
            "true",
        )?;
        let log_upload_interval = tolerant.value(
            "--log-upload-interval",
            "RHC_LOG_UPLOAD_INTERVAL",
            cli.log_upload_interval,
            at_least_1s,
            Duration::from_secs(60),
            "60s",
        )?;
        let log_upload_max_bytes_per_second = tolerant.value(
            "--log-upload-max-bytes-per-second",
            "RHC_LOG_UPLOAD_MAX_BYTES_PER_SECOND",
            cli.log_upload_max_bytes_per_second,
            any,
            0,
            "0 (no cap)",
        )?;
        let log_appends = tolerant.value(
            "--log-appends",
            "RHC_LOG_APPENDS",
            cli.log_appends,
            any,
            true,
            "true",
        )?;
        let event_keys = tolerant.value(
            "--event-keys",
            "RHC_EVENT_KEYS",
            cli.event_keys,
            any,
            crate::events::http::EventKeys::Camel,
            "camel",
        )?;
        let log_format = tolerant.value(
            "--log-format",
            "RHC_LOG_FORMAT",
            cli.log_format,
            any,
            "text".to_string(),
            "text",
        )?;
        let enable_log_collector = tolerant.value(
            "--enable-log-collector",
            "ENABLE_LOG_COLLECTOR",
            cli.enable_log_collector,
            any,
            true,
            "true",
        )?;
        let enable_event_collector = tolerant.value(
            "--enable-event-collector",
            "ENABLE_EVENT_COLLECTOR",
            cli.enable_event_collector,
            any,
            true,
            "true",
        )?;
        if !enable_log_collector && !enable_event_collector {
            return Err(ConfigError(
                "--enable-log-collector and --enable-event-collector are both false: nothing to do"
                    .into(),
            ));
        }
        let endpoint_poll_interval = tolerant.value(
            "--endpoint-poll-interval",
            "RAY_COLLECTOR_POLL_INTERVAL",
            cli.endpoint_poll_interval,
            at_least_1s,
            Duration::from_secs(30),
            "30s",
        )?;
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
        let ingest_token = ingest_token(cli.ingest_token_file.as_deref(), env)?;
        let (dashboard, mut warnings) =
            DashboardConfig::from_env(dashboard_address, endpoint_poll_interval, env)
                .map_err(|e| ConfigError(e.to_string()))?;
        let store = storage::configure(&storage, storage_env)
            .map_err(|e| ConfigError(format!("storage {storage}: {e}")))?;
        let pod_ip = env("POD_IP")
            .map(|ip| ip.trim().to_string())
            .filter(|ip| !ip.is_empty());
        if let Some(ip) = &pod_ip {
            if ip.parse::<IpAddr>().is_err() {
                return Err(bad("POD_IP", ip, "not an IP address"));
            }
        }
        let quarantine_node = match &node_id {
            Some(n) => n.clone(),
            None => env("HOSTNAME")
                .filter(|h| is_safe_segment(h))
                .unwrap_or_else(|| "unknown-node".into()),
        };
        let root = storage.root.clone();
        if env("AWS_S3ID").is_some() && env("AWS_ACCESS_KEY_ID").is_none() {
            early_warnings.push(
                "AWS_S3ID (KubeRay's name) is not read: set AWS_ACCESS_KEY_ID, \
                 AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN for S3 keys"
                    .to_string(),
            );
        }
        // KubeRay defaults to worker. Here a head without markers would be invisible in the
        // history server, while a worker acting as head only writes the same empty marker
        // again and polls the dashboard: so head, said out loud.
        let role = match cli.role {
            Some(r) => r,
            None => {
                early_warnings.push(
                    "RAY_ROLE (--role) is not set: acting as head (session markers, dashboard \
                     snapshots); set RAY_ROLE=worker on worker pods, as KubeRay's manifests do"
                        .to_string(),
                );
                Role::Head
            }
        };
        warnings.splice(0..0, early_warnings.into_iter().chain(tolerant.warnings));

        Ok(Settings {
            listen,
            metrics_listen: cli.metrics_listen,
            storage,
            store,
            layout: ClusterLayout {
                root,
                namespace,
                cluster,
                owner,
            },
            node_id,
            role,
            spool_dir: cli.spool_dir,
            rotation_interval,
            upload_window,
            max_segment_bytes,
            max_spool_bytes,
            compression,
            gzip_level,
            shutdown_timeout,
            max_body_bytes,
            max_gzip_ratio,
            dedup_window,
            max_open_segments: max_open_segments as usize,
            upload_concurrency: upload_concurrency as usize,
            upload_part_bytes: upload_part_bytes as usize,
            log_format,
            event_keys,
            ray_tmp_dir: cli.ray_tmp_dir,
            enable_log_collector,
            enable_event_collector,
            enable_export_events,
            log_upload_interval,
            log_upload_max_bytes_per_second,
            log_appends,
            ingest_token,
            dashboard,
            pod_ip,
            quarantine_node,
            warnings,
        })
    }
}

/// The ingest token, from `--ingest-token-file` (`RHC_INGEST_TOKEN_FILE`) or `RHC_INGEST_TOKEN`
/// (not both); none when neither is set (an empty variable is unset). A token named but
/// unusable is refused: a collector that accepted every post while Ray's manifest carries a
/// token, or refused Ray's, would fail silently. Messages never show the token.
fn ingest_token(
    file: Option<&std::path::Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<IngestToken>, ConfigError> {
    let var = env("RHC_INGEST_TOKEN").filter(|v| !v.trim().is_empty());
    match (file, var) {
        (Some(_), Some(_)) => Err(ConfigError(
            "both --ingest-token-file (RHC_INGEST_TOKEN_FILE) and RHC_INGEST_TOKEN are set: give the ingest token one way".into(),
        )),
        (Some(path), None) => {
            let raw = std::fs::read_to_string(path).map_err(|e| {
                ConfigError(format!(
                    "--ingest-token-file {}: cannot read it: {e}",
                    path.display()
                ))
            })?;
            IngestToken::parse(&raw).map(Some).map_err(|why| {
                ConfigError(format!("--ingest-token-file {}: {why}", path.display()))
            })
        }
        (None, Some(raw)) => IngestToken::parse(&raw)
            .map(Some)
            .map_err(|why| ConfigError(format!("RHC_INGEST_TOKEN: {why}"))),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;
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
        assert_eq!(s.gzip_level, GzipLevel::FASTEST);
        assert_eq!(s.max_segment_bytes, 64 << 20);
        assert_eq!(s.max_spool_bytes, 1 << 30);
        assert_eq!(s.role, Role::Head);
        assert!(
            s.warnings.iter().any(|w| w.contains("RAY_ROLE")),
            "{:?}",
            s.warnings
        );
        assert_eq!(s.rotation_interval, Duration::from_secs(300));
        assert_eq!(s.shutdown_timeout, Duration::from_secs(25));
    }

    #[test]
    fn the_read_only_listener_is_optional_and_needs_its_own_port() {
        assert_eq!(resolve(&[], &[]).unwrap().metrics_listen, None);
        let s = resolve(&["--metrics-listen", "0.0.0.0:8085"], &[]).unwrap();
        assert_eq!(
            s.metrics_listen.map(|a| a.to_string()).as_deref(),
            Some("0.0.0.0:8085")
        );
        for clash in ["127.0.0.1:8084", "0.0.0.0:8084"] {
            let e = resolve(&["--metrics-listen", clash], &[]).unwrap_err();
            assert!(
                e.contains("--metrics-listen") && e.contains("port of its own"),
                "{e}"
            );
        }
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
        let s = resolve(&["--gzip-level", " 6 "], &[]).unwrap();
        assert_eq!((s.compression, s.gzip_level.get()), (Compression::Gzip, 6));
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
            s.dashboard.address,
            "http://rc-head-svc.ns.svc.cluster.local:8265"
        );
        let s = resolve(
            &[],
            &[("FQ_RAY_IP", "https://h"), ("RAY_DASHBOARD_PORT", "9000")],
        )
        .unwrap();
        assert_eq!(s.dashboard.address, "https://h:9000");
        let s = resolve(
            &["--dashboard-address", "http://x:1/"],
            &[("FQ_RAY_IP", "h")],
        )
        .unwrap();
        assert_eq!(s.dashboard.address, "http://x:1");
        assert_eq!(
            resolve(&[], &[]).unwrap().dashboard.address,
            "http://localhost:8265"
        );
    }

    /// The ingest token from a file or `RHC_INGEST_TOKEN`, checked, never shown in an error.
    #[test]
    fn the_ingest_token_is_read_checked_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "tok-0123456789abcdef\n").unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "tok-0123456789\n").unwrap();
        let odd = dir.path().join("odd");
        std::fs::write(&odd, "tok-0123456789abcdef/secret\n").unwrap();
        let file = |p: &std::path::Path| p.to_str().unwrap().to_string();
        assert!(resolve(&[], &[]).unwrap().ingest_token.is_none());
        assert!(resolve(&[], &[("RHC_INGEST_TOKEN", " ")])
            .unwrap()
            .ingest_token
            .is_none());
        let s = resolve(&["--ingest-token-file", &file(&good)], &[]).unwrap();
        assert_eq!(
            s.ingest_token.as_ref().map(|t| t.expose()),
            Some("tok-0123456789abcdef")
        );
        assert!(!format!("{s:?}").contains("0123456789abcdef"));
        let s = resolve(&[], &[("RHC_INGEST_TOKEN", "tok-0123456789abcdef")]).unwrap();
        assert_eq!(
            s.ingest_token.as_ref().map(|t| t.expose()),
            Some("tok-0123456789abcdef")
        );
        for (args, env, needle) in [
            (
                vec!["--ingest-token-file", "/nonexistent/token"],
                vec![],
                "cannot read it",
            ),
            (
                vec!["--ingest-token-file", file(&short).leak()],
                vec![],
                "has 14 bytes",
            ),
            (
                vec!["--ingest-token-file", file(&odd).leak()],
                vec![],
                "byte 21",
            ),
            (
                vec![],
                vec![("RHC_INGEST_TOKEN", "tok 0123456789abcdef")],
                "RHC_INGEST_TOKEN: byte 4",
            ),
            (
                vec!["--ingest-token-file", file(&good).leak()],
                vec![("RHC_INGEST_TOKEN", "tok-0123456789abcdef")],
                "both",
            ),
        ] {
            let e = resolve(&args, &env).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
            assert!(!e.contains("0123456789"), "{e}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        for (args, needle) in [
            (vec!["--max-spool-bytes", "12x"], "--max-spool-bytes"),
            (vec!["--rotation-interval", "soon"], "--rotation-interval"),
            (vec!["--role", "boss"], "--role"),
            (vec!["--compression", "zstd"], "--compression"),
            (vec!["--gzip-level", "0"], "--gzip-level"),
            (vec!["--gzip-level", "10"], "--gzip-level"),
            (vec!["--gzip-level", "fast"], "--gzip-level"),
            (
                vec!["--compression", "none", "--gzip-level", "6"],
                "applies only to gzip",
            ),
            (vec!["--dedup-window", "16777217"], "--dedup-window"),
            (vec!["--dedup-window", "lots"], "--dedup-window"),
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
        // The same bad values from KubeRay's variables: the default, and a warning naming
        // the variable.
        // (clap reads the process environment, not the map: a variable clap reads is given
        // here as its flag too, as clap would hand it over.)
        for (flag, var, value, check) in [
            ("", "RAY_COLLECTOR_EVENT_MAX_DISK_MB", "lots", "1GiB"),
            (
                "",
                "RAY_COLLECTOR_EVENT_COMPRESSION_ENABLED",
                "maybe",
                "gzip",
            ),
            (
                "--endpoint-poll-interval",
                "RAY_COLLECTOR_POLL_INTERVAL",
                "0",
                "30s",
            ),
            (
                "--rotation-interval",
                "RAY_COLLECTOR_EVENT_ROTATION_INTERVAL",
                "soon",
                "5m",
            ),
            ("--events-port", "EVENTS_PORT", "80845", "8084"),
            (
                "--enable-log-collector",
                "ENABLE_LOG_COLLECTOR",
                "yes please",
                "true",
            ),
            ("--max-spool-bytes", "RHC_MAX_SPOOL_BYTES", "12x", "1GiB"),
            ("--max-body-bytes", "RHC_MAX_BODY_BYTES", "1GiB", "64MiB"),
            ("--upload-concurrency", "RHC_UPLOAD_CONCURRENCY", "0", "2"),
            ("--log-format", "RHC_LOG_FORMAT", "yaml", "text"),
            (
                "--log-upload-interval",
                "RHC_LOG_UPLOAD_INTERVAL",
                "0s",
                "60s",
            ),
        ] {
            let args: Vec<&str> = if flag.is_empty() {
                vec![]
            } else {
                vec![flag, value]
            };
            let s = resolve(&args, &[(var, value)]).unwrap_or_else(|e| panic!("{var}: {e}"));
            assert!(
                s.warnings
                    .iter()
                    .any(|w| w.contains(&format!("{var}={value:?}")) && w.ends_with(check)),
                "{var}: {:?}",
                s.warnings
            );
        }
        let s = resolve(
            &["--endpoint-poll-interval", "0"],
            &[("RAY_COLLECTOR_POLL_INTERVAL", "0")],
        )
        .unwrap();
        assert_eq!(s.dashboard.poll_interval, Duration::from_secs(30));
        let s = resolve(&["--events-port", "x"], &[("EVENTS_PORT", "x")]).unwrap();
        assert_eq!(s.listen.port(), 8084);
        // A flag is refused, even when the variable holds another value.
        let e = resolve(
            &["--endpoint-poll-interval", "0s"],
            &[("RAY_COLLECTOR_POLL_INTERVAL", "10s")],
        )
        .unwrap_err();
        assert!(e.contains("--endpoint-poll-interval"), "{e}");
    }

    #[test]
    fn dashboard_pod_and_quarantine_settings_are_resolved_up_front() {
        let s = resolve(
            &[],
            &[
                ("RAY_AUTH_MODE", "token"),
                ("POD_IP", " 10.0.0.7 "),
                ("HOSTNAME", "raycluster-head-abcde"),
                ("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", "/api/x"),
            ],
        )
        .unwrap();
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(s.quarantine_node, "raycluster-head-abcde");
        assert_eq!(s.dashboard.additional_endpoints, ["/api/x"]);
        assert!(
            s.warnings.iter().any(|w| w.contains("RAY_AUTH_MODE=token")),
            "{:?}",
            s.warnings
        );
        let s = resolve(&["--node-id", "AQAAAA=="], &[("HOSTNAME", "h")]).unwrap();
        assert_eq!(s.quarantine_node, "01000000");
        let s = resolve(&[], &[("HOSTNAME", "../x")]).unwrap();
        assert_eq!(s.quarantine_node, "unknown-node");
        for (k, v) in [
            ("POD_IP", "ten"),
            ("RAY_AUTH_TOKEN", "a\nb"),
            ("RAY_COLLECTOR_ADDITIONAL_ENDPOINTS", "x"),
        ] {
            let e = resolve(&[], &[(k, v)]).unwrap_err();
            assert!(e.contains(k), "{k}: {e}");
        }
    }
}
