"""On the test Slurm cluster: the ranks of ``mldist submit``'s job take the engine decision its script made."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import ROOT, mldist

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

Submit = Callable[..., str]


def test_every_rank_says_it_took_the_decision_of_mldist_submit(
    slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    """Two nodes, one rank each, ``mldist env`` in each rank (MPI joined: the engine is MPI on CPUs)."""
    out = tmp_path / "job"
    job = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "1", "--time", "5",
        "--venv", str(ROOT / ".venv"), "--output-dir", str(out), "--job-name", "decided",
        "--", "python", "-m", "mldist", "env", "--no-tensorflow",
    )  # fmt: skip
    status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    batch = mldist(["logs", job], env=slurm_env).stdout
    ranks = [mldist(["logs", job, "--rank", str(r)], env=slurm_env).stdout for r in (0, 1)]
    why = f"{status}\n{batch}\n--- rank 0\n{ranks[0][-3000:]}\n--- rank 1\n{ranks[1][-3000:]}"
    assert " COMPLETED " in f" {status} ", why
    assert "no engine decision" not in batch, why
    for text in ranks:
        decided = [line for line in text.splitlines() if line.startswith("decided ")]
        assert decided == [
            "decided   decided by mldist submit: CPU workers in an MPI world that matches the launcher's"
        ], why
