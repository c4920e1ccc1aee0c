#!/usr/bin/env bash
# The README's second command: lint, type-check, check the install on Python 3.10,
# and run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow", or -n 0 for one process).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/bootstrap.sh --no-compile
export PATH="$root/.venv/bin:$PATH"
echo "== ruff"; ruff check .; ruff format --check .
# Side by side: byte-compiling .venv and the project (on both cores), mypy and the Python 3.10
# check (one core each, independent): 48 s one after another on a fresh clone here. Compiled
# once, because the suite starts about a thousand Python processes, and where
# PYTHONDONTWRITEBYTECODE is set each one compiled what it imports again (0.06 CPU-s for mldist).
logs=$(mktemp -d)
python -m compileall -q -j 0 .venv/lib src tests >/dev/null 2>&1 &
compiling=$!
mypy >"$logs/mypy" 2>&1 &
typing=$!
bash scripts/check-py310.sh >"$logs/py310" 2>&1 &
py310=$!
failed=0
wait "$typing" || failed=1
echo "== mypy"; cat "$logs/mypy"
wait "$py310" || failed=1
echo "== python 3.10"; cat "$logs/py310"
wait "$compiling" || true # as pip does, a module that does not compile (test data) is left as it is
rm -rf "$logs"
[ "$failed" = 0 ] || exit 1
# Bytecode is written from here on: pytest keeps the test modules it rewrote for its assertions (each
# xdist worker rewrote them all again at collection: 10.6 against 6.1 CPU-s here).
unset PYTHONDONTWRITEBYTECODE
# Three pytest workers on this 2-core machine (pytest-xdist; tests/conftest.py groups the tests that
# must share one): the tests wait on processes, schedulers and timeouts more than they compute (the
# stall, straggler and half-formed tests: 94 s of wall at 74 % of one core with 2 workers, 55 s with 4).
# MLDIST_TEST_WORKERS=0 runs them in this process.
echo "== pytest"; exec pytest -n "${MLDIST_TEST_WORKERS:-3}" "$@"
