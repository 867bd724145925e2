"""The examples as the README runs them."""

import os
import re

from conftest import EXAMPLES, launch

TRAIN = os.path.join(EXAMPLES, "train_ctr.py")


def test_train_ctr_reaches_its_threshold():
    run = launch(2, 2, TRAIN)
    assert run.returncode == 0, run.stdout + run.stderr
    accuracies = [float(a) for a in re.findall(r"held-out accuracy ([0-9.]+), loss [0-9.]+ after",
                                                run.stdout)]
    assert len(accuracies) == 2 and min(accuracies) >= 0.8, run.stdout


def test_train_ctr_fails_below_its_threshold():
    """Its exit code means something: an unreachable threshold fails the job."""
    run = launch(1, 1, TRAIN, "--epochs", "1", "--samples", "2000", "--threshold", "0.99")
    assert run.returncode != 0
    assert "BELOW THRESHOLD" in run.stdout, run.stdout + run.stderr
