"""The stand-in harness for rendered batch scripts: run them for real, see what every program got.

Each rendered script runs under ``bash`` with ``tests/standins/standin.py`` playing
srun, mpiexec, aprun, apptainer, module, conda, python3, scontrol, qsub and sbatch. The
stand-ins log every call (argv and environment) as JSON lines, start the task
command once per task with the launcher's rank variables, and refuse options
they do not know, so the tests see exactly what each program was given.

Used by the test_render_*.py files beside it; the ``standin_bin`` fixture (a directory of
wrappers named after the programs) is in this folder's conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import TESTS, clean_env, cmdlines
from mldist.launch.batch.launchers import launcher_name
from mldist.launch.batch.render import RANK_WRAPPER, render
from mldist.launch.batch.spec import JobSpec

STANDIN = TESTS / "standins" / "standin.py"

PROGRAMS: tuple[str, ...] = ("argv-recorder", "srun", "mpiexec", "aprun", "mpirun", "apptainer", "python3")
PROGRAMS += ("module", "conda", "scontrol", "qsub", "sbatch", "nproc", "lscpu")

CMD = ("argv-recorder", "train.py", "--epochs", "3")
LAUNCHER = {"slurm": "srun", "pbs": "mpiexec", "cobalt": "aprun"}
#: Per --launcher: the program, and the variables its tasks read their rank and the world size from.
PROG_OF = {"srun": "srun", "aprun": "aprun", "pals": "mpiexec", "openmpi": "mpirun", "hydra": "mpiexec"}
RANK_OF = {"srun": "SLURM_PROCID", "aprun": "ALPS_APP_PE", "pals": "PMI_RANK", "hydra": "PMI_RANK"}
RANK_OF |= {"openmpi": "OMPI_COMM_WORLD_RANK"}
SIZE_OF = {"srun": "SLURM_NTASKS", "aprun": "MLDIST_SIZE", "pals": "PMI_SIZE", "hydra": "PMI_SIZE"}
SIZE_OF |= {"openmpi": "OMPI_COMM_WORLD_SIZE"}
#: What the stand-ins' nproc and lscpu report (base_env): 8 CPUs, 4 cores.
NPROC, CORES = 8, 4


def measured(tasks: int, hyperthreads: int = 1) -> int:
    """Threads per rank the script computes from the stand-ins' node (no --cpus-per-task)."""
    return max(1, min(CORES * hyperthreads, NPROC) // tasks)


PREFIX = {"slurm": "#SBATCH", "pbs": "#PBS", "cobalt": "#COBALT"}
JOB_ID = {"slurm": ("SLURM_JOB_ID", "4242"), "pbs": ("PBS_JOBID", "77.pbs"), "cobalt": ("COBALT_JOBID", "88")}
RANK_VAR = {"slurm": "SLURM_PROCID", "pbs": "PMI_RANK", "cobalt": "ALPS_APP_PE"}
SIZE_VAR = {"slurm": "SLURM_NTASKS", "pbs": "PMI_SIZE", "cobalt": "MLDIST_SIZE"}
#: Where array tasks find their index: Slurm, PBS Pro, Torque.
ARRAY_VARS = ("SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX", "PBS_ARRAYID")
ENV_PYTHON_CALLS = [
    ["-c", "import sys; print(sys.executable, sys.version)"],
    ["-m", "pip", "freeze"],
    ["-m", "mldist", "env", "--json", "--no-tensorflow"],
]
HOOK_CALL = ["-c", "from mldist.base.joined import hook_folder; print(hook_folder())"]
#: The job's engine decision, made once before the ranks start (then the ranks' count and launcher).
DECIDED_CALL = ["-m", "mldist.launch.batch.decided"]


# -- stand-ins and running scripts ------------------------------------------------------------------


def session_members(sid: int) -> list[str]:
    """Live (non-zombie) processes in session ``sid``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _ppid, _pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(f"{pid} [{state}]: {cmd}")
    return found


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (this one excluded) that contain ``text``."""
    return [f"{pid}: {cmd}" for pid, cmd in cmdlines() if pid != os.getpid() and text in cmd]


@dataclass
class Job:
    """A rendered script, its directories, and (once run) what the stand-ins saw."""

    spec: JobSpec
    tmp: Path
    workdir: Path
    jobdir: Path
    script: Path
    text: str
    log: Path
    cwd: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    leftovers: list[str] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        with (self.tmp / "stdout").open("wb") as out, (self.tmp / "stderr").open("wb") as err:
            self.proc = subprocess.Popen(
                ["bash", str(self.script)],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        return self.proc

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout)
        finally:
            self._reap()
        return self.returncode

    def run(self, timeout: float = 30) -> int:
        self.start()
        return self.wait(timeout)

    def stop(self) -> None:
        """Kill the job's process group if it is still running (after a failed assertion)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def _reap(self) -> None:
        """Note processes of the job still alive after it ended (up to 3 s grace), then kill them."""
        assert self.proc is not None
        sid = self.proc.pid
        deadline = time.monotonic() + 3
        while True:
            left = session_members(sid) + processes_mentioning(str(self.tmp))
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.leftovers = left
        if self.proc.poll() is None or left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGKILL)
            self.proc.wait(5)

    @property
    def stdout(self) -> str:
        return (self.tmp / "stdout").read_text()

    @property
    def stderr(self) -> str:
        return (self.tmp / "stderr").read_text()

    @property
    def taskdir(self) -> Path:
        """Where the ranks log: the job directory, or an array task's ``array-INDEX`` in it."""
        if not self.spec.array:
            return self.jobdir
        index = next((self.env[v] for v in ARRAY_VARS if v in self.env), "0")
        return self.jobdir / f"array-{index}"

    def records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def calls(self, prog: str) -> list[dict[str, Any]]:
        """Records of ``prog`` being started (not its later events)."""
        return [r for r in self.records() if r["prog"] == prog and "event" not in r]

    def argvs(self, prog: str) -> list[list[str]]:
        return [r["argv"] for r in self.calls(prog)]

    def events(self, prog: str, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["prog"] == prog and r.get("event") == event]

    def explain(self) -> str:
        out, err = self.stdout, self.stderr
        logs = "".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(self.taskdir.glob("rank-*.log")))
        return f"exit {self.returncode}\n--- stdout\n{out}--- stderr\n{err}{logs}--- script\n{self.text}"


