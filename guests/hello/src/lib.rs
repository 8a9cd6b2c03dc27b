//! The smallest job: one log line, one line on stdout, success.

baton_guest::job!(|info| {
    baton_guest::log::info!(
        "hello from {} slot {} attempt {} on {} (fence {}, {:?})",
        info.job,
        info.slot,
        info.attempt,
        info.runner,
        info.fence,
        info.reason
    );
    println!("hello on stdout");
    Ok(())
});
