#!/usr/bin/env bash
# Create or update .venv with mldist (editable), TensorFlow for CPUs, JAX for CPUs (Keras 3 on
# JAX and its tests), TensorFlow Probability (examples/bayesian_tfp.py and its test) and the dev tools.
# Idempotent: a second run with unchanged inputs only checks and returns.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "bootstrap: $py is missing or older than Python 3.10; set PYTHON=/path/to/python3.10+" >&2
  exit 2
fi
stamp=.venv/.mldist-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$py" -m venv .venv
echo "bootstrap: installing mldist and its dependencies into .venv (about a minute)" >&2
# Some machines list local mirrors that may be absent; pip's warnings about them are noise.
# --no-compile, then compileall on every core: pip compiles the 11,000 modules one by one
# (84 s in all here, 68 s this way).
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt \
  -e ".[cpu,jax,dev,tfp]" 2> >(grep -v "is neither a file nor a directory" >&2)
# Legacy Keras 2 for TF_USE_LEGACY_KERAS=1 users and for tfp.layers: --no-deps, because tf-keras's
# metadata pulls the full (CUDA) tensorflow wheel next to tensorflow-cpu.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile --no-deps -c constraints.txt \
  tf-keras 2> >(grep -v "is neither a file nor a directory" >&2)
# As pip does, a module that does not compile (a package's template or test data) is left as it is.
.venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true
echo "$want" > "$stamp"
