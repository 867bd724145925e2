#!/usr/bin/env bash
# 1 MXNet scheduler + 1 MXNet server + 2 MXNet workers (dist_sync) on 127.0.0.1, free port.
# Prints per-node results and one final line `PASS mxnet-only` / `FAIL mxnet-only (...)`.
# Extra arguments go to run_interop.py (e.g. --servers 2, --verbose 2 --logdir DIR, --show-logs).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="$("$here/setup_venv.sh")" || { echo "FAIL mxnet-only (venv setup failed)"; exit 1; }
# run_interop.py bounds every node (--timeout, default 120 s) and kills leftovers; this outer
# bound only guards the launcher itself.
exec timeout -k 10 600 "$py" "$here/run_interop.py" --label mxnet-only "$@"
