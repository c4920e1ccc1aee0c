"""examples/bayesian_tfp.py: a TensorFlow Probability Bayesian network on 2 workers under ``mldist run``.

Every rank seeds itself differently (initial weights, Flipout noise) and trains on its own
shard, so trainable weights that end bit-identical on both ranks show that rank 0's start was
broadcast and every gradient averaged. Needs the ``tfp`` extra (scripts/bootstrap.sh installs
it); without it the test skips, except under CI=true, where it fails.

    pytest tests/training/test_tfp_example.py
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from helpers import PY, ROOT, cannot_here, check, mldist

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "bayesian_tfp.py"


def need_tfp() -> None:
    """Skip (fail under CI=true) when TensorFlow Probability or TF-Keras is not installed."""
    missing = [name for name in ("tensorflow_probability", "tf_keras") if importlib.util.find_spec(name) is None]
    if missing:
        cannot_here(f"{' and '.join(missing)} not installed: pip install -e '.[tfp]' (scripts/bootstrap.sh does)")


def test_bayesian_tfp_example_trains_in_step_on_two_workers(tmp_path: Path) -> None:
    need_tfp()
    out = tmp_path / "out"
    cmd = ["run", "-n", "2", "--no-run-dir", "--", PY, str(EXAMPLE), "--epochs", "3", "--out", str(out)]
    res = check(mldist(cmd, timeout=300, cwd=tmp_path))
    r0, r1 = (json.loads((out / f"result-rank{r}.json").read_text()) for r in (0, 1))
    assert [(r["rank"], r["size"]) for r in (r0, r1)] == [(0, 2), (1, 2)]
    assert r0["train_examples"] == 1437  # the KL divisor: the whole training set, not a rank's shard
    # The same weights after training: rank 0's start was broadcast and every gradient averaged.
    assert r0["weights_sha256"] == r1["weights_sha256"]
    # ...though each rank draws its own weight samples: the test predictions (fresh draws) differ.
    assert r0["test_nll"] != r1["test_nll"]
    losses = r0["loss_history"]  # negative ELBO per example, averaged over ranks
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    assert r0["test_accuracy"] > 0.6, r0  # ten classes: chance is 0.1 (about 0.93 after 3 epochs)
    assert "[0] 2 worker(s): test accuracy" in res.stdout and "[1] Epoch" not in res.stdout
