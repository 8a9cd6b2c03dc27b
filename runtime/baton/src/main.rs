//! The `baton` command. The commands live in [`cli`]; this file only starts them and turns a
//! failure into one `error: …` line and exit code 1 (see [`cli`] for every exit code).

use std::process::ExitCode;

mod cli;
mod http;

/// The binary's allocator: mimalloc. A busy host makes many small, short-lived allocations per
/// store request (the client's buffers and futures, a claim's arguments), which glibc's
/// allocator served at about a third of the host's CPU in the scale run (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match cli::main().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// What failed, then why, on one line: each cause of the chain once (a message that already
/// quotes its cause does not repeat it).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
