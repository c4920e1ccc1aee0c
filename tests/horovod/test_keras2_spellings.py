"""Horovod's TF2 examples on Keras 3 through the alias: Keras 2's spellings work (issue 64).

Horovod's ``tensorflow2_synthetic_benchmark.py`` and ``tensorflow2_mnist.py`` broadcast ``opt.variables()``
of Keras's own optimizer, which Keras 3 made a list property (``TypeError: 'list' object is not callable``);
``tensorflow2_keras_mnist.py`` passes ``compile(experimental_run_tf_function=False)``, which Keras 3 refuses.
tests/workers/hvd_keras2_spellings.py is written in those examples' style; it runs on 2 workers under
``mldist run``. Each rank starts from its own weights and data, so weights that end bit-identical show that
the broadcast of ``opt.variables()`` and the averaging worked.

    pytest tests/horovod -m slow
"""

from __future__ import annotations

import pytest

from helpers import PY, WORKERS, check, clean_env, mldist, results

pytestmark = pytest.mark.slow
WORKER = str(WORKERS / "hvd_keras2_spellings.py")


def test_keras2_spellings_of_a_horovod_script_run_through_the_alias() -> None:
    cmd = ["run", "-n", "2", "--no-run-dir", "--", PY, "-m", "mldist.horovod.alias", WORKER, "alias"]
    res = check(mldist(cmd, env=clean_env(), timeout=240))
    first, second = sorted(results(res.stdout), key=lambda row: row["rank"])
    assert first["tape_variables_is_list"] and second["tape_variables_is_list"], (first, second)
    for part in ("tape", "tape_optimizer", "fit", "fit_optimizer"):
        assert first[part] == second[part], (part, first, second)


def test_the_optimizer_mldist_hands_out_answers_both_spellings_without_the_alias() -> None:
    """No alias, no patch: mldist's own optimizer answers ``opt.variables()``; Keras's stays a plain list."""
    res = check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, WORKER, "own"], env=clean_env(), timeout=240))
    first, second = sorted(results(res.stdout), key=lambda row: row["rank"])
    assert first["own_called"] and first["own_count"] > 0, first
    assert not first["keras_own_callable"] and not second["keras_own_callable"], (first, second)
    assert first["fit"] == second["fit"], (first, second)
