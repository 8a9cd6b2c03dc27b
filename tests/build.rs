//! Builds the guest components in `guests/` for `wasm32-wasip2` and tells the tests where they
//! are: `GUEST_<NAME>` (e.g. `GUEST_HELLO`, `GUEST_BUSY_LOOP`) is the path of each job crate's
//! component, for `env!`.
//!
//! The guests are a cargo workspace of their own, built by a nested cargo into
//! `$CARGO_TARGET_DIR/guests` (or `$OUT_DIR/guests` without one), so CI reuses the build. The
//! wasm32-wasip2 target links a `cdylib` into a component, so nothing needs converting.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf();
    let guests = root.join("guests");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed={}", guests.display());
    println!("cargo:rerun-if-changed={}", root.join("wit").display());
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    let target_dir = match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            };
            dir.join("guests")
        }
        _ => out_dir.join("guests"),
    };

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&guests)
        .arg("build")
        .arg("--locked")
        .arg("--workspace")
        .arg("--target=wasm32-wasip2")
        .arg("--target-dir")
        .arg(&target_dir);
    // What the outer cargo sets for this build must not leak into the guests' build: host
    // flags, the outer target directory and target, wrappers and profile overrides.
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PROFILE_")
            || key.starts_with("CARGO_BUILD_")
            || key.starts_with("CARGO_TARGET_")
            || key.starts_with("CARGO_CFG_")
            || key.starts_with("CARGO_FEATURE_")
            || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
        {
            cmd.env_remove(key);
        }
    }
    for key in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO_ENCODED_RUSTDOCFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "OUT_DIR",
        "TARGET",
        "HOST",
        "OPT_LEVEL",
        "PROFILE",
        "DEBUG",
        "NUM_JOBS",
    ] {
        cmd.env_remove(key);
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!(
            "cannot run cargo to build the guests in {}: {e}",
            guests.display()
        )
    });
    if !status.success() {
        panic!(
            "building the guest components failed ({status}); run `cargo build --target wasm32-wasip2` in {} to see why (is the target installed? `rustup target add wasm32-wasip2`)",
            guests.display()
        );
    }

    let built = target_dir.join("wasm32-wasip2").join("debug");
    let copies = out_dir.join("components");
    fs::create_dir_all(&copies).expect("create the components directory");
    for name in job_crates(&guests) {
        let file = name.replace('-', "_");
        let from = built.join(format!("{file}.wasm"));
        let to = copies.join(format!("{name}.wasm"));
        fs::copy(&from, &to)
            .unwrap_or_else(|e| panic!("the guest build did not produce {}: {e}", from.display()));
        let var = format!("GUEST_{}", name.replace('-', "_").to_uppercase());
        println!("cargo:rustc-env={var}={}", to.display());
    }
}

/// The guest crates that are components: every directory of `guests/` with a Cargo.toml,
/// except the SDK.
fn job_crates(guests: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let entries = fs::read_dir(guests).expect("read the guests directory");
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name == "sdk" || name.starts_with('.') || !path.join("Cargo.toml").is_file() {
            continue;
        }
        names.push(name.to_owned());
    }
    names.sort();
    names
}
