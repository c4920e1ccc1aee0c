"""hvd.SyncBatchNormalization: 2 ranks on halves of each batch train exactly as BatchNormalization on the whole."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from helpers import LEGACY_KERAS, WORKERS, check, clean_env, results, run_py

pytestmark = pytest.mark.slow
WORKER = str(WORKERS / "hvd_sync_bn.py")


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_sync_batch_norm_on_halves_equals_batch_norm_on_the_union(
    flavour: str, shared_hvd: Callable[[str, str], str]
) -> None:
    env = clean_env(TF_USE_LEGACY_KERAS=LEGACY_KERAS[flavour])
    (one,) = results(check(run_py(WORKER, env=env, timeout=180)).stdout)
    two = results(shared_hvd(flavour, "hvd_sync_bn.py"))
    assert one["layer"] == "BatchNormalization" and {t["layer"] for t in two} == {"SyncBatchNormalization"}
    for row in two:
        for got, want in zip(row["weights"], one["weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if flavour == "keras3":  # the control: per-rank statistics end elsewhere, so the comparison can fail
        apart = results(shared_hvd(flavour, "hvd_sync_bn.py local"))
        assert not np.allclose(apart[0]["weights"][0], one["weights"][0], rtol=1e-5, atol=1e-6)
