//! The `baton` command. The commands live in [`cli`]; this file only starts them.

mod cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    cli::main().await
}
