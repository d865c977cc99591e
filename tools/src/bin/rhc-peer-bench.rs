//! One measurement of one collector, ours or KubeRay's Go collector, under `rhc-loadgen`,
//! for the side-by-side benchmark (`bench/peer.sh` runs it in interleaved rounds).
//!
//! A run: empty the S3 server (moto on 127.0.0.1) and create the bucket; start the subject
//! with its benchmark settings; let it idle a second (its idle RSS and CPU so far); run the
//! load generator against it (`--pid` samples it, so the JSON has its in-window CPU and RSS);
//! then SIGTERM it and reap it with `wait4`, which gives the CPU and peak RSS of its whole
//! life, the final compression and upload included; read the whole bucket back and count
//! the events in it. With `--max` the run ends with `kill -9` instead (a maximum-rate run: no
//! drain, no check). Prints one JSON line; exit 1 when the run could not be made.
//!
//! The subjects:
//! - `ours`: gzip (the default), `--rotation-interval 5s` (so compression and upload fall
//!   inside the measured window), `--max-spool-bytes 64GiB`, `--role worker`, logs and export
//!   events off.
//! - `ours-ingest`: the same with `--rotation-interval 1h --max-segment-bytes 4GiB`: nothing
//!   is sealed during a run (the ingest-only configuration of BENCHMARKS.md).
//! - `peer-gzip`, `peer-plain`: KubeRay's collector with compression on or off,
//!   `RAY_COLLECTOR_EVENT_ROTATION_INTERVAL=5s` (its rotation check runs every 30 s, so this
//!   is the most often it rotates), `RAY_COLLECTOR_EVENT_MAX_DISK_MB=65536` (its default 200
//!   answers 503 from 160 MiB on, which 25,000 events/s fill in 7 s), its other defaults
//!   (100 MB files, Worker role, GOMAXPROCS = the 2 cores); the log collector off. See
//!   `rhc_testkit::peer` for every variable and the stand-ins it needs to start.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use object_store::{ObjectStore, ObjectStoreExt};
use rhc_testkit::collector::Collector;
use rhc_testkit::http::try_http_request;
use rhc_testkit::peer::{
    peer_collector_bin, AnyCollector, PeerCollector, PeerSettings, PEER_INSTALL,
};
use rhc_testkit::usage::cpu_seconds;
use serde_json::{json, Value};

/// The session the load generator puts in its events (its default), which the peer's
/// stand-in also reports as `session_latest`.
const SESSION: &str = "session_2026-11-22_00-00-00_000000_1";
const BUCKET: &str = "bench";
/// moto ignores signatures but wants one.
const MOTO_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0000000000000000000000000000000000000000000000000000000000000000";
/// The longest a SIGTERM drain may take before the run is called failed: the peer has no
/// deadline of its own; ours has `--shutdown-timeout` (25 s).
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Subject {
    Ours,
    OursIngest,
    PeerGzip,
    PeerPlain,
}

impl Subject {
    fn name(self) -> &'static str {
        match self {
            Subject::Ours => "ours",
            Subject::OursIngest => "ours-ingest",
            Subject::PeerGzip => "peer-gzip",
            Subject::PeerPlain => "peer-plain",
        }
    }
}

/// Measures one collector under rhc-loadgen; one JSON line on stdout.
#[derive(Parser, Debug)]
#[command(name = "rhc-peer-bench")]
struct Args {
    #[arg(long, value_enum)]
    subject: Subject,
    /// Our collector binary.
    #[arg(long, default_value = "target/release/ray-history-collector")]
    collector: PathBuf,
    /// KubeRay's collector binary (default: $RHC_PEER_COLLECTOR).
    #[arg(long)]
    peer: Option<PathBuf>,
    /// The load generator binary.
    #[arg(long, default_value = "target/release/rhc-loadgen")]
    loadgen: PathBuf,
    /// Port of the moto S3 server on 127.0.0.1 (emptied before the run).
    #[arg(long)]
    s3_port: u16,
    /// Spool/data dir, logs (replaced).
    #[arg(long)]
    work_dir: PathBuf,
    /// The peer's stand-in Ray tmp root: a short path (the raylet socket path must fit 107
    /// bytes). Default: /tmp/rhc-peer-<pid>.
    #[arg(long)]
    ray_tmp: Option<PathBuf>,
    /// Offered events/s (0: as fast as the answers come).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 15.0)]
    duration: f64,
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Clients of the load generator, each one batch at a time.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// End with kill -9: no drain, no bucket check (a maximum-rate run).
    #[arg(long)]
    max: bool,
    /// Seconds idle between ready and the load.
    #[arg(long, default_value_t = 1.0)]
    idle: f64,
    #[arg(long, default_value = "")]
    label: String,
    /// Keep the work dir afterwards.
    #[arg(long)]
    keep: bool,
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!(
                "rhc-peer-bench: {} {}: {e}",
                args.subject.name(),
                args.label
            );
            std::process::exit(1);
        }
    }
}

