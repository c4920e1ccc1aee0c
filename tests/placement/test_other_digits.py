"""Numbers from launchers, servers and argv in digits that are not ASCII (``'²'.isdigit()`` is true, and
``int('²')`` a ValueError): each place refuses or ignores them as it does a word, never a traceback."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from mldist.data.datasets.fetch import _total
from mldist.errors import ConfigError
from mldist.horovod.elastic import restarted
from mldist.launch.batch import formed
from mldist.placement.allocation import allocation
from mldist.placement.cluster import assign_ports, build_cluster_spec
from mldist.placement.detect import detect
from mldist.runtime.engines.jax_init import world

OTHER = ["\u00b2", "\u0663", "\uff12"]  # superscript two, Arabic-Indic three, fullwidth two


@pytest.mark.parametrize("digit", OTHER)
def test_jax_counts_and_ids_are_refused_in_one_line(digit: str) -> None:
    for env in (
        {"JAX_NUM_PROCESSES": digit, "JAX_PROCESS_ID": "0"},
        {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": digit},
    ):
        with pytest.raises(ConfigError, match="is not a whole number"):
            world(env)


@pytest.mark.parametrize("digit", OTHER)
def test_a_worker_port_is_refused_and_a_job_key_is_hashed(digit: str) -> None:
    env = {"MLDIST_RANK": "0", "MLDIST_SIZE": "2", "MLDIST_WORKERS": f"h:1,h:{digit}"}
    with pytest.raises(ConfigError, match=f"worker address 'h:{digit}' is not host:port"):
        build_cluster_spec(detect(env), env)
    assert len(assign_ports(f"{digit}.0", 2, 20000)) == 2


@pytest.mark.parametrize("digit", OTHER)
def test_counts_from_schedulers_and_servers_are_ignored(digit: str) -> None:
    found = allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": digit})
    assert found is not None and found.tasks is None
    assert _total(SimpleNamespace(headers={"Content-Length": digit}), 0) is None
    assert restarted({"SLURM_RESTART_COUNT": digit}) is False


def test_the_formed_helper_refuses_a_count_in_other_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert formed.main([str(tmp_path), "\u00b2"]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m mldist.launch.batch.formed")
