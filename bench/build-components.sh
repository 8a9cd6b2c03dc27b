#!/usr/bin/env sh
# Builds the two guest components `baton bench` measures, from guests/, into a directory
# (default: bench/components), as `empty.wasm` (a job that does nothing: the per-run overhead)
# and `busy-loop.wasm` (a job that spins and never asks signal-aborted(): the zombie stop):
#
#   bench/build-components.sh [DIR]
#   baton bench --store URL --components DIR
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/bench/components}"
guests_target="${CARGO_TARGET_DIR:-$root/target}/guests"

rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
cargo build --manifest-path "$root/guests/Cargo.toml" --locked --release \
  --target wasm32-wasip2 --target-dir "$guests_target" -p empty -p busy-loop
mkdir -p "$out"
for job in empty busy-loop; do
  file="$(echo "$job" | tr - _)"
  cp "$guests_target/wasm32-wasip2/release/$file.wasm" "$out/$job.wasm"
done
echo "$out"
