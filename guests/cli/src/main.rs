//! A plain command-line program, built for `wasm32-wasip2` with no Baton SDK: the kind of
//! program a user already has. Baton runs it as a command component (`wasi:cli/run`).
//!
//! `cli [--write FILE] [--stderr TEXT] [--get URL] [--effects STEPS STEP_MS] [--spin]
//! [--exit STATUS] ARGS…`: prints
//! `argv` and every `BATON_*` variable to stdout, appends them to `/data/FILE` when asked, writes
//! TEXT to stderr, sends `GET URL` through `wasi:http` (the `wasip2` crate) and prints
//! `got STATUS BYTES` (exit 4 when it fails), writes the fault tests' side-effect lines (as
//! `guests/side-effect` does, from the run's `BATON_*` facts, never asking whether it should
//! stop: only the host can stop it), spins forever without a host call when asked
//! (only the host can stop it), and exits with STATUS (0 unless given): through Rust's
//! `std::process::exit`, or with `--exit-code STATUS` through `wasi:cli/exit`'s
//! `exit-with-code` (WASI 0.2.12), which carries the status itself.

use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    println!("argv {}", args.join(" "));
    let mut facts: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("BATON_"))
        .collect();
    facts.sort();
    for (k, v) in &facts {
        println!("{k}={v}");
    }
    let mut status = 0;
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--write" => {
                let Some(file) = rest.next() else {
                    eprintln!("--write needs a file name");
                    std::process::exit(2);
                };
                let path = format!("/data/{file}");
                let mut out = match std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                {
                    Ok(out) => out,
                    Err(e) => {
                        eprintln!("cannot open {path}: {e}");
                        std::process::exit(3);
                    }
                };
                let line: Vec<String> = facts.iter().map(|(k, v)| format!("{k}={v}")).collect();
                if let Err(e) = writeln!(out, "{} {}", args.join(" "), line.join(" ")) {
                    eprintln!("cannot write {path}: {e}");
                    std::process::exit(3);
                }
            }
            "--stderr" => {
                if let Some(text) = rest.next() {
                    eprintln!("{text}");
                }
            }
            "--get" => {
                let Some(url) = rest.next() else {
                    eprintln!("--get needs a URL");
                    std::process::exit(2);
                };
                match get(url) {
                    Ok((status, bytes)) => println!("got {status} {bytes}"),
                    Err(why) => {
                        eprintln!("GET {url} failed: {why}");
                        std::process::exit(4);
                    }
                }
            }
            "--effects" => {
                let mut number = || rest.next().and_then(|s| s.parse::<u64>().ok());
                let (steps, step_ms) = (number().unwrap_or(10), number().unwrap_or(30));
                if let Err(why) = effects(steps, step_ms) {
                    eprintln!("{why}");
                    std::process::exit(3);
                }
            }
            "--spin" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "--exit-code" => {
                let code = rest.next().and_then(|s| s.parse().ok()).unwrap_or(1);
                wasip2::cli::exit::exit_with_code(code);
            }
            "--exit" => {
                status = rest.next().and_then(|s| s.parse().ok()).unwrap_or(1);
            }
            _ => {}
        }
    }
    std::process::exit(status);
}

/// Sends `GET url` (`http://HOST:PORT/PATH`) through `wasi:http`; answers the status and how
/// many bytes the body had.
fn get(url: &str) -> Result<(u16, usize), String> {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, Method, OutgoingRequest, Scheme};
    use wasip2::io::streams::StreamError;

    let rest = url
        .strip_prefix("http://")
        .ok_or("only http:// URLs are sent")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    request
        .set_method(&Method::Get)
        .and_then(|()| request.set_scheme(Some(&Scheme::Http)))
        .and_then(|()| request.set_authority(Some(authority)))
        .and_then(|()| request.set_path_with_query(Some(path)))
        .map_err(|()| "the request is malformed".to_owned())?;
    let pending = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    pending.subscribe().block();
    let response = pending
        .get()
        .ok_or("no response")?
        .map_err(|()| "the response was taken twice".to_owned())?
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    let body = response.consume().map_err(|()| "no body".to_owned())?;
    let stream = body.stream().map_err(|()| "no body stream".to_owned())?;
    let mut bytes = 0;
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes += chunk.len(),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => return Err(e.to_debug_string()),
        }
    }
    Ok((status, bytes))
}

/// Appends `<slot> <attempt> <fence> <runner> <wall-clock ms> <step>` to
/// `/data/<slot>-<attempt>-<runner>.log`, `steps` times, `step_ms` apart.
fn effects(steps: u64, step_ms: u64) -> Result<(), String> {
    let fact = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let (slot, attempt) = (fact("BATON_SLOT_MS")?, fact("BATON_ATTEMPT")?);
    let (fence, runner) = (fact("BATON_FENCE")?, fact("BATON_RUNNER")?);
    let path = format!("/data/{slot}-{attempt}-{runner}.log");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    for n in 0..steps {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| format!("the wall clock is before 1970: {e}"))?
            .as_millis();
        writeln!(file, "{slot} {attempt} {fence} {runner} {now} {n}")
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        std::thread::sleep(std::time::Duration::from_millis(step_ms));
    }
    Ok(())
}
