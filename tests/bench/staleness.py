#!/usr/bin/env python3
"""Bounded staleness against a straggler (issue 33 item 3), side by side.

Runs `pslite demo --staleness S --slow-worker R --slow-ms M` for S = 0,
2, 8 and none (asynchronous; `--bounds` picks others), interleaved,
ROUNDS times each, and prints for each S the median time worker 0 took to reach the accuracy threshold, the
final accuracy, the largest clock gap the servers let a pull through with
(at most S: the bound held) and the wall time, then one
`RESULT staleness s=... time_to_threshold_s=... final_accuracy=...` line
per S (medians) and the time to the threshold as a ratio of s=0's.

    python3 tests/bench/staleness.py [--rounds 3] [--workers 4]
        [--slow-ms 20] [--jitter-ms 0] [--threshold 0.88] [--epochs 3]
        [--bounds 0,2,8,none]

`--slow-ms 0 --jitter-ms M` replaces the one straggler by jitter on every
worker (each sleeps an exponential time of mean M per iteration).

Builds nothing: run `cargo build --release -p pslite-cli` first (it uses
target/release/pslite of this checkout).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PSLITE = os.path.join(ROOT, "target", "release", "pslite")
RESULT = re.compile(
    r"RESULT staleness s=(\S+) time_to_threshold_s=(\S+) final_accuracy=(\S+) max_gap=(\S+)"
)
WALL = re.compile(r"wall time ([0-9.]+) s")


def run(args, s):
    cmd = [
        PSLITE, "demo",
        "--servers", str(args.servers),
        "--workers", str(args.workers),
        "--epochs", str(args.epochs),
        "--threshold", str(args.threshold),
        "--staleness", s,
        *(["--slow-worker", str(args.slow_worker), "--slow-ms", str(args.slow_ms)]
          if args.slow_ms > 0 else []),
        "--jitter-ms", str(args.jitter_ms),
        "--timeout", "300",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    m = RESULT.search(out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    wall = WALL.search(out.stdout)
    t = float("inf") if m.group(2) == "never" else float(m.group(2))
    return t, float(m.group(3)), m.group(4), float(wall.group(1)) if wall else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--slow-worker", type=int, default=1)
    p.add_argument("--slow-ms", type=int, default=20)
    p.add_argument("--jitter-ms", type=int, default=0,
                   help="every worker sleeps a random time (exponential, this mean) per iteration")
    p.add_argument("--threshold", type=float, default=0.88)
    p.add_argument("--bounds", default="0,2,8,none",
                   help="the values of s to run, comma-separated (0 first: the ratios are to it)")
    args = p.parse_args()
    bounds = [b.strip() for b in args.bounds.split(",") if b.strip()]
    if not bounds or bounds[0] != "0":
        sys.exit("--bounds must start with 0 (the ratios are to s=0)")
    runs = {s: [] for s in bounds}
    for r in range(args.rounds):
        for s in bounds:
            runs[s].append(run(args, s))
            t, a, g, w = runs[s][-1]
            print(f"round {r + 1} s={s}: time to {args.threshold} {t:.2f} s, "
                  f"final accuracy {a:.4f}, max gap {g}, wall {w:.1f} s", flush=True)
    print(f"\n{args.servers} servers, {args.workers} workers, worker {args.slow_worker} "
          f"slowed by {args.slow_ms} ms per iteration, jitter {args.jitter_ms} ms (mean) "
          f"on every worker, {args.epochs} epochs, "
          f"threshold {args.threshold}, median of {args.rounds}:")
    print("| s | time to threshold (s) | vs s=0 | final accuracy | max clock gap | wall (s) |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(x[0] for x in runs["0"])
    for s in bounds:
        t = statistics.median(x[0] for x in runs[s])
        a = statistics.median(x[1] for x in runs[s])
        gaps = sorted({x[2] for x in runs[s]})
        w = statistics.median(x[3] for x in runs[s])
        print(f"| {s} | {t:.2f} | {t / base:.2f} | {a:.4f} | {', '.join(gaps)} | {w:.1f} |")
    for s in bounds:
        t = statistics.median(x[0] for x in runs[s])
        a = statistics.median(x[1] for x in runs[s])
        print(f"RESULT staleness s={s} time_to_threshold_s={t:.2f} final_accuracy={a:.4f}")


if __name__ == "__main__":
    main()
