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
workers="${MLDIST_TEST_WORKERS:-2}"
echo "== pytest"
if [ $# -gt 0 ] || [ "$workers" = 0 ]; then
  exec pytest -n "$workers" "$@"
fi
# The whole suite: the tests of the shared services (the Slurm cluster, the sshd hosts) mostly wait
# on daemons and job states, so they run in a pytest of their own beside the workers of the rest,
# one after the other (both scripts edit /etc/hosts). Their output follows the main run's.
services=(tests/slurm tests/launch/test_hosts.py)
services_log=$(mktemp)
services_tmp=$(mktemp -d)
pytest -p no:cacheprovider --basetemp "$services_tmp" "${services[@]}" >"$services_log" 2>&1 &
services_pid=$!
trap 'kill "$services_pid" 2>/dev/null || true' INT TERM
main=0
pytest -n "$workers" "${services[@]/#/--ignore=}" || main=$?
side=0
wait "$services_pid" || side=$?
echo "== pytest: the services' tests (${services[*]})"
cat "$services_log"
rm -rf "$services_log" "$services_tmp"
if [ "$main" != 0 ]; then exit "$main"; fi
exit "$side"
