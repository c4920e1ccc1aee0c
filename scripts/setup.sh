#!/usr/bin/env bash
# The README's first command: set everything up, then run the main job
# (2 workers on this machine's CPUs).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/bootstrap.sh
exec .venv/bin/mldist run -n 2 -- .venv/bin/python examples/show_ranks.py
