#!/usr/bin/env bash
# Interoperability jobs between pslite (Rust) and MXNet 1.9.1's embedded C++ ps-lite, on 127.0.0.1.
#
# Usage: tests/interop/run.sh [--jobs LIST] [--repeat N] [--keep-logs DIR]
#   LIST: comma-separated job names or numbers (default: all), e.g. --jobs 1,2
#   N:    run the selected jobs N times in a row (default 1)
#   DIR:  keep every job's logs under DIR (default: a temp dir, removed unless a job failed)
#
# Builds nothing: it runs release binaries from $PSLITE_BIN_DIR (default
# ${CARGO_TARGET_DIR:-<repo>/target}/release), built by
#     cargo build --release -p pslite -p pslite-cli --bins --examples
# and creates (once) the MXNet venv with setup_venv.sh (PyPI: mxnet==1.9.1, numpy==1.23.5).
#
# Jobs (every node bounded by run_interop.py --timeout, every job by an outer timeout):
#   1 rust-scheduler  pslite scheduler + 1 MXNet server + 2 MXNet workers
#   2 rust-worker     MXNet scheduler + 1 MXNet server + 1 mxnet_worker (Rust)
#   3 rust-server     pslite scheduler + 1 mxnet_server (Rust) + 2 MXNet workers
#   4 mixed-workers   MXNet scheduler + 2 MXNet servers + 1 mxnet_worker + 1 MXNet worker
#                     (array split over both servers, sums merged across implementations)
#   5 mixed-servers   pslite scheduler + 1 mxnet_server + 1 MXNet server + 1 MXNet worker
#                     + 1 mxnet_worker
#   6 cxx-pslite      our C++ programs linked against C++ ps-lite (tests/interop/cxx/), each
#                     under `pslite launch -s 2 -w 2` 20 times with C++ ps-lite's scheduler and
#                     20 times with pslite's, and a killed C++ server declared dead
#                     (tests/interop/cxx_pslite.py; SKIP without a compiler or a checkout)
# The Rust workers of jobs 2 and 4 check that pslite's key-value store refuses a C++ scheduler at
# once, and that of job 5 uses it (MX_NODE_STORE) beside MXNet nodes.
# A job passes if every node exits 0, every worker passes all its value checks, and no Rust node
# (scheduler, worker, server) logs a WARN or ERROR line (PS_VERBOSE=1 for every node). The
# "waiting for ...: N s of M (PS_START_TIMEOUT)" progress lines do not count: MXNet nodes take
# more than 10 s to import on a cold venv, and saying so is not a fault.
# Prints one line per job, `PASS <job>` or `FAIL <job> (<reason>)`; exits 1 if any job failed,
# 2 if it could not run at all.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

jobs_arg="all"
repeat=1
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs_arg="${2:?--jobs needs a list}"; shift 2 ;;
    --repeat) repeat="${2:?--repeat needs a number}"; shift 2 ;;
    --keep-logs) keep="${2:?--keep-logs needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$repeat" in ''|*[!0-9]*|0) echo "run.sh: --repeat needs a positive number" >&2; exit 2 ;; esac

bin="${PSLITE_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/release}"
sched="$bin/pslite"
rworker="$bin/examples/mxnet_worker"
rserver="$bin/examples/mxnet_server"
for f in "$sched" "$rworker" "$rserver"; do
  if [ ! -x "$f" ]; then
    echo "FAIL interop (missing $f: run 'cargo build --release -p pslite -p pslite-cli --bins --examples' or set PSLITE_BIN_DIR)"
    exit 2
  fi
done

py="$("$here/setup_venv.sh")" || { echo "FAIL interop (MXNet venv setup failed, see above)"; exit 2; }

if [ -n "$keep" ]; then
  logroot="$keep"; mkdir -p "$logroot"
else
  logroot="$(mktemp -d "${TMPDIR:-/tmp}/pslite-interop.XXXXXX")"
fi

NODE_TIMEOUT=120   # seconds per node (run_interop.py kills what is left)
JOB_TIMEOUT=180    # seconds per job, launcher included

