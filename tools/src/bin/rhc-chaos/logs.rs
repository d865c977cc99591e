//! A benchmark: shipping one large log file, its time and peak memory.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::thread::{self};
use std::time::{Duration, Instant};

use crate::{mib, secs, Ctx, RssMonitor, Verdict};
use object_store::ObjectStoreExt;
use rhc_testkit::collector::Collector;
use serde_json::json;

pub(crate) fn logs_2g(ctx: &Ctx) -> Result<Verdict, String> {
    let size = ctx.args.log_mib << 20;
    let n = ctx.seq.fetch_add(1, Ordering::Relaxed);
    let bucket = format!("chaos-logs-{n}");
    ctx.storage.create_bucket(&bucket)?;
    let dir = ctx.work.join(format!("logs-{n}"));
    let session = "session_2026-11-22_02-06-36_260774_21819";
    let logs = dir.join("ray").join(session).join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    std::os::unix::fs::symlink(
        dir.join("ray").join(session),
        dir.join("ray").join("session_latest"),
    )
    .map_err(|e| e.to_string())?;
    // A worker log of `size` bytes of log-like lines.
    let path = logs.join("worker-big.out");
    {
        let f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let mut written = 0u64;
        let mut i = 0u64;
        while written < size {
            let line = format!(
                "[2026-11-22 02:06:{:02},{:03} I 48213 48213] core_worker.cc:{}: task {} finished in {} us, object store {} bytes\n",
                i % 60,
                i % 1000,
                i % 5000,
                i,
                i * 7 % 100_000,
                i * 31 % 1_000_000_000
            );
            let take = (size - written).min(line.len() as u64) as usize;
            w.write_all(&line.as_bytes()[..take])
                .map_err(|e| e.to_string())?;
            written += take as u64;
            i += 1;
        }
        w.flush().map_err(|e| e.to_string())?;
    }
    let (url, env) = ctx.storage.collector_config(&bucket, ctx.storage.port);
    let args: Vec<String> = vec![
        "--storage".into(),
        url,
        "--cluster-name".into(),
        "chaos".into(),
        "--ray-tmp-dir".into(),
        dir.join("ray").display().to_string(),
        "--node-id".into(),
        "3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5".into(),
        "--enable-export-events".into(),
        "false".into(),
    ];
    let mut c = Collector::configure(ctx.bin.clone(), &dir.join("spool"), &args, &env);
    c.log = dir.join("collector.log");
    let t = Instant::now();
    c.try_spawn()?;
    let rss = RssMonitor::start(c.pid());
    let mut done = None;
    while t.elapsed() < Duration::from_secs(600) {
        if c.metric("rhc_log_bytes_uploaded_total") >= size as f64 {
            done = Some(t.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let rss_peak = rss.peak();
    drop(rss);
    let (code, _) = c
        .try_terminate(Duration::from_secs(60))
        .map(|(s, d)| (s.code(), d))?;
    let store = ctx.storage.store(&bucket)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let key = format!(
        "cluster-history/raycluster/default/chaos/{session}/3ae6595c248ad7def1c7206bfd50b18e860d5eb167e4e068c64823a5/logs/worker-big.out"
    );
    let object_size = rt
        .block_on(store.head(&object_store::path::Path::from(key.as_str())))
        .map(|m| m.size)
        .map_err(|e| format!("HEAD {key}: {e}"))?;
    let _ = std::fs::remove_file(&path);
    let pass = done.is_some() && object_size == size && rss_peak <= 64 << 20 && code == Some(0);
    Ok(Verdict::new(
        pass,
        format!(
            "one {:.0} MB log file to {}: uploaded in {} ({:.0} MB/s), object {} bytes, RSS peak {:.1} MiB (target < 64 MiB); exit {code:?}",
            size as f64 / 1e6,
            ctx.storage.describe(),
            done.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_else(|| "NEVER".into()),
            done.map(|d| size as f64 / 1e6 / d.as_secs_f64()).unwrap_or(0.0),
            object_size,
            mib(rss_peak as f64),
        ),
        json!({"bytes": size, "seconds": done.map(secs), "object_bytes": object_size,
               "rss_peak_mib": mib(rss_peak as f64), "exit_code": code}),
    ))
}
