#!/usr/bin/env python3
"""A chaos soak with network partitions (issue 43, item 6).

A replicated job (`PS_REPLICAS=2`, 3 servers, 4 pushing workers and a
reader, elastic workers `DMLC_NUM_WORKER=1:MAX`, `PS_RESEND=1`, heartbeats)
runs for `--minutes` with every process in a network namespace of its own
(namespaces, veth pairs and the bridge as tests/bench/links.py makes them).
Like Jepsen's nemesis, every few seconds the soak injects one fault at
random:

- kill: kill -9 of a server or a pusher; a replacement starts (a server
  takes the dead one's id and gets copies of its ranges back, a pusher joins
  the elastic job at the next barrier);
- stop: SIGSTOP of a server or a pusher past the heartbeat timeout, then
  SIGCONT;
- cut: the node's link down for 1-10 s (`ip link set net0 down`, then
  up): a partition. The scheduler's link is cut too, for less than the
  heartbeat timeout (`--scheduler-cuts full`: 1-10 s as the others);
- slow: the node's link limited by tbf (0.5-10 Mbit/s each way) for 5-15 s;
- loss: 5% of the node's packets dropped each way (an nft rule,
  `numgen random mod 100 < 5`; this kernel has no tc netem) for 5-15 s.

At most one server is faulted at a time, and a server fault waits
`--server-cooldown` seconds after the last one healed (with 2 copies, two
servers down before the copies are made lose a key range: the job stops by
design). The reader is never faulted: it is the client that reads the end
state.

Each pusher process keeps a history (apps/examples/chaos.rs): every push
before it is sent and whether its wait returned Ok. At the end the soak
heals every fault, lets the pushers leave, and the reader pulls every key;
tests/soak/check.py then requires every key to be a whole number within
[sum of acknowledged pushes, + sum of uncertain ones] (failed or never
answered: they may or may not have been applied). It prints the faults as
they happen, then

    RESULT chaos minutes= faults= lost_updates= false_deaths= stalls_s= ...

(false_deaths: nodes the scheduler declared dead that were neither killed,
exited, stopped nor cut off at the time; stalls_s: the longest time no
pusher had a push acknowledged; uncertain: pushes that failed or never
returned; stuck_at_end: pushers that did not leave when asked and were
killed), each push error and false death with its likely cause (the most
severe fault shortly before or during it on that process, else its
namespace, else the scheduler, else a server), and the faults around the
longest stalls. The logs (kept on failure or with --keep-logs) hold every
node's output, the histories and timeline.json (faults and processes). Exits 1 when an acknowledged update is lost, a push was applied twice,
or the job did not finish (its nodes did not all exit 0 within
`--finish-timeout`). Needs root (ip netns, tc, nft) and the release build
of the example (`cargo build --release -p pslite --example chaos`).
Namespaces, nft tables (inside them) and processes are removed when it
exits, also on failure or Ctrl-C; namespaces an earlier killed run left are
removed at start.

    tests/soak/chaos.py [--minutes 2] [--seed S] [--heartbeat-timeout 4] [--keep-logs]
"""

import argparse
import atexit
import datetime
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(HERE))
import check  # noqa: E402
import links  # noqa: E402  (Network: namespaces, veth pairs, the bridge; their cleanup)

log = links.log
sh = links.sh

SCHEDULER, SERVERS, READER = 0, (1, 2, 3), 4
DEATH = re.compile(r"^(\S+)\s+WARN\s+scheduler: (?:node|worker) (\d+) is dead \((.*?)\)")
NODE_LINE = re.compile(r"chaos (server|pusher|reader) node (\d+)")
# The scheduler's info lines (RUST_LOG below) saying which address took an
# id: how a death is traced to a process that never printed its id (killed
# while it waited to be admitted). Every process gets a port of its own
# (PORT), so an address names one process.
ASSIGNED = re.compile(r"^(\S+)\s+INFO\s+scheduler: (?:(?:server|worker) ([\d.]+:\d+) registered as node (\d+)"
                      r"|([\d.]+:\d+) replaces node (\d+))")


