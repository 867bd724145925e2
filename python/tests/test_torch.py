"""pslite.torch (issue 29 items 2, 7): data-parallel training equals one
process on the global batch, broadcasts are exact, the digits example
reaches 0.95 under the venv's own `pslite` (no target/release on the PATH),
and train_ctr.py --torch reaches its threshold. Skipped without torch and
scikit-learn (python/test.sh installs both)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import EXAMPLES, launch, node_script

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

DIGITS = os.path.join(EXAMPLES, "train_digits.py")
CTR = os.path.join(EXAMPLES, "train_ctr.py")


@pytest.mark.parametrize("workers", [2, 3])
def test_data_parallel_equals_one_process_on_the_global_batch(workers):
    # 96-byte parts: every layer is cut into parts spread over both servers.
    run = launch(2, workers, node_script("dp_equal.py"), PSLITE_PARTITION_BYTES=96)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("PASS dp") == workers, run.stdout + run.stderr
    assert "float32: data-parallel equals one process" in run.stdout
    assert "float64: data-parallel equals one process" in run.stdout


def test_train_digits_under_the_venvs_pslite():
    pslite = os.path.join(os.path.dirname(sys.executable), "pslite")
    assert os.access(pslite, os.X_OK), f"{pslite}: pip install ./python puts it there"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "PYTHONUNBUFFERED": "1"}
    run = subprocess.run([pslite, "launch", "-s", "2", "-w", "2", "--timeout", "300", "--",
                          "python", DIGITS], env=env, capture_output=True, text=True,
                         timeout=360)
    assert run.returncode == 0, run.stdout + run.stderr
    acc = [float(a) for a in re.findall(r"test accuracy ([0-9.]+) after", run.stdout)]
    assert len(acc) == 2 and min(acc) >= 0.95, run.stdout
    assert acc[0] == acc[1], "the workers' models differ"


def test_train_ctr_torch_reaches_its_threshold():
    run = launch(2, 2, CTR, "--torch")
    assert run.returncode == 0, run.stdout + run.stderr
    acc = [float(a) for a in re.findall(r"held-out accuracy ([0-9.]+), loss [0-9.]+ after",
                                        run.stdout)]
    assert len(acc) == 2 and min(acc) >= 0.8, run.stdout
