//! Sleeps for an hour inside a host call (WASI `poll`), where no epoch check runs: the host
//! stops it by dropping the call.

use std::time::Duration;

baton_guest::job!(|_info| {
    std::thread::sleep(Duration::from_secs(3600));
    Ok(())
});
