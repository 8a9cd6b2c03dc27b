#!/usr/bin/env sh
# Builds the Python job into a Baton component: ./build.sh [OUT.wasm] (default: job.wasm here).
# Needs componentize-py (pip install -r requirements.txt). Copy this folder to start a job of
# your own: job.py is the whole job.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
wit="$here/../../wit"
out="${1:-$here/job.wasm}"
if ! command -v componentize-py >/dev/null 2>&1; then
  echo "componentize-py is not installed: pip install -r $here/requirements.txt" >&2
  exit 1
fi
# Write next to the target, then rename: a running baton never reads a half-written file.
componentize-py -d "$wit" -w job componentize job -p "$here" -o "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
