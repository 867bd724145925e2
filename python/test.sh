#!/usr/bin/env bash
# pslite for Python, as CI checks it: a venv under target/ (NumPy, pytest and
# maturin from PyPI), `pip install ./python`, then the pytest suite
# (python/tests: clusters of Python, Rust and MXNet nodes under `pslite
# launch`). Needs the release binaries: cargo build --release --bins --examples.
# Usage: python/test.sh [pytest args]   Env: PSLITE_PY_VENV (default target/pyenv).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PSLITE_PY_VENV:-$repo/target/pyenv}"
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
if [ ! -x "$py" ]; then
  base="${PYTHON:-python3}"
  if ! "$base" -m venv "$venv" 2>/dev/null; then
    # e.g. Debian without python3-venv: virtualenv from PyPI into a side directory
    rm -rf "$venv" "$venv.tools"
    "$base" -m pip install -q --disable-pip-version-check --target "$venv.tools" virtualenv
    PYTHONPATH="$venv.tools" "$base" -m virtualenv -q "$venv"
  fi
fi
export PATH="$venv/bin:$PATH"  # maturin, and the Python the nodes run
"${pip[@]}" numpy pytest "maturin>=1.9.4,<2"
# maturin is in the venv already: build with it rather than a fresh isolated copy.
"${pip[@]}" --no-build-isolation "$repo/python"
cd "$repo"
exec "$py" -m pytest -q python/tests "$@"
