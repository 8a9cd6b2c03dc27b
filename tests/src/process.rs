//! The real `baton` binary as a child process: its stderr lines on a channel, signals, exit.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `baton` whose stderr lines arrive on a channel. Killed when dropped.
pub struct BatonProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

/// `baton` as a command: without the caller's `BATON_*` variables, and with its compile cache
/// (`$XDG_CACHE_HOME/baton`, where `--cache-dir` is not given) in a temporary directory of this
/// test process, removed when the process exits, never in the user's own cache.
pub fn baton_command() -> Command {
    let mut cmd = Command::new(crate::baton_binary());
    for (key, _) in std::env::vars() {
        if key.starts_with("BATON_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("XDG_CACHE_HOME", cache_home());
    cmd
}

static CACHE_HOME: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// This test process's cache directory for child `baton` processes.
fn cache_home() -> &'static std::path::Path {
    CACHE_HOME.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("baton-tests-cache-")
            .tempdir()
            .expect("a temporary cache directory")
            .keep();
        extern "C" fn remove_cache_home() {
            if let Some(dir) = CACHE_HOME.get() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        // SAFETY: registers a plain function with no arguments, run once at exit.
        unsafe { libc::atexit(remove_cache_home) };
        dir
    })
}

impl BatonProcess {
    /// Starts `baton ARGS…` with these extra environment variables (and `RUST_LOG=info`, and
    /// none of the caller's `BATON_*` variables).
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> BatonProcess {
        let mut cmd = baton_command();
        cmd.args(args)
            .env("RUST_LOG", "info")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start baton");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        BatonProcess {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line that `pred` accepts; returns it. Panics with everything baton said when
    /// none comes within `within`.
    pub fn wait_line(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "no {what} within {within:?}; baton said:\n{}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("a pid fits in i32");
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// Waits for the process to exit, or panics after `within`; keeps reading its lines.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let until = Instant::now() + within;
        loop {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            if let Some(status) = self.child.try_wait().expect("wait") {
                // The reader thread ends with the pipe: collect what is left.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(
                Instant::now() < until,
                "baton did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for BatonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a finished `baton` command printed, and how it exited.
pub struct Output {
    /// Its exit code (`None` if a signal ended it).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `baton ARGS…` to the end (without the caller's `BATON_*` variables, plus `envs`).
pub fn baton(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let out = baton_command()
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run baton");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
