"""One golden rendered script per scheduler: any change to a template shows as a diff of tests/golden/.

Each spec is fixed and rich (geometry, GPUs where the scheduler has them, time limit, requeue
with grace, modules, a venv or a container, an environment value with a quote and a dollar,
account, queue, dependency, an absolute output directory), so the golden file shows almost
every line the renderer can write. After an intended template change, regenerate and review:

    MLDIST_UPDATE_GOLDEN=1 pytest tests/launch/batch/test_golden.py
    git diff tests/golden/
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import pytest

from helpers import TESTS
from mldist.launch.batch.render import render
from mldist.launch.batch.spec import JobSpec

GOLDEN = TESTS / "golden"
UPDATE = "MLDIST_UPDATE_GOLDEN"

COMMON: dict[str, Any] = dict(
    command=("python", "train.py", "--epochs", "5"),
    job_name="golden",
    nodes=2,
    tasks_per_node=4,
    time="2:00:00",
    requeue=True,
    grace=120,
    modules=("gcc/12.2", "cuda/12.2"),
    env=(("NCCL_DEBUG", "INFO"), ("RUN_NOTE", "it's $HOME")),
    account="proj1",
    output_dir="/scratch/u/run",
)

SPECS: dict[str, JobSpec] = {
    "slurm": JobSpec(
        **COMMON,
        scheduler="slurm",
        gpus_per_node=4,
        cpus_per_task=8,
        mem="64G",
        queue="gpu",
        dependency="afterok:123",
        container="/sw/images/tf.sif",
        binds=("/data:/mnt:ro",),
    ),
    "pbs": JobSpec(
        **COMMON,
        scheduler="pbs",
        gpus_per_node=4,
        cpus_per_task=8,
        queue="prod",
        dependency="afterok:12.pbs",
        venv="/home/u/venvs/tf",
        directives=("-l filesystems=home:eagle",),
    ),
    "cobalt": JobSpec(
        **COMMON,
        scheduler="cobalt",
        cpus_per_task=16,
        hyperthreads=2,
        queue="debug-cache-quad",
        dependency="1234:1235",
        constraint="mcdram=cache:numa=quad",
        container="/sw/images/tf.sif",
    ),
}


@pytest.mark.parametrize("scheduler", sorted(SPECS))
def test_rendered_script_matches_the_golden_file(scheduler: str) -> None:
    path = GOLDEN / f"{scheduler}.sh"
    got = render(SPECS[scheduler])
    if os.environ.get(UPDATE) == "1":
        path.write_text(got)
    want = path.read_text() if path.exists() else ""
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True),
                got.splitlines(keepends=True),
                f"tests/golden/{scheduler}.sh (golden)",
                f"render(SPECS[{scheduler!r}]) (now)",
            )
        )
        pytest.fail(
            f"the rendered {scheduler} script differs from tests/golden/{scheduler}.sh:\n{diff}\n"
            f"If the change is intended, regenerate the file and review its diff:\n"
            f"  {UPDATE}=1 pytest 'tests/launch/batch/test_golden.py::test_rendered_script_matches_the_golden_file'\n"
            f"  git diff tests/golden/",
            pytrace=False,
        )


def test_every_scheduler_has_a_golden_script() -> None:
    from mldist.launch.batch.schedulers import SCHEDULERS

    assert sorted(SPECS) == sorted(SCHEDULERS)
    assert sorted(p.stem for p in GOLDEN.glob("*.sh")) == sorted(SPECS)
