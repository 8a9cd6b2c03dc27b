//! Building the Python and JavaScript jobs with their own scripts, once per source, and one Wasm
//! host for the test binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use baton_wasm::{HostConfig, Sandbox, WasmHost};
use sha2::{Digest, Sha256};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// The target directory this test runs from (`<target>/debug/deps/polyglot-…`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.ancestors()
        .nth(3)
        .expect("the test runs from <target>/<profile>/deps")
        .to_path_buf()
}

/// A language's job: its folder under guests/ and the files its build reads.
#[derive(Clone, Copy, Debug)]
pub enum Lang {
    /// guests/python: job.py, built by componentize-py.
    Python,
    /// guests/js: job.js, built by componentize-js.
    JavaScript,
}

impl Lang {
    fn folder(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::JavaScript => "js",
        }
    }

    fn sources(self) -> &'static [&'static str] {
        match self {
            Lang::Python => &["job.py", "build.sh", "requirements.txt", "wit/job-py.wit"],
            Lang::JavaScript => &[
                "job.js",
                "build.sh",
                "build.mjs",
                "package.json",
                "package-lock.json",
                "wit/job-js.wit",
            ],
        }
    }
}

/// The language's job component, built by its own `build.sh` the first time its sources (or
/// the WIT) change, into `<target>/polyglot/`.
pub fn built(lang: Lang) -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    static JS: OnceLock<PathBuf> = OnceLock::new();
    let cell = match lang {
        Lang::Python => &PY,
        Lang::JavaScript => &JS,
    };
    cell.get_or_init(|| build(lang)).clone()
}

fn build(lang: Lang) -> PathBuf {
    let folder = root().join("guests").join(lang.folder());
    let mut hash = Sha256::new();
    for file in lang.sources() {
        hash.update(std::fs::read(folder.join(file)).unwrap_or_default());
    }
    hash.update(std::fs::read(root().join("wit/baton-job.wit")).expect("read the WIT"));
    let dir = target_dir().join("polyglot");
    std::fs::create_dir_all(&dir).expect("create <target>/polyglot");
    let out = dir.join(format!(
        "{}-{}.wasm",
        lang.folder(),
        &hex::encode(hash.finalize())[..16]
    ));
    if out.is_file() {
        return out;
    }
    let started = Instant::now();
    let result = Command::new(folder.join("build.sh"))
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}/build.sh: {e}", folder.display()));
    assert!(
        result.status.success(),
        "guests/{}/build.sh failed ({}):\n{}{}",
        lang.folder(),
        result.status,
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    println!(
        "built the {lang:?} job with guests/{}/build.sh in {:.1} s: {} bytes",
        lang.folder(),
        started.elapsed().as_secs_f64(),
        std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0)
    );
    out
}

/// A host whose guest lines are captured, with a compile cache in `cache`.
pub fn host_with_cache(cache: Option<PathBuf>) -> WasmHost {
    WasmHost::new(HostConfig {
        log_sink: baton_tests::captured::sink(),
        cache_dir: cache,
        ..HostConfig::default()
    })
    .expect("the wasm host starts")
}

/// The host every test shares, with the binary's compile cache under the target directory.
pub fn host() -> &'static WasmHost {
    static HOST: OnceLock<WasmHost> = OnceLock::new();
    HOST.get_or_init(|| host_with_cache(Some(target_dir().join("polyglot").join("cache"))))
}

pub use baton_tests::captured::lines_of;

/// A sandbox with a 256 MiB cap (an interpreter needs more than a Rust job) and `env`.
pub fn sandbox(env: &[(&str, &str)]) -> Sandbox {
    Sandbox {
        job_file: PathBuf::from("test.toml"),
        memory: 256 << 20,
        run_timeout: Duration::from_secs(120),
        data_dir: None,
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Sandbox::default()
    }
}

pub use baton_tests::attempt::{context, summary};