def base_env(bindir: Path, log: Path, tmp: Path) -> dict[str, str]:
    drop = ("BASH_FUNC_", "COBALT_", "OMP_", "APPTAINER", "CONDA", "STANDIN_", "MY_")
    env = {k: v for k, v in clean_env().items() if not k.startswith(drop)}
    # PYTHONPATH too: the stand-ins record what the script sets (a container inherits the job's).
    for key in ("BASH_ENV", "ENV", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
        env.pop(key, None)
    (tmp / "tmpdir").mkdir(exist_ok=True)
    env.update(PATH=f"{bindir}:{os.environ['PATH']}", MLDIST_STANDIN_LOG=str(log), TMPDIR=str(tmp / "tmpdir"))
    env.update(STANDIN_NPROC=str(NPROC), STANDIN_CORES=str(CORES))
    return env


def make_job(
    tmp: Path, bindir: Path, scheduler: str = "slurm", job_env: dict[str, str] | None = None, **kw: Any
) -> Job:
    """Render ``JobSpec(**kw)`` into its output directory's ``job.sh``, with the scheduler's job environment.

    PBS jobs start in another directory with ``PBS_O_WORKDIR`` pointing at the work directory.
    """
    kw.setdefault("command", CMD)
    spec = JobSpec(scheduler=scheduler, **kw)
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    jobdir = Path(spec.output_dir) if os.path.isabs(spec.output_dir) else workdir / spec.output_dir
    jobdir.mkdir(parents=True, exist_ok=True)
    text = render(spec)
    script = jobdir / "job.sh"
    script.write_text(text)
    cwd = workdir
    log = tmp / "standin.jsonl"
    environ = base_env(bindir, log, tmp)
    key, value = JOB_ID[scheduler]
    environ[key] = value
    if scheduler == "pbs":
        cwd = tmp / "elsewhere"
        cwd.mkdir(exist_ok=True)
        environ["PBS_O_WORKDIR"] = str(workdir)
    environ.update(job_env or {})
    return Job(spec, tmp, workdir, jobdir, script, text, log, cwd, environ)


# -- directives ------------------------------------------------------------------------------------


def header(text: str) -> list[str]:
    """The leading comment block, the only part schedulers read directives from."""
    lines = text.split("\n")
    assert lines[0] == "#!/bin/bash"
    out = []
    for line in lines:
        if line.strip() and not line.startswith("#"):
            break
        out.append(line)
    return out


def sbatch_words(rest: str) -> list[str]:
    """The words sbatch reads from a ``#SBATCH`` line (after the magic word), as Slurm's ``_get_argument``.

    Quotes (either kind) group and are removed, backslash escapes, an unquoted ``#`` starts a comment,
    an unmatched quote is fatal.
    """
    words: list[str] = []
    i, n = 0, len(rest)
    while True:
        while i < n and rest[i].isspace():
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quote = ""
        escape = comment = False
        while i < n and (quote or not rest[i].isspace()):
            c = rest[i]
            if escape:
                escape = False
            elif c == "\\":
                escape = True
                i += 1
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    i += 1
                    continue
            elif c in "\"'":
                quote = c
                i += 1
                continue
            elif c == "#":
                comment = True
                break
            word.append(c)
            i += 1
        if quote:
            raise ValueError(f"sbatch: fatal: Unmatched `{quote}` in [{rest}]")
        if not word:
            return words
        words.append("".join(word))
        if comment:
            return words


def parsed_directives(job_text: str, scheduler: str) -> list[Any]:
    """Slurm: the words sbatch reads. PBS/Cobalt: (flag, value) per line."""
    prefix = PREFIX[scheduler] + " "
    lines = [line[len(prefix) :] for line in header(job_text) if line.startswith(prefix)]
    if scheduler == "slurm":
        return [w for line in lines for w in sbatch_words(line)]
    return [tuple(line.split(None, 1)) for line in lines]


def check_consistency(scheduler: str, directives: list[Any], launch: list[str]) -> None:
    """The launcher asks for what the directives reserved."""
    if scheduler == "slurm":
        d = dict(w[2:].split("=", 1) for w in directives if w.startswith("--") and "=" in w)
        s = dict(a[2:].split("=", 1) for a in launch)
        assert s["nodes"] == d["nodes"] and s["ntasks-per-node"] == d["ntasks-per-node"]
        assert int(s["ntasks"]) == int(d["nodes"]) * int(d["ntasks-per-node"])
        if "cpus-per-task" in d:
            assert s["cpus-per-task"] == d["cpus-per-task"]
        else:  # measured when the job starts, on whole nodes
            assert "--exclusive" in directives and s["cpus-per-task"].isdigit()
    elif scheduler == "pbs":
        chunk = next(v for f, v in directives if f == "-l" and v.startswith("select="))
        select = dict(kv.split("=") for kv in chunk.split(":"))
        opts = dict(zip(launch[::2], launch[1::2], strict=True))
        assert int(opts["-n"]) == int(select["select"]) * int(select["mpiprocs"])
        assert opts["--ppn"] == select["mpiprocs"]
        if "ncpus" in select:
            assert int(select["ncpus"]) == int(select["mpiprocs"]) * int(opts["--depth"])
        else:  # measured when the job starts, on whole nodes
            assert ("-l", "place=scatter:excl") in directives
    else:
        opts = dict(zip(launch[::2], launch[1::2], strict=False))
        assert int(opts["-n"]) == int(dict(directives)["-n"]) * int(opts["-N"])


def slurm_base(
    out: str, tasks: int = 1, nodes: int = 1, name: str = "mldist", exclusive: bool = True, array: bool = False
) -> list[str]:
    """The directives of every Slurm job; ``--exclusive`` when the threads are measured at the start."""
    return [
        f"--job-name={name}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks}",
        f"--output={out}/job-%A_%a.out" if array else f"--output={out}/job-%j.out",
        "--open-mode=append",
        *(["--exclusive"] if exclusive else []),
    ]


def pbs_base(
    out: str, select: str = "select=1:mpiprocs=1", name: str = "mldist", array: bool = False
) -> list[tuple[str, str]]:
    """The directives of every PBS job; whole nodes (``excl``) when the select has no ncpus."""
    place = "place=scatter" if ":ncpus=" in select else "place=scatter:excl"
    log = f"{out}/job.^array_index^.out" if array else f"{out}/job.out"
    return [("-N", name), ("-l", select), ("-l", place), ("-o", log), ("-j", "oe")]


def cobalt_base(out: str, nodes: int = 1) -> list[tuple[str, str]]:
    return [("-n", str(nodes)), ("-O", f"{out}/job")]


def aprun_env(size: int, local: int, threads: int) -> list[str]:
    return [
        "-e",
        f"MLDIST_SIZE={size}",
        "-e",
        f"MLDIST_LOCAL_SIZE={local}",
        "-e",
        f"OMP_NUM_THREADS={threads}",
    ]


BASE: dict[str, Callable[[str], list[Any]]] = {"slurm": slurm_base, "pbs": pbs_base, "cobalt": cobalt_base}
#: One rank on one node, threads measured: all 4 cores of the stand-ins' node.
LAUNCH_1 = {
    "slurm": [
        *["--kill-on-bad-exit=1", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1"],
        *["--cpus-per-task=4", "--cpu-bind=cores"],
    ],
    "pbs": ["-n", "1", "--ppn", "1", "--depth", "4", "--cpu-bind", "depth"],
    "cobalt": ["-n", "1", "-N", "1", "-d", "4", "-j", "1", "-cc", "depth", *aprun_env(1, 1, 4)],
}


# -- what every run must show --------------------------------------------------------------------


def out_dir(t: Path) -> str:
    """The job's output directory below a test's ``tmp_path``."""
    return str(t / "out")


def fake_venv(venv: Path) -> Path:
    """A directory whose ``bin/activate`` only exports ``STANDIN_VENV_MARKER=venv-ok``."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text("export STANDIN_VENV_MARKER=venv-ok\n")
    return venv


def rank_launches(job: Job) -> list[list[str]]:
    """argv of the launcher calls that start the ranks (not aprun's one-rank core count probe)."""
    return [a for a in job.argvs(PROG_OF[launcher_name(job.spec)]) if "mldist-rank" in a]


def check_job_ran(job: Job, launch: list[str], container: list[str], command: tuple[str, ...] = CMD) -> None:
    """What every successful run must show: one launch, each task once with its rank, logs, the record."""
    s = job.spec
    sched, prog = s.scheduler, PROG_OF[launcher_name(s)]
    assert job.returncode == 0, job.explain()
    assert job.stdout.splitlines()[-1] == "mldist: job step ended with exit code 0"
    assert job.leftovers == []

    wrapper = ["bash", "-c", RANK_WRAPPER, "mldist-rank", str(len(s.wrap)), *s.wrap]
    assert rank_launches(job) == [[*launch, *wrapper, *container, *command]]
    assert job.events(prog, "exit")[-1]["codes"] == [0] * s.total_tasks

    tasks = job.calls(command[0])
    assert len(tasks) == s.total_tasks
    assert all(t["argv"] == list(command[1:]) for t in tasks)
    assert sorted(int(t["env"][RANK_OF[launcher_name(s)]]) for t in tasks) == list(range(s.total_tasks))
    assert {t["env"][SIZE_OF[launcher_name(s)]] for t in tasks} == {str(s.total_tasks)}

    logs = sorted(p.name for p in job.taskdir.glob("rank-*.log"))
    assert logs == sorted(f"rank-{r}.log" for r in range(s.total_tasks))
    for r in range(s.total_tasks):
        seen = json.loads((job.taskdir / f"rank-{r}.log").read_text().splitlines()[-1])
        assert seen["env"][RANK_OF[launcher_name(s)]] == str(r)

    _, job_id = JOB_ID[sched]
    record = job.taskdir / f"environment-{job_id}.txt"
    lines = record.read_text().splitlines()
    attempt = tasks[0]["env"]["MLDIST_ATTEMPT"]
    assert lines[0].startswith(f"# job {job_id} attempt {attempt} on ")
    for heading in ("## modules", "## python", "## pip freeze", "## mldist env"):
        assert heading in lines
    probe = ["-c", "import mldist"]  # does the container have mldist? (only with a container)
    calls = [a for a in job.argvs("python3") if a != probe]
    assert calls[: len(ENV_PYTHON_CALLS)] == ENV_PYTHON_CALLS
    decided = [*DECIDED_CALL, str(s.total_tasks), launcher_name(s)]
    assert calls[len(ENV_PYTHON_CALLS)] == decided
    calls.pop(len(ENV_PYTHON_CALLS))
    # Not in a container: where the ranks' start-up hook is, then (the step succeeded) the never-formed check.
    after = [] if container else [HOOK_CALL, ["-m", "mldist.launch.batch.formed", str(s.total_tasks)]]
    assert [a if a[0] == "-c" else [*a[:2], a[-1]] for a in calls[len(ENV_PYTHON_CALLS) :]] == after
    # The environment record asks the tasks' python: inside the container when there is one.
    if container:
        prefix = container[1:]  # apptainer's own argv: exec, options, image
        runs = [a for a in job.argvs("apptainer") if a[0] != "pull" and a[-2:] != ["-c", "import mldist"]]
        assert [a[: len(prefix)] for a in runs] == [prefix] * len(runs)
        expected = [["python3", *a] for a in [*ENV_PYTHON_CALLS, decided]] + [list(command)] * s.total_tasks
        assert sorted(a[len(prefix) :] for a in runs) == sorted(expected)
    else:
        assert job.calls("apptainer") == []

    assert job.calls("scontrol") == [] and job.calls("qsub") == [] and job.calls("sbatch") == []
