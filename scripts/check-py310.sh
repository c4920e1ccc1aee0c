#!/usr/bin/env bash
# The oldest supported Python: install mldist without extras into a Python 3.10
# environment (.venv-py310) and run two commands that need no TensorFlow. Part of
# scripts/test.sh; catches dependencies missing on 3.10 (tomli) and 3.11-only syntax.
# PYTHON310=/path/to/python3.10 chooses the interpreter; else python3.10 on PATH or pyenv's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
find_py310() {
  local candidate
  for candidate in "${PYTHON310:-}" "$(command -v python3.10 || true)" \
    "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.10*/bin/python3.10; do
    # pyenv's shims exist on PATH but may refuse to run: ask each candidate for its version.
    if [ -n "$candidate" ] && [ -x "$candidate" ] &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if ! py=$(find_py310); then
  if [ "${CI:-}" = "true" ]; then
    echo "check-py310: no Python 3.10 found; set PYTHON310=/path/to/python3.10" >&2
    exit 1
  fi
  echo "check-py310: skipped, no Python 3.10 here (set PYTHON310=/path/to/python3.10)" >&2
  exit 0
fi
venv=.venv-py310
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# Not editable: the wheel build checks the package metadata as users get it.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall . \
  2> >(grep -v "is neither a file nor a directory" >&2)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
(cd "$out" && "$root/$venv/bin/mldist" --help >/dev/null)
(cd "$out" && "$root/$venv/bin/mldist" submit --dry-run --scheduler slurm -- python train.py >"$out/job.sh")
grep -q '^#SBATCH --nodes=1$' "$out/job.sh"
echo "check-py310: mldist --help and submit --dry-run work on $("$venv/bin/python" --version)"
