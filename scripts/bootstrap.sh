#!/usr/bin/env bash
# Create or update .venv with mldist (editable), TensorFlow for CPUs, JAX for CPUs (Keras 3 on
# JAX and its tests), TensorFlow Probability (examples/bayesian_tfp.py and its test), the dev tools and the
# documentation site's (scripts/docs.sh).
# Idempotent: a second run with unchanged inputs only checks and returns.
# --no-compile leaves byte-compiling .venv to the caller (scripts/test.sh does it beside mypy).
set -euo pipefail
compile=1
case "${1:-}" in
  "") ;;
  --no-compile) compile=0 ;;
  *) echo "bootstrap: unknown argument '$1'; the only option is --no-compile" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
usable() { "$1" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; }
# PYTHON if set; else the distribution's python3 before the one on PATH. Debian's is an optimised
# build (profile-guided, libpython linked in); pyenv's default build is neither. Every process of
# the suite (about a thousand) runs Python: on this machine `import tensorflow, keras` takes 3.8
# CPU-s on /usr/bin/python3.11 and 4.4 on pyenv's 3.11, a pure-Python loop 1.48 s against 1.84 s.
if [ -n "${PYTHON:-}" ]; then
  py=$PYTHON
elif usable /usr/bin/python3; then
  py=/usr/bin/python3
else
  py=python3
fi
if ! usable "$py"; then
  echo "bootstrap: $py is missing, older than Python 3.10 or without venv; set PYTHON=/path/to/python3.10+" >&2
  exit 2
fi
base=$("$py" -c 'import os, sys; print(os.path.realpath(sys.executable), sys.version.split()[0])')
stamp=.venv/.mldist-installed
want=$( (cat pyproject.toml constraints.txt; echo "$base") | sha256sum | cut -c1-16)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# A .venv made from another interpreter is made again (--clear) rather than mixed.
venv_base=$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys._base_executable), sys.version.split()[0])' 2>/dev/null || true)
if [ "$venv_base" != "$base" ]; then
  "$py" -m venv --clear .venv
fi
echo "bootstrap: installing mldist and its dependencies into .venv (about a minute)" >&2
# Some machines list local mirrors that may be absent; pip's warnings about them are noise.
# --no-compile, then compileall on every core: pip compiles the 11,000 modules one by one
# (84 s in all here, 68 s this way).
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt \
  -e ".[cpu,jax,dev,tfp,docs]" 2> >(grep -v "is neither a file nor a directory" >&2)
# Legacy Keras 2 for TF_USE_LEGACY_KERAS=1 users and for tfp.layers: --no-deps, because tf-keras's
# metadata pulls the full (CUDA) tensorflow wheel next to tensorflow-cpu.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile --no-deps -c constraints.txt \
  tf-keras 2> >(grep -v "is neither a file nor a directory" >&2)
# As pip does, a module that does not compile (a package's template or test data) is left as it is.
if [ "$compile" = 1 ]; then
  .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true
fi
echo "$want" > "$stamp"
