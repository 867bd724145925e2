"""The type stubs list every argument (issue 29 item 4): mypy's stubtest
compares them with the native module's signatures, and mypy --strict
checks a program that uses the API (out=, cast=, refusals, pslite.torch)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytest.importorskip("mypy")


def test_stubs_match_the_native_module():
    # Every argument of every function and method, with its default (PyO3
    # gives the native ones signatures); --ignore-disjoint-bases: PEP 800's
    # marker is not in this Python's typing yet.
    run = subprocess.run([sys.executable, "-m", "mypy.stubtest", "pslite._pslite",
                          "--ignore-disjoint-bases", "--allowlist",
                          os.path.join(HERE, "stubtest_allowlist.txt")],
                         capture_output=True, text=True, timeout=300, cwd=HERE)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_typed_program_checks():
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          os.path.join(HERE, "typed_usage.py")], capture_output=True, text=True,
                         timeout=300, cwd=HERE)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_error_class_is_exported_by_the_package():
    # pslite/__init__.py lists the error classes again (mypy needs a literal
    # __all__): the two lists must not drift apart.
    import pslite
    import pslite.errors

    for name in pslite.errors.__all__:
        assert name in pslite.__all__, name
        assert getattr(pslite, name) is getattr(pslite.errors, name), name
