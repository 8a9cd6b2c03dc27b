//! The fault tests' witness of side effects. Each attempt appends, in `STEPS` small steps of
//! `STEP_MS` milliseconds each (environment grants; 10 steps of 30 ms by default), one line
//!
//! ```text
//! <slot> <attempt> <fence> <runner> <wall-clock ms> <step>
//! ```
//!
//! to `/data/<slot>-<attempt>-<runner>.log` in its granted data directory. It never asks
//! `signal_aborted()`: only the host can stop it, so the lines show exactly how long an attempt
//! kept acting after its lease was lost. The wall clock is the host's (WASI `wall-clock`), so
//! on a runner whose clock is shifted the times are shifted too.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A number from a granted environment variable, or `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

baton_guest::job!(|info| {
    let steps = setting("STEPS", 10);
    let step = Duration::from_millis(setting("STEP_MS", 30));
    let path = format!("/data/{}-{}-{}.log", info.slot, info.attempt, info.runner);
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    for n in 0..steps {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| format!("the wall clock is before 1970: {e}"))?
            .as_millis();
        let line = format!(
            "{} {} {} {} {now} {n}\n",
            info.slot, info.attempt, info.fence, info.runner
        );
        file.write_all(line.as_bytes())
            .map_err(|e| format!("cannot append to {path}: {e}"))?;
        std::thread::sleep(step);
    }
    Ok(())
});
