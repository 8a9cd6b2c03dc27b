//! Executes `unreachable`.

baton_guest::job!(|_info| {
    if std::hint::black_box(true) {
        core::arch::wasm32::unreachable();
    }
    Ok(())
});
