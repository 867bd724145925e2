#!/usr/bin/env bash
# Makes the venv python/examples/dlrm.py runs TorchRec in (default
# ~/.cache/pslite/torchrec-venv, or the directory given), from PyPI with the pins of
# requirements-torchrec.txt, then torchrec 1.9.2 without its dependency on the CUDA
# fbgemm-gpu (fbgemm-gpu-cpu provides the same fbgemm_gpu package). PyPI's torch wheel
# for Linux brings CUDA libraries along (several GB the first time); TorchRec runs on CPU.
# Usage: python/examples/torchrec_venv.sh [venv-dir]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-$HOME/.cache/pslite/torchrec-venv}"
py="$venv/bin/python"
[ -x "$py" ] || "${PYTHON:-python3}" -m venv "$venv"
pip=("$py" -m pip install -q --disable-pip-version-check)
"${pip[@]}" -r "$here/requirements-torchrec.txt"
"${pip[@]}" --no-deps torchrec==1.9.2
# an earlier install that pulled fbgemm-gpu overwrote fbgemm-gpu-cpu's files
if "$py" -m pip show -q fbgemm-gpu > /dev/null 2>&1; then
  "$py" -m pip uninstall -q -y fbgemm-gpu
  "${pip[@]}" --force-reinstall --no-deps fbgemm-gpu-cpu==1.9.0
fi
"$py" -c 'import torch, fbgemm_gpu, torchrec; print("torch", torch.__version__, "fbgemm_gpu", fbgemm_gpu.__version__, "torchrec", torchrec.__version__)'
