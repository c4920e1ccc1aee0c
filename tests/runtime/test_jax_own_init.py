"""JAX's own ``jax.distributed.initialize()``, with no arguments, in the workers of mldist's launchers
(issue 51): JAX's guide (tests/workers/jax_guide.py, no mldist import) under ``mldist run -n 2`` and under
the captured environments of a PBS Pro PALS job and a Cobalt aprun job; the variables each worker gets;
the start-up hook that registers mldist's detector without importing JAX; the one line when JAX moved it.

Across hosts: tests/launch/test_hosts.py; under Slurm: tests/slurm/test_slurm.py; Keras's DataParallel
fit started with JAX's initialize(): tests/runtime/test_own_api.py (order ``jax``).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from helpers import PY, TESTS, WORKERS, check, clean_env, mldist, results
from mldist.base import joined
from mldist.runtime import compat
from mldist.runtime.engines import jax_init

GUIDE = str(WORKERS / "jax_guide.py")
ENVS = TESTS / "fixtures" / "envs"


def guide_lines(text: str, rank: int, prefix: bool = True) -> list[str]:
    """What rank ``rank`` of JAX's guide printed (``[rank]`` before each line under ``mldist run``):
    its process index, count and device count, then its psum."""
    head = f"[{rank}] " if prefix else ""
    lines = [line.removeprefix(head) for line in text.splitlines() if line.startswith(head)]
    return [line for line in lines if re.fullmatch(r"[0-9]+ [0-9]+ [0-9]+|\[[0-9. ]+\]", line)]


@pytest.mark.slow
def test_the_jax_guide_forms_one_group_under_mldist_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = check(mldist(["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, GUIDE], env=clean_env(), timeout=180))
    for rank in (0, 1):
        assert guide_lines(res.stdout, rank) == [f"{rank} 2 2", "[2.]"], res.stdout + res.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["group"] == {"0": "jax.distributed", "1": "jax.distributed"}


def test_each_worker_gets_jaxs_variables_and_a_users_own_stay() -> None:
    names = ["JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "RANK"]
    show = f"import os, json; print('RESULT', json.dumps({{n.lower(): os.environ.get(n) for n in {names!r}}}))"
    rows = results(check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", show])).stdout)
    assert [(r["jax_num_processes"], r["jax_process_id"]) for r in rows] == [("2", "0"), ("2", "1")]
    address = rows[0]["jax_coordinator_address"]
    assert re.fullmatch(r"[^:]+:[0-9]+", address) and rows[1]["jax_coordinator_address"] == address
    mine = check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", show], env=clean_env(JAX_PROCESS_ID="7")))
    assert [r["jax_process_id"] for r in results(mine.stdout)] == ["7", "7"]
    assert "JAX_PROCESS_ID=7 of this environment stays as it is" in mine.stderr


def test_the_hook_waits_for_jax_and_a_worker_without_it_never_imports_it() -> None:
    show = (
        "import sys, os, json; finders = [type(f).__name__ for f in sys.meta_path]; "
        "print('RESULT', json.dumps({'rank': os.environ['RANK'], 'jax': 'jax' in sys.modules, "
        "'waits': 'AfterImport' in finders}))"
    )
    rows = results(check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", show])).stdout)
    assert [(r["jax"], r["waits"]) for r in rows] == [(False, True), (False, True)]
    off = results(
        check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", show], env=clean_env(MLDIST_HOOK="0"))).stdout
    )
    assert [r["waits"] for r in off] == [False, False]


def test_the_detector_comes_first_once_and_says_one_line_when_jax_moved_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax._src import clusters

    kinds = list(clusters.ClusterEnv._cluster_types)
    monkeypatch.setattr(clusters.ClusterEnv, "_cluster_types", kinds)  # this test's own list
    env = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "h:5"}
    assert compat.add_jax_cluster("mldist-test", jax_init.Finder(env)) == ""
    assert compat.add_jax_cluster("mldist-test", jax_init.Finder(env)) == ""  # once
    first = kinds[0]
    assert first.name == "mldist-test" and [k.name for k in kinds].count("mldist-test") == 1
    assert (first.is_env_present(), first.get_process_count(), first.get_process_id()) == (True, 2, 1)
    assert first.get_coordinator_address(None, "6") == "h:6"
    monkeypatch.setattr(clusters.ClusterEnv, "_cluster_types", tuple(kinds))
    line = compat.add_jax_cluster("mldist-moved", jax_init.Finder(env))
    assert "moved its cluster detectors" in line and "JAX_NUM_PROCESSES" in line and "\n" not in line


def _captured(name: str, tasks: list[int], tmp_path: Path, **over: str) -> list[dict[str, str]]:
    """The captured environments of ``tasks`` of fixture ``name``, with the hook, on this host (its node file's
    hosts: this one), and ``over``."""
    data = json.loads((ENVS / f"{name}.json").read_text())
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("127.0.0.1\n" * len(tasks))
    envs = []
    for index in tasks:
        env = clean_env(**{**data["tasks"][index]["env"], **over})
        env = {k: (str(nodefile) if v in data.get("files", {}) else v) for k, v in env.items()}
        envs.append(env | joined.with_hook(env))
    return envs


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def _run_ranks(envs: list[dict[str, str]]) -> list[str]:
    procs = [
        subprocess.Popen([PY, GUIDE], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for env in envs
    ]
    return [p.communicate(timeout=180)[0] for p in procs]


@pytest.mark.slow
def test_the_jax_guide_under_a_pbs_pals_job_and_a_cobalt_aprun_job(tmp_path: Path) -> None:
    """Two ranks of each captured job on this host: PALS names its hosts in PBS's node file; aprun names
    none (the script's `-e MLDIST_SIZE=...`; here rank 0's address in MLDIST_WORKERS, as a site gives it)."""
    pals = _captured("pals_pbs_mpiexec_2x2", [0, 1], tmp_path, PMI_SIZE="2", PMI_UNIVERSE_SIZE="2", PMI_LOCAL_SIZE="2")
    for rank, out in enumerate(_run_ranks(pals)):
        assert guide_lines(out, rank, prefix=False)[-2:] == [f"{rank} 2 2", "[2.]"], out[-2000:]
    workers = ",".join(f"127.0.0.1:{port}" for port in _free_ports(2))
    aprun = [
        {**env, "ALPS_APP_PE": str(rank)}
        for rank, env in enumerate(
            _captured(
                "alps_aprun_2x2", [0, 0], tmp_path, MLDIST_SIZE="2", MLDIST_LOCAL_SIZE="2", MLDIST_WORKERS=workers
            )
        )
    ]
    for rank, out in enumerate(_run_ranks(aprun)):
        assert guide_lines(out, rank, prefix=False)[-2:] == [f"{rank} 2 2", "[2.]"], out[-2000:]


@pytest.mark.slow
def test_a_jax_count_in_other_digits_is_one_line_per_rank_under_mldist_run(tmp_path: Path) -> None:
    """``JAX_NUM_PROCESSES=²`` (a digit to ``str.isdigit``, not to ``int``): each rank that speaks says the
    value in one line, with no traceback and no line that blames a missing join."""
    script = tmp_path / "train.py"
    script.write_text("import mldist\n\nmldist.init()\nprint('UNREACHABLE')\n")
    env = clean_env(KERAS_BACKEND="jax", JAX_NUM_PROCESSES="\u00b2")
    res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, str(script)], env=env)
    assert res.returncode != 0 and "UNREACHABLE" not in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    said = [line for line in res.stderr.splitlines() if re.match(r"\[[01]\] ", line)]
    value = (
        "mldist: error: JAX_NUM_PROCESSES='\u00b2' is not a whole number: unset it, or set it to this worker's value"
    )
    # Either rank may fail first (the order is the scheduler's): the other then names it.
    failed = "mldist: error: rank {} ended on an error before it joined the group"
    assert said and all(line[4:] == value or line[4:].startswith(failed.format(1 - int(line[1]))) for line in said), (
        res.stderr[-3000:]
    )
    assert "Traceback" not in res.stderr and "without joining" not in res.stderr
