//! Baton's lease engine without WebAssembly: a Rust closure as the job, run every second on a
//! SQLite store. Start it twice on the same file and each slot runs on one of the two; stop the
//! one that runs (Ctrl-C) and the other takes over.
//!
//! ```sh
//! cargo run -p baton-native-example -- [STORE_URL] [RUNS]
//! ```
//!
//! `STORE_URL` defaults to `sqlite://native.db`; the program stops, with hand-over, after
//! `RUNS` runs that this process saw end in `success` (defaults to 3; 0 runs until Ctrl-C).

use std::time::Duration;

use baton_core::instance::{handler_fn, EventKind, Instance, InstanceConfig, Job};
use baton_core::lease::LeaseOptions;
use baton_core::schedule::Schedule;

#[tokio::main]
async fn main() {
    if let Err(message) = run().await {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let store_url = args
        .next()
        .unwrap_or_else(|| "sqlite://native.db".to_owned());
    let runs: usize = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|_| format!("RUNS must be a whole number, not {n:?}"))?,
        None => 3,
    };
    let runner = format!("native-{}", std::process::id());

    // The job: every second, a lease of 3 s (renewed every 500 ms, lease / 6; the spec's other
    // options at their defaults).
    let schedule = Schedule::parse("* * * * * *", "UTC").map_err(|e| e.to_string())?;
    let options = LeaseOptions::with_lease(Duration::from_secs(3));
    let handler = handler_fn(|ctx| async move {
        println!(
            "tick: slot {} attempt {} fence {} on {}",
            ctx.slot, ctx.attempt, ctx.fence, ctx.runner
        );
        // Work that watches the signal: a stop or a lost lease ends it early.
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => Ok(()),
            _ = ctx.signal.aborted() => Err("stopped before the work was done".to_owned()),
        }
    });
    let job = Job {
        name: "tick".to_owned(),
        schedule,
        options,
        handler,
    };

    let config = InstanceConfig::new(store_url, runner);
    let instance = Instance::start(config, vec![job])
        .await
        .map_err(|e| e.to_string())?;
    let mut events = instance.subscribe();
    println!("running job tick every second as {}", instance.runner());

    let mut successes = 0;
    loop {
        tokio::select! {
            event = events.recv() => {
                let Ok(event) = event else { break };
                println!("{} {} slot {}", event.kind.as_str(), event.job, event.slot);
                if event.kind == EventKind::Success {
                    successes += 1;
                    if runs > 0 && successes >= runs {
                        break;
                    }
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    let report = instance.stop(Duration::from_secs(5)).await;
    println!(
        "stopped: {} attempt(s) ended, {} left to their lease",
        report.ended, report.abandoned
    );
    Ok(())
}
