//! What an operator sees for bad input: one `error:` line naming the thing and the fix, and
//! exit code 1 (2 for a command line that does not parse). No password ever shows.

use baton_tests::process::{baton, Output};

fn fails(out: &Output) -> String {
    assert_eq!(
        out.code,
        Some(1),
        "expected exit 1; stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    out.stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in:\n{}", out.stderr))
        .to_owned()
}

#[test]
fn unknown_store_scheme_lists_the_schemes() {
    let line = fails(&baton(&["runs", "--store", "mongodb://db:27017"], &[]));
    assert_eq!(
        line,
        "error: opening store mongodb://db:27017: unknown store scheme \"mongodb\"; use \
         sqlite://PATH, redis://HOST:PORT, valkey://HOST:PORT or postgres://USER@HOST:PORT/DB"
    );
}

#[test]
fn unreachable_store_names_host_and_port_and_hides_the_password() {
    let port = baton_tests::servers::free_port(false);
    let url = format!("redis://ops:hunter2@127.0.0.1:{port}");
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = dir.path().display().to_string();
    for out in [
        baton(&["runs", "--store", &url], &[]),
        baton(&["run", "--jobs", &jobs, "--store", &url], &[]),
    ] {
        let line = fails(&out);
        assert!(
            line.contains(&format!("cannot reach store 127.0.0.1:{port}")),
            "{line}"
        );
        assert!(line.contains("redis://ops:***@127.0.0.1"), "{line}");
        assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    }
}

#[test]
fn malformed_cron_says_what_a_schedule_looks_like() {
    let line = fails(&baton(&["next", "every minute"], &[]));
    assert!(
        line.starts_with("error: invalid cron expression \"every minute\""),
        "{line}"
    );
    assert!(line.contains("expected 5 fields"), "{line}");
}

#[test]
fn unknown_time_zone_asks_for_an_iana_name() {
    let line = fails(&baton(&["next", "@daily", "--tz", "Mars/Olympus"], &[]));
    assert_eq!(
        line,
        "error: unknown time zone \"Mars/Olympus\"; use an IANA name such as UTC, \
         Europe/Berlin or America/New_York"
    );
}

#[test]
fn missing_jobs_directory_says_how_to_make_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope").display().to_string();
    let store = format!("sqlite://{}", dir.path().join("b.db").display());
    for args in [
        vec!["run", "--jobs", missing.as_str(), "--store", store.as_str()],
        vec!["jobs", "--jobs", missing.as_str()],
    ] {
        let line = fails(&baton(&args, &[]));
        assert_eq!(
            line,
            format!(
                "error: jobs directory {missing} does not exist; create it (one <name>.toml \
                 beside each <name>.wasm) or pass --jobs DIR"
            )
        );
    }
}

#[test]
fn bad_config_file_names_the_file_and_the_known_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("baton.toml");
    std::fs::write(&config, "stor = \"sqlite://x.db\"\n").expect("write");
    let config = config.display().to_string();
    let out = baton(&["run", "--config", &config], &[]);
    fails(&out);
    // The TOML parser's message spans lines (it quotes the file): the error starts the first.
    let line = out.stderr.replace('\n', " ");
    assert!(
        line.starts_with(&format!("error: config file {config}: ")),
        "{line}"
    );
    assert!(line.contains("unknown field `stor`"), "{line}");
    assert!(
        line.trim_end().ends_with(
            "the keys are jobs, store, runner, namespace, stop_timeout, http, http_token, log_format, cache_dir and allow_dirs"
        ),
        "{line}"
    );
}

#[test]
fn history_of_an_unknown_job_points_at_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("b.db").display());
    let line = fails(&baton(&["history", "nightly", "--store", &store], &[]));
    assert_eq!(
        line,
        "error: the store has no runs of job \"nightly\" in namespace \"baton\"; `baton runs` \
         lists the jobs it has"
    );
}

#[test]
fn a_command_line_that_does_not_parse_exits_2() {
    let out = baton(&["run", "--no-such-flag"], &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--no-such-flag"), "{}", out.stderr);
}

#[test]
fn check_names_a_malformed_allowed_host_and_no_command_prints_a_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write_job = |name: &str, toml: &str| {
        std::fs::write(dir.path().join(format!("{name}.toml")), toml).expect("write");
        std::fs::copy(env!("GUEST_HELLO"), dir.path().join(format!("{name}.wasm"))).expect("copy");
    };
    write_job(
        "hook",
        "schedule = \"@hourly\"\n[grants]\nallowed_outbound_hosts = [\"https://ok.example.com\", \"hooks.example.com\"]\n",
    );
    let out = baton(&["check", &dir.path().display().to_string()], &[]);
    let line = fails(&out);
    assert!(
        out.stdout.contains("hook.toml")
            && out.stdout.contains("grants.allowed_outbound_hosts")
            && out.stdout.contains("\"hooks.example.com\""),
        "{line}\n{}",
        out.stdout
    );

    std::fs::remove_file(dir.path().join("hook.toml")).expect("remove");
    write_job(
        "secretive",
        "schedule = \"@hourly\"\n[config]\ntoken = { env = \"BATON_CLI_TEST_TOKEN\" }\n",
    );
    let secret = "cli-s3cret-value";
    let dir_arg = dir.path().display().to_string();
    for args in [
        vec!["check", dir_arg.as_str()],
        vec!["jobs", "--jobs", dir_arg.as_str()],
    ] {
        let out = baton(&args, &[("BATON_CLI_TEST_TOKEN", secret)]);
        assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
        assert!(
            !out.stdout.contains(secret) && !out.stderr.contains(secret),
            "{}\n{}",
            out.stdout,
            out.stderr
        );
    }
    // Without the variable, the job does not load, and the error names the job, the key and
    // the source.
    let out = baton(&["check", &dir_arg], &[]);
    assert!(
        out.stdout.contains("job secretive")
            && out.stdout.contains("config.token")
            && out.stdout.contains("BATON_CLI_TEST_TOKEN"),
        "{}",
        out.stdout
    );
}
