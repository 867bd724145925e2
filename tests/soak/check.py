"""The chaos soak's checker (tests/soak/chaos.py): reads what the workers
were told (their histories) and what the servers hold at the end (the
reader's pull), and says what was lost, what was applied twice, when no
worker made progress, and which declared deaths no fault explains.

A history is JSON lines written by `apps/examples/chaos.rs` (`pusher`):
`{"node":N,"keys":K,"t":T}` once, then per push `{"id":I,"s":SEED,"t":T}`
before it is sent and `{"id":I,"ok":true|false,"t":T[,"err":..]}` once its
wait returned. Push I adds `(SEED + i) % 4 + 1` to the i-th key. Like a
Jepsen history: an acknowledged push (`ok` true) must be in the final
values; a push that failed or never returned (the process was killed, or
its wait ended in an error such as a timeout) may or may not have been
applied: it is *uncertain*. So every key's final value must be a whole
number within [sum of acknowledged, sum of acknowledged + sum of
uncertain]. Below: a lost update; above: a push applied twice (or one no
worker made).

Run as `python3 tests/soak/check.py --self-test` to check the checker on
made-up histories.
"""

import json
import pathlib
import sys


def push_values(seed, keys):
    return [(seed + i) % 4 + 1 for i in range(keys)]


class History:
    """One pusher process's history."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.node = None
        self.keys = None
        self.invoked = {}  # id -> (seed, t)
        self.done = {}  # id -> (ok, t, err)
        self.errors = []  # (t, began, err) of pushes and barriers that failed
        self.left = None
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill -9 mid-write
            if "node" in rec:
                self.node, self.keys = rec["node"], rec["keys"]
            elif "s" in rec:
                self.invoked[rec["id"]] = (rec["s"], rec["t"])
            elif "ok" in rec:
                self.done[rec["id"]] = (rec["ok"], rec["t"], rec.get("err"))
                if not rec["ok"]:
                    began = self.invoked.get(rec["id"], (None, rec["t"]))[1]
                    self.errors.append((rec["t"], began, rec.get("err", "")))
            elif "barrier" in rec:
                self.errors.append((rec["t"], rec["t"], "barrier: " + rec.get("err", "")))
            elif "left" in rec:
                self.left = rec["t"]

    def acked(self):
        return [(i, s) for i, (s, _) in self.invoked.items() if self.done.get(i, (False,))[0]]

    def uncertain(self):
        return [(i, s) for i, (s, _) in self.invoked.items() if not self.done.get(i, (False,))[0]]

    def ack_times(self):
        return [t for ok, t, _ in self.done.values() if ok]


def check(histories, final_keys, final_vals):
    """Compares the final values with the histories. Returns a dict of
    counts and the per-key rows that failed."""
    n = len(final_keys)
    acked = [0] * n
    maybe = [0] * n
    pushes_acked = pushes_uncertain = 0
    for h in histories:
        if h.keys is None:
            continue
        if h.keys != n:
            raise ValueError(f"{h.path} pushed {h.keys} keys, the reader read {n}")
        for _, seed in h.acked():
            pushes_acked += 1
            for i, v in enumerate(push_values(seed, n)):
                acked[i] += v
        for _, seed in h.uncertain():
            pushes_uncertain += 1
            for i, v in enumerate(push_values(seed, n)):
                maybe[i] += v
    lost, extra, off_grid, bad = 0, 0, 0, []
    missing = surplus = 0
    for i, (key, got) in enumerate(zip(final_keys, final_vals)):
        low, high = acked[i], acked[i] + maybe[i]
        if got != int(got):
            off_grid += 1
            bad.append((key, got, low, high, "not a whole number"))
        elif got < low:
            lost += 1
            missing += low - got
            bad.append((key, got, low, high, f"{low - got:g} of acknowledged pushes missing"))
        elif got > high:
            extra += 1
            surplus += got - high
            bad.append((key, got, low, high, f"{got - high:g} more than every push could add"))
    return {
        "keys": n,
        "pushes_acked": pushes_acked,
        "pushes_uncertain": pushes_uncertain,
        "lost_updates": lost,
        "missing": missing,
        "duplicated": extra,
        "surplus": surplus,
        "off_grid": off_grid,
        "applied_uncertain": sum(final_vals) - sum(acked) if not bad else None,
        "uncertain_value": sum(maybe),
        "bad": bad,
    }


def stalls(ack_times, start, end):
    """The gaps between consecutive acknowledgements (any worker) within
    [start, end], longest first, as (length, from, to)."""
    times = sorted(t for t in ack_times if start <= t <= end)
    points = [start] + times + [end]
    gaps = [(b - a, a, b) for a, b in zip(points, points[1:])]
    return sorted(gaps, reverse=True)


def self_test():
    import tempfile

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="chaos-check-"))
    keys = 3
    (tmp / "a.jsonl").write_text("\n".join([
        json.dumps({"node": 9, "keys": keys, "t": 0}),
        json.dumps({"id": 1, "s": 5, "t": 1}), json.dumps({"id": 1, "ok": True, "t": 1.1}),
        json.dumps({"id": 2, "s": 6, "t": 2}), json.dumps({"id": 2, "ok": False, "t": 3, "err": "timeout"}),
        json.dumps({"id": 3, "s": 7, "t": 4}),  # killed before its answer
        '{"id": 4, "s"',  # a line cut short
    ]) + "\n")
    h = History(tmp / "a.jsonl")
    acked = push_values(5, keys)  # [2, 3, 4]
    maybe = [a + b for a, b in zip(push_values(6, keys), push_values(7, keys))]
    exact = check([h], [1, 2, 3], [float(v) for v in acked])
    assert exact["lost_updates"] == 0 and exact["duplicated"] == 0 and exact["pushes_uncertain"] == 2, exact
    top = check([h], [1, 2, 3], [float(a + m) for a, m in zip(acked, maybe)])
    assert top["lost_updates"] == 0 and top["duplicated"] == 0, top
    short = check([h], [1, 2, 3], [float(acked[0] - 1), float(acked[1]), float(acked[2])])
    assert short["lost_updates"] == 1 and short["missing"] == 1, short
    twice = check([h], [1, 2, 3], [float(acked[0] + maybe[0] + 1), float(acked[1]), float(acked[2])])
    assert twice["duplicated"] == 1, twice
    frac = check([h], [1, 2, 3], [acked[0] + 0.5, float(acked[1]), float(acked[2])])
    assert frac["off_grid"] == 1, frac
    gaps = stalls([1.0, 1.5, 4.0], 0.0, 5.0)
    assert gaps[0] == (2.5, 1.5, 4.0), gaps
    print("check.py self-test: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    else:
        sys.exit("usage: check.py --self-test (the soak imports this module)")
