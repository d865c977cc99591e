//! The process shell: parse the command line, resolve the settings (exit 2 on any
//! configuration error, before anything starts), set up logging, metrics and the runtime,
//! run the collector, `inspect` or `serve`, and turn the outcome into an exit code.
//!
//! Exit codes: 0 everything uploaded, 1 a runtime failure, 2 a bad flag or variable, 3 the
//! shutdown deadline passed with files left in the spool for the next start, or files were
//! left that the spool could not place. `inspect`: 0 done, 1 an error; with
//! `--compare-runs`, 0 the settings are equal, 1 they differ, 2 an error (a bad flag is 2
//! everywhere).

use std::process::ExitCode;

use clap::Parser;
use ray_history_collector::cli::{Cli, Command};
use ray_history_collector::settings::Settings;
use ray_history_collector::{metrics, run, storage, Exit};

/// Reads an environment variable, treating non-UTF-8 as absent. The one door to the process
/// environment: everything else is given this function.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn main() -> ExitCode {
    // Before any thread starts: arenas that already exist are kept.
    let one_arena = use_one_malloc_arena();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                e.exit();
            }
            // One line naming the flag and the value, not clap's multi-line report.
            let text = e.render().to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
            eprintln!("{line}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Some(Command::Inspect(args)) => return inspect(args),
        Some(Command::Serve(args)) => return serve(args),
        None => {}
    }
    let settings = match Settings::resolve(cli.run, &env_var) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&settings.log_format);
    for w in &settings.warnings {
        tracing::warn!("{w}");
    }
    if !one_arena {
        tracing::warn!("mallopt(M_ARENA_MAX, 1) failed: freed memory may stay resident");
    }
    let handle = match metrics::install(storage::gzip::FAST_COMPRESSOR) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: installing the metrics recorder: {e}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rhc-worker")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(settings, handle));
    // Tasks still running (a stuck connection, a watcher, a request body still being
    // decoded on a worker it holds) must not hold the exit: what must finish (the seal, the
    // uploads, the final flushes) has finished or been given up within --shutdown-timeout.
    runtime.shutdown_timeout(RUNTIME_STOP);
    match result {
        Ok(Exit::Clean) => ExitCode::SUCCESS,
        Ok(Exit::LeftOnDisk) => ExitCode::from(3),
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// How long the runtime waits, after the collector's work is done, for tasks still running
/// before they are dropped. A request body being decoded holds its worker until it is done
/// (review r39f: 2 s here put the exit of a 3 s `--shutdown-timeout` at 3.0 s).
const RUNTIME_STOP: std::time::Duration = std::time::Duration::from_millis(200);

/// Makes glibc's malloc use one arena (glibc only; a no-op elsewhere). Returns false if
/// glibc refused.
///
/// glibc gives threads that contend for the heap arenas of their own (up to 8 per core) and
/// keeps what is freed in each: an 8 MiB upload part read on a blocking-pool thread stays
/// resident in that thread's arena after it is sent, and `malloc_trim` (the spool's idle
/// trim) shrinks the top of the main arena only. Measured on 2 cores: shipping a 2 GiB log
/// peaked at 47–64 MiB (`/proc/<pid>/smaps`: six arenas of ~8.4 MiB resident each), and
/// 25–34 MiB stayed resident 10 s after an ingest burst. With one arena: 22.5 MiB, and
/// 18.5–23.5 MiB (the rest is live: code and the deduplication window); page faults, ingest
/// rate and p99 unchanged within the noise, no lock waits in a perf profile. A fixed
/// `M_MMAP_THRESHOLD` also fixes the log peak, but it pins the trim threshold at 128 KiB:
/// every freed request body is then given back and faulted in again, 8× the page faults
/// and ~15 % more CPU at 100,000 events/s.
fn use_one_malloc_arena() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    true
}

/// Makes glibc's malloc keep what is freed for reuse instead of giving it back to the
/// kernel (glibc only; a no-op elsewhere): for `inspect`, a run that ends, whose peak is its
/// whole footprint anyway. Each page given back is faulted in again when reused, and page
/// faults are dear under virtualisation: on 1,000,000 events (`bench/inspect_big.sh`) this
/// took minor faults from 31,000 to 19,000 and `inspect`'s CPU time down 3-4 % (peak RSS
/// +5 MiB). Not for the collector or `serve`, whose freed memory must go back.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's tuning; called before any other thread exists.
    unsafe {
        // Freed memory at the top of the heap is kept up to 256 MiB; allocations below
        // 32 MiB come from the heap (reused) rather than from mmaps of their own (unmapped
        // when freed); the heap grows 16 MiB at a time.
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
}

fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// `ray-history-collector inspect ...`: a one-shot reader, no logging setup beyond errors.
fn inspect(args: ray_history_collector::cli::InspectArgs) -> ExitCode {
    use ray_history_collector::inspect::{Outcome, COMPARE_ERROR_EXIT};
    // `--compare-runs` answers "the same settings?" with 0 or 1, so its errors are 2.
    let error_exit = if args.compare_runs.is_some() {
        COMPARE_ERROR_EXIT
    } else {
        1
    };
    // Still before any other thread exists.
    keep_freed_memory();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(error_exit);
        }
    };
    match runtime.block_on(ray_history_collector::inspect::run(args, &env_var)) {
        Ok(Outcome::Done | Outcome::SameSettings) => ExitCode::SUCCESS,
        Ok(Outcome::SettingsDiffer) => ExitCode::from(1),
        Ok(Outcome::NotCompared) => ExitCode::from(COMPARE_ERROR_EXIT),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(error_exit)
        }
    }
}

/// `ray-history-collector serve ...`: the bucket over HTTP until SIGTERM or Ctrl-C.
fn serve(args: ray_history_collector::cli::ServeArgs) -> ExitCode {
    init_logging("text");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rhc-serve")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(ray_history_collector::serve::run(args, &env_var));
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let line = ray_history_collector::util::escape::escape_message(&format!("{e:#}"));
            tracing::error!("{line}");
            eprintln!("error: {line}");
            ExitCode::from(1)
        }
    }
}
