#!/usr/bin/env python3
"""How long a small pslite.torch job takes from launch to exit, next to its
training time (issue 40 item 3): `pslite launch -s 2 -w 2 [--torch] --
python python/examples/train_digits.py`, timed from the launcher's start
to its exit, with the training time the workers print (the slower one's).
Also when training started (the later worker's "before training" line)
and how long the job took to end after training (exit_s: the launcher's
exit after the last worker's final line). Each mode runs --repeat times,
in turn, and prints its median:

    RESULT torch_start mode=torch launch_to_exit_s=.. train_s=.. start_s=.. exit_s=.. torch_alone_s=..

torch_alone_s is how long two Pythons take side by side to import torch and
make a first optimizer (torch.optim imports torch._dynamo, over a second),
measured after each launch: the part of start_s that no launcher can save.

--mode torch (the default) launches with --torch (the scheduler and the
servers native); --mode script runs the script as every role; --mode both
runs the two in turn. Run from the repository; the `pslite` command comes
from --pslite (default target/release/pslite), the nodes' Python is this
one (its directory goes first on their PATH). Needs torch and scikit-learn.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(REPO, "python", "examples", "train_digits.py")


def run_once(pslite, torch_mode, extra, script=DIGITS):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    argv = [pslite, "launch", "-s", "2", "-w", "2", "--timeout", "600",
            *(["--torch"] if torch_mode else []), "--", sys.executable, script, *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    started, finished, train, lines = [], [], [], []
    for line in proc.stdout:
        now = time.monotonic() - t0
        lines.append(line)
        if "before training" in line:
            started.append(now)
        m = re.search(r"test accuracy [0-9.]+ after ([0-9.]+) s", line)
        if m:
            finished.append(now)
            train.append(float(m.group(1)))
    code = proc.wait()
    total = time.monotonic() - t0
    if code != 0 or len(train) != 2 or len(started) != 2:
        sys.exit(f"torch_start: the job failed (exit {code}):\n{''.join(lines[-30:])}")
    return {"launch_to_exit_s": total, "train_s": max(train), "start_s": max(started),
            "exit_s": total - max(finished)}


#: What torch itself does before any training script can train: import it
#: and make a first optimizer (which imports torch._dynamo: over a second).
TORCH_ALONE = ("import os, torch; "
               "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1); os._exit(0)")


def torch_alone_s():
    """How long two processes take to start Python, import torch and make a
    first optimizer side by side, as the two workers do: the floor of a
    worker's start, which neither pslite nor the launcher can shorten."""
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", TORCH_ALONE]) for _ in range(2)]
    if any(p.wait() != 0 for p in procs):
        sys.exit("torch_start: torch alone failed")
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("torch", "script", "both"), default="torch")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pslite", default=os.path.join(REPO, "target", "release", "pslite"))
    ap.add_argument("--script", default=DIGITS, help="the training script (train_digits.py)")
    ap.add_argument("args", nargs="*", help="train_digits.py's arguments (after --)")
    args = ap.parse_args()
    modes = {"torch": [True], "script": [False], "both": [True, False]}[args.mode]
    runs = {m: [] for m in modes}
    for _ in range(args.repeat):
        for m in modes:
            r = run_once(args.pslite, m, args.args, args.script)
            r["torch_alone_s"] = torch_alone_s()
            runs[m].append(r)
            print(f"run mode={'torch' if m else 'script'} "
                  + " ".join(f"{k}={v:.2f}" for k, v in r.items()), flush=True)
    for m in modes:
        figures = {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]}
        print(f"RESULT torch_start mode={'torch' if m else 'script'} "
              + " ".join(f"{k}={v:.2f}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
