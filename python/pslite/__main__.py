"""The `pslite` command (`pslite launch ...`, `python -m pslite launch ...`).

The same command as the Rust binary, run from the native module: a launcher
started from a venv runs its nodes with that venv (its `bin/` first on their
PATH, this interpreter for a `.py` program).
"""

import sys


def main() -> None:
    """Runs the command with this process's arguments and exits with its code."""
    from ._pslite import _cli

    _cli(["pslite", *sys.argv[1:]], sys.executable)


if __name__ == "__main__":
    main()
