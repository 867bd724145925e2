"""The `pslite` command from pip (issue 29 items 1 and 5): a fresh venv
with only the package's wheel installed runs jobs with its own `pslite`,
no target/release on the PATH, and its Python nodes use the venv; a Python
node's traceback is summed up by its exception line in the failure table."""

import glob
import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES, REPO, node_script

KV_APP = os.path.join(EXAMPLES, "kv_app.py")
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"


def wheel():
    found = os.environ.get("PSLITE_WHEEL") or max(
        glob.glob(os.path.join(REPO, "target", "python", "wheels", "pslite-*.whl")),
        key=os.path.getmtime, default=None)
    if not found:
        pytest.fail("no pslite wheel: python/test.sh builds one into target/python/wheels")
    return found


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", wheel()],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv


def bare_env(**extra):
    """No venv, no target/release, no DMLC_*: what a new shell has."""
    env = {"PATH": BARE_PATH, "HOME": os.environ.get("HOME", "/root"), "PYTHONUNBUFFERED": "1"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_the_venvs_pslite_runs_a_job_of_the_venvs_python(fresh_venv, tmp_path):
    pslite = fresh_venv / "bin" / "pslite"
    assert pslite.is_file()
    # `python` and a bare .py program both resolve to the venv's Python
    # (numpy is only there), though the launcher's PATH lacks the venv.
    for program in (["python", KV_APP], [KV_APP]):
        run = subprocess.run([str(pslite), "launch", "-s", "2", "-w", "2", "--timeout", "120",
                              "--", *program], env=bare_env(KV_APP_REPEAT=5),
                             capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.count("sums exact") == 2, run.stdout
        assert "target/release" not in run.stdout + run.stderr
    # The status command it prints is the venv's own.
    assert f"see the job with: {pslite} status --port" in run.stderr, run.stderr


def test_python_m_pslite_and_the_scheduler_it_starts(fresh_venv, tmp_path):
    python = str(fresh_venv / "bin" / "python")
    version = subprocess.run([python, "-m", "pslite", "--version"], env=bare_env(),
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("pslite "), version
    code = ("import os, sys; print('node python', sys.executable, "
            "os.environ['PATH'].split(':')[0], os.environ.get('VIRTUAL_ENV'))")
    script = tmp_path / "where.py"
    script.write_text(code + "\n")
    run = subprocess.run([python, "-m", "pslite", "launch", "--scheduler-program", "pslite",
                          "--exit-grace", "1", "--timeout", "60", "--", str(script)],
                         env=bare_env(), capture_output=True, text=True, timeout=120)
    # The nodes only print (no cluster): the scheduler (`python -m pslite
    # scheduler`, the venv's) waits for them, so the job ends after the
    # exit grace; what matters is where the nodes ran.
    assert "[scheduler]" not in run.stderr or "No module named" not in run.stderr, run.stderr
    lines = [l for l in run.stdout.splitlines() if "node python" in l]
    assert len(lines) == 2, run.stdout + run.stderr
    for line in lines:
        assert f"node python {python} {fresh_venv}/bin {fresh_venv}" in line, line


def test_a_traceback_is_summed_up_by_its_exception(fresh_venv):
    run = subprocess.run([str(fresh_venv / "bin" / "pslite"), "launch", "-s", "1", "-w", "1",
                          "--timeout", "60", "--", "python", node_script("fails.py")],
                         env=bare_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    table = run.stderr[run.stderr.index("first error line"):]
    row = [l for l in table.splitlines()
           if l.split("pslite launch:", 1)[-1].strip().startswith("worker 0")]
    assert row and row[0].rstrip().endswith("ValueError: bad learning rate: -1"), run.stderr
    # The traceback itself is still in the node's output.
    assert "Traceback (most recent call last):" in run.stderr
    assert "in configure" in run.stderr
