"""Strict inputs, out=, and requests a server cannot take (issue 29 items
3 and 4): every bad input raises its named error within a second (an app
the server lacks: after PS_APP_WAIT), nothing refused is applied."""

from conftest import launch, node_script


def test_refusals_raise_their_named_error():
    run = launch(2, 1, node_script("refusals.py"), PS_APP_WAIT=300)
    assert run.returncode == 0, run.stdout + run.stderr
    passed = [l for l in run.stdout.splitlines() if "PASS refusals" in l]
    assert len(passed) == 4, run.stdout + run.stderr
    for name in ("DtypeMismatch", "LengthMismatch", "UnknownApp", "RequestRefused"):
        assert f"{name} in " in run.stdout, run.stdout


def test_inputs_convert_only_when_exact_and_out_fills_in_place():
    run = launch(1, 1, node_script("strict.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    passed = [l for l in run.stdout.splitlines() if "PASS strict" in l]
    assert len(passed) == 3, run.stdout + run.stderr
