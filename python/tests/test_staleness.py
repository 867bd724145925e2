"""Bounded staleness from Python (issue 33 item 3): `KVWorker.clock()`,
`KVWorker.staleness` and PS_STALENESS, against Rust sum stores, with a
straggler: s = 0 keeps every worker in step, s = 2 lets the fast ones run
exactly up to 2 iterations ahead."""

import re

import pytest

from conftest import launch, node_script


@pytest.mark.parametrize("s", [0, 2])
def test_clock_keeps_workers_within_the_bound(s):
    run = launch(2, 3, node_script("staleness.py"), PS_STALENESS=s)
    assert run.returncode == 0, run.stdout + run.stderr
    gaps = [int(g) for g in re.findall(r"PASS staleness rank \d+ gap (\d+)", run.stdout)]
    assert len(gaps) == 3, run.stdout + run.stderr
    assert max(gaps) == s, run.stdout


def test_a_bad_staleness_is_refused_by_name():
    run = launch(1, 1, node_script("staleness.py"), PS_STALENESS="two")
    assert run.returncode != 0
    assert "PS_STALENESS must be" in run.stdout + run.stderr, run.stdout + run.stderr
