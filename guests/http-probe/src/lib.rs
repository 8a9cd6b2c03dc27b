//! The outbound tests' guest. It sends `GET` requests to each URL of the comma-separated
//! `URLS` (environment grants), `REPEAT` times (default 1), `INTERVAL_MS` apart (default 0),
//! and logs one line per request: `sent <url> <status> <body bytes>` or `error <url>: <why>`.
//!
//! - `FORGE=1` sets its own `baton-fence`, `baton-job` and `Idempotency-Key` headers, which
//!   the host must replace;
//! - `WRITE=1` appends `<slot> <attempt> <wall-clock ms> <n>` to `/data/writes.log` before
//!   each request;
//! - `LOG_SECRET=1` logs the value of `config.token`, which the host must redact;
//! - `KEEP_GOING=1` carries on after a failed request; otherwise the first one fails the run;
//! - `CALLS=N` first calls the host's `signal-aborted` N times (to time a host call).

use std::io::Write;

fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn number(name: &str, default: u64) -> u64 {
    setting(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

baton_guest::job!(|info| {
    let mut aborted = 0;
    for _ in 0..number("CALLS", 0) {
        aborted += u32::from(baton_guest::signal_aborted());
    }
    if aborted > 0 {
        return Err("the signal aborted".into());
    }
    let urls = setting("URLS").ok_or("URLS is not set")?;
    let forge = setting("FORGE").is_some();
    let write = setting("WRITE").is_some();
    let keep_going = setting("KEEP_GOING").is_some();
    if setting("LOG_SECRET").is_some() {
        let token = baton_guest::config::require("token")?;
        baton_guest::log::info!("the token is {token}");
    }
    let forged = [
        ("baton-fence", "1"),
        ("baton-job", "someone-else"),
        ("idempotency-key", "forged"),
    ];
    let headers: &[(&str, &str)] = if forge { &forged } else { &[] };
    let interval = std::time::Duration::from_millis(number("INTERVAL_MS", 0));
    for n in 0..number("REPEAT", 1) {
        for url in urls.split(',') {
            if write {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open("/data/writes.log")
                    .map_err(|e| format!("cannot open /data/writes.log: {e}"))?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|e| format!("the wall clock is before 1970: {e}"))?
                    .as_millis();
                // One write per line: a line written in pieces (as `writeln!` on a file does)
                // is cut where the host refuses the next piece, once the attempt is fenced.
                let line = format!("{} {} {now} {n}\n", info.slot, info.attempt);
                file.write_all(line.as_bytes())
                    .map_err(|e| format!("cannot write: {e}"))?;
            }
            match baton_guest::http::request("GET", url, headers, &[]) {
                Ok(r) => baton_guest::log::info!("sent {url} {} {}", r.status, r.body.len()),
                Err(e) => {
                    baton_guest::log::warn!("error {url}: {e}");
                    if !keep_going {
                        return Err(e);
                    }
                }
            }
        }
        std::thread::sleep(interval);
    }
    Ok(())
});
