//! The `baton` command.

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Baton: a distributed cron runtime for WebAssembly components.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the jobs of a jobs directory against a shared store.
    Run {
        /// The jobs directory: `<name>.wasm` beside `<name>.toml`.
        #[arg(long, default_value = "./jobs")]
        jobs: std::path::PathBuf,
        /// The shared store.
        #[arg(long, default_value = "sqlite://baton.db")]
        store: String,
        /// The namespace in the store; clusters that share a store use different ones.
        #[arg(long, default_value = baton::store::DEFAULT_NAMESPACE)]
        namespace: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            jobs,
            store,
            namespace,
        } => {
            let redacted = baton::store::redact(&store);
            let _store = baton::store::open(&store, &namespace)
                .await
                .with_context(|| format!("opening store {redacted}"))?;
            let found = std::fs::read_dir(&jobs)
                .with_context(|| format!("reading jobs directory {}", jobs.display()))?
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
                .count();
            println!(
                "store {redacted} is ready; {found} job file(s) in {} (running jobs comes with the instance and the Wasm host)",
                jobs.display()
            );
        }
    }
    Ok(())
}
