"""Readable output: TensorFlow's start-up notices are not repeated by every rank unless asked for."""

from __future__ import annotations

import pytest

from helpers import PY, check, clean_env, mldist

SCRIPT = "import mldist, tensorflow as tf; ctx = mldist.init(); print('TRAINING', ctx.rank)"
NOTICE = "oneDNN custom operations are on"
#: TensorFlow turns oneDNN on by itself only on CPUs with AVX-512 VNNI/BF16 or AMX, and prints NOTICE only
#: then; asked for, it prints it on any x86 CPU. So the control holds on every machine.
ONEDNN_ON = {"TF_ENABLE_ONEDNN_OPTS": "1"}


@pytest.mark.slow
def test_startup_notices_are_hidden_unless_verbose() -> None:
    quiet = check(mldist(["run", "-n", "2", "--", PY, "-c", SCRIPT], timeout=120, env=clean_env(**ONEDNN_ON)))
    both = quiet.stdout + quiet.stderr
    assert "[0] TRAINING 0" in both and "[1] TRAINING 1" in both
    assert NOTICE not in both and "absl::InitializeLog" not in both
    verbose = check(mldist(["run", "-n", "2", "--verbose", "--", PY, "-c", SCRIPT], env=clean_env(**ONEDNN_ON)))
    assert NOTICE in verbose.stdout + verbose.stderr  # the control: TensorFlow does print it
