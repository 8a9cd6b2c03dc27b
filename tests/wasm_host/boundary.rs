//! The jobs directory is a boundary: a job file cannot grant its guest the host's files. Every
//! path it names stays beneath the jobs directory; a directory elsewhere is granted by the
//! node's operator only (`--allow-dir NAME=PATH`, named `@NAME` in the job file). Real
//! components, real files, the real `baton` binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_tests::process::{baton, BatonProcess};
use baton_wasm::jobs::{load_job, JobError};
use baton_wasm::AllowedDirs;

use crate::support::{context, copy_guest, host, run, unique};

const WITHIN: Duration = Duration::from_secs(60);

/// A jobs directory `root/jobs` beside a directory `root/outside` that holds a secret.
struct Layout {
    root: tempfile::TempDir,
}

impl Layout {
    fn new() -> Layout {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("jobs")).expect("mkdir jobs");
        std::fs::create_dir_all(root.path().join("outside")).expect("mkdir outside");
        std::fs::write(root.path().join("outside/secret.txt"), "outside-s3cret\n")
            .expect("write the secret");
        Layout { root }
    }

    fn jobs(&self) -> PathBuf {
        self.root.path().join("jobs")
    }

    fn outside(&self) -> PathBuf {
        self.root.path().join("outside")
    }

    /// The `write-data` guest as job `name`, with `grants` under `[grants]` and `config` under
    /// `[config]`.
    fn job(&self, name: &str, grants: &str, config: &str) -> PathBuf {
        let toml = self.jobs().join(format!("{name}.toml"));
        std::fs::write(
            &toml,
            format!("schedule = \"@hourly\"\n[grants]\n{grants}\n[config]\n{config}\n"),
        )
        .expect("write the job file");
        copy_guest(env!("GUEST_WRITE_DATA"), &self.jobs(), name);
        toml
    }

    /// Nothing was written outside the jobs directory.
    fn assert_outside_untouched(&self) {
        let mut entries: Vec<String> = std::fs::read_dir(self.outside())
            .expect("read outside")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        entries.sort();
        assert_eq!(entries, ["secret.txt"], "something was written outside");
    }
}

/// The load error of `toml`, with nothing granted by the node.
fn refused(toml: &Path) -> String {
    match load_job(toml, &AllowedDirs::new()) {
        Ok(_) => panic!("{} loaded", toml.display()),
        Err(e @ (JobError::Path { .. } | JobError::Config { .. })) => e.to_string(),
        Err(other) => panic!("refused for another reason: {other}"),
    }
}

#[test]
fn a_data_dir_that_leaves_the_jobs_directory_is_refused_naming_the_file_the_key_the_path_and_the_fix(
) {
    let l = Layout::new();
    let absolute = l.outside().display().to_string();
    std::os::unix::fs::symlink(l.outside(), l.jobs().join("link")).expect("symlink");
    std::fs::create_dir_all(l.jobs().join("data")).expect("mkdir data");
    std::os::unix::fs::symlink(l.outside(), l.jobs().join("data/deep")).expect("symlink");
    for (written, why) in [
        ("../outside", "leads outside"),
        (absolute.as_str(), "is absolute"),
        ("link", "leads outside"),
        ("data/deep/more", "leads outside"),
    ] {
        let toml = l.job("escape", &format!("data_dir = {written:?}"), "");
        let message = refused(&toml);
        assert!(
            message.starts_with(&format!(
                "{}: grants.data_dir: {written:?} {why}",
                toml.display()
            )) && message.contains("--allow-dir NAME=")
                && message.contains("\"@NAME\""),
            "{written}: {message}"
        );
    }
    l.assert_outside_untouched();
}

