//! A job that carries 40 MiB of data and reads some of it: the component is about 40 MB.

static PAYLOAD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/payload.bin"));

baton_guest::job!(|info| {
    // Touch the payload at a slot-dependent place, so it is neither dead nor constant-folded.
    let at = usize::try_from(info.slot.unsigned_abs()).unwrap_or(0) % PAYLOAD.len();
    let sum: u32 = PAYLOAD[at..].iter().take(4096).map(|b| u32::from(*b)).sum();
    baton_guest::log::info!("payload of {} bytes, sum at {at}: {sum}", PAYLOAD.len());
    Ok(())
});