# Rust log lines are "<time> LEVEL message"; mxnet_server reports "mxnet_server: ERROR ...";
# pslite::exit_code prints "error: ..." on failure. Start-up progress lines are not problems.
rust_problems() {
  grep -hE '^[0-9TZ:.-]+ +(WARN|ERROR) |^error: |mxnet_server: ERROR' "$@" 2>/dev/null \
    | grep -vE ' WARN  waiting for .*\(PS_START_TIMEOUT\)$' | head -5
}

failed=0
run_job() {  # name, rust logs to check (space-separated node names), run_interop.py args...
  local name="$1" rust_nodes="$2"; shift 2
  local dir="$logroot/$name.$round"
  rm -rf "$dir"; mkdir -p "$dir"
  timeout -k 10 "$JOB_TIMEOUT" "$py" "$here/run_interop.py" --label "$name" --logdir "$dir" \
    --timeout "$NODE_TIMEOUT" --verbose 1 "$@" >"$dir/run_interop.out" 2>&1
  local rc=$? reason=""
  if [ $rc -ne 0 ]; then
    reason="$(grep -E '^FAIL ' "$dir/run_interop.out" | tail -1 | sed -E 's/^FAIL [^ ]+ \((.*)\)$/\1/')"
    [ -n "$reason" ] || reason="launcher exit $rc"
  else
    local n logs=()
    for n in $rust_nodes; do logs+=("$dir/$n.log"); done
    for n in $rust_nodes; do
      case "$n" in
        worker*) grep -q "PASS \[rust-worker rank [0-9]*\] all checks" "$dir/$n.log" ||
                   reason="${reason:+$reason; }$n: no final PASS line" ;;
      esac
    done
    local bad; bad="$(rust_problems "${logs[@]}")"
    if [ -n "$bad" ]; then
      reason="${reason:+$reason; }Rust node logged: $(echo "$bad" | head -1)"
    fi
  fi
  if [ -z "$reason" ]; then
    echo "PASS $name"
  else
    echo "FAIL $name ($reason)"
    echo "     logs: $dir"
    failed=1
  fi
}

want() {  # number, name
  [ "$jobs_arg" = all ] && return 0
  case ",$jobs_arg," in *",$1,"*|*",$2,"*) return 0 ;; esac
  return 1
}

for round in $(seq 1 "$repeat"); do
  want 1 rust-scheduler && run_job rust-scheduler "scheduler" \
    --servers 1 --workers 2 --scheduler "$sched scheduler"
  want 2 rust-worker && MX_NODE_STORE=0 run_job rust-worker "worker0" \
    --servers 1 --workers 1 --worker "$rworker"
  want 3 rust-server && run_job rust-server "scheduler server0" \
    --servers 1 --workers 2 --scheduler "$sched scheduler" --server "$rserver"
  want 4 mixed-workers && MX_NODE_STORE=0 run_job mixed-workers "worker0" \
    --servers 2 --workers 2 --worker "$rworker" --worker mx
  want 5 mixed-servers && MX_NODE_STORE=1 run_job mixed-servers "scheduler server0 worker1" \
    --servers 2 --workers 2 --scheduler "$sched scheduler" --server "$rserver" --server mx \
    --worker mx --worker "$rworker"
  if want 6 cxx-pslite; then
    dir="$logroot/cxx-pslite.$round"
    mkdir -p "$dir"
    if timeout -k 10 3600 python3 "$here/cxx_pslite.py" --bin-dir "$bin" >"$dir/cxx_pslite.out" 2>&1; then
      if grep -q '^SKIP ' "$dir/cxx_pslite.out"; then
        echo "PASS cxx-pslite ($(grep '^SKIP ' "$dir/cxx_pslite.out" | head -1))"
      else
        echo "PASS cxx-pslite ($(tail -1 "$dir/cxx_pslite.out"))"
      fi
    else
      echo "FAIL cxx-pslite ($(grep -E '^FAIL ' "$dir/cxx_pslite.out" | head -1))"
      echo "     logs: $dir"
      failed=1
    fi
  fi
done

if [ $failed -eq 0 ] && [ -z "$keep" ]; then
  rm -rf "$logroot"
fi
exit $failed
