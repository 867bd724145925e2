#!/usr/bin/env python3
"""The summary table at the top of docs/BENCHMARKS.md, measured again.

Runs, side by side in one session and ROUNDS times over (alternating, so a
load spike hits every program alike):

- `kv_bench --only cxx` and `--only rtt`: pslite and raw ZeroMQ (over TCP,
  the path C++ ps-lite takes) in the same run, nodes on one host (shared
  memory and ipc, the defaults);
- the same with `PS_SHM=0` (which turns ipc off too): the path nodes on
  different hosts take, TCP, here over loopback (no real network's
  bandwidth or latency);
- C++ ps-lite (dmlc/ps-lite) running the same workloads
  (tests/bench/cxx_kv_bench.cc) under the same launcher, built here from a
  ps-lite checkout (`--ps-lite DIR`, or PSLITE_CXX_SRC) against the system's
  libzmq and protobuf (Debian: libzmq3-dev libprotobuf-dev
  protobuf-compiler) into target/cxxbench; without one that column is left
  out.

Every ratio is pslite's time / the other's time (lower is better), taken
within one round and then summarised over the rounds (median, and the range
in brackets). Prints the table in markdown, then every measurement, the date,
the commit and the load average. Needs the release binaries
(`cargo build --release --bins --examples`).

    tests/bench/summary.py [--rounds 5] [--ps-lite ~/ps-lite] [--bin-dir target/release]

`--build-only` builds the C++ program and prints its path (kv_bench's
`--only scale` runs its `connection` mode beside pslite's, given `--cxx`).
"""

import argparse
import datetime
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTERS = ["1+1", "2+2"]


def load():
    return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def run(cmd, env=None, timeout=900):
    """Runs `cmd`, returns its stdout; a failure ends the summary."""
    full_env = dict(os.environ, **(env or {}))
    r = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def kv_bench(bins, part, shm):
    """{(name, cluster): fields} of kv_bench's RESULT lines."""
    env = {} if shm else {"PS_SHM": "0"}
    out = run([bins / "examples" / "kv_bench", "--only", part], env)
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            _, name, cluster, *_ = line.split()
            results[(name, cluster)] = {k: float(v) for k, v in fields(line).items()}
    return results


def build_cxx(src, rev):
    """Builds tests/bench/cxx_kv_bench.cc against ps-lite: `src` is a
    checkout, or a git repository (bare too) whose commit `rev` is taken."""
    out = ROOT / "target" / "cxxbench"
    binary = out / "cxx_kv_bench"
    bench = ROOT / "tests" / "bench" / "cxx_kv_bench.cc"
    if binary.exists() and binary.stat().st_mtime > bench.stat().st_mtime:
        return binary
    for tool in ("g++", "protoc"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian: g++ protobuf-compiler libprotobuf-dev libzmq3-dev)")
    build = out / "ps-lite"
    if build.exists():
        shutil.rmtree(build)
    if (src / "src" / "meta.proto").exists():
        shutil.copytree(src, build, ignore=shutil.ignore_patterns(".git", "build", "deps"))
    else:
        build.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(src), "archive", rev], capture_output=True, check=False)
        if archive.returncode != 0:
            sys.exit(f"{src} is neither a ps-lite checkout nor a git repository with {rev}")
        subprocess.run(["tar", "-x", "-C", str(build)], input=archive.stdout, check=True)
    run(["protoc", "--cpp_out=" + str(build / "src"), "--proto_path=" + str(build / "src"),
         str(build / "src" / "meta.proto")])
    flags = ["-std=c++14", "-O3", "-msse2", "-w", "-I", str(build / "src"), "-I", str(build / "include")]
    objects = []
    for name in ("customer", "postoffice", "van", "meta.pb"):
        obj = out / f"{name}.o"
        run(["g++", *flags, "-c", str(build / "src" / f"{name}.cc"), "-o", str(obj)])
        objects.append(str(obj))
    run(["g++", *flags, str(bench), *objects, "-lzmq", "-lprotobuf", "-pthread", "-o", str(binary)])
    return binary


def cxx(bins, binary, cluster, mode):
    """Medians of C++ ps-lite's BENCH lines (all workers' rounds)."""
    s, w = cluster.split("+")
    out = run([bins / "pslite", "launch", "--timeout", "600", "-s", s, "-w", w, "--", binary, mode])
    values = {"push": [], "pull": []}
    for line in out.splitlines():
        if "BENCH " not in line:
            continue
        f = fields(line.split("BENCH ", 1)[1])
        for key, unit in (("push_ms", "push"), ("pull_ms", "pull"), ("push_us", "push")):
            if key in f:
                values[unit] += [float(x) for x in f[key].split(",")]
    return {k: statistics.median(v) for k, v in values.items() if v}


