"""No copies on either side: pushed arrays are held, not copied, until sent;
received data is a read-only NumPy view of the received buffer (checked by
address against the process's memory map)."""

import re

import pytest

from conftest import launch, node_script


@pytest.mark.parametrize("shm", ["1", "0"])
def test_views_of_received_buffers(shm):
    run = launch(1, 1, node_script("zero_copy.py"), PS_SHM=shm)
    assert run.returncode == 0, run.stdout + run.stderr
    for role in ("server", "worker"):
        assert f"PASS zero-copy {role}" in run.stdout, run.stdout + run.stderr


def test_push_does_not_copy_the_array():
    """256 MiB pushed over ZeroMQ (PS_SHM=0): the worker's peak memory grows
    by far less than the array (a copy would add 256 MiB)."""
    run = launch(1, 1, node_script("big_push.py"), PS_SHM="0")
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(r"RSS before=(\d+) after=(\d+) size=(\d+)", run.stdout)
    assert m, run.stdout + run.stderr
    before, after, size = map(int, m.groups())
    assert after - before < size // 4, f"peak memory grew by {after - before} KiB for a {size} KiB push"
