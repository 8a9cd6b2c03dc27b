//! The fault tests' state writer. Each attempt makes `STEPS` fenced writes of its job's state,
//! `STEP_MS` milliseconds apart (environment grants; 100 writes of 10 ms by default): it sets
//! the key `w-<slot>-<attempt>` to the step's number and adds one to the shared key `writes`.
//! It never asks `signal_aborted()` and goes on whatever the store answers (`fenced` included):
//! only the host can stop it, so the store's write records show whether a write of an attempt
//! that was no longer current was ever accepted.

use std::time::Duration;

use baton_guest::state;

/// A number from a granted environment variable, or `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

baton_guest::job!(|info| {
    let steps = setting("STEPS", 100);
    let step = Duration::from_millis(setting("STEP_MS", 10));
    let key = format!("w-{}-{}", info.slot, info.attempt);
    let mut fenced = 0;
    for n in 0..steps {
        let written = state::set_as(&key, n).and_then(|()| state::increment("writes", 1));
        if let Err(state::Error::Fenced) = written {
            fenced += 1;
        }
        std::thread::sleep(step);
    }
    if fenced > 0 {
        return Err(format!("{fenced} of {steps} writes were fenced"));
    }
    Ok(())
});
