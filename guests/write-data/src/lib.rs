//! Writes `out.txt` into the data directory its job file grants, which the guest sees at
//! `/data`, and reads back `in.txt` if the host put one there.

use std::fs;

baton_guest::job!(|info| {
    if let Ok(input) = fs::read_to_string("/data/in.txt") {
        baton_guest::log::info!("in.txt says {:?}", input.trim());
    }
    let line = format!("{} {} {}\n", info.job, info.slot, info.attempt);
    fs::write("/data/out.txt", line).map_err(|e| format!("cannot write /data/out.txt: {e}"))?;
    baton_guest::log::info!("wrote /data/out.txt");
    Ok(())
});
