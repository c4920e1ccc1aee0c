"""mldist run on real worker processes (plain Python/bash workers: no TensorFlow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import PY, check, clean_env, mldist, processes_with, tail, wait_for
from mldist.launch.local import RunConfig, failure_order, worker_env
from mldist.placement.resources import cpu_probe


def _sleeper(tag: str) -> str:
    # A grandchild that would outlive its worker if the launcher leaked it.
    return f"sleep 300 & exec -a {tag} sleep 300"


def test_every_worker_gets_its_rank_and_the_same_worker_list() -> None:
    code = (
        "import json, os; print(json.dumps({k: os.environ[k] for k in "
        "('MLDIST_RANK','MLDIST_SIZE','MLDIST_LOCAL_RANK','MLDIST_LOCAL_SIZE','MLDIST_WORKERS')}))"
    )
    res = check(mldist(["run", "-n", "3", "--", PY, "-c", code]))
    rows = {}
    for line in res.stdout.splitlines():
        prefix, _, payload = line.partition(" ")
        rows[prefix] = json.loads(payload)
    assert sorted(rows) == ["[0]", "[1]", "[2]"]
    for r in range(3):
        assert rows[f"[{r}]"]["MLDIST_RANK"] == str(r)
        assert rows[f"[{r}]"]["MLDIST_SIZE"] == "3"
    lists = {row["MLDIST_WORKERS"] for row in rows.values()}
    assert len(lists) == 1
    ports = [w.rsplit(":", 1)[1] for w in lists.pop().split(",")]
    assert len(set(ports)) == 3


@pytest.mark.parametrize(
    "rank, death, code, message",
    [(1, "exit 3", 3, "rank 1 exited with code 3"), (0, "kill -9 $$", 137, "rank 0 was killed by SIGKILL")],
    ids=["exit-code", "sigkill"],
)
def test_a_failing_worker_stops_the_group_with_its_code_and_leaves_nothing(
    rank: int, death: str, code: int, message: str, tag: str
) -> None:
    """A worker that exits with a code, or is killed, takes the others down; its code is the launcher's."""
    script = f"if [ $MLDIST_RANK = {rank} ]; then sleep 1; {death}; fi; {_sleeper(tag)}"
    t0 = time.monotonic()
    res = mldist(["run", "-n", "2", "--", "bash", "-c", script])
    elapsed = time.monotonic() - t0
    check(res, code)
    assert message in res.stderr
    assert elapsed < 15
    assert processes_with(tag) == []


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PY, "-m", "mldist", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )


def _wait_for_line(path: Path, count: int, timeout: float = 30) -> None:
    def started() -> bool:
        return path.exists() and len(path.read_text().splitlines()) >= count

    wait_for(started, timeout, f"workers to start: {path}")


