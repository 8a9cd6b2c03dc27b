//! Tries to leave its sandbox: reads `/etc/passwd`, writes `/tmp/baton-escape`, reads a path
//! that climbs out of its data directory, and reads the host's environment. Logs each result
//! and fails with them, unless one succeeded, which it reports as "escaped".

use std::fs;

baton_guest::job!(|_info| {
    let mut errors = Vec::new();
    let mut escaped = Vec::new();
    match fs::read_to_string("/etc/passwd") {
        Ok(_) => escaped.push("read /etc/passwd".to_owned()),
        Err(e) => errors.push(format!("read /etc/passwd: {e}")),
    }
    match fs::write("/tmp/baton-escape", b"escaped") {
        Ok(()) => escaped.push("wrote /tmp/baton-escape".to_owned()),
        Err(e) => errors.push(format!("write /tmp/baton-escape: {e}")),
    }
    match fs::read_to_string("/data/../../../../etc/passwd") {
        Ok(_) => escaped.push("read /data/../../../../etc/passwd".to_owned()),
        Err(e) => errors.push(format!("read /data/../../../../etc/passwd: {e}")),
    }
    for (key, _) in std::env::vars() {
        if key == "PATH" || key == "HOME" {
            escaped.push(format!("saw the host's {key}"));
        }
    }
    for e in &errors {
        baton_guest::log::info!("refused: {e}");
    }
    if escaped.is_empty() {
        Err(errors.join("; "))
    } else {
        Err(format!("escaped: {}", escaped.join("; ")))
    }
});
