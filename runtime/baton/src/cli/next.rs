//! `baton next`: the slots of a cron expression, to check a schedule (and its daylight-saving
//! behaviour) by eye.

use anyhow::Context;
use baton_core::schedule::{format_in, Schedule};

/// The options of `baton next`.
#[derive(clap::Args)]
pub struct NextArgs {
    /// A cron expression: five fields, six with seconds first, or a macro such as @hourly.
    cron: String,
    /// The IANA time zone the expression is read in, e.g. Europe/Berlin.
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// How many slots to print.
    #[arg(long, default_value_t = 5)]
    count: usize,
    /// Print the slots after this instant (RFC 3339, e.g. 2026-03-28T12:00:00Z). Defaults to
    /// now.
    #[arg(long)]
    after: Option<String>,
}

/// Prints the next slots, one RFC 3339 time per line with the zone's offset.
pub fn next(args: NextArgs) -> anyhow::Result<()> {
    let schedule = Schedule::parse(&args.cron, &args.tz)?;
    let after = match &args.after {
        Some(text) => chrono::DateTime::parse_from_rfc3339(text)
            .with_context(|| {
                format!("--after {text:?} is not an RFC 3339 time; write e.g. 2026-03-28T12:00:00Z")
            })?
            .timestamp_millis(),
        None => chrono::Utc::now().timestamp_millis(),
    };
    for slot in schedule.upcoming(after, args.count) {
        println!("{}", format_in(slot, schedule.time_zone()));
    }
    Ok(())
}
