//! Entry point: parse the configuration, set up logging and metrics, run.

use std::process::ExitCode;

use clap::Parser;
use ray_history_collector::config::{Cli, Command, Settings};
use ray_history_collector::{env_var, metrics, run, Exit};

fn main() -> ExitCode {
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
    if let Some(Command::Inspect(args)) = cli.command {
        return inspect(args);
    }
    let settings = match Settings::resolve(cli.run, &env_var) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&settings.log_format);
    let handle = match metrics::install() {
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
    // Tasks still running (a stuck connection, a watcher) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
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
fn inspect(args: ray_history_collector::inspect::InspectArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(ray_history_collector::inspect::run(args, &env_var)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
