//! The Wasm host's tests: the guest components of `guests/`, run through the real instance.

#[test]
fn guests_are_built() {
    for path in [
        env!("GUEST_HELLO"),
        env!("GUEST_BUSY_LOOP"),
        env!("GUEST_OTHER_WORLD"),
    ] {
        assert!(std::path::Path::new(path).is_file(), "{path}");
    }
}
