//! Writes 4 MiB to stdout and 1 MiB to stderr in many lines, then succeeds.

use std::io::Write;

baton_guest::job!(|_info| {
    let line = [b'x'; 1023];
    let mut out = std::io::stdout().lock();
    for i in 0..4096u32 {
        write!(out, "{i:05} ").map_err(|e| e.to_string())?;
        out.write_all(&line[6..]).map_err(|e| e.to_string())?;
        out.write_all(b"\n").map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())?;
    let mut err = std::io::stderr().lock();
    for _ in 0..1024u32 {
        err.write_all(&line).map_err(|e| e.to_string())?;
        err.write_all(b"\n").map_err(|e| e.to_string())?;
    }
    Ok(())
});
