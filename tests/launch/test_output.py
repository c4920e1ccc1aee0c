"""Readable output: TensorFlow's start-up notices are not repeated by every rank unless asked for."""

from __future__ import annotations

import pytest

from helpers import PY, check, mldist

SCRIPT = "import mldist, tensorflow as tf; ctx = mldist.init(); print('TRAINING', ctx.rank)"
NOTICE = "oneDNN custom operations are on"


@pytest.mark.slow
def test_startup_notices_are_hidden_unless_verbose() -> None:
    quiet = check(mldist(["run", "-n", "2", "--", PY, "-c", SCRIPT], timeout=120))
    both = quiet.stdout + quiet.stderr
    assert "[0] TRAINING 0" in both and "[1] TRAINING 1" in both
    assert NOTICE not in both and "absl::InitializeLog" not in both
    verbose = check(mldist(["run", "-n", "2", "--verbose", "--", PY, "-c", SCRIPT], timeout=120))
    assert NOTICE in verbose.stdout + verbose.stderr  # the control: TensorFlow does print it
