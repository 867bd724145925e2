#!/usr/bin/env python3
"""pslite across hosts at real link speeds (issue 30).

Every node runs in a network namespace of its own (its "machine"), joined to
the others by a veth pair on a bridge that lives in a namespace of its own.
Each node's link is limited with `tc qdisc ... tbf` to RATE Gbit/s in both
directions (the node's own end limits what it sends, the bridge's end what
it receives), so every library waits for the same wire. In one run, side by
side:

- links: 120 MB push and pull (C++ ps-lite's benchmark workload: 10 M keys
  with f32 values, fresh values every round) at 1+1 and 2+2 by pslite
  (`kv_bench --mode cxx_fresh`), raw ZeroMQ (`kv_bench`'s raw baseline: the
  same bytes over the same sockets) and C++ ps-lite (`tests/bench/
  cxx_kv_bench.cc`, built from a ps-lite checkout as tests/bench/summary.py
  builds it; without one that column is left out). `limit_ms` is the wire's
  limit: the bytes the busiest link carries x 8 / RATE; for a pull also
  `pull_serial_limit_ms`, its request's and its answer's in turn (an answer
  starts only once its request has arrived whole: the bound of raw ZeroMQ's
  and C++ ps-lite's one request per server; pslite sends a large pull in
  chunks, so its answers stream while later keys travel); and
  `pull_own_limit_ms`, the limit of pslite's own wire between pslite
  nodes, whose answers to a large pull leave out the keys (the worker has
  them: `PBMeta.same_keys`), so they carry the values only.
- priority: a layer-wise step (`kv_bench --mode layers`: 10 layers whose
  gradients are pushed back to front, then pulled front to back) with every
  request at priority 0 (first come, first served) and with P3's priorities
  (the first layer highest): when the first layer's pull completes, and the
  whole step.
- compression: `pslite demo` with each gradient compressor: bytes moved,
  time per epoch, final accuracy.

Prints tables and `RESULT links|priority|compression ...` lines. Speed is
never asserted; the script fails only when something does not run. Needs
root (ip netns, tc) and the release binaries (`cargo build --release --bins
--examples`). Everything it creates (namespaces, processes) is removed when
it exits, also on failure or Ctrl-C, and namespaces left by an earlier run
that was killed are removed at start.

    tests/bench/links.py [--rate 1] [--rate 5] [--only links|priority|compression]
                         [--keys 10000000] [--rounds 3] [--ps-lite DIR] [--small]
"""

import argparse
import atexit
import datetime
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import summary  # noqa: E402  (build_cxx: how the project builds C++ ps-lite)

