"""After a batch job's step: the same never-formed line as ``mldist run``'s, into the batch log.

The ranks' start-up hook (:mod:`mldist.runtime.start.startup`, on ``PYTHONPATH`` in the script) left
one note each in the run directory's ``progress/``. Exit code 1 when the line applies and
``MLDIST_REQUIRE_GROUP=1``, else 0.

Example::

    python3 -m mldist.launch.batch.formed "$MLDIST_RUN_DIR/progress" 8
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ...base import joined
from ...base.envparse import whole


def main(argv: list[str]) -> int:
    """Say the line for the notes in ``argv[0]`` of a job of ``argv[1]`` ranks; 1 if it is an error."""
    if len(argv) != 2 or whole(0)(argv[1]) is None:
        print("usage: python -m mldist.launch.batch.formed PROGRESS_DIR RANKS", file=sys.stderr)
        return 2
    line = joined.line(joined.read(Path(argv[0])), int(argv[1]))
    if not line:
        return 0
    if joined.required(os.environ):
        print(f"mldist: error: {line}; failing the job ({joined.REQUIRE_ENV}=1)", flush=True)
        return 1
    print(f"mldist: {line}; {joined.REQUIRE_ENV}=1 makes this an error", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