fn run(args: &Args) -> Result<Value, String> {
    reset_moto(args.s3_port)?;
    let _ = std::fs::remove_dir_all(&args.work_dir);
    std::fs::create_dir_all(&args.work_dir)
        .map_err(|e| format!("{}: {e}", args.work_dir.display()))?;
    let ray_tmp = args
        .ray_tmp
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/rhc-peer-{}", std::process::id())));
    let (mut subject, settings) = configure(args, &ray_tmp)?;
    let ready = subject.try_spawn()?;
    let pid = subject.pid();
    std::thread::sleep(Duration::from_secs_f64(args.idle));
    let idle_rss_mib = rhc_testkit::collector::rss_bytes(pid).unwrap_or(0) as f64 / 1048576.0;
    let cpu_before = cpu_seconds(pid).ok_or("the subject is gone before the load")?;

    let load = run_loadgen(args, subject.port(), pid)?;
    let cpu_after_load = cpu_seconds(pid).unwrap_or(f64::NAN);
    let acked = load["acked_total"].as_f64().unwrap_or(0.0);
    let eps = load["events_per_s"].as_f64().unwrap_or(0.0);
    let window_cpu = load["cpu_cores"].as_f64().unwrap_or(f64::NAN);
    let mut out = json!({
        "subject": args.subject.name(), "label": args.label, "rate": args.rate,
        "duration_s": args.duration, "warmup_s": args.warmup, "max": args.max,
        "ready_s": ready.as_secs_f64(), "idle_rss_mib": idle_rss_mib,
        "settings": settings, "load": load,
        // CPU per event inside the measured window (loadgen's /proc samples).
        "window_cpu_s_per_million": if eps > 0.0 { window_cpu / eps * 1e6 } else { f64::NAN },
        "cpu_during_load_s": cpu_after_load - cpu_before,
    });
    if args.max {
        subject.kill9();
    } else {
        let t = Instant::now();
        subject.signal_term();
        let (status, usage) = subject.wait_exit_usage(SHUTDOWN_LIMIT)?;
        let shutdown = t.elapsed();
        let check = read_bucket(args.s3_port)?;
        let cpu = usage.cpu_s() - cpu_before;
        if let Some(o) = out.as_object_mut() {
            o.insert("exit_code".into(), status.code().into());
            o.insert("shutdown_s".into(), shutdown.as_secs_f64().into());
            o.insert("cpu_total_s".into(), usage.cpu_s().into());
            o.insert("cpu_user_s".into(), usage.user_s.into());
            o.insert("cpu_system_s".into(), usage.system_s.into());
            // From the first event to the exit: ingest, spool, compression, upload, drain.
            o.insert("cpu_load_and_drain_s".into(), cpu.into());
            o.insert(
                "cpu_s_per_million".into(),
                (if acked > 0.0 {
                    cpu / acked * 1e6
                } else {
                    f64::NAN
                })
                .into(),
            );
            o.insert(
                "max_rss_mib".into(),
                (usage.max_rss_kib as f64 / 1024.0).into(),
            );
            o.insert("bucket".into(), check);
        }
    }
    drop(subject);
    let _ = std::fs::remove_dir_all(&ray_tmp);
    if !args.keep {
        let _ = std::fs::remove_dir_all(&args.work_dir);
    }
    Ok(out)
}

