//! The `baton` command line: parsing, logging, and one module per command.

use clap::{Parser, Subcommand};

mod run;

/// Baton: a distributed cron runtime for WebAssembly components.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the jobs of a jobs directory against a shared store, until SIGTERM or Ctrl-C.
    Run(run::RunArgs),
}

/// Parses the command line, sets up logging and runs the command.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Run(args) => run::run(args).await,
    }
}

/// One structured line per event on stderr; `RUST_LOG` filters (defaults to `info`, with the
/// compiler's own chatter at `warn`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,wasmtime=warn,cranelift=warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
