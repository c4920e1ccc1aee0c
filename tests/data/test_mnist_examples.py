"""examples/mnist_fit.py and examples/mnist_custom_loop.py on a small generated MNIST in the cache.

The slow tests run each on 2 workers under ``mldist run``: both ranks must end with the same
weights (the broadcast and the gradient averaging worked) and rank 0 alone saves the model.

    pytest tests/data -m slow
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakedata import mnist_npz, write

from helpers import PY, ROOT, check, clean_env, mldist, run_py

EXAMPLES = ("mnist_fit.py", "mnist_custom_loop.py")


@pytest.mark.parametrize("script", EXAMPLES)
def test_without_mnist_the_example_names_the_fetch_command(tmp_path: Path, script: str) -> None:
    res = run_py(str(ROOT / "examples" / script), timeout=60, env=clean_env(MLDIST_DATA_DIR=str(tmp_path)))
    check(res, 2)
    assert res.stderr.strip() == (
        f"{script}: error: mnist is not in the data cache {tmp_path} (no mnist.npz): run "
        f"`mldist data fetch mnist --cache {tmp_path}` where there is internet access (a login node)"
    )


# On TensorFlow: neither example has a line of its own for JAX, and a bundled Keras example on JAX
# (examples/digits_cnn.py: mldist.data.shard and fit) is in runtime/test_engine.py.
@pytest.mark.slow
@pytest.mark.parametrize("script", EXAMPLES)
def test_the_example_trains_in_step_on_two_workers(tmp_path: Path, script: str) -> None:
    write(tmp_path / "cache" / "mnist", {"mnist.npz": mnist_npz(n_train=512, n_test=128)})
    out = tmp_path / "out"
    env = clean_env(MLDIST_DATA_DIR=str(tmp_path / "cache"))
    cmd = ["run", "-n", "2", "--no-run-dir", "--", PY, str(ROOT / "examples" / script), "--epochs", "2"]
    check(mldist([*cmd, "--batch-size", "32", "--out", str(out)], env=env, timeout=300, cwd=tmp_path))
    rows = [json.loads((out / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["size"], r["train_images"]) for r in rows] == [(0, 2, 512), (1, 2, 512)]
    assert rows[0]["weights_sha256"] == rows[1]["weights_sha256"]
    assert rows[0]["test_accuracy"] > 0.3  # the bands make the labels learnable: well above chance (0.1)
    assert [p.name for p in out.glob("*.keras")] == [script.replace(".py", ".keras")]  # rank 0's, renamed
