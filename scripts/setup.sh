#!/usr/bin/env bash
# The README's first command: set everything up, then run the main job
# (2 workers training the bundled digits CNN on this machine's CPUs).
# Extra arguments go to the example (e.g. --epochs 5).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/bootstrap.sh
exec .venv/bin/mldist run -n 2 -- .venv/bin/python examples/digits_cnn.py "$@"