def test_sigterm_is_forwarded_and_the_workers_code_passes_through(tmp_path: Path, tag: str) -> None:
    ready = tmp_path / "ready"
    script = f'trap "echo saved; exit 75" TERM; echo up >> {ready}; {_sleeper(tag)} & wait'
    proc = _start(["run", "-n", "2", "--grace", "10", "--", "bash", "-c", script])
    _wait_for_line(ready, 2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75
    assert sorted(line for line in out.splitlines() if "saved" in line) == ["[0] saved", "[1] saved"]
    assert processes_with(tag) == []


def test_worker_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path, tag: str) -> None:
    ready = tmp_path / "ready"
    script = f'trap "" TERM INT; echo up >> {ready}; exec -a {tag} sleep 300'
    proc = _start(["run", "-n", "2", "--grace", "1", "--", "bash", "-c", script])
    _wait_for_line(ready, 2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 137
    assert 0.9 < time.monotonic() - t0 < 10
    assert "after the grace period" in err
    assert processes_with(tag) == []


def test_log_dir_writes_one_file_per_rank(tmp_path: Path) -> None:
    res = check(mldist(["run", "-n", "2", "--log-dir", str(tmp_path), "--", "bash", "-c", "echo hi from $MLDIST_RANK"]))
    assert res.stdout == ""
    assert (tmp_path / "rank-0.log").read_text() == "hi from 0\n"
    assert (tmp_path / "rank-1.log").read_text() == "hi from 1\n"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_cpu_bind_cores_gives_disjoint_cpu_sets() -> None:
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    res = check(mldist(["run", "-n", "2", "--cpu-bind", "cores", "--", PY, "-c", code]))
    sets = [set(json.loads(line.split(" ", 1)[1])) for line in res.stdout.splitlines()]
    assert len(sets) == 2 and all(sets)
    assert not sets[0] & sets[1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to narrow the mask")
def test_unbound_workers_in_a_narrowed_mask_share_it_and_pin_nothing() -> None:
    """As in a container or ``salloc -c``: the launcher's mask is the job's, not each worker's."""
    first = min(os.sched_getaffinity(0))
    env_json = [PY, "-m", "mldist", "env", "--json", "--no-tensorflow"]  # the plan init() applies
    res = check(
        mldist(["run", "-n", "2", "--no-run-dir", "--", *env_json], preexec_fn=lambda: os.sched_setaffinity(0, {first}))
    )
    reports = [json.loads(text) for text in joined_json(res.stdout)]
    plans = [(r["threads"]["cpus"], r["threads"]["source"]) for r in reports]
    assert plans == [(1, "1 cores / 2 ranks")] * 2, tail(res)  # before: (1, "affinity mask") each
    assert not any("KMP_AFFINITY" in r["init_would_set"] for r in reports)  # before: both pinned to that CPU


def test_unbound_workers_get_their_share_of_threads_before_they_import_numpy() -> None:
    """OpenBLAS sizes its pool at import: the launcher sets OMP_NUM_THREADS to each rank's share (issue 62),
    and the plan still names the share as its source."""
    allowed = len(os.sched_getaffinity(0))
    share = max(1, allowed // 2)
    code = "import os; print(os.environ.get('OMP_NUM_THREADS'))"
    res = check(mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", code], env=clean_env()))
    assert sorted(res.stdout.splitlines()) == [f"[{r}] {share if share < allowed else None}" for r in (0, 1)], tail(res)
    env_json = [PY, "-m", "mldist", "env", "--json", "--no-tensorflow"]
    res = check(mldist(["run", "-n", "2", "--no-run-dir", "--", *env_json], env=clean_env()))
    plans = [(r["threads"]["cpus"], r["threads"]["source"]) for r in map(json.loads, joined_json(res.stdout))]
    assert plans == [(share, f"{allowed} cores / 2 ranks")] * 2, tail(res)


def joined_json(stdout: str) -> list[str]:
    """Each rank's JSON document from ``[rank] ``-prefixed lines."""
    by_rank: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        rank, _, text = line.partition(" ")
        by_rank.setdefault(rank, []).append(text)
    return ["\n".join(lines) for _, lines in sorted(by_rank.items())]


def test_worker_env_quiets_tensorflow_unless_the_user_chose() -> None:
    cfg = RunConfig(nprocs=2, command=("python",))
    env = worker_env({"TF_CONFIG": "{}"}, cfg, 1, ["127.0.0.1:1", "127.0.0.1:2"], "run")
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "1" and "TF_CONFIG" not in env and env["MLDIST_RANK"] == "1"
    mine = worker_env({"TF_CPP_MIN_LOG_LEVEL": "0"}, cfg, 0, ["127.0.0.1:1", "127.0.0.1:2"], "run")
    assert mine["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_an_inherited_low_omp_num_threads_gets_one_note_and_is_passed_on() -> None:
    show = "import os; print(os.environ.get('OMP_NUM_THREADS'))"
    res = check(mldist(["run", "-n", "1", "--no-run-dir", "--", PY, "-c", show], env=clean_env(OMP_NUM_THREADS="1")))
    assert res.stdout == "[0] 1\n"  # the user's value is still what the worker gets
    probe = cpu_probe()
    notes = [line for line in res.stderr.splitlines() if line.startswith("mldist run: note: OMP_NUM_THREADS=1 ")]
    assert len(notes) == (1 if not probe.pinned and probe.total > 1 else 0), res.stderr
    res = check(mldist(["run", "-n", "1", "--no-run-dir", "--", PY, "-c", show]))
    assert "note:" not in res.stderr and res.stdout == "[0] None\n"


def test_the_first_failure_is_the_earliest_then_a_killed_rank() -> None:
    # Both ended between two looks: mpiexec's times decide; without them a rank killed by a signal
    # comes before one that exited (it may have exited because its peer died).
    assert failure_order([(0, 1), (1, -9)], {0: 0.0, 1: 0.0}) == [(1, -9), (0, 1)]
    assert failure_order([(0, 1), (1, -9)], {0: 5.0, 1: 6.0}) == [(0, 1), (1, -9)]
    assert failure_order([(1, 1), (0, 0)], {}) == [(0, 0), (1, 1)]


def test_the_workers_get_the_configs_environment_and_the_launchers_stays_as_it_was(tmp_path: Path) -> None:
    from mldist.launch.local import inherited, run

    code = "import os; print(os.environ['MLDIST_TEST_EXTRA'], os.environ['MLDIST_TEST_KEPT'])"
    cfg = RunConfig(
        nprocs=2,
        command=(PY, "-c", code),
        communication="ring",
        log_dir=str(tmp_path),
        env={"MLDIST_TEST_EXTRA": "x y"},
    )
    before = dict(os.environ)
    os.environ["MLDIST_TEST_KEPT"] = "kept"
    try:
        assert inherited(cfg)["MLDIST_TEST_EXTRA"] == "x y"
        assert run(cfg) == 0
        assert "MLDIST_TEST_EXTRA" not in os.environ
    finally:
        os.environ.pop("MLDIST_TEST_KEPT")
    assert dict(os.environ) == before
    assert [(tmp_path / f"rank-{r}.log").read_text() for r in (0, 1)] == ["x y kept\n"] * 2


@pytest.mark.parametrize("env", [{"1BAD": "x"}, {"A B": "x"}, {"OK": "nul\0"}, {"": "x"}])
def test_a_worker_variable_that_no_shell_could_pass_is_refused(env: dict[str, str]) -> None:
    from mldist.errors import ConfigError

    with pytest.raises(ConfigError, match="worker variable"):
        RunConfig(nprocs=1, command=("python",), env=env)


def test_every_worker_gets_the_common_rank_variables_and_a_users_own_stay() -> None:
    code = "import os; print(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE')))"
    for engine in ("ring", "mpi"):  # started directly, and through mpiexec's shims
        res = check(mldist(["run", "-n", "2", "--communication", engine, "--", PY, "-c", code]))
        assert sorted(line.split(" ", 1)[1] for line in res.stdout.splitlines()) == ["0 2 0 2", "1 2 1 2"], engine
        assert "MASTER_ADDR" not in res.stdout
    env = clean_env(RANK="7")
    res = check(mldist(["run", "-n", "2", "--communication", "ring", "--", PY, "-c", code], env=env))
    assert sorted(line.split(" ", 1)[1] for line in res.stdout.splitlines()) == ["7 2 0 2", "7 2 1 2"]
    assert res.stderr.count("RANK=7 of this environment stays as it is for every worker") == 1, res.stderr


def test_mpi_workers_get_open_mpis_rabenseifner_iallreduce_unless_the_user_chose() -> None:
    # libnbc's default for < 4 ranks or in-place sends the whole buffer twice, one way after the other
    # (placement.common.MPI_TUNING); a user's own choice (a site's tuning) stays.
    name = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"
    code = f"import os; print(os.environ.get({name!r}))"
    cmd = ["run", "-n", "2", "--communication", "mpi", "--", PY, "-c", code]
    res = check(mldist(cmd))
    assert sorted(line.split(" ", 1)[1] for line in res.stdout.splitlines()) == ["3", "3"]
    res = check(mldist(cmd, env=clean_env(**{name: "1"})))
    assert sorted(line.split(" ", 1)[1] for line in res.stdout.splitlines()) == ["1", "1"]
