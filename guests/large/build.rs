//! Writes the 40 MiB payload the job embeds: pseudo-random bytes, so no compression or
//! zero-page trick makes the component small.

use std::io::Write;

const SIZE: usize = 40 << 20;

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let path = out.join("payload.bin");
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == SIZE as u64) {
        return;
    }
    let mut bytes = Vec::with_capacity(SIZE);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while bytes.len() < SIZE {
        // xorshift64: cheap and never repeats within the payload.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    let mut file = std::fs::File::create(&path).expect("create the payload");
    file.write_all(&bytes).expect("write the payload");
    println!("cargo:rerun-if-changed=build.rs");
}
