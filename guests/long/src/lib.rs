//! Works in 10 ms steps for up to a minute, checking `signal_aborted()` before each one, and
//! stops cleanly with an error (so a stopping host hands the run over) when it is set.

use std::time::Duration;

baton_guest::job!(|_info| {
    for step in 0..6000u32 {
        if baton_guest::signal_aborted() {
            baton_guest::log::warn!("aborted before step {step}; stopping cleanly");
            return Err(format!("aborted before step {step}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
});