def rows(rounds):
    """(label, cluster, key) of every row of the table, where `key` picks a
    figure of a round: (part, shm, what)."""
    table = []
    for shm, where in ((True, "same host"), (False, "across hosts")):
        for cluster in CLUSTERS:
            table.append((f"{where}: push 120 MB, fresh values", cluster, ("cxx", shm, "push")))
            table.append((f"{where}: pull 120 MB, fresh values", cluster, ("cxx", shm, "pull")))
        for cluster in CLUSTERS:
            table.append((f"{where}: 1-key push round trip", cluster, ("rtt", shm, "push")))
    return table


def measure_round(bins, binary, rtt_launches):
    """One round: every program once, side by side. Returns
    {(part, shm, what, cluster): (pslite, raw, cxx or None)}."""
    figures = {}
    for shm in (True, False):
        res = kv_bench(bins, "cxx", shm)
        for cluster in CLUSTERS:
            r = res[("cxx_fresh", cluster)]
            figures[("cxx", shm, "push", cluster)] = [r["push_ms"], r["raw_push_ms"], None]
            figures[("cxx", shm, "pull", cluster)] = [r["pull_ms"], r["raw_pull_ms"], None]
    if binary:
        for cluster in CLUSTERS:
            c = cxx(bins, binary, cluster, "cxx")
            for shm in (True, False):  # C++ ps-lite has one path: TCP
                figures[("cxx", shm, "push", cluster)][2] = c["push"]
                figures[("cxx", shm, "pull", cluster)][2] = c["pull"]
    for shm in (True, False):
        res = kv_bench(bins, "rtt", shm)
        for cluster in CLUSTERS:
            r = res[("rtt", cluster)]
            figures[("rtt", shm, "push", cluster)] = [r["ours_us"], r["raw_us"], None]
    if binary:
        for cluster in CLUSTERS:
            c = statistics.median(cxx(bins, binary, cluster, "rtt")["push"] for _ in range(rtt_launches))
            for shm in (True, False):
                figures[("rtt", shm, "push", cluster)][2] = c
    return figures


def summary(values):
    """`median (low-high)` of ratios, or `-`."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = statistics.median(values)
    if len(values) == 1:
        return f"{m:.2f}"
    return f"{m:.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ps-lite", default=os.environ.get("PSLITE_CXX_SRC"),
                        help="a checkout (or git clone) of github.com/dmlc/ps-lite")
    parser.add_argument("--ps-lite-rev", default="15b8adf",
                        help="the commit to build when --ps-lite is a git repository")
    parser.add_argument("--bin-dir", default=str(ROOT / "target" / "release"),
                        help="where pslite and examples/kv_bench are")
    parser.add_argument("--build-only", action="store_true",
                        help="build the C++ program (needs --ps-lite), print its path and stop")
    args = parser.parse_args()
    if args.build_only:
        if not args.ps_lite:
            sys.exit("--build-only needs --ps-lite (or PSLITE_CXX_SRC)")
        print(build_cxx(pathlib.Path(args.ps_lite), args.ps_lite_rev))
        return
    bins = pathlib.Path(args.bin_dir)
    binary = build_cxx(pathlib.Path(args.ps_lite), args.ps_lite_rev) if args.ps_lite else None
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    start, loads, rounds = datetime.datetime.now(datetime.timezone.utc), [load()], []
    for i in range(args.rounds):
        rounds.append(measure_round(bins, binary, rtt_launches=5))
        loads.append(load())
        print(f"round {i + 1} of {args.rounds} done, load average {loads[-1]}", file=sys.stderr)
    end = datetime.datetime.now(datetime.timezone.utc)

    def unit(part):
        return "ms" if part == "cxx" else "µs"

    print(f"Measured {start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC at {commit}, {args.rounds} rounds, "
          f"{os.cpu_count()} cores, load average (1, 5, 15 min) over the rounds: {'; '.join(loads)}.\n")
    print("| what | cluster | pslite | raw ZeroMQ | C++ ps-lite | pslite / raw ZeroMQ | pslite / C++ ps-lite |")
    print("|---|---|---|---|---|---|---|")
    for label, cluster, (part, shm, what) in rows(rounds):
        per_round = [r[(part, shm, what, cluster)] for r in rounds]
        med = [statistics.median(x[i] for x in per_round) if per_round[0][i] is not None else None
               for i in range(3)]
        show = [f"{m:.1f} {unit(part)}" if m is not None else "-" for m in med]
        vs_raw = summary([x[0] / x[1] for x in per_round])
        vs_cxx = summary([x[0] / x[2] if x[2] else None for x in per_round])
        print(f"| {label} | {cluster} | {show[0]} | {show[1]} | {show[2]} | {vs_raw} | {vs_cxx} |")
    print("\nEvery measurement (pslite, raw ZeroMQ, C++ ps-lite), by round:\n\n```text")
    for i, r in enumerate(rounds):
        for (part, shm, what, cluster), values in sorted(r.items(), key=str):
            where = "same-host" if shm else "across-hosts"
            print(f"round {i + 1} {part} {where} {what} {cluster} " +
                  " ".join("-" if v is None else f"{v:.1f}" for v in values))
    print("```")


if __name__ == "__main__":
    main()
