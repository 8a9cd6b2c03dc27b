//! Example job `counter`: keeps a per-job count of its successful runs in its job state.
//!
//! Each run reads the count, then adds one to the key `successful-runs` as its last step, so the
//! count moves only for a run that succeeds. The increment is fenced by the store: if this
//! attempt lost its lease meanwhile (another runner took the run over), the store refuses it,
//! the count is not moved twice, and the run ends with the error.

use baton_guest::{log, state};

baton_guest::job!(|info| {
    let before: i64 = state::get_as("successful-runs").map_err(|e| e.to_string())?.unwrap_or(0);
    log::info!("{} attempt {}: {before} successful runs so far", info.job, info.attempt);
    // The last step: if this attempt lost its lease meanwhile, the store refuses the
    // increment (`fenced`), the count is not moved twice, and the run ends with the error.
    let count = state::increment("successful-runs", 1).map_err(|e| e.to_string())?;
    log::info!("now {count} successful runs");
    Ok(())
});
