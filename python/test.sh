#!/usr/bin/env bash
# pslite for Python, as CI checks it, in the venv CI keeps outside the clone
# ($PSLITE_PY_VENV, default ~/.cache/pslite/torch-venv): created when
# missing with NumPy, pytest, mypy, maturin, PyTorch and scikit-learn from
# PyPI (PyTorch is large: about 6 GB and 5 minutes the first time), reused
# after. Builds the package's wheel (into target/python, its own build
# directory), installs it, then runs the pytest suite (python/tests:
# clusters of Python, Rust and MXNet nodes under `pslite launch`, the
# launcher from a fresh venv, pslite.torch). Needs the release binaries:
# cargo build --release --bins --examples.
# Usage: python/test.sh [pytest args]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PSLITE_PY_VENV:-$HOME/.cache/pslite/torch-venv}"
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
if [ ! -x "$py" ] || ! "$py" -c 'import torch, sklearn, mypy' 2> /dev/null; then
  echo "python/test.sh: creating $venv (PyTorch and scikit-learn from PyPI; once)" >&2
  base="${PYTHON:-python3}"
  if [ ! -x "$py" ] && ! "$base" -m venv "$venv" 2>/dev/null; then
    # e.g. Debian without python3-venv: virtualenv from PyPI into a side directory
    rm -rf "$venv" "$venv.tools"
    "$base" -m pip install -q --disable-pip-version-check --target "$venv.tools" virtualenv
    PYTHONPATH="$venv.tools" "$base" -m virtualenv -q "$venv"
  fi
  "${pip[@]}" numpy pytest mypy "maturin>=1.9.4,<2" torch scikit-learn
fi
export PATH="$venv/bin:$PATH"  # maturin, and the Python the nodes run
# The wheel (maturin from the venv: no isolated copy), then the package.
wheels="$repo/target/python/wheels"
rm -f "$wheels"/pslite-*.whl
"$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
  -w "$wheels" "$repo/python"
export PSLITE_WHEEL="$(ls -t "$wheels"/pslite-*.whl | head -1)"
"${pip[@]}" --force-reinstall --no-deps "$PSLITE_WHEEL"
cd "$repo"
exec "$py" -m pytest -q python/tests "$@"