class Proc:
    """One process of the job in its slot's namespace, output to a log."""

    def __init__(self, net, slot, role, gen, env, argv, logs):
        self.slot, self.role, self.gen = slot, role, gen
        self.address = f"{env['DMLC_NODE_HOST']}:{env['PORT']}" if "PORT" in env else None
        self.name = f"{role}{slot}-{gen}"
        self.log = logs / f"{self.name}.log"
        full = ["ip", "netns", "exec", net.ns(slot), "env", "-i", f"PATH={os.environ.get('PATH', '')}"]
        full += [f"{k}={v}" for k, v in env.items()] + [str(a) for a in argv]
        self.out = open(self.log, "w")
        # `ip netns exec` and `env` exec the program: the pid is its pid.
        self.proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.start = time.time()
        self.end = None
        self.killed = False

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        if self.end is None and self.proc.poll() is not None:
            self.end = time.time()
            self.out.close()
        return self.end is None

    def signal(self, sig):
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def node_id(self):
        try:
            m = NODE_LINE.search(self.log.read_text(errors="replace"))
        except OSError:
            return None
        return int(m.group(2)) if m else None

    def tail(self, n=5):
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Soak:
    def __init__(self, args, net, logs):
        self.args = args
        self.net = net
        self.logs = logs
        self.rng = random.Random(args.seed)
        self.binary = pathlib.Path(args.bin_dir) / "examples" / "chaos"
        self.stop_file = logs / "STOP"
        self.final_file = logs / "final.json"
        self.pushers = list(range(READER + 1, READER + 1 + args.pushers))
        self.port = 9400 + os.getpid() % 500
        self.next_port = 20000  # each server and worker process its own
        self.procs = {}  # slot -> current Proc
        self.history = []  # every Proc ever started
        self.gens = {}
        self.faults = []  # dicts: n, kind, slot, role, node, start, end, detail
        self.active = {}  # slot -> fault
        self.heals = []  # (time, fault, action)
        self.server_free_at = 0.0
        self.restarts = []  # (time, slot)
        self.stopping = False
        self.stuck = []  # pushers that had not left when asked to
        self.job_over = False  # the scheduler or the reader exited early
        self.exits = []  # (time, proc name, code, killed, last lines)
        hb = args.heartbeat_timeout
        self.env = {
            "DMLC_NUM_SERVER": len(SERVERS),
            "DMLC_NUM_WORKER": f"1:{2 * args.pushers + 2}",
            "DMLC_PS_ROOT_URI": net.ip(SCHEDULER), "DMLC_PS_ROOT_PORT": self.port,
            "PS_REPLICAS": 2, "PS_RESEND": 1,
            "PS_HEARTBEAT_INTERVAL": 1, "PS_HEARTBEAT_TIMEOUT": hb,
            "PS_START_TIMEOUT": 120, "PS_REQUEST_WARN": 10,
            "CHAOS_STOP": self.stop_file, "CHAOS_FINAL": self.final_file,
            "CHAOS_KEYS": args.keys, "CHAOS_PAUSE_MS": args.pause_ms, "CHAOS_WAIT_S": args.wait_s,
        }
        for kv in args.env or []:
            k, v = kv.split("=", 1)
            self.env[k] = v

    # -- processes ------------------------------------------------------

    def role(self, slot):
        if slot == SCHEDULER:
            return "scheduler"
        if slot in SERVERS:
            return "server"
        return "reader" if slot == READER else "pusher"

    def start(self, slot):
        role = self.role(slot)
        gen = self.gens.get(slot, -1) + 1
        self.gens[slot] = gen
        env = dict(self.env, DMLC_ROLE="worker" if role in ("pusher", "reader") else role,
                   DMLC_NODE_HOST=self.net.ip(slot))
        if role != "scheduler":
            self.next_port += 1
            env["PORT"] = self.next_port
        if role in ("pusher", "reader"):
            env["CHAOS_ROLE"] = role
        if role == "scheduler":
            env["RUST_LOG"] = "warn,pslite_van_core::scheduler=info"
        if role == "pusher":
            env["CHAOS_HISTORY"] = self.logs / f"history-{slot}-{gen}.jsonl"
        p = Proc(self.net, slot, role, gen, env, [self.binary], self.logs)
        self.procs[slot] = p
        self.history.append(p)
        return p

    def reap(self, now):
        """Notices exits; starts replacements of servers and pushers."""
        for slot, p in list(self.procs.items()):
            if p.alive():
                continue
            if slot in self.restarts_pending():
                continue
            code = p.proc.returncode
            if p not in [e[4] for e in self.exits]:
                self.exits.append((p.end, p.name, code, p.killed, p, p.tail(3)))
                if not p.killed and code != 0:
                    log(f"[{self.t(now)}] {p.name} (node {p.node_id()}) exited with {code}: "
                        f"{p.tail(1)}")
            if self.job_over or (self.stopping and (slot not in SERVERS or code == 0)):
                continue
            if slot in SERVERS or slot in self.pushers:
                # A server's replacement waits a moment so that the
                # scheduler has declared the old one dead.
                delay = 1.0 if slot in SERVERS else 0.0
                self.restarts.append((now + delay, slot))
        for when, slot in list(self.restarts):
            if when <= now:
                self.restarts.remove((when, slot))
                if self.job_over or (self.stopping and slot not in SERVERS):
                    continue
                p = self.start(slot)
                log(f"[{self.t(now)}] started {p.name} (replacement)")

    def restarts_pending(self):
        return {slot for _, slot in self.restarts}

    def t(self, now):
        return f"{now - self.t0:7.1f}s"

    # -- the nemesis ----------------------------------------------------

    def candidates(self, kind):
        hb = self.args.heartbeat_timeout
        now = time.time()
        out = []
        for slot, p in self.procs.items():
            if slot == READER or slot in self.active or not p.alive():
                continue
            if slot in SERVERS and (now < self.server_free_at
                                    or any(s in SERVERS for s in self.active)):
                continue
            if slot == SCHEDULER and kind in ("kill", "stop"):
                continue
            if slot == SCHEDULER and kind == "cut" and self.args.scheduler_cuts == "off":
                continue
            if kind == "cut" and slot == SCHEDULER and self.args.scheduler_cuts == "short" and hb < 3:
                continue
            out.append(slot)
        return out

    def inject(self, now):
        kinds = ["kill", "kill", "stop", "cut", "cut", "slow", "loss"]
        self.rng.shuffle(kinds)
        for kind in kinds:
            slots = self.candidates(kind)
            if slots:
                break
        else:
            return
        slot = self.rng.choice(slots)
        p = self.procs[slot]
        hb = self.args.heartbeat_timeout
        fault = {"n": len(self.faults) + 1, "kind": kind, "slot": slot, "role": p.role,
                 "proc": p.name, "node": p.node_id(), "start": now, "end": now, "detail": ""}
        ns = self.net.ns(slot)
        heal = None
        if kind == "kill":
            p.killed = True
            p.signal(signal.SIGKILL)
        elif kind == "stop":
            length = hb + self.rng.uniform(1, 4)
            p.signal(signal.SIGSTOP)
            fault["detail"] = f"{length:.1f} s"
            heal = (length, lambda: p.signal(signal.SIGCONT))
        elif kind == "cut":
            top = 10.0
            if slot == SCHEDULER and self.args.scheduler_cuts == "short":
                top = hb - 1.5
            length = self.rng.uniform(1, top)
            sh("ip", "-n", ns, "link", "set", "net0", "down")
            fault["detail"] = f"{length:.1f} s"
            heal = (length, lambda: sh("ip", "-n", ns, "link", "set", "net0", "up"))
        elif kind == "slow":
            rate = self.rng.choice(["500kbit", "1mbit", "2mbit", "10mbit"])
            length = self.rng.uniform(5, 15)
            ends = ((ns, "net0"), (self.net.switch, self.net.veth(slot)))
            for n, dev in ends:
                sh("ip", "netns", "exec", n, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                   "rate", rate, "burst", "32kbit", "latency", "400ms")
            fault["detail"] = f"{rate} for {length:.1f} s"

            def unslow(ends=ends):
                for n, dev in ends:
                    sh("ip", "netns", "exec", n, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            heal = (length, unslow)
        elif kind == "loss":
            length = self.rng.uniform(5, 15)
            rules = ("table inet chaos {\n"
                     " chain in { type filter hook input priority 0; numgen random mod 100 < 5 drop; }\n"
                     " chain out { type filter hook output priority 0; numgen random mod 100 < 5 drop; }\n"
                     "}\n")
            r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"nft failed: {r.stderr.strip()}")
            fault["detail"] = f"5% each way for {length:.1f} s"
            heal = (length, lambda: sh("ip", "netns", "exec", ns, "nft", "delete", "table", "inet",
                                       "chaos", check=False))
        self.faults.append(fault)
        log(f"[{self.t(now)}] fault {fault['n']}: {kind} {p.name} (node {fault['node']}) {fault['detail']}")
        if heal:
            self.active[slot] = fault
            self.heals.append((now + heal[0], fault, heal[1]))
        if slot in SERVERS:
            until = now + (heal[0] if heal else 1.0)
            self.server_free_at = until + self.args.server_cooldown

    def heal_due(self, now, everything=False):
        for item in list(self.heals):
            when, fault, action = item
            if everything or when <= now:
                self.heals.remove(item)
                action()
                fault["end"] = time.time()
                self.active.pop(fault["slot"], None)
                if fault["slot"] in SERVERS:
                    self.server_free_at = fault["end"] + self.args.server_cooldown

    # -- the run --------------------------------------------------------

    def histories(self):
        return [check.History(f) for f in sorted(self.logs.glob("history-*.jsonl"))]

    def run(self):
        args = self.args
        self.t0 = time.time()
        for slot in [SCHEDULER, *SERVERS, READER, *self.pushers]:
            self.start(slot)
        # The job runs once every pusher has had a push acknowledged.
        deadline = time.time() + 120
        while True:
            acked = {h.path.name for h in self.histories() if h.ack_times()}
            if len(acked) >= len(self.pushers):
                break
            for p in self.procs.values():
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited with {p.proc.returncode} before the job ran:\n"
                                       + p.tail(15))
            if time.time() > deadline:
                raise RuntimeError(f"the job did not start within 120 s (logs: {self.logs})")
            time.sleep(0.2)
        self.nemesis_start = time.time()
        log(f"[{self.t(self.nemesis_start)}] every pusher acknowledged a push: faults begin")
        end = self.nemesis_start + args.minutes * 60
        next_fault = self.nemesis_start + self.rng.uniform(1, 3)
        while time.time() < end:
            now = time.time()
            self.heal_due(now)
            self.reap(now)
            if not self.procs[SCHEDULER].alive() or not self.procs[READER].alive():
                log(f"[{self.t(now)}] the {'scheduler' if not self.procs[SCHEDULER].alive() else 'reader'}"
                    f" exited: the job is over")
                self.job_over = True
                break
            if now >= next_fault:
                self.inject(now)
                next_fault = now + self.rng.uniform(args.min_interval, args.max_interval)
            time.sleep(0.1)
        self.nemesis_end = time.time()
        self.heal_due(self.nemesis_end, everything=True)
        for p in self.procs.values():
            p.signal(signal.SIGCONT)
        log(f"[{self.t(self.nemesis_end)}] faults over ({len(self.faults)}), all healed; letting the job settle")
        # Replacements still starting must join before the pushers leave.
        settle = time.time() + (0 if self.job_over else args.settle)
        while time.time() < settle:
            self.reap(time.time())
            time.sleep(0.1)
        self.stopping = True
        self.stop_file.write_text("stop\n")
        self.stop_time = time.time()
        log(f"[{self.t(self.stop_time)}] asked the pushers to leave; waiting for the reader and the job's end")
        # A pusher leaves once its push and barrier return, each bounded by
        # CHAOS_WAIT_S; one still there after both is stuck: it is killed
        # (its last push counts as uncertain) so the reader can read.
        leave_by = time.time() + (0 if self.job_over else 3 * args.wait_s + 10)
        while time.time() < leave_by and any(self.procs[s].alive() for s in self.pushers):
            self.reap(time.time())
            time.sleep(0.2)
        for s in self.pushers:
            p = self.procs[s]
            if p.alive() and not self.job_over:
                self.stuck.append(p)
                log(f"[{self.t(time.time())}] {p.name} (node {p.node_id()}) did not leave within "
                    f"{3 * args.wait_s + 10} s: killing it; last lines:\n{p.tail(3)}")
                p.killed = True
                p.signal(signal.SIGKILL)
        deadline = time.time() + args.finish_timeout
        finished = False
        while time.time() < deadline:
            self.reap(time.time())
            core = [self.procs[SCHEDULER], self.procs[READER], *(self.procs[s] for s in SERVERS)]
            if all(not p.alive() for p in core):
                finished = all(p.proc.returncode == 0 for p in core) and not self.stuck
                break
            time.sleep(0.2)
        self.finish_time = time.time()
        return finished

    # -- the report -----------------------------------------------------

    def around(self, start, end):
        """The faults that overlap [start, end]."""
        return [f for f in self.faults if f["start"] <= end and max(f["end"], f["start"]) >= start]

    def node_of(self, name):
        """The node id of process `name`: printed, or (for one killed before
        it printed it) the id the scheduler gave its address meanwhile."""
        for p in self.history:
            if p.name == name:
                if p.node_id() is not None:
                    return p.node_id()
                ids = [n for _, n, q in self.assignments() if q is p]
                return ids[-1] if ids else "?"
        return "?"

    def describe(self, f):
        node = f["node"] if f["node"] is not None else self.node_of(f["proc"])
        node = 1 if f["role"] == "scheduler" else node
        return f"fault {f['n']} {f['kind']} {f['proc']} (node {node}) {f['detail']} at {self.t(f['start'])}"

    def scheduler_lines(self, pattern):
        """(time, match) of the scheduler's log lines that match."""
        out = []
        for p in self.history:
            if p.role != "scheduler":
                continue
            for line in p.log.read_text(errors="replace").splitlines():
                m = pattern.match(line)
                if m:
                    try:
                        t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
                    except ValueError:
                        continue
                    out.append((t, m))
        return out

    def deaths(self):
        """(time, node, why) of every 'node N is dead' of the scheduler."""
        return [(t, int(m.group(2)), m.group(3)) for t, m in self.scheduler_lines(DEATH)]

    def assignments(self):
        """(time, node, process) of every id the scheduler gave a process."""
        by_address = {p.address: p for p in self.history if p.address}
        out = []
        for t, m in self.scheduler_lines(ASSIGNED):
            address, node = (m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5))
            if address in by_address:
                out.append((t, int(node), by_address[address]))
        return out

    def likely(self, slot, t, began=None, proc=None):
        """The fault most likely behind a failure of `slot` at `t` (of a
        request that began at `began`): among the faults shortly before or
        while it waited, on that process, else on that slot (its namespace),
        else on the scheduler, else on a server, the most severe (a kill or a stop, then a cut, then a slow
        link or loss), then the nearest to its beginning (None: none)."""
        began = t if began is None else min(began, t)
        window = self.args.heartbeat_timeout + 10
        severity = {"kill": 0, "stop": 0, "cut": 1, "slow": 2, "loss": 2}
        recent = [f for f in self.faults if f["start"] <= t and max(f["end"], f["start"]) >= began - window]
        for pick in (lambda f: f["proc"] == proc, lambda f: f["slot"] == slot,
                     lambda f: f["slot"] == SCHEDULER, lambda f: f["slot"] in SERVERS):
            found = [f for f in recent if pick(f)]
            if found:
                return min(found, key=lambda f: (severity[f["kind"]], abs(f["start"] - began)))
        return None

    def cause(self, slot, t, tally, proc=None, began=None):
        f = self.likely(slot, t, began, proc)
        key = f"{f['kind']} of the {f['role']}" if f else "no fault on it, the scheduler or a server"
        if f and f["slot"] == slot and f["role"] == "pusher":
            key = (f"{f['kind']} of that pusher" if proc in (None, f["proc"])
                   else f"{f['kind']} of the pusher before it in that namespace")
        tally[key] = tally.get(key, 0) + 1
        return f"likely cause: {self.describe(f)}" if f else f"likely cause: none ({key})"

    def holder(self, node, t):
        """The process that had id `node` at `t`: the one the scheduler last
        gave it to (a replacement server takes a dead one's id), else the
        latest started of those that printed it."""
        given = [(ta, p) for ta, n, p in self.assignments() if n == node and ta <= t]
        if given:
            return max(given, key=lambda g: g[0])[1]
        printed = [p for p in self.history if p.node_id() == node and p.start <= t]
        return max(printed, key=lambda p: p.start) if printed else None

    def explained(self, t, node):
        """Whether a fault or an exit explains node `node` declared dead at
        `t`: its process had ended, or was stopped, or its namespace's link
        was cut, shortly before."""
        window = self.args.heartbeat_timeout + 3
        p = self.holder(node, t)
        if p is None:
            return False
        p.alive()
        if p.end is not None and p.end <= t + 0.5:
            return True
        for f in self.faults:
            ours = f["proc"] == p.name and f["kind"] in ("kill", "stop") \
                or f["slot"] == p.slot and f["kind"] == "cut"
            if ours and f["start"] <= t and max(f["end"], f["start"]) >= t - window:
                return True
        return False

    def report(self, finished):
        args = self.args
        # The nemesis's record, for reading the logs afterwards.
        procs = [{"name": p.name, "slot": p.slot, "role": p.role, "pid": p.pid, "node": p.node_id(),
                  "start": p.start, "end": p.end, "code": p.proc.returncode, "killed": p.killed}
                 for p in self.history]
        (self.logs / "timeline.json").write_text(json.dumps({"t0": self.t0, "faults": self.faults,
                                                             "processes": procs}, indent=1))
        hs = self.histories()
        final = None
        if self.final_file.exists():
            try:
                final = json.loads(self.final_file.read_text())
            except ValueError:
                final = None
        result = None
        if final:
            result = check.check(hs, final["keys"], final["vals"])
        acks = [t for h in hs for t in h.ack_times()]
        gaps = check.stalls(acks, self.nemesis_start, self.nemesis_end)
        deaths = [d for d in self.deaths() if d[0] <= self.stop_time]
        false = [d for d in deaths if not self.explained(d[0], d[1])]
        errors = [(t, h.path.name, began, e) for h in hs for t, began, e in h.errors]
        error_causes, death_causes = {}, {}
        kinds = {}
        for f in self.faults:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1

        print(f"\n## Chaos soak: {args.minutes} min, {len(self.faults)} faults "
              f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}), seed {args.seed}\n")
        for f in self.faults:
            print(f"- {self.describe(f)}")
        print(f"\npushers' processes: {len(hs)}; pushes acknowledged: "
              f"{result['pushes_acked'] if result else sum(len(h.acked()) for h in hs)}, uncertain "
              f"(failed or never answered): {result['pushes_uncertain'] if result else '-'}")
        if errors:
            print(f"\n### Errors the pushers saw ({len(errors)})\n")
            for t, name, began, e in sorted(errors):
                print(f"- {self.t(t)} {name}: {e}")
                _, slot, gen = name.split(".")[0].split("-")
                print(f"    {self.cause(int(slot), t, error_causes, f'pusher{slot}-{gen}', began)}")
        print(f"\n### Deaths declared by the scheduler ({len(deaths)}, {len(false)} not explained by a fault)\n")
        for t, node, why in deaths:
            tag = "FALSE" if (t, node, why) in false else "explained"
            print(f"- {self.t(t)} node {node} ({why}): {tag}")
            if tag == "FALSE":
                h = self.holder(node, t)
                print(f"    {self.cause(h.slot if h else None, t, death_causes, h.name if h else None)}")
        print("\n### Longest times no pusher had a push acknowledged\n")
        for length, a, b in gaps[:3]:
            print(f"- {length:.1f} s from {self.t(a)} to {self.t(b)}")
            # The pushes that waited through most of it (and returned):
            # what the others' barrier waited for.
            for h in hs:
                for i, (_, began) in h.invoked.items():
                    ok, ended, err = h.done.get(i, (None, None, None))
                    if ended is not None and began <= a + 0.5 and ended >= (a + b) / 2:
                        _, slot, gen = h.path.stem.split("-")
                        how = "acknowledged" if ok else f"failed: {err}"
                        print(f"    push {i} of pusher{slot}-{gen} waited from {self.t(began)} to "
                              f"{self.t(ended)} ({how})")
            for f in self.around(a - args.heartbeat_timeout, b):
                print(f"    {self.describe(f)}")
        for title, tally in (("push errors", error_causes), ("false deaths", death_causes)):
            if tally:
                print(f"\n{title} by likely cause: "
                      + "; ".join(f"{k}: {v}" for k, v in sorted(tally.items(), key=lambda kv: -kv[1])))
        if result:
            if result["bad"]:
                print(f"\n### Keys that do not match the histories ({len(result['bad'])})\n")
                for key, got, low, high, why in result["bad"][:20]:
                    print(f"- key {key}: {got:g}, expected {low}..{high}: {why}")
            else:
                print(f"\nevery key ({result['keys']}) within its bounds; of the uncertain pushes, "
                      f"{result['applied_uncertain']:g} of the {result['uncertain_value']:g} they would add "
                      f"over all keys were applied")
            if final.get("again") != final.get("vals"):
                print("\nthe reader's second pull (2 s later) read other values: "
                      "the end state had not settled")
        else:
            print("\nno final values: the reader did not write them")
        if self.stuck:
            print(f"\n{len(self.stuck)} pusher(s) did not leave when asked and were killed: "
                  + ", ".join(f"{p.name} (node {p.node_id()})" for p in self.stuck))
        unsettled = bool(final) and final.get("again") != final.get("vals")
        lost = result["lost_updates"] if result else "-"
        ok = finished and result is not None and result["lost_updates"] == 0 \
            and result["duplicated"] == 0 and result["off_grid"] == 0 and not unsettled
        print(f"\nRESULT chaos minutes={args.minutes:g} faults={len(self.faults)} lost_updates={lost} "
              f"false_deaths={len(false)} stalls_s={gaps[0][0]:.1f} "
              f"duplicated={result['duplicated'] if result else '-'} "
              f"uncertain={result['pushes_uncertain'] if result else '-'} "
              f"acked={result['pushes_acked'] if result else '-'} deaths={len(deaths)} "
              f"push_errors={len(errors)} stuck_at_end={len(self.stuck)} finished={int(finished)} "
              f"seed={args.seed}")
        return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2, help="how long faults are injected (CI: 2)")
    parser.add_argument("--seed", type=int, default=None, help="the nemesis's random seed (default: random)")
    parser.add_argument("--pushers", type=int, default=4)
    parser.add_argument("--keys", type=int, default=8, help="keys per key range each push adds to")
    parser.add_argument("--pause-ms", type=int, default=20, help="pushers' pause between epochs")
    parser.add_argument("--heartbeat-timeout", type=int, default=4, help="PS_HEARTBEAT_TIMEOUT (s)")
    parser.add_argument("--min-interval", type=float, default=2.0, help="least seconds between faults")
    parser.add_argument("--max-interval", type=float, default=5.0, help="most seconds between faults")
    parser.add_argument("--server-cooldown", type=float, default=8.0,
                        help="seconds after a server fault healed before the next server fault")
    parser.add_argument("--scheduler-cuts", choices=["off", "short", "full"], default="short",
                        help="cut the scheduler's link: never, for less than the heartbeat timeout, "
                             "or 1-10 s as the other nodes'")
    parser.add_argument("--wait-s", type=int, default=30,
                        help="seconds a push or a pull may take (CHAOS_WAIT_S; a barrier twice that): "
                             "then it counts as failed (uncertain) and the pusher is replaced")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds after the faults end before the pushers are asked to leave")
    parser.add_argument("--finish-timeout", type=float, default=180.0,
                        help="seconds the job may take to end after the pushers are asked to leave")
    parser.add_argument("--bin-dir", default=str(ROOT / "target" / "release"))
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--env", action="append", metavar="VAR=VALUE",
                        help="an environment variable for every node (e.g. PS_RESEND_TIMEOUT=300)")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    for kv in args.env or []:
        if "=" not in kv:
            sys.exit(f"--env {kv}: expected VAR=VALUE")
    if not 1 <= args.min_interval <= args.max_interval:
        sys.exit("--min-interval must be at least 1 and at most --max-interval")
    if args.heartbeat_timeout < 2:
        sys.exit("--heartbeat-timeout must be at least 2 (the interval is 1 s)")
    if os.geteuid() != 0:
        sys.exit("chaos.py needs root (ip netns, tc, nft)")
    binary = pathlib.Path(args.bin_dir) / "examples" / "chaos"
    if not binary.exists():
        sys.exit(f"{binary} is missing: cargo build --release -p pslite --example chaos")
    for tool in ("ip", "tc", "nft"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            sys.exit(f"chaos.py needs {tool} (apt-get install iproute2 nftables)")

    links.sweep_stale()
    logs = pathlib.Path(subprocess.run(["mktemp", "-d", "/tmp/pslite-chaos.XXXXXX"], capture_output=True,
                                       text=True, check=True).stdout.strip())
    soak = None
    net = links.Network(nodes=READER + 1 + args.pushers)
    state = {"ok": False}

    def cleanup():
        if soak:
            for p in soak.history:
                if p.alive():
                    p.signal(signal.SIGKILL)
        net.teardown()
        if state["ok"] and not args.keep_logs:
            subprocess.run(["rm", "-rf", str(logs)])
        else:
            log(f"logs: {logs}")

    atexit.register(cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    log(f"chaos soak at {commit}: {args.minutes:g} min, seed {args.seed}, logs in {logs}")
    net.setup()
    soak = Soak(args, net, logs)
    finished = soak.run()
    state["ok"] = soak.report(finished)
    if not state["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit(f"chaos.py: {e}")
