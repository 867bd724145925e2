#!/usr/bin/env bash
# Create (idempotently) a Python venv with MXNet 1.9.1 for the ps-lite interop tests.
# Usage: tests/interop/setup_venv.sh    -> prints the venv's python path on stdout (only line).
# Env:   PSLITE_INTEROP_VENV  venv location (default <repo>/target/interop-venv)
#        PYTHON               base interpreter (default: first of python3, python3.11 ... python3.8
#                             whose version is 3.8-3.11)
# Facts: mxnet 1.9.1 ships one wheel, py3-none-manylinux2014_x86_64 (Linux x86_64, any CPython 3).
# numpy must be < 1.24 (mxnet 1.9.1 uses np.bool, removed in 1.24); numpy 1.23.5 has wheels for
# CPython 3.8-3.11 only, hence the interpreter range. Everything comes from PyPI.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${PSLITE_INTEROP_VENV:-$repo/target/interop-venv}"
py="$venv/bin/python"

ok() { [ -x "$py" ] && "$py" - <<'PY' >/dev/null 2>&1
import importlib.metadata as m
assert m.version("mxnet") == "1.9.1" and m.version("numpy") == "1.23.5"
PY
}

pick_python() {
  local c
  for c in ${PYTHON:-} python3 python3.11 python3.10 python3.9 python3.8; do
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(0 if (3, 8) <= sys.version_info[:2] <= (3, 11) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

if ! ok; then
  base="$(pick_python)" || {
    echo "setup_venv: need CPython 3.8-3.11 (numpy 1.23.5 wheels); set PYTHON=/path/to/python3.11" >&2
    exit 1; }
  echo "setup_venv: installing mxnet==1.9.1 numpy==1.23.5 into $venv (base: $base, $("$base" -V 2>&1))" >&2
  mkdir -p "$(dirname "$venv")"
  if [ ! -x "$py" ]; then
    rm -rf "$venv"
    if ! "$base" -m venv "$venv" >&2 2>/dev/null; then
      # e.g. Debian without python3-venv: bootstrap virtualenv from PyPI into a side directory
      echo "setup_venv: 'python -m venv' failed; trying virtualenv from PyPI" >&2
      rm -rf "$venv" "$venv.tools"
      "$base" -m pip install --disable-pip-version-check -q --target "$venv.tools" virtualenv >&2
      PYTHONPATH="$venv.tools" "$base" -m virtualenv -q "$venv" >&2
    fi
  fi
  "$py" -m pip install --disable-pip-version-check -q "mxnet==1.9.1" "numpy==1.23.5" >&2
  ok || { echo "setup_venv: install check failed" >&2; exit 1; }
fi
echo "$py"
