#!/usr/bin/env bash
# Create (idempotently) a Python venv with MXNet 1.9.1 for the ps-lite interop tests.
# Usage: tests/interop/setup_venv.sh    -> prints the venv's python path on stdout (last line).
# Env:   PSLITE_INTEROP_VENV  venv location (default <repo>/target/interop-venv)
#        PYTHON               base interpreter (default python3)
# mxnet 1.9.1 ships a py3-none-manylinux2014_x86_64 wheel (any CPython 3), so the stock python3
# works. numpy must be < 1.24 (mxnet 1.9.1 uses np.bool, removed in 1.24).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${PSLITE_INTEROP_VENV:-$repo/target/interop-venv}"
base="${PYTHON:-python3}"
py="$venv/bin/python"

ok() { [ -x "$py" ] && "$py" - <<'PY' >/dev/null 2>&1
import importlib.metadata as m
assert m.version("mxnet") == "1.9.1" and m.version("numpy") == "1.23.5"
PY
}

if ! ok; then
  echo "setup_venv: installing mxnet==1.9.1 numpy==1.23.5 into $venv" >&2
  mkdir -p "$(dirname "$venv")"
  [ -x "$py" ] || "$base" -m venv "$venv" >&2
  "$py" -m pip install --disable-pip-version-check -q "mxnet==1.9.1" "numpy==1.23.5" >&2
  ok || { echo "setup_venv: install check failed" >&2; exit 1; }
fi
echo "$py"