PREFIX = "plk"
# The demo's compressors, with the parameters its gradients need (2bit's
# threshold and randomk's fraction depend on the gradients' scale; MXNet's
# default threshold 0.5 is far above this model's per-feature gradients).
COMPRESSORS = ["none", "onebit", "topk:0.01", "randomk:0.05", "2bit:0.02"]
CLUSTERS = [(1, 1), (2, 2)]
# Names of our namespaces: plk<pid>n<i> (node i) and plk<pid>sw (the bridge).
OURS = re.compile(rf"^{PREFIX}(\d+)(?:n\d+|sw)$")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(*cmd, check=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {r.stderr.strip()}")
    return r.stdout


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces():
    out = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kill_namespace(name):
    """Kills every process in namespace `name`, then deletes it."""
    for pid in sh("ip", "netns", "pids", name, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    # A killed process may take a moment to leave the namespace.
    for _ in range(50):
        if subprocess.run(["ip", "netns", "del", name], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    log(f"could not delete network namespace {name}")


def sweep_stale():
    """Deletes namespaces an earlier run left behind (its process is gone)."""
    for name in namespaces():
        m = OURS.match(name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            log(f"removing {name}, left by an earlier run (process {m.group(1)} is gone)")
            kill_namespace(name)


class Network:
    """`nodes` namespaces on one bridge, each link limited to `rate` Gbit/s
    each way."""

    def __init__(self, nodes):
        self.tag = f"{PREFIX}{os.getpid()}"
        self.nodes = nodes
        self.subnet = f"10.97.{os.getpid() % 250 + 1}"
        self.created = []

    def ns(self, i):
        return f"{self.tag}n{i}"

    def ip(self, i):
        return f"{self.subnet}.{10 + i}"

    def veth(self, i):
        return f"{self.tag}v{i}"

    @property
    def switch(self):
        return f"{self.tag}sw"

    def setup(self):
        sh("ip", "netns", "add", self.switch)
        self.created.append(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.nodes):
            n = self.ns(i)
            sh("ip", "netns", "add", n)
            self.created.append(n)
            sh("ip", "link", "add", self.veth(i), "netns", self.switch, "type", "veth",
               "peer", "name", "net0", "netns", n)
            sh("ip", "-n", self.switch, "link", "set", self.veth(i), "master", "br0", "up")
            sh("ip", "-n", n, "link", "set", "lo", "up")
            sh("ip", "-n", n, "addr", "add", f"{self.ip(i)}/24", "dev", "net0")
            sh("ip", "-n", n, "link", "set", "net0", "up")

    def limit(self, gbit):
        """tbf at `gbit` on both ends of every node's link. The bucket holds
        2 ms of traffic (at least 256 KiB: less than a timer tick's worth
        starves the link), the queue up to 10 ms (a NIC's usual queue)."""
        burst = max(256 * 1024, int(gbit * 1e9 / 8 * 0.002))
        for i in range(self.nodes):
            for ns, dev in ((self.ns(i), "net0"), (self.switch, self.veth(i))):
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                   "tbf", "rate", f"{gbit}gbit", "burst", str(burst), "latency", "10ms")

    def reap(self):
        """Kills every process still in a node's namespace."""
        for i in range(self.nodes):
            for pid in sh("ip", "netns", "pids", self.ns(i), check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def teardown(self):
        for name in reversed(self.created):
            kill_namespace(name)
        self.created = []


class Node:
    """A process in a namespace, its output in a log file."""

    def __init__(self, net, i, name, env, argv, logs, pipe=False):
        self.name = name
        self.log = logs / f"{name}.log"
        full = ["ip", "netns", "exec", net.ns(i), "env", "-i", f"PATH={os.environ.get('PATH', '')}",
                "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"]
        full += [f"{k}={v}" for k, v in env.items()] + [str(a) for a in argv]
        self.out = open(self.log, "w")
        if pipe:
            self.proc = subprocess.Popen(full, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.out, text=True, start_new_session=True)
        else:
            self.proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=self.out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, deadline):
        try:
            rc = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self.name} did not finish in time (log: {self.log})")
        self.out.close()
        return rc

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.out.close()

    def text(self):
        return self.log.read_text(errors="replace")


class Bench:
    def __init__(self, args, net, logs):
        self.args = args
        self.net = net
        self.logs = logs
        self.bins = pathlib.Path(args.bin_dir)
        self.kv_bench = self.bins / "examples" / "kv_bench"
        self.pslite = self.bins / "pslite"
        self.port = 9100
        self.runs = 0
        # --env VAR=VALUE: for every node of every cluster (pslite's; C++
        # ps-lite ignores PS_* variables it does not know).
        self.pslite_env = dict(kv.split("=", 1) for kv in args.env or [])

    def cluster(self, servers, workers, argv, env=None, timeout=600, programs=None, label="run"):
        """Runs one ps-lite job: scheduler in namespace 0, servers in 1..S,
        workers after them. Returns the workers' outputs."""
        self.port += 1
        self.runs += 1
        common = {
            "DMLC_NUM_SERVER": servers, "DMLC_NUM_WORKER": workers,
            "DMLC_PS_ROOT_URI": self.net.ip(0), "DMLC_PS_ROOT_PORT": self.port,
            "PS_START_TIMEOUT": 120,
        }
        common.update(env or {})
        common.update(self.pslite_env)
        roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
        nodes = []
        try:
            for i, role in enumerate(roles):
                e = dict(common, DMLC_ROLE=role, DMLC_NODE_HOST=self.net.ip(i))
                prog = (programs or {}).get(role, argv)
                nodes.append(Node(self.net, i, f"{self.runs:03d}-{label}-{role}{i}", e, prog, self.logs))
            deadline = time.monotonic() + timeout
            failed = [n for n in nodes if n.wait(deadline) != 0]
            if failed:
                raise RuntimeError(f"{', '.join(n.name for n in failed)} failed; last lines of "
                                   f"{failed[0].log}:\n" + "\n".join(failed[0].text().splitlines()[-15:]))
            return [n.text() for n, role in zip(nodes, roles) if role == "worker"]
        finally:
            for n in nodes:
                if n.proc.poll() is None:
                    n.kill()
            self.net.reap()

    # -- links --------------------------------------------------------------

    def pslite_bulk(self, s, w):
        outs = self.cluster(s, w, [self.kv_bench, "--mode", "cxx_fresh", "--keys", self.args.keys,
                                   "--repeat", self.args.rounds], label=f"pslite-{s}+{w}")
        return bench_medians(outs, "cxx_fresh")

    def cxx_bulk(self, binary, s, w):
        outs = self.cluster(s, w, [binary, "cxx", self.args.keys, self.args.rounds],
                            label=f"cxx-{s}+{w}")
        return bench_medians(outs, "cxx_fresh")

    def raw_bulk(self, s, w):
        """kv_bench's raw ZeroMQ baseline, its servers and clients each in
        the namespace the pslite node of that rank has."""
        procs = []
        try:
            clients = []
            for c in range(w):
                i = 1 + s + c
                node = Node(self.net, i, f"{self.runs:03d}-raw-{s}+{w}-client{c}",
                            {"KV_BENCH_RAW_HOST": self.net.ip(i)},
                            [self.kv_bench, "--raw-client", c], self.logs, pipe=True)
                procs.append(node)
                clients.append(node)
            client_eps = [endpoint(c) for c in clients]
            server_eps = []
            for r in range(s):
                i = 1 + r
                node = Node(self.net, i, f"{self.runs:03d}-raw-{s}+{w}-server{r}",
                            {"KV_BENCH_RAW_HOST": self.net.ip(i)},
                            [self.kv_bench, "--raw-server", r, "--raw-clients", ",".join(client_eps)],
                            self.logs, pipe=True)
                procs.append(node)
                server_eps.append(endpoint(node))
            for c in clients:
                c.proc.stdin.write(f"CONNECT {','.join(server_eps)}\n")
                c.proc.stdin.flush()
            keys, iters = self.args.keys, self.args.rounds
            result = {}
            for what, line in (("push", f"RUN {s} {keys * 12} 0 16 {iters}\n"),
                               ("pull", f"RUN {s} {keys * 8} 1 {keys * 4} {iters}\n")):
                for c in clients:
                    c.proc.stdin.write(line)
                    c.proc.stdin.flush()
                medians = []
                for c in clients:
                    answer = c.proc.stdout.readline()
                    if not answer.startswith("MEDIAN "):
                        raise RuntimeError(f"a raw client said {answer!r} (log: {c.log})")
                    medians.append(float(answer.split()[1]) / 1e3)
                result[what] = statistics.median(medians)
            return result
        finally:
            for p in procs:
                if p.proc.poll() is None:
                    p.kill()
            self.net.reap()

    def links(self, rate, binary):
        keys = self.args.keys
        rows = []
        for s, w in CLUSTERS:
            log(f"links: rate {rate} Gbit/s, {s}+{w}")
            ours = self.pslite_bulk(s, w)
            raw = self.raw_bulk(s, w)
            cxx = self.cxx_bulk(binary, s, w) if binary else {}
            limit = limit_ms(keys, s, w, rate)
            rows.append((s, w, ours, raw, cxx, limit))
        print(f"\n## Links at {rate} Gbit/s: push and pull of {keys * 12 / 1e6:.0f} MB "
              f"({keys} keys, fresh values; medians of {self.args.rounds} rounds per worker)\n")
        print("| cluster | limit ms | pslite push | pslite pull | raw push | raw pull | C++ push | C++ pull "
              "| pslite / limit, push | pslite / limit, pull | pslite / serial limit, pull "
              "| pslite / own limit, pull | pslite / C++, push | pslite / C++, pull |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        results = []
        for s, w, ours, raw, cxx, limit in rows:
            def f(d, k):
                return f"{d[k]:.0f}" if k in d else "-"

            def ratio(a, b):
                return f"{a / b:.2f}" if b else "-"
            print(f"| {s}+{w} | {limit['push']:.0f} / {limit['pull']:.0f} | {f(ours, 'push')} | {f(ours, 'pull')} "
                  f"| {f(raw, 'push')} | {f(raw, 'pull')} | {f(cxx, 'push')} | {f(cxx, 'pull')} "
                  f"| {ratio(ours['push'], limit['push'])} | {ratio(ours['pull'], limit['pull'])} "
                  f"| {ratio(ours['pull'], limit['pull_serial'])} "
                  f"| {ratio(ours['pull'], limit['pull_own'])} "
                  f"| {ratio(ours['push'], cxx.get('push'))} | {ratio(ours['pull'], cxx.get('pull'))} |")
            line = (f"RESULT links rate={rate} {s}+{w} push_ms={ours['push']:.1f} pull_ms={ours['pull']:.1f} "
                    f"limit_ms={limit['push']:.1f} pull_limit_ms={limit['pull']:.1f} "
                    f"pull_serial_limit_ms={limit['pull_serial']:.1f} "
                    f"pull_own_limit_ms={limit['pull_own']:.1f} "
                    f"raw_push_ms={raw['push']:.1f} raw_pull_ms={raw['pull']:.1f}")
            if cxx:
                line += f" cxx_push_ms={cxx['push']:.1f} cxx_pull_ms={cxx['pull']:.1f}"
            results.append(line)
        return results


    # -- priority -----------------------------------------------------------

    def priority(self, rate):
        """kv_bench --mode layers: per step, first layer's answer and the
        whole step, first come first served against P3's priorities."""
        rows, results = [], []
        for s, w in CLUSTERS:
            log(f"priority: rate {rate} Gbit/s, {s}+{w}")
            outs = self.cluster(s, w, [self.kv_bench, "--mode", "layers", "--keys", self.args.layer_values,
                                       "--repeat", self.args.steps], label=f"layers-{s}+{w}")
            got = {"fifo": {"first": [], "step": []}, "priority": {"first": [], "step": []}}
            for out in outs:
                for line in out.splitlines():
                    if "BENCH layers " not in line:
                        continue
                    f = summary.fields(line.split("BENCH ", 1)[1])
                    got[f["order"]]["first"].append(float(f["first_ms"]))
                    got[f["order"]]["step"].append(float(f["step_ms"]))
            if not got["fifo"]["first"] or not got["priority"]["first"]:
                raise RuntimeError("no BENCH layers lines:\n" + "\n".join(outs)[-2000:])
            m = {o: {k: statistics.median(v) for k, v in d.items()} for o, d in got.items()}
            rows.append((s, w, m))
            results.append(
                f"RESULT priority rate={rate} {s}+{w} fifo_first_ms={m['fifo']['first']:.1f} "
                f"priority_first_ms={m['priority']['first']:.1f} "
                f"first_speedup={m['fifo']['first'] / m['priority']['first']:.2f} "
                f"fifo_step_ms={m['fifo']['step']:.1f} priority_step_ms={m['priority']['step']:.1f} "
                f"step_ratio={m['priority']['step'] / m['fifo']['step']:.2f}")
        mb = self.args.layer_values * 4 / 1e6
        print(f"\n## Priority at {rate} Gbit/s: 10 layers, {mb:.0f} MB of gradients a step pushed back to "
              f"front, answers needed front to back (medians of {self.args.steps} steps per worker and order)\n")
        print("| cluster | first layer, FIFO | first layer, priority | sooner by | step, FIFO | step, priority "
              "| priority / FIFO, step |")
        print("|---|---|---|---|---|---|---|")
        for s, w, m in rows:
            print(f"| {s}+{w} | {m['fifo']['first']:.0f} ms | {m['priority']['first']:.0f} ms "
                  f"| {m['fifo']['first'] / m['priority']['first']:.1f}x | {m['fifo']['step']:.0f} ms "
                  f"| {m['priority']['step']:.0f} ms | {m['priority']['step'] / m['fifo']['step']:.2f} |")
        return results


    # -- compression --------------------------------------------------------

    def compression(self, rate):
        """pslite demo (2 servers, 2 workers) with each compressor: bytes on
        the wire between workers and servers, time per epoch, final accuracy."""
        results, rows = [], []
        extra = ["--samples", str(self.args.demo_samples), "--epochs", str(self.args.demo_epochs),
                 "--threshold", str(self.args.demo_threshold)]
        for name in COMPRESSORS:
            log(f"compression: rate {rate} Gbit/s, {name}")
            argv = [self.pslite, "demo", "--node", *extra]
            if name != "none":
                argv += ["--compression", name]
            outs = self.cluster(2, 2, argv, label=f"demo-{name.replace(':', '_')}")
            epochs, wire, accuracy = [], 0, None
            for out in outs:
                for line in out.splitlines():
                    m = re.search(r"epoch\s+(\d+)/\d+\s+test loss [\d.]+\s+accuracy ([\d.]+)\s+([\d.]+) s", line)
                    if m and int(m.group(1)) > 0:
                        epochs.append(float(m.group(3)))
                        accuracy = float(m.group(2))
                    m = re.search(r"worker \d+: .* ([\d.]+) MB on the wire", line)
                    if m:
                        wire += float(m.group(1))
            if accuracy is None or not epochs:
                raise RuntimeError(f"the demo with {name} printed no epochs:\n" + "\n".join(outs)[-2000:])
            epoch_s = statistics.median(epochs)
            rows.append((name, wire, epoch_s, accuracy))
            results.append(f"RESULT compression rate={rate} 2+2 compressor={name} wire_mb={wire:.1f} "
                           f"epoch_s={epoch_s:.3f} accuracy={accuracy:.4f} "
                           f"threshold={self.args.demo_threshold} passed={int(accuracy >= self.args.demo_threshold)}")
        base = rows[0]
        print(f"\n## Gradient compression at {rate} Gbit/s: the demo (2 servers, 2 workers, "
              f"{self.args.demo_samples} samples, {self.args.demo_epochs} epochs)\n")
        print("| compressor | MB on the wire | / uncompressed | s per epoch (median) | / uncompressed "
              f"| final accuracy (threshold {self.args.demo_threshold}) |")
        print("|---|---|---|---|---|---|")
        for name, wire, epoch_s, accuracy in rows:
            print(f"| {name} | {wire:.1f} | {wire / base[1]:.2f} | {epoch_s:.2f} | {epoch_s / base[2]:.2f} "
                  f"| {accuracy:.4f} |")
        return results


def endpoint(node):
    line = node.proc.stdout.readline()
    if not line.startswith("ENDPOINT "):
        raise RuntimeError(f"{node.name} said {line!r} (log: {node.log})")
    return line.split()[1]


def bench_medians(outputs, name):
    """Median push and pull ms over every worker's rounds of `BENCH name` lines."""
    values = {"push": [], "pull": []}
    for out in outputs:
        for line in out.splitlines():
            if f"BENCH {name} " not in line:
                continue
            f = summary.fields(line.split("BENCH ", 1)[1])
            values["push"] += [float(x) for x in f["push_ms"].split(",")]
            values["pull"] += [float(x) for x in f["pull_ms"].split(",")]
    if not values["push"]:
        raise RuntimeError(f"no BENCH {name} line in the workers' output:\n" + "\n".join(outputs)[-2000:])
    return {k: statistics.median(v) for k, v in values.items()}


def limit_ms(keys, s, w, gbit):
    """The wire's limit of a push and of a pull of `keys` keys (8-byte keys,
    4-byte values) by each of `w` workers to `s` servers: the bytes on the
    busiest link (one direction of one node's link) x 8 / rate. A push: the
    worker sends keys and values, each server receives its share from every
    worker. A pull: the worker sends keys, each server answers keys and
    values; `pull_serial` adds the request's and the answer's, since an
    answer starts only once its request has arrived whole."""
    push = max(keys * 12, w * keys * 12 / s)
    request = max(keys * 8, w * keys * 8 / s)
    answer = max(keys * 12, w * keys * 12 / s)
    pull = max(request, answer)
    # A pull's answer cannot leave before its request (all its keys) has
    # arrived: one request and its answer take at least both in turn.
    serial = request + answer
    # pslite's own wire between pslite nodes: a large pull's answers leave
    # their keys out (PBMeta.same_keys), so they carry the values only.
    own = max(request, max(keys * 4, w * keys * 4 / s))
    return {k: v * 8 / (gbit * 1e9) * 1e3
            for k, v in (("push", push), ("pull", pull), ("pull_serial", serial),
                         ("pull_own", own))}


def parse_rates(values):
    rates = []
    for v in values or ["1"]:
        for part in v.split(","):
            try:
                r = float(part)
            except ValueError:
                sys.exit(f"--rate {part}: expected Gbit/s, a number")
            if not 0.01 <= r <= 100:
                sys.exit(f"--rate {part}: expected Gbit/s between 0.01 and 100")
            rates.append(int(r) if r == int(r) else r)
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", action="append", help="link rate in Gbit/s (repeat or comma-separate; default 1)")
    parser.add_argument("--only", choices=["links", "priority", "compression"])
    parser.add_argument("--keys", type=int, default=10_000_000, help="keys of the bulk push and pull")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the bulk push and pull per run")
    parser.add_argument("--layer-values", type=int, default=25_000_000,
                        help="f32 values of the layer-wise model (priority part), over 10 layers")
    parser.add_argument("--steps", type=int, default=6, help="steps of the layer-wise model per order")
    parser.add_argument("--demo-samples", type=int, default=200_000, help="the demo's samples (compression part)")
    parser.add_argument("--demo-epochs", type=int, default=5, help="the demo's epochs (compression part)")
    parser.add_argument("--demo-threshold", type=float, default=0.8,
                        help="the accuracy the demo must reach (its nodes fail below it)")
    parser.add_argument("--ps-lite", default=os.environ.get("PSLITE_CXX_SRC"),
                        help="a checkout (or git clone) of github.com/dmlc/ps-lite for the C++ column")
    parser.add_argument("--ps-lite-rev", default="15b8adf")
    parser.add_argument("--bin-dir", default=str(ROOT / "target" / "release"))
    parser.add_argument("--small", action="store_true",
                        help="CI: a small size of every part, to show it runs (figures mean little)")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--env", action="append", metavar="VAR=VALUE",
                        help="an environment variable for every node (e.g. PS_PARTITION_BYTES=4M)")
    args = parser.parse_args()
    if args.small:
        args.keys, args.rounds, args.layer_values, args.steps = 100_000, 2, 1_000_000, 2
        # Two short epochs: the small data set gets to about 0.8-0.85.
        args.demo_samples, args.demo_epochs, args.demo_threshold = 40_000, 2, 0.7
    rates = parse_rates(args.rate)
    for kv in args.env or []:
        if "=" not in kv:
            sys.exit(f"--env {kv}: expected VAR=VALUE")
    if os.geteuid() != 0:
        if args.small:
            print("SKIP links.py --small: needs root (ip netns, tc)")
            return
        sys.exit("links.py needs root (ip netns, tc)")
    bins = pathlib.Path(args.bin_dir)
    for b in (bins / "pslite", bins / "examples" / "kv_bench"):
        if not b.exists():
            sys.exit(f"{b} is missing: cargo build --release --bins --examples")
    binary = summary.build_cxx(pathlib.Path(args.ps_lite), args.ps_lite_rev) if args.ps_lite else None

    sweep_stale()
    logs = pathlib.Path(subprocess.run(["mktemp", "-d", "/tmp/pslite-links.XXXXXX"], capture_output=True,
                                       text=True, check=True).stdout.strip())
    net = Network(nodes=1 + 2 + 2)
    ok = False

    def cleanup():
        net.teardown()
        if ok and not args.keep_logs:
            subprocess.run(["rm", "-rf", str(logs)])
        else:
            log(f"logs: {logs}")

    atexit.register(cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))

    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    start = datetime.datetime.now(datetime.timezone.utc)
    print(f"# pslite at link speeds\n\nMeasured {start:%Y-%m-%d %H:%M} UTC at {commit}, {os.cpu_count()} cores, "
          f"load average {summary.load()} at start; every node in its own network namespace, each link "
          f"limited by tbf each way.")
    net.setup()
    bench = Bench(args, net, logs)
    results = []
    want = lambda part: args.only in (None, part)  # noqa: E731
    for rate in rates:
        net.limit(rate)
        if want("links"):
            results += bench.links(rate, binary)
        if want("priority"):
            results += bench.priority(rate)
        if want("compression"):
            results += bench.compression(rate)
    print(f"\nload average at the end: {summary.load()}\n\n## Machine-readable\n\n```text")
    print("\n".join(results))
    print("```")
    ok = True


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit(f"links.py: {e}")
