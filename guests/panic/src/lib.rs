//! Panics with a message, which reaches the host on stderr before the trap.

baton_guest::job!(|info| {
    panic!("the job {} gave up on purpose", info.job);
});
