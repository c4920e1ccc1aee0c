"""mldist build-env on the test Slurm cluster: build a venv in a job, then train with it on 2 nodes.

The build installs mldist from this checkout (``--source``: the default would follow how the
test runner installed mldist) with the [cpu] extra and constraints.txt, non-editable, from the
package indexes pip is configured with.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import ROOT, mldist

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
Submit = Callable[..., str]


def _build(env: dict[str, str], venv: Path, out: Path) -> tuple[str, str]:
    """Submit the build job; its id and the follow-up line printed."""
    requirements = out.parent / "requirements.txt"
    requirements.write_text("scikit-learn  # examples/digits_cnn.py loads its data set with it\n")
    res = mldist(
        ["build-env", "--venv", str(venv), "--scheduler", "slurm", "--time", "20", "--source", str(ROOT),
         "--requirements", str(requirements), "--output-dir", str(out), "--job-name", "build-env"],
        env=env, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    m = re.search(r"submitted build job (\S+) \(slurm\) for (.+)", res.stdout)
    assert m and m.group(2) == str(venv), res.stdout
    follow = [line.strip() for line in res.stdout.splitlines() if line.strip().startswith("mldist submit ")]
    assert follow, res.stdout
    return m.group(1), follow[0]


def test_build_env_then_train_on_two_nodes_with_it(
    slurm_env: dict[str, str], tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    venv, build_out = tmp_path / "my venv", tmp_path / "build"  # a blank in the path, on purpose
    started = time.monotonic()
    job, follow = _build(slurm_env, venv, build_out)
    assert shlex.split(follow)[:6] == ["mldist", "submit", "--scheduler", "slurm", "--venv", str(venv)], follow
    status = wait_for(slurm_env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=1200)
    took = time.monotonic() - started
    logs = mldist(["logs", job], env=slurm_env).stdout
    assert " COMPLETED " in f" {status} ", f"{status}\n{logs[-6000:]}"
    assert re.search(r"imports ok: mldist \S+ tensorflow 2\.", logs), logs[-3000:]
    inside = re.search(r"mldist build-env: done in (\d+) s", logs)
    assert inside, logs[-3000:]
    print(f"\nbuild job {job}: the build took {inside.group(1)} s; COMPLETED {took:.0f} s after submitting")
    for record in (venv / "mldist-build.txt", build_out / "mldist-build.txt"):
        freeze = record.read_text()
        assert freeze.startswith("# mldist build-env: "), freeze[:500]
        names = {re.split(r"[=@ ]", line, maxsplit=1)[0].lower().replace("_", "-") for line in freeze.splitlines()}
        assert {"tensorflow-cpu", "mldist", "mpi4py", "scikit-learn"} <= names, freeze
    # Non-editable: the venv holds its own copy of mldist, not a link to this tree.
    assert not list(venv.glob("lib/python3*/site-packages/__editable__*")), "mldist was installed editable"

    out = tmp_path / "train"
    train = _submit(
        slurm_env,
        "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "1", "--time", "10",
        "--venv", str(venv), "--output-dir", str(out), "--job-name", "digits",
        "--", "python", str(ROOT / "examples" / "digits_cnn.py"), "--epochs", "1", "--out", str(out / "results"),
    )  # fmt: skip
    status = wait_for(slurm_env, train, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    batch = mldist(["logs", train], env=slurm_env).stdout
    assert " COMPLETED " in f" {status} ", f"{status}\n{batch[-6000:]}"
    for rank in (0, 1):
        result = json.loads((out / "results" / f"result-rank{rank}.json").read_text())
        assert (result["rank"], result["size"]) == (rank, 2)
    # The ranks ran the venv's Python, not this checkout's .venv.
    env_record = (out / f"environment-{train}.txt").read_text()
    assert str(venv / "bin" / "python") in env_record, env_record[:2000]
