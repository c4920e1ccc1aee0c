"""``JobSpec`` values that need no rendering (``mldist.launch.batch.spec``).

What the renderer refuses or accepts is in test_render_refusals.py.
"""

from __future__ import annotations

import pytest

from mldist.launch.batch.spec import parse_time


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("0:45", 45), ("2:00:00", 7200), ("1-12", 129600)])
def test_times(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


def test_the_network_between_nodes_is_exported_for_mpi_and_nccl() -> None:
    from mldist.errors import ConfigError
    from mldist.launch.batch.render import render
    from mldist.launch.batch.spec import JobSpec

    named = render(JobSpec(command=("python", "t.py"), nodes=2, network_interface="ib0")).splitlines()
    assert "export OMPI_MCA_btl_tcp_if_include=ib0 PRTE_MCA_oob_tcp_if_include=ib0" in named
    assert "export NCCL_SOCKET_IFNAME=ib0" in named
    cidr = render(JobSpec(command=("python", "t.py"), nodes=2, network_interface="10.1.0.0/16"))
    assert "OMPI_MCA_btl_tcp_if_include=10.1.0.0/16" in cidr and "NCCL_SOCKET_IFNAME" not in cidr  # NCCL: names only
    assert "_if_include" not in render(JobSpec(command=("python", "t.py"), nodes=2))
    with pytest.raises(ConfigError, match="--network-interface 'ib0; id'"):
        JobSpec(command=("python",), network_interface="ib0; id")


def test_the_spec_is_the_bottom_type_and_the_table_checks_come_above_it() -> None:
    import ast
    from pathlib import Path

    from mldist.errors import ConfigError
    from mldist.launch.batch import spec
    from mldist.launch.batch.checks import check

    tree = ast.parse(Path(spec.__file__).read_text())
    local = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
    assert local == {"expand"}, "spec.py may import the shell-word parser only: the tables take a JobSpec"
    unchecked = spec.JobSpec(command=("python",), scheduler="lsf", launcher="mpirun")  # the tables are not asked
    with pytest.raises(ConfigError, match="--launcher 'mpirun' is not one of srun, aprun"):
        check(unchecked)
    with pytest.raises(ConfigError, match="--scheduler 'lsf' is not one of slurm"):
        check(spec.JobSpec(command=("python",), scheduler="lsf"))
    assert check(spec.JobSpec(command=("python",), launcher="hydra")).launcher == "hydra"
