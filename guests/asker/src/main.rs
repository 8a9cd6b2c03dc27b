//! A command component (`fn main`, exporting `wasi:cli/run`) that also imports `baton:job`'s
//! host interface through the guest SDK, without exporting `run`.
//!
//! `asker [--wait-abort]`: prints `job=… attempt=… reason=… aborted=…` from `info()` and
//! `signal-aborted()`; with `--wait-abort`, asks every 10 ms until the signal aborts, then
//! writes `stopping` to stderr and exits with a failure (a hand-over when the host stops).

fn main() {
    let info = baton_guest::info();
    println!(
        "job={} attempt={} reason={:?} aborted={}",
        info.job,
        info.attempt,
        info.reason,
        baton_guest::signal_aborted()
    );
    if std::env::args().any(|a| a == "--wait-abort") {
        while !baton_guest::signal_aborted() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        eprintln!("stopping");
        std::process::exit(1);
    }
}
