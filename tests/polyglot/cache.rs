//! The compile cache on disk: a restart loads large components without compiling them, and an
//! entry that is damaged, foreign or in a directory others may write is ignored, never trusted.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use baton_core::instance::Handler;

use crate::support::{built, context, host_with_cache, sandbox, Lang};

/// The one `.cwasm` entry in `dir`.
fn entry(dir: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the cache")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

/// Loads `component` on a new host (as a restarted `baton` would) with the cache in `dir`.
fn load_fresh(dir: &Path, component: &Path) -> (bool, f64) {
    let host = host_with_cache(Some(dir.to_path_buf()));
    let started = Instant::now();
    let loaded = host.load(component).expect("the component loads");
    (
        loaded.from_disk_cache,
        started.elapsed().as_secs_f64() * 1e3,
    )
}

#[test]
fn restarted_host_loads_a_large_component_from_the_disk_cache_without_compiling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let component = built(Lang::Python);
    let (cached, compiled_ms) = load_fresh(dir.path(), &component);
    assert!(!cached, "the first load compiles");
    let (cached, loaded_ms) = load_fresh(dir.path(), &component);
    assert!(cached, "the second host reads the cache");
    println!(
        "python job: compiled in {compiled_ms:.0} ms, loaded from the disk cache in {loaded_ms:.0} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_cache_entry_is_ignored_compiled_again_and_rewritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let component = Path::new(env!("GUEST_HELLO"));
    load_fresh(dir.path(), component);
    let path = entry(dir.path());
    let mut bytes = std::fs::read(&path).expect("read the entry");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&path, &bytes).expect("damage the entry");

    let host = host_with_cache(Some(dir.path().to_path_buf()));
    let loaded = host
        .load(component)
        .expect("loads despite the damaged entry");
    assert!(!loaded.from_disk_cache, "a damaged entry is not used");
    let job = host.job_from(loaded, sandbox(&[]));
    assert_eq!(job.run(context("damaged-cache")).await, Ok(()));
    assert!(
        load_fresh(dir.path(), component).0,
        "the entry was rewritten and is used again"
    );
}

#[test]
fn foreign_bytes_with_a_matching_digest_are_not_run_as_compiled_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let component = Path::new(env!("GUEST_HELLO"));
    load_fresh(dir.path(), component);
    let path = entry(dir.path());
    // Someone puts other bytes there, with a digest that matches them.
    let foreign = std::fs::read(component).expect("read a component");
    std::fs::write(&path, &foreign).expect("write foreign bytes");
    let digest = {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(&foreign))
    };
    std::fs::write(path.with_extension("sha256"), digest).expect("write a matching digest");
    assert!(
        !load_fresh(dir.path(), component).0,
        "bytes that are not a compiled component are compiled again, not loaded"
    );
}

#[test]
fn cache_in_a_directory_others_may_write_is_not_trusted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let component = Path::new(env!("GUEST_HELLO"));
    load_fresh(dir.path(), component);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("open the directory to everyone");
    assert!(
        !load_fresh(dir.path(), component).0,
        "a world-writable cache is ignored"
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
        .expect("close it again");
    assert!(
        load_fresh(dir.path(), component).0,
        "and used once it is private"
    );
}

#[test]
fn cache_entry_that_is_a_link_leading_out_of_the_cache_is_not_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let component = Path::new(env!("GUEST_HELLO"));
    load_fresh(dir.path(), component);
    // The entry and its digest move out of the cache, and links to them take their place: a
    // valid compiled component, reached only by leaving the cache directory.
    let path = entry(dir.path());
    for file in [path.clone(), path.with_extension("sha256")] {
        let moved = elsewhere
            .path()
            .join(file.file_name().expect("a file name"));
        std::fs::rename(&file, &moved).expect("move the entry out");
        std::os::unix::fs::symlink(&moved, &file).expect("link to it");
    }
    assert!(
        !load_fresh(dir.path(), component).0,
        "an entry outside the cache directory is compiled again, not loaded"
    );
}
