#!/usr/bin/env sh
# Builds the Python job into a Baton component: ./build.sh [OUT.wasm] (default: job.wasm here).
# Needs componentize-py (pip install -r requirements.txt). Copy this folder to start a job of
# your own: job.py is the whole job.
#
# The world is wit/job-py.wit: Baton's job world (wit/ of the repository) and outbound HTTP. The
# WASI 0.2 packages it names come from the directory WASI_WIT when set, else from the
# wasmtime-wasi-http crate that Baton's host is built with (found with `cargo metadata`).
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
repo="$here/../.."
out="${1:-$here/job.wasm}"
if ! command -v componentize-py >/dev/null 2>&1; then
  echo "componentize-py is not installed: pip install -r $here/requirements.txt" >&2
  exit 1
fi
wasi="${WASI_WIT:-}"
if [ -z "$wasi" ]; then
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is not installed: set WASI_WIT to a directory of the WASI 0.2.12 WIT packages" >&2
    exit 1
  fi
  wasi="$(cargo metadata --quiet --format-version 1 --manifest-path "$repo/Cargo.toml" | python3 -c '
import json, os, sys
for package in json.load(sys.stdin)["packages"]:
    if package["name"] == "wasmtime-wasi-http":
        print(os.path.join(os.path.dirname(package["manifest_path"]), "wit", "deps"))
        break
')"
  if [ -z "$wasi" ] || [ ! -d "$wasi" ]; then
    echo "no wasmtime-wasi-http crate in $repo: set WASI_WIT to a directory of the WASI 0.2.12 WIT packages" >&2
    exit 1
  fi
fi
wit="$(mktemp -d)"
trap 'rm -rf "$wit"' EXIT
mkdir -p "$wit/deps/baton-job"
cp "$here/wit/job-py.wit" "$wit/"
cp "$repo"/wit/*.wit "$wit/deps/baton-job/"
cp "$wasi"/*.wit "$wit/deps/"
# Write next to the target, then rename: a running baton never reads a half-written file.
componentize-py -d "$wit" -w job-py componentize job -p "$here" -o "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
