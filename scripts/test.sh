#!/usr/bin/env bash
# The README's second command: lint, type-check, check the install on Python 3.10,
# and run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow", or -n 0 for one process).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/bootstrap.sh
export PATH="$root/.venv/bin:$PATH"
echo "== ruff"; ruff check .; ruff format --check .
echo "== mypy"; mypy
echo "== python 3.10"; bash scripts/check-py310.sh
# The project's own modules, byte-compiled once: the suite starts about a thousand Python processes,
# and where PYTHONDONTWRITEBYTECODE is set each one compiled them again (0.06 CPU-s per process here).
python -m compileall -q -j 0 src tests >/dev/null
# Two pytest workers (pytest-xdist; tests/conftest.py groups the tests that must share one): the
# tests wait on processes, schedulers and timeouts as much as they compute. MLDIST_TEST_WORKERS=0
# runs them in this process.
echo "== pytest"; exec pytest -n "${MLDIST_TEST_WORKERS:-2}" "$@"
