"""Worker: several worker scripts one after another in one process. Usage: scenarios.py SCRIPT [ARG ...] [+ SCRIPT ...].

One launch then serves several tests: each rank starts Python, TensorFlow and mldist once (about
6 CPU-seconds a rank) instead of once per script. Each script runs as ``python SCRIPT ARGS`` would
(``__main__``, its own ``sys.argv``) between the lines ``SCENARIO BEGIN <key>`` and ``SCENARIO END
<key>``, where the key is the script and its arguments joined by spaces; Keras's global state is
cleared in between. A script that raises ends the process as it would alone (the launcher stops the
group and names the rank), so the scenarios after it print nothing and their tests fail too.
Scripts that end the process on purpose (exit codes, signals) or change it for good (TensorFlow 1
graph mode: put it last) do not belong here. tests/helpers.py's ``scenario`` reads one key's lines.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _split(argv: list[str]) -> list[list[str]]:
    runs: list[list[str]] = [[]]
    for arg in argv:
        if arg == "+":
            runs.append([])
        else:
            runs[-1].append(arg)
    return [run for run in runs if run]


def _clear_keras() -> None:
    """Forget the layers, names and graphs of the last script (its variables are no longer used)."""
    import tensorflow as tf

    tf.keras.backend.clear_session()


def main() -> None:
    for run in _split(sys.argv[1:]):
        key = " ".join(run)
        print(f"SCENARIO BEGIN {key}", flush=True)
        sys.argv = [str(HERE / run[0]), *run[1:]]
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:  # argparse and scripts that end with sys.exit(0)
            if exc.code not in (None, 0):
                raise
        _clear_keras()
        print(f"SCENARIO END {key}", flush=True)


if __name__ == "__main__":
    main()
