#!/usr/bin/env sh
# Builds the example jobs' components from guests/ into examples/jobs/ and runs them with
# `baton run` on the embedded SQLite store (sqlite://baton.db, in the current directory). Extra
# arguments go to `baton run`, e.g. `examples/run.sh --store sqlite:///tmp/b.db`.
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="$root/examples/jobs"
guests_target="${CARGO_TARGET_DIR:-$root/target}/guests"

rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
cargo build --manifest-path "$root/guests/Cargo.toml" --locked --release \
  --target wasm32-wasip2 --target-dir "$guests_target" -p hello -p write-data -p long -p counter
for job in hello write-data long counter; do
  file="$(echo "$job" | tr - _)"
  # Copy then rename, so a running baton never sees a half-written component.
  cp "$guests_target/wasm32-wasip2/release/$file.wasm" "$jobs/.$job.wasm.tmp"
  mv "$jobs/.$job.wasm.tmp" "$jobs/$job.wasm"
done
exec cargo run --manifest-path "$root/Cargo.toml" -p baton -- run --jobs "$jobs" "$@"
