"""What the renderer refuses (one line naming the value), what it accepts, and each scheduler's limits.

Pure rendering: no script runs, so these are not marked slow.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness import CMD, parsed_directives
from mldist.errors import ConfigError
from mldist.launch.batch.render import render
from mldist.launch.batch.spec import JobSpec

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"job_name": "my job"}, repr("my job")),
    ({"job_name": "it's"}, repr("it's")),
    ({"job_name": 'say"x'}, repr('say"x')),
    ({"job_name": "a\nb"}, repr("a\nb")),
    ({"job_name": "9lives"}, repr("9lives")),
    ({"job_name": "x" * 65}, repr("x" * 65)),
    ({"output_dir": 'out"dir'}, repr('out"dir')),
    ({"output_dir": "out%jdir"}, repr("out%jdir")),
    ({"output_dir": "out\ndir"}, repr("out\ndir")),
    ({"output_dir": "out\\dir"}, repr("out\\dir")),
    ({"output_dir": 'out"dir', "scheduler": "pbs"}, repr('out"dir')),
    ({"output_dir": "out%dir", "scheduler": "cobalt"}, repr("out%dir")),
    ({"output_dir": "out dir", "scheduler": "pbs"}, repr("out dir")),
    ({"output_dir": "out dir", "scheduler": "cobalt"}, repr("out dir")),
    ({"output_dir": "out#dir", "scheduler": "pbs"}, repr("out#dir")),
    ({"output_dir": "it's", "scheduler": "cobalt"}, repr("it's")),
    ({"account": "my proj"}, repr("my proj")),
    ({"account": "p'x"}, repr("p'x")),
    ({"queue": "a;b"}, repr("a;b")),
    ({"dependency": "afterok:1 && x"}, repr("afterok:1 && x")),
    ({"array": "$(x)"}, repr("$(x)")),
    ({"constraint": "a b"}, repr("a b")),
    ({"env": (("A B", "1"),)}, repr("A B")),
    ({"env": (("1X", "1"),)}, repr("1X")),
    ({"env": (("A=B", "1"),)}, repr("A=B")),
    ({"env": (("", "1"),)}, repr("")),
    ({"env": (("MY_X", "a\0b"),)}, repr("a\0b")),
    ({"unset": ("A B",)}, repr("A B")),
    ({"directives": ("--exclusive\n#SBATCH --wrap=x",)}, repr("--exclusive\n#SBATCH --wrap=x")),
    ({"directives": ("--a\r--b",)}, repr("--a\r--b")),
    ({"mem": "lots"}, repr("lots")),
    ({"time": "soon"}, repr("soon")),
    ({"time": "0"}, repr("0")),
    ({"scheduler": "lsf"}, repr("lsf")),
    ({"launcher": "mpirun"}, repr("mpirun")),
    ({"command": ("python", "a\0b")}, repr("a\0b")),
    ({"modules": ("gcc\0",)}, repr("gcc\0")),
    ({"nodes": 0}, "--nodes 0"),
    ({"tasks_per_node": 0}, "--tasks-per-node 0"),
    ({"hyperthreads": 0}, "--hyperthreads 0"),
    ({"gpus_per_node": -1}, "--gpus-per-node -1"),
    ({"cpus_per_task": 0}, "--cpus-per-task 0"),
    ({"grace": -5}, "--grace -5"),
    ({"venv": "/v", "conda": "c"}, "--venv"),
    ({"command": ()}, "no command"),
    ({"array": "3-1"}, "the range 3-1 goes down"),
    ({"array": "x"}, "--array 'x'"),
    ({"array": "0-9%0"}, "%0 must allow"),
    ({"array": "0-9:0"}, "step of 0-9:0"),
    ({"array": "0-9%2", "scheduler": "pbs"}, "PBS has no throttle"),
    ({"array": "1,3", "scheduler": "pbs"}, "PBS's -J takes one range"),
    ({"nodes": 2, "min_nodes": 3}, "--min-nodes 3"),
    ({"nodes": 2, "min_nodes": 0}, "--min-nodes 0"),
    ({"nodes": 2, "min_nodes": 1, "scheduler": "pbs"}, "--min-nodes: pbs"),
    ({"nodes": 2, "min_nodes": 1, "scheduler": "cobalt"}, "--min-nodes: cobalt"),
    ({"nodes": 2, "min_nodes": 1, "launcher": "openmpi"}, "--launcher openmpi"),
    ({"nodes": 2, "min_nodes": 1, "container": "/i.sif"}, "--container"),
]


@pytest.mark.parametrize("kw, named", REFUSED, ids=[f"{i}-{next(iter(k))}" for i, (k, _) in enumerate(REFUSED)])
def test_refused_values_name_themselves(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        render(JobSpec(**{"command": CMD, **kw}))
    message = str(err.value)
    assert named in message
    assert "\n" not in message, "ConfigError messages are printed as one line"


@pytest.mark.parametrize(
    "kw",
    [
        {"output_dir": "out dir"},  # Slurm takes spaces (quoted)
        {"output_dir": "out#dir it's"},
        {"job_name": "a" * 64},
        {"account": "proj_1.x-y"},
        {"dependency": "afterok:1:2,afterany:3"},
        {"env": (("_X1", "any\nthing"),)},
        {"directives": ("--comment=has spaces and 'quotes'",)},
        {"requeue": True, "time": "10", "grace": 599},
        {"nodes": 2, "min_nodes": 2},
        {"array": "0-9%2"},  # Slurm's throttle: at most 2 tasks at once
        {"array": "1,3,5-7:2"},
        {"array": "0-9:3", "scheduler": "pbs"},
    ],
)
def test_plain_values_are_accepted(kw: dict[str, Any]) -> None:
    """The counterpart of the refusals: nearby values that must pass."""
    assert render(JobSpec(**{"command": CMD, **kw})).startswith("#!/bin/bash\n")


# -- scheduler limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, named",
    [
        ({"scheduler": "pbs", "constraint": "a100"}, "--constraint"),
        ({"scheduler": "cobalt", "array": "0-3"}, "--array"),
        ({"scheduler": "cobalt", "mem": "4G"}, "--mem"),
        ({"scheduler": "cobalt", "gpus_per_node": 1}, "--gpus-per-node"),
        ({"requeue": True}, "--requeue needs --time"),
        ({"scheduler": "pbs", "requeue": True}, "--requeue needs --time"),
        ({"requeue": True, "time": "10", "grace": 600}, "--grace 600"),
        ({"requeue": True, "time": "10", "grace": 601}, "--grace 601"),
        ({"scheduler": "cobalt", "requeue": True, "time": "0:30", "grace": 90}, "--grace 90"),
    ],
)
def test_scheduler_limits(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        render(JobSpec(**{"command": CMD, **kw}))


def test_limits_are_scheduler_specific() -> None:
    """What PBS/Cobalt refuse, Slurm takes (so the refusals above are about the scheduler)."""
    text = render(JobSpec(command=CMD, constraint="a100", array="0-3", mem="4G", gpus_per_node=1))
    assert {"--constraint=a100", "--array=0-3", "--mem=4G", "--gpus-per-node=1"} <= set(
        parsed_directives(text, "slurm")
    )
    assert ("-J", "0-3") in parsed_directives(render(JobSpec(command=CMD, scheduler="pbs", array="0-3")), "pbs")


@pytest.mark.parametrize(("kw", "nodes"), [({"min_nodes": 2}, "3"), ({"min_nodes": 2, "nodes_range": True}, "2-3")])
def test_an_elastic_job_keeps_its_nodes_and_starts_through_the_agent(kw: dict[str, Any], nodes: str) -> None:
    text = render(JobSpec(command=CMD, nodes=3, tasks_per_node=2, requeue=True, time="10", **kw))
    directives = parsed_directives(text, "slurm")
    assert f"--nodes={nodes}" in directives and "--no-kill" in directives, directives
    agent = "python3 -m mldist.launch.batch.agent --min-nodes 2 --tasks-per-node 2 --requeue -- srun "
    assert agent in text and "mldist.launch.batch.formed" not in text  # rounds have fewer ranks
    assert "--no-kill" not in parsed_directives(render(JobSpec(command=CMD, nodes=3)), "slurm")