/// The subject, not started, and its settings as they are to be written down.
fn configure(args: &Args, ray_tmp: &Path) -> Result<(AnyCollector, Value), String> {
    let endpoint = format!("http://127.0.0.1:{}", args.s3_port);
    match args.subject {
        Subject::Ours | Subject::OursIngest => {
            let bin = std::fs::canonicalize(&args.collector)
                .map_err(|e| format!("{}: {e}", args.collector.display()))?;
            let raytmp = args.work_dir.join("ray");
            std::fs::create_dir_all(&raytmp).map_err(|e| e.to_string())?;
            let mut flags: Vec<String> = [
                "--storage",
                &format!("s3://{BUCKET}"),
                "--cluster-name",
                "bench",
                "--role",
                "worker",
                "--max-spool-bytes",
                "64GiB",
                "--enable-log-collector",
                "false",
                "--enable-export-events",
                "false",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if args.subject == Subject::Ours {
                flags.extend(["--rotation-interval".into(), "5s".into()]);
            } else {
                flags.extend(
                    ["--rotation-interval", "1h", "--max-segment-bytes", "4GiB"].map(String::from),
                );
            }
            let mut all = flags.clone();
            all.extend(["--ray-tmp-dir".into(), raytmp.display().to_string()]);
            let env = [
                ("AWS_ENDPOINT", endpoint.as_str()),
                ("AWS_ALLOW_HTTP", "true"),
                ("AWS_ACCESS_KEY_ID", "test"),
                ("AWS_SECRET_ACCESS_KEY", "testsecret"),
                ("AWS_REGION", "us-east-1"),
            ];
            let mut c = Collector::configure(bin, &args.work_dir.join("spool"), &all, &env);
            c.log = args.work_dir.join("collector.log");
            let settings = json!({"flags": flags, "env": env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>()});
            Ok((AnyCollector::Ours(c), settings))
        }
        Subject::PeerGzip | Subject::PeerPlain => {
            let bin = args
                .peer
                .clone()
                .or_else(peer_collector_bin)
                .ok_or_else(|| {
                    format!("KubeRay's collector: set RHC_PEER_COLLECTOR or --peer (it is what `{PEER_INSTALL}` installs)")
                })?;
            let mut s = PeerSettings::defaults(&endpoint, BUCKET, SESSION);
            s.compression = args.subject == Subject::PeerGzip;
            s.rotation = "5s".into();
            s.max_disk_mb = 65536;
            let p = PeerCollector::configure(bin, &args.work_dir, ray_tmp, s)?;
            let env: Vec<String> = p.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
            Ok((AnyCollector::Peer(p), json!({"env": env})))
        }
    }
}

fn run_loadgen(args: &Args, port: u16, pid: u32) -> Result<Value, String> {
    let out = Command::new(&args.loadgen)
        .args([
            "--url",
            &format!("http://127.0.0.1:{port}/v1/events"),
            "--batch",
            &args.batch.to_string(),
            "--concurrency",
            &args.concurrency.to_string(),
            "--rate",
            &args.rate.to_string(),
            "--duration",
            &args.duration.to_string(),
            "--warmup",
            &args.warmup.to_string(),
            "--pid",
            &pid.to_string(),
            "--session",
            SESSION,
            "--json",
            "--label",
            &args.label,
        ])
        .output()
        .map_err(|e| format!("{}: {e}", args.loadgen.display()))?;
    if !out.status.success() {
        return Err(format!(
            "rhc-loadgen failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("rhc-loadgen's JSON: {e}"))
}

fn reset_moto(port: u16) -> Result<(), String> {
    let base = format!("http://127.0.0.1:{port}");
    try_http_request("POST", &format!("{base}/moto-api/reset"), &[], b"")
        .map_err(|e| format!("resetting moto: {e}"))?;
    let r = try_http_request(
        "PUT",
        &format!("{base}/{BUCKET}"),
        &[("Authorization", MOTO_AUTH)],
        b"",
    )
    .map_err(|e| format!("creating the bucket: {e}"))?;
    if r.status != 200 {
        return Err(format!("creating the bucket: HTTP {}", r.status));
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct IdOnly<'a> {
    #[serde(rename = "eventId", borrow)]
    event_id: Option<std::borrow::Cow<'a, str>>,
}

/// Every event object of the bucket read back: lines, distinct event ids, sizes.
fn read_bucket(port: u16) -> Result<Value, String> {
    let store = rhc_testkit::services::moto_client(&format!("http://127.0.0.1:{port}"), BUCKET)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let (mut objects, mut event_objects, mut lines, mut broken) = (0u64, 0u64, 0u64, 0u64);
    let (mut stored, mut raw) = (0u64, 0u64);
    let mut ids: HashSet<String> = HashSet::new();
    rt.block_on(async {
        use futures::TryStreamExt;
        let metas: Vec<_> = store
            .list(None)
            .try_collect()
            .await
            .map_err(|e| format!("listing the bucket: {e}"))?;
        for m in &metas {
            objects += 1;
            let key = m.location.as_ref();
            if !(key.contains("/node_events/") || key.contains("/job_events/")) || m.size == 0 {
                continue;
            }
            let bytes = store
                .get(&m.location)
                .await
                .map_err(|e| format!("GET {key}: {e}"))?
                .bytes()
                .await
                .map_err(|e| format!("GET {key}: {e}"))?;
            event_objects += 1;
            stored += bytes.len() as u64;
            let text = if key.ends_with(".gz") {
                let mut out = Vec::new();
                std::io::Read::read_to_end(
                    &mut flate2::read::MultiGzDecoder::new(&bytes[..]),
                    &mut out,
                )
                .map_err(|e| format!("{key}: not gzip: {e}"))?;
                out
            } else {
                bytes.to_vec()
            };
            raw += text.len() as u64;
            for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                lines += 1;
                match serde_json::from_slice::<IdOnly>(line) {
                    Ok(IdOnly { event_id: Some(id) }) => {
                        ids.insert(id.into_owned());
                    }
                    _ => broken += 1,
                }
            }
        }
        Ok::<(), String>(())
    })?;
    Ok(
        json!({"objects": objects, "event_objects": event_objects, "lines": lines,
              "distinct_events": ids.len(), "duplicate_lines": lines - broken - ids.len() as u64,
              "broken_lines": broken, "stored_bytes": stored, "raw_bytes": raw,
              "read_s": started.elapsed().as_secs_f64()}),
    )
}
