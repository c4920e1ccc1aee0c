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
# Two pytest workers (pytest-xdist; tests/conftest.py groups the tests that must share one): the
# tests wait on processes, schedulers and timeouts as much as they compute. MLDIST_TEST_WORKERS=0
# runs them in this process.
echo "== pytest"; exec pytest -n "${MLDIST_TEST_WORKERS:-2}" "$@"
