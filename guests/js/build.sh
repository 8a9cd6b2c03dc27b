#!/usr/bin/env sh
# Builds the JavaScript job into a Baton component: ./build.sh [OUT.wasm] (default: job.wasm
# here). Needs Node.js 20 or later; installs the pinned build tool (componentize-js) from
# package-lock.json on first use. Copy this folder to start a job of your own: job.js is the job.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/job.wasm}"
if ! command -v node >/dev/null 2>&1; then
  echo "node is not installed: Node.js 20 or later builds JavaScript jobs" >&2
  exit 1
fi
# npm writes node_modules/.package-lock.json last: reinstall when it is missing (an install that
# did not finish) or older than the lock (the pinned versions changed).
installed="$here/node_modules/.package-lock.json"
if [ ! -f "$installed" ] || [ "$here/package-lock.json" -nt "$installed" ]; then
  npm ci --prefix "$here" --no-audit --no-fund --silent
fi
node "$here/build.mjs" "$out"
