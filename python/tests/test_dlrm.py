"""python/examples/dlrm.py at CI size (`--small`), pslite's trainer only: it
learns the synthetic data's signal and prints its RESULT lines."""

import os
import re
import subprocess
import sys

from conftest import BOUND, EXAMPLES, env

DLRM = os.path.join(EXAMPLES, "dlrm.py")


def test_dlrm_small_pslite_reaches_its_auc():
    run = subprocess.run([sys.executable, DLRM, "--small", "--trainers", "pslite", "--workers", "2"],
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=BOUND + 60)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    line = re.search(r"^RESULT dlrm rows=(\d+) W=2 trainer=pslite sps=(\d+) auc=([0-9.]+) "
                     r"worker_rss_mb=(\d+) server_rss_mb=(\d+)$", run.stdout, re.M)
    assert line, out
    rows, sps, auc, worker_mb, server_mb = line.groups()
    assert int(rows) == 200_000 and int(sps) > 0, out
    # The data's Bayes AUC is 0.83; plain PyTorch and TorchRec reach 0.80 at this size
    # (an untrained model 0.5, the dense features alone 0.62).
    assert float(auc) >= 0.78, out
    assert int(worker_mb) > 0 and int(server_mb) > 0, out
    summary = re.search(r"^RESULT dlrm rows=200000 W=2 pslite_sps=(\d+) torchrec_sps=NA "
                        r"pslite_auc=([0-9.]+) torchrec_auc=NA worker_rss_mb=(\d+)$",
                        run.stdout, re.M)
    assert summary and summary.group(2) == auc, out
