"""kv_bench for Python: pslite's Python API next to Rust kv_bench, in the same run.

Run by itself it is the driver: it launches clusters of itself (every node
Python: scheduler, servers and workers) and clusters of Rust
`target/release/examples/kv_bench` through `pslite launch`, alternating, and
prints markdown tables and then one line per figure:

    RESULT py cxx_fresh 1+1 push_ms=.. pull_ms=.. rust_push_ms=.. rust_pull_ms=..
    RESULT py cxx_fresh 2+2 push_ms=.. pull_ms=.. rust_push_ms=.. rust_pull_ms=..
    RESULT py rtt 1+1 us=.. rust_us=..
    RESULT py rtt 2+2 us=.. rust_us=..

- cxx_fresh: C++ ps-lite's benchmark workload (10 M uint64 keys, float32
  values: 120 MB) pushed then pulled, each push with a value array never
  sent before (made before the timer starts), each pull answered with
  values never sent before (the servers make them beforehand), the keys
  the same array every time (`pslite.frozen`, as Rust's `SArray`); medians
  of every round of every worker. Each node runs what Rust kv_bench's runs,
  step by step: first `cxx` (the same arrays every round), then
  `cxx_fresh`; the tables give both, and for each the ratio of each run
  (a Python cluster and the Rust one after it).
- rtt: the 1-key push round trip, median of 2000 per run, RUNS runs of each
  side alternating, medians.

Build first: `cargo build --release --bins --examples` and
`pip install ./python`. Options: --keys, --repeat, --runs, --only cxx|rtt,
--bin-dir (where `pslite` and `examples/kv_bench` are; default
$PSLITE_BIN_DIR or <repo>/target/release).

Run with DMLC_ROLE set (as `pslite launch` does) it is one node: the
workers print `BENCH ...` lines for the driver.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import pslite

#: cmd of the push that asks each server to make its fresh answers.
CMD_PREPARE_FRESH = 1
#: cmd of a pull answered with values never sent before.
CMD_FRESH = 2
#: Round trips timed per rtt run (as Rust kv_bench at 1 key).
RTT_ITERS = 2000


# ------------------------------------------------------------- node mode

def empty_server(po, repeat):
    """Rust kv_bench's empty server: pushes are answered at once; a CMD_FRESH
    pull gets one of the value arrays made at CMD_PREPARE_FRESH (never sent
    before); other pulls get zeros (a slice of one pslite-owned array, the
    same every time, as Rust's cached `SArray`)."""
    server = pslite.KVServer(po)
    prepared = []
    zeros = [pslite.frozen(np.zeros(0, dtype=np.float32))]

    def handle(meta, pairs, srv):
        if meta.push and meta.cmd == CMD_PREPARE_FRESH:
            n = len(pairs.keys)
            prepared.extend(np.full(n, i + 1.0, dtype=np.float32) for i in range(repeat))
        if not meta.pull:
            srv.response(meta)
            return
        keys = pairs.keys
        if meta.cmd == CMD_FRESH and prepared:
            vals = prepared.pop()
        else:
            if zeros[0].size < keys.size:
                zeros[0] = pslite.frozen(np.zeros(keys.size, dtype=np.float32))
            vals = zeros[0][: keys.size]
        srv.response(meta, pslite.KVPairs(keys, vals))

    server.set_request_handle(handle)
    return server


def spread_keys(n):
    """n keys spread over the whole key space (every server gets a share)."""
    step = np.uint64(np.iinfo(np.uint64).max // max(n, 1))
    return np.arange(n, dtype=np.uint64) * step


def cxx_workload(po, kv, keys_n, repeat):
    """Rust kv_bench's cxx workload, step by step: the same value array every
    round (`cxx`), then a fresh one per push and fresh answers per pull
    (`cxx_fresh`); the keys the same array throughout. Arrays pslite owns
    (`pslite.frozen`) stand for Rust's `SArray`s, which a NumPy array made
    by the caller is not: pslite cannot know it did not change, so it is
    copied at every push, as a fresh one is."""
    keys = pslite.frozen(spread_keys(keys_n))
    same = pslite.frozen(np.ones(keys_n, dtype=np.float32))
    for fresh in (False, True):
        pull_cmd = 0
        if fresh:
            # Every server makes its fresh answers now, outside the timer.
            kv.push(keys, same, cmd=CMD_PREPARE_FRESH).wait()
            po.barrier(pslite.WORKER_GROUP)
            pull_cmd = CMD_FRESH
        push, pull = [], []
        for r in range(repeat):
            vals = np.full(keys_n, r + 2.0, dtype=np.float32) if fresh else same
            t = time.perf_counter()
            kv.push(keys, vals).wait()
            push.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            got = kv.pull(keys, cmd=pull_cmd).take().vals
            pull.append((time.perf_counter() - t) * 1e3)
            if got.size != keys_n:
                raise SystemExit(f"pulled {got.size} values, expected {keys_n}")
            del vals, got
        print("BENCH %s keys=%d push_ms=%s pull_ms=%s" % (
            "cxx_fresh" if fresh else "cxx", keys_n, ",".join("%.3f" % x for x in push),
            ",".join("%.3f" % x for x in pull)), flush=True)


def rtt(po, kv):
    keys = pslite.frozen(spread_keys(1))
    vals = np.ones(1, dtype=np.float32)
    po.barrier(pslite.WORKER_GROUP)
    for _ in range(20):
        kv.push(keys, vals).wait()
        kv.pull(keys).take()
    fresh = [np.full(1, i + 2.0, dtype=np.float32) for i in range(RTT_ITERS)]
    po.barrier(pslite.WORKER_GROUP)
    times = []
    perf = time.perf_counter
    while fresh:
        v = fresh.pop()
        t = perf()
        kv.push(keys, v).wait()
        times.append((perf() - t) * 1e6)
    print("BENCH rtt push_us=%.1f" % statistics.median(times), flush=True)


def node(args):
    po = pslite.Postoffice.from_env()
    po.start()
    server = empty_server(po, args.repeat) if po.is_server else None
    if po.is_worker:
        kv = pslite.KVWorker(po)
        if args.mode == "cxx":
            cxx_workload(po, kv, args.keys, args.repeat)
        else:
            rtt(po, kv)
        kv.close()
    po.finalize()
    if server is not None:
        server.close()


# ---------------------------------------------------------------- driver

def launch(pslite_bin, servers, workers, command):
    """Runs one cluster; returns the workers' BENCH lines (prefix removed)."""
    argv = [pslite_bin, "launch", "--timeout", "600", "--servers", str(servers),
            "--workers", str(workers), "--"] + command
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit("the %d+%d cluster `%s` failed:\n%s%s" % (
            servers, workers, " ".join(command), out.stdout, out.stderr))
    lines = []
    for line in out.stdout.splitlines():
        _, _, rest = line.partition("] ")
        if rest.startswith("BENCH "):
            lines.append(rest[len("BENCH "):])
    return lines


def field(line, name):
    for word in line.split():
        key, _, value = word.partition("=")
        if key == name:
            return value
    return None


def numbers(text):
    return [float(x) for x in text.split(",") if x]


def driver(args):
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    bin_dir = args.bin_dir or os.environ.get("PSLITE_BIN_DIR") or os.path.join(
        repo, "target", "release")
    pslite_bin = os.path.join(bin_dir, "pslite")
    rust_bench = os.path.join(bin_dir, "examples", "kv_bench")
    for f in (pslite_bin, rust_bench):
        if not os.access(f, os.X_OK):
            raise SystemExit(f"kv_bench.py: {f} is missing: run "
                             "`cargo build --release --bins --examples` or give --bin-dir")
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--keys", str(args.keys), "--repeat", str(args.repeat)]
    py_cmd = lambda mode: me + ["--mode", mode] + common  # noqa: E731
    rust_cmd = lambda mode: [rust_bench, "--mode", mode] + common  # noqa: E731
    print("# kv_bench.py: pslite's Python API next to Rust kv_bench (same machine, same run)\n")
    print("%d cores, load average %.1f, %d keys x %d rounds, %d cxx and %d rtt runs each, "
          "Python %s, NumPy %s\n" % (
              os.cpu_count() or 0, os.getloadavg()[0], args.keys, args.repeat, args.cxx_runs,
              args.runs, sys.version.split()[0], np.__version__))
    results = []
    if args.only in (None, "cxx"):
        print("C++ ps-lite's workload, %d keys: ms per push or pull, the median of every round "
              "of every worker; py/Rust: the median of the runs' ratios (each run: a Python "
              "cluster, then a Rust one), and in brackets their range; best: the fastest round "
              "of each side (the least disturbed on a busy machine).\n" % args.keys)
        print("| cluster | what | Python ms | Rust ms | py/Rust | py/Rust of each run "
              "| best Python / Rust ms |")
        print("|---|---|---|---|---|---|---|")
        rows = [("cxx_fresh", "push_ms", "push, fresh values"),
                ("cxx_fresh", "pull_ms", "pull, fresh values"),
                ("cxx", "push_ms", "push, the same arrays"),
                ("cxx", "pull_ms", "pull, the same arrays")]
        for s, w in ((1, 1), (2, 2)):
            pooled = {(side, name, op): [] for side in "pr" for name, op, _ in rows}
            ratios = {(name, op): [] for name, op, _ in rows}
            for _ in range(args.cxx_runs):
                run = {}
                for side, cmd in (("p", py_cmd("cxx")), ("r", rust_cmd("cxx"))):
                    lines = launch(pslite_bin, s, w, cmd)
                    for name, op, _ in rows:
                        run[side, name, op] = [x for l in lines if l.split()[0] == name
                                               for x in numbers(field(l, op))]
                        pooled[side, name, op] += run[side, name, op]
                for name, op, _ in rows:
                    ratios[name, op].append(statistics.median(run["p", name, op]) /
                                            statistics.median(run["r", name, op]))
            med = {k: statistics.median(v) for k, v in pooled.items()}
            for name, op, label in rows:
                r = ratios[name, op]
                print("| 1+%d+%d | %s | %.1f | %.1f | %.2f (%.2f-%.2f) | %s | %.2f / %.2f |" % (
                    s, w, label, med["p", name, op], med["r", name, op], statistics.median(r),
                    min(r), max(r), ", ".join("%.2f" % x for x in r),
                    min(pooled["p", name, op]), min(pooled["r", name, op])))
            results.append("RESULT py cxx_fresh %d+%d push_ms=%.1f pull_ms=%.1f "
                           "rust_push_ms=%.1f rust_pull_ms=%.1f" % (
                               s, w, med["p", "cxx_fresh", "push_ms"],
                               med["p", "cxx_fresh", "pull_ms"], med["r", "cxx_fresh", "push_ms"],
                               med["r", "cxx_fresh", "pull_ms"]))
        print()
    if args.only in (None, "rtt"):
        print("| cluster | Python runs (µs) | Rust runs (µs) | Python median | Rust median "
              "| py/Rust |")
        print("|---|---|---|---|---|---|")
        for s, w in ((1, 1), (2, 2)):
            py_runs, rs_runs = [], []
            for _ in range(args.runs):
                py = [float(field(l, "push_us")) for l in launch(pslite_bin, s, w, py_cmd("rtt"))
                      if l.startswith("rtt ")]
                rs = [float(field(l, "push_us")) for l in launch(pslite_bin, s, w, rust_cmd("rtt"))
                      if l.startswith("sweep ")]
                py_runs.append(statistics.median(py))
                rs_runs.append(statistics.median(rs))
            o, r = statistics.median(py_runs), statistics.median(rs_runs)
            print("| 1+%d+%d | %s | %s | %.1f | %.1f | %.2f |" % (
                s, w, ", ".join("%.1f" % x for x in py_runs),
                ", ".join("%.1f" % x for x in rs_runs), o, r, o / r))
            results.append("RESULT py rtt %d+%d us=%.1f rust_us=%.1f" % (s, w, o, r))
        print()
    print("load average at the end: %.1f\n" % os.getloadavg()[0])
    for line in results:
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5, help="rtt runs of each side")
    ap.add_argument("--cxx-runs", type=int, default=3, help="cxx clusters of each side")
    ap.add_argument("--only", choices=["cxx", "rtt"])
    ap.add_argument("--bin-dir")
    ap.add_argument("--mode", default="cxx", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if os.environ.get("DMLC_ROLE"):
        node(args)
    else:
        driver(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
