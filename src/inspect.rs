//! `ray-history-collector inspect <storage-url>`: reads back what collectors wrote.
//!
//! Placeholder being written; see the issue "export events and inspect".

/// Arguments of `inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// The bucket to read: same forms as --storage.
    pub storage: String,
}

/// Runs `inspect`.
pub async fn run(args: InspectArgs, _env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<()> {
    anyhow::bail!("inspect {} is not implemented yet", args.storage)
}