#[test]
fn a_config_file_outside_the_jobs_directory_is_refused_and_its_secret_is_never_read() {
    let l = Layout::new();
    let absolute = l.outside().join("secret.txt").display().to_string();
    std::os::unix::fs::symlink(l.outside().join("secret.txt"), l.jobs().join("key"))
        .expect("symlink");
    for written in ["../outside/secret.txt", absolute.as_str(), "key"] {
        let toml = l.job("thief", "", &format!("k = {{ file = {written:?} }}"));
        let message = refused(&toml);
        assert!(
            message.starts_with(&format!(
                "{}: job thief: config.k: file {written:?} ",
                toml.display()
            )) && !message.contains("outside-s3cret"),
            "{written}: {message}"
        );
    }
    // A file beneath the jobs directory is read as before.
    std::fs::write(l.jobs().join("own.txt"), "mine\n").expect("write");
    let toml = l.job("owner", "", "k = { file = \"own.txt\" }");
    let spec = load_job(&toml, &AllowedDirs::new()).expect("a file beneath loads");
    assert_eq!(spec.config["k"].expose(), "mine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_swapped_in_after_load_does_not_redirect_the_guests_writes() {
    let l = Layout::new();
    let toml = l.job("swapped", "data_dir = \"data\"", "");
    let spec = load_job(&toml, &AllowedDirs::new()).expect("the job loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    // Once loaded, the data directory moves away and a link to outside takes its place.
    std::fs::rename(l.jobs().join("data"), l.jobs().join("data.moved")).expect("rename");
    std::os::unix::fs::symlink(l.outside(), l.jobs().join("data")).expect("symlink");
    let name = unique("swapped");
    assert_eq!(run(&job, context(&name), WITHIN).await, Ok(()));
    l.assert_outside_untouched();
    let written = std::fs::read_to_string(l.jobs().join("data.moved/out.txt"))
        .expect("out.txt written into the directory granted at load");
    assert!(written.starts_with(&format!("{name} ")), "{written}");
    // A reload sees the link and refuses it.
    assert!(refused(&toml).contains("grants.data_dir: \"data\" leads outside"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_the_node_grants_is_written_through_its_name() {
    let l = Layout::new();
    let toml = l.job("exporter", "data_dir = \"@exports/report\"", "");
    let message = refused(&toml);
    assert!(
        message.contains("names @exports, which this node does not grant (it grants none)")
            && message.contains("--allow-dir exports=PATH"),
        "{message}"
    );
    let mut allowed = AllowedDirs::new();
    allowed.insert("exports", l.outside()).expect("grant");
    let spec = load_job(&toml, &allowed).expect("the granted directory loads");
    let job = host().job(&spec).expect("the sandbox is set up");
    let name = unique("exporter");
    assert_eq!(run(&job, context(&name), WITHIN).await, Ok(()));
    let written = std::fs::read_to_string(l.outside().join("report/out.txt"))
        .expect("out.txt written beneath the granted directory");
    assert!(written.starts_with(&format!("{name} ")), "{written}");
    // Beneath the grant only.
    let toml = l.job("exporter", "data_dir = \"@exports/../jobs\"", "");
    let message = load_job(&toml, &allowed).err().map(|e| e.to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("\"@exports/../jobs\" leads outside")),
        "{message:?}"
    );
}

#[test]
fn baton_check_refuses_an_escape_and_accepts_the_same_job_with_the_nodes_grant() {
    let l = Layout::new();
    l.job("escape", "data_dir = \"../outside\"", "");
    let jobs = l.jobs().display().to_string();
    let out = baton(&["check", &jobs], &[]);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("escape.toml: grants.data_dir: \"../outside\" leads outside"),
        "{}",
        out.stdout
    );
    l.job("escape", "data_dir = \"@out\"", "");
    let grant = format!("out={}", l.outside().display());
    let out = baton(&["check", &jobs, "--allow-dir", &grant], &[]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let out = baton(&["check", &jobs], &[("BATON_ALLOW_DIR", grant.as_str())]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
}

#[test]
fn baton_run_writes_into_a_directory_its_config_file_grants_and_logs_the_grant() {
    let l = Layout::new();
    std::fs::write(
        l.jobs().join("export.toml"),
        "schedule = \"* * * * * *\"\nlease = \"5s\"\n[grants]\ndata_dir = \"@exports/report\"\n",
    )
    .expect("write the job file");
    copy_guest(env!("GUEST_WRITE_DATA"), &l.jobs(), "export");
    // The config file's relative allow_dirs path is taken from the file's own directory.
    let config = l.root.path().join("baton.toml");
    std::fs::write(
        &config,
        format!(
            "jobs = \"jobs\"\nstore = \"sqlite://{}\"\nallow_dirs = {{ exports = \"outside\" }}\n",
            l.root.path().join("baton.db").display()
        ),
    )
    .expect("write the config file");
    let config = config.display().to_string();
    let mut b = BatonProcess::start(&["run", "--config", &config], &[]);
    let line = b.wait_line(Duration::from_secs(60), "the start-up line", |l| {
        l.contains("baton is running")
    });
    assert!(
        line.contains(&format!(
            "allowed_dirs=@exports={}",
            l.root.path().join("outside").display()
        )),
        "{line}"
    );
    b.wait_line(Duration::from_secs(30), "a success", |l| {
        l.contains("success") && l.contains("export")
    });
    b.signal(libc::SIGTERM);
    let status = b.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}; said:\n{}", b.seen.join("\n"));
    let written = std::fs::read_to_string(l.outside().join("report/out.txt"))
        .expect("out.txt written beneath the granted directory");
    assert!(written.starts_with("export "), "{written}");
}
