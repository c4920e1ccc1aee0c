"""Batch scripts from ``mldist.jobs.render``, run for real against stand-in programs.

Each rendered script runs under ``bash`` with ``tests/standins/standin.py`` playing
srun, mpiexec, aprun, apptainer, module, conda, python3, scontrol and qsub. The
stand-ins log every call (argv and environment) as JSON lines, start the task
command once per task with the launcher's rank variables, and refuse options
they do not know, so the tests see exactly what each program was given.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import clean_env
from mldist.errors import ConfigError
from mldist.launch.batch.render import RANK_WRAPPER, render
from mldist.launch.batch.spec import JobSpec

pytestmark = pytest.mark.slow  # ~20 s: some 70 scripts run, two of them wait for a 3 s timer

STANDIN = Path(__file__).resolve().parent / "standins" / "standin.py"
PROGRAMS: tuple[str, ...] = ("argv-recorder", "srun", "mpiexec", "aprun", "apptainer", "python3")
PROGRAMS += ("module", "conda", "scontrol", "qsub", "sbatch")

CMD = ("argv-recorder", "train.py", "--epochs", "3")
LAUNCHER = {"slurm": "srun", "pbs": "mpiexec", "cobalt": "aprun"}
PREFIX = {"slurm": "#SBATCH", "pbs": "#PBS", "cobalt": "#COBALT"}
JOB_ID = {"slurm": ("SLURM_JOB_ID", "4242"), "pbs": ("PBS_JOBID", "77.pbs"), "cobalt": ("COBALT_JOBID", "88")}
RANK_VAR = {"slurm": "SLURM_PROCID", "pbs": "PMI_RANK", "cobalt": "ALPS_APP_PE"}
SIZE_VAR = {"slurm": "SLURM_NTASKS", "pbs": "PMI_SIZE", "cobalt": "MLDIST_SIZE"}
ENV_PYTHON_CALLS = [
    ["-c", "import sys; print(sys.executable, sys.version)"],
    ["-m", "pip", "freeze"],
    ["-m", "mldist", "env", "--json", "--no-tensorflow"],
]


# -- stand-ins and running scripts ------------------------------------------------------------------


@pytest.fixture(scope="session")
def standin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of ``NAME`` wrappers that run the stand-in with this Python (no exec bit needed in git)."""
    bindir = tmp_path_factory.mktemp("standin-bin")
    for name in PROGRAMS:
        wrapper = bindir / name
        argv = " ".join(shlex.quote(a) for a in (sys.executable, "-I", "-S", str(STANDIN), name))
        wrapper.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        wrapper.chmod(0o755)
    return bindir


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
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd}")
    return found


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
        logs = "".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(self.jobdir.glob("rank-*.log")))
        return f"exit {self.returncode}\n--- stdout\n{out}--- stderr\n{err}{logs}--- script\n{self.text}"


def base_env(bindir: Path, log: Path, tmp: Path) -> dict[str, str]:
    drop = ("BASH_FUNC_", "COBALT_", "OMP_", "APPTAINER", "CONDA", "STANDIN_", "MY_")
    env = {k: v for k, v in clean_env().items() if not k.startswith(drop)}
    for key in ("BASH_ENV", "ENV", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(key, None)
    (tmp / "tmpdir").mkdir(exist_ok=True)
    env.update(PATH=f"{bindir}:{os.environ['PATH']}", MLDIST_STANDIN_LOG=str(log), TMPDIR=str(tmp / "tmpdir"))
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


def wait_for(what: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {message}")
        time.sleep(0.05)


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
        assert s.get("cpus-per-task") == d.get("cpus-per-task")
    elif scheduler == "pbs":
        chunk = next(v for f, v in directives if f == "-l" and v.startswith("select="))
        select = dict(kv.split("=") for kv in chunk.split(":"))
        opts = dict(zip(launch[::2], launch[1::2], strict=True))
        assert int(opts["-n"]) == int(select["select"]) * int(select["mpiprocs"])
        assert opts["--ppn"] == select["mpiprocs"]
        assert int(select["ncpus"]) == int(select["mpiprocs"]) * int(opts["--depth"])
    else:
        opts = dict(zip(launch[::2], launch[1::2], strict=False))
        assert int(opts["-n"]) == int(dict(directives)["-n"]) * int(opts["-N"])


def slurm_base(out: str, tasks: int = 1, nodes: int = 1, name: str = "mldist") -> list[str]:
    return [
        f"--job-name={name}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks}",
        f"--output={out}/job-%j.out",
        "--open-mode=append",
    ]


def pbs_base(out: str, select: str = "select=1:ncpus=1:mpiprocs=1", name: str = "mldist") -> list[tuple[str, str]]:
    return [("-N", name), ("-l", select), ("-l", "place=scatter"), ("-o", f"{out}/job.out"), ("-j", "oe")]


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
LAUNCH_1 = {
    "slurm": ["--kill-on-bad-exit=1", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1"],
    "pbs": ["-n", "1", "--ppn", "1", "--depth", "1", "--cpu-bind", "depth"],
    "cobalt": ["-n", "1", "-N", "1", "-d", "1", "-j", "1", "-cc", "depth", *aprun_env(1, 1, 1)],
}


# -- the option matrix -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One scheduler and option set: the spec, and what every program must then have seen."""

    id: str
    scheduler: str
    spec: Callable[[Path], dict[str, Any]]
    directives: Callable[[Path], list[Any]]
    launch: list[str]
    task_env: Callable[[Path], dict[str, str]] = lambda t: {}
    env: dict[str, str] = field(default_factory=dict)
    modules: tuple[str, ...] = ()
    container: Callable[[Path], list[str]] = lambda t: []
    absent: tuple[str, ...] = ()


def _out(t: Path) -> str:
    return str(t / "out")


def _fake_venv(t: Path) -> str:
    venv = t / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text("export STANDIN_VENV_MARKER=venv-ok\n")
    return str(venv) + "/"  # the renderer strips the slash


def _software(scheduler: str) -> Case:
    return Case(
        f"{scheduler}-modules-venv-env",
        scheduler,
        lambda t: dict(
            output_dir=_out(t),
            modules=("gcc/12.2", "cuda/12.2"),
            venv=_fake_venv(t),
            env=(("MY_A", "1"), ("MY_B", "two words")),
            unset=("STANDIN_DROP",),
        ),
        lambda t: BASE[scheduler](_out(t)),
        LAUNCH_1[scheduler],
        lambda t: {"MY_A": "1", "MY_B": "two words", "STANDIN_VENV_MARKER": "venv-ok"},
        env={"STANDIN_DROP": "set outside"},
        modules=("gcc/12.2", "cuda/12.2"),
        absent=("STANDIN_DROP",),
    )


def _conda(scheduler: str) -> Case:
    return Case(
        f"{scheduler}-conda",
        scheduler,
        lambda t: dict(output_dir=_out(t), conda="ml-env"),
        lambda t: BASE[scheduler](_out(t)),
        LAUNCH_1[scheduler],
        lambda t: {"STANDIN_CONDA_ENV": "ml-env"},
    )


def _container(scheduler: str) -> Case:
    gpus = 1 if scheduler == "slurm" else 0  # Cobalt refuses GPUs; PBS: the no-GPU form
    launch = LAUNCH_1[scheduler] + (["--gpus-per-task=1"] if gpus else [])
    directives: Callable[[Path], list[Any]] = lambda t: BASE[scheduler](_out(t))  # noqa: E731
    if scheduler == "slurm":
        directives = lambda t: [*slurm_base(_out(t)), "--gpus-per-node=1"]  # noqa: E731
    elif scheduler == "pbs":
        directives = lambda t: pbs_base(_out(t))  # noqa: E731
    return Case(
        f"{scheduler}-container",
        scheduler,
        lambda t: (
            dict(output_dir=_out(t), container=str(t / "img.sif"), binds=("/scratch", "/data:/mnt:ro"))
            | ({"gpus_per_node": 1} if gpus else {})
        ),
        directives,
        launch,
        lambda t: {"APPTAINER_CACHEDIR": f"{t}/tmpdir/apptainer-cache-{os.getuid()}"},
        container=lambda t: (
            [
                *["apptainer", "exec", *(["--nv"] if gpus else [])],
                *[
                    "--bind",
                    str(t / "work"),
                    "--bind",
                    _out(t),
                    "--bind",
                    "/scratch",
                    "--bind",
                    "/data:/mnt:ro",
                ],
                str(t / "img.sif"),
            ]
        ),
    )


def _requeue(scheduler: str) -> Case:
    extra: dict[str, list[Any]] = {
        "slurm": ["--time=0:10:00", "--requeue", "--signal=B:USR1@30"],
        "pbs": [("-l", "walltime=0:10:00")],
        "cobalt": [("-t", "10")],
    }
    return Case(
        f"{scheduler}-requeue-step-ok",
        scheduler,
        lambda t: dict(output_dir=_out(t), requeue=True, time="10", grace=30),
        lambda t: [*BASE[scheduler](_out(t)), *extra[scheduler]],
        LAUNCH_1[scheduler],
    )


CASES = [
    Case(
        "slurm-defaults",
        "slurm",
        lambda t: {},
        lambda t: slurm_base("mldist-jobs"),
        LAUNCH_1["slurm"],
        lambda t: (
            {"OMP_NUM_THREADS": "1", "MLDIST_CPUS_PER_TASK": "1", "MLDIST_JOB_DIR": "mldist-jobs"}
            | {"MLDIST_ATTEMPT": "0", "SLURM_JOB_ID": "4242"}
        ),
    ),
    Case(
        "slurm-multinode",
        "slurm",
        lambda t: dict(
            output_dir=_out(t),
            job_name="train.v2",
            nodes=2,
            tasks_per_node=2,
            gpus_per_node=2,
            cpus_per_task=3,
            mem="32G",
            time="1:30:00",
            queue="gpu",
            account="proj1",
            array="0-3",
            dependency="afterok:123",
            constraint="a100",
            directives=("--exclusive", "--mail-type=END"),
        ),
        lambda t: [
            *slurm_base(_out(t), tasks=2, nodes=2, name="train.v2"),
            "--cpus-per-task=3",
            "--gpus-per-node=2",
            "--time=1:30:00",
            "--mem=32G",
            "--dependency=afterok:123",
            "--array=0-3",
            "--account=proj1",
            "--partition=gpu",
            "--constraint=a100",
            "--exclusive",
            "--mail-type=END",
        ],
        [
            *["--kill-on-bad-exit=1", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2"],
            *["--cpus-per-task=3", "--cpu-bind=cores", "--gpus-per-task=1"],
        ],
        lambda t: (
            {"OMP_NUM_THREADS": "3", "MLDIST_CPUS_PER_TASK": "3", "MLDIST_JOB_DIR": _out(t)}
            | {"MLDIST_ATTEMPT": "2", "SLURM_NTASKS": "4"}
        ),
        env={"SLURM_RESTART_COUNT": "2"},
    ),
    Case(
        "slurm-days-gpus-not-per-task",
        "slurm",
        lambda t: dict(output_dir=_out(t), tasks_per_node=2, gpus_per_node=4, time="1-12"),
        lambda t: [*slurm_base(_out(t), tasks=2), "--gpus-per-node=4", "--time=1-12:00:00"],
        ["--kill-on-bad-exit=1", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2"],
    ),
    Case(
        "pbs-defaults",
        "pbs",
        lambda t: {},
        lambda t: pbs_base("mldist-jobs"),
        LAUNCH_1["pbs"],
        lambda t: (
            {"OMP_NUM_THREADS": "1", "MLDIST_CPUS_PER_TASK": "1", "MLDIST_JOB_DIR": "mldist-jobs"}
            | {"MLDIST_ATTEMPT": "0", "PBS_JOBID": "77.pbs"}
        ),
    ),
    Case(
        "pbs-multinode",
        "pbs",
        lambda t: dict(
            output_dir=_out(t),
            job_name="pbs-run",
            nodes=2,
            gpus_per_node=2,
            cpus_per_task=4,
            mem="64GB",
            time="2:00:00",
            queue="prod",
            account="proj",
            dependency="afterok:12.pbs",
            array="1-4",
            directives=("-l filesystems=home:eagle",),
        ),
        lambda t: [
            *pbs_base(_out(t), "select=2:ncpus=8:mpiprocs=2:ngpus=2:mem=64gb", name="pbs-run"),
            ("-l", "walltime=2:00:00"),
            ("-q", "prod"),
            ("-A", "proj"),
            ("-W", "depend=afterok:12.pbs"),
            ("-J", "1-4"),
            ("-l", "filesystems=home:eagle"),
        ],
        ["-n", "4", "--ppn", "2", "--depth", "4", "--cpu-bind", "depth"],
        lambda t: {"OMP_NUM_THREADS": "4", "MLDIST_CPUS_PER_TASK": "4", "PMI_SIZE": "4"},
    ),
    Case(
        "cobalt-defaults",
        "cobalt",
        lambda t: {},
        lambda t: cobalt_base("mldist-jobs"),
        LAUNCH_1["cobalt"],
        lambda t: (
            {"OMP_NUM_THREADS": "1", "MLDIST_CPUS_PER_TASK": "1", "MLDIST_JOB_DIR": "mldist-jobs"}
            | {"MLDIST_ATTEMPT": "0", "COBALT_JOBID": "88", "MLDIST_SIZE": "1", "MLDIST_LOCAL_SIZE": "1"}
        ),
    ),
    Case(
        "cobalt-multinode",
        "cobalt",
        lambda t: dict(
            output_dir=_out(t),
            nodes=2,
            tasks_per_node=2,
            cpus_per_task=4,
            hyperthreads=2,
            time="1:30:30",
            queue="debug-cache-quad",
            account="proj",
            constraint="mcdram=cache:numa=quad",
            dependency="1234:1235",
            directives=("-M me@example.org",),
        ),
        lambda t: [
            *cobalt_base(_out(t), nodes=2),
            ("-t", "91"),
            ("-q", "debug-cache-quad"),
            ("-A", "proj"),
            ("--attrs", "mcdram=cache:numa=quad"),
            ("--dependencies", "1234:1235"),
            ("-M", "me@example.org"),
        ],
        ["-n", "4", "-N", "2", "-d", "4", "-j", "2", "-cc", "depth", *aprun_env(4, 2, 4)],
        lambda t: (
            {"OMP_NUM_THREADS": "4", "MLDIST_CPUS_PER_TASK": "4", "MLDIST_SIZE": "4"} | {"MLDIST_LOCAL_SIZE": "2"}
        ),
    ),
    *(make(s) for make in (_software, _conda, _container, _requeue) for s in ("slurm", "pbs", "cobalt")),
]


def check_job_ran(job: Job, launch: list[str], container: list[str], command: tuple[str, ...] = CMD) -> None:
    """What every successful run must show: one launch, each task once with its rank, logs, the record."""
    s = job.spec
    sched = s.scheduler
    assert job.returncode == 0, job.explain()
    assert job.stdout.splitlines()[-1] == "mldist: job step ended with exit code 0"
    assert job.leftovers == []

    launches = job.calls(LAUNCHER[sched])
    assert [r["argv"] for r in launches] == [[*launch, "bash", "-c", RANK_WRAPPER, "mldist-rank", *container, *command]]
    assert job.events(LAUNCHER[sched], "exit")[0]["codes"] == [0] * s.total_tasks

    tasks = job.calls(command[0])
    assert len(tasks) == s.total_tasks
    assert all(t["argv"] == list(command[1:]) for t in tasks)
    assert sorted(int(t["env"][RANK_VAR[sched]]) for t in tasks) == list(range(s.total_tasks))
    assert {t["env"][SIZE_VAR[sched]] for t in tasks} == {str(s.total_tasks)}

    logs = sorted(p.name for p in job.jobdir.glob("rank-*.log"))
    assert logs == sorted(f"rank-{r}.log" for r in range(s.total_tasks))
    for r in range(s.total_tasks):
        seen = json.loads((job.jobdir / f"rank-{r}.log").read_text().splitlines()[-1])
        assert seen["env"][RANK_VAR[sched]] == str(r)

    _, job_id = JOB_ID[sched]
    record = job.jobdir / f"environment-{job_id}.txt"
    lines = record.read_text().splitlines()
    attempt = tasks[0]["env"]["MLDIST_ATTEMPT"]
    assert lines[0].startswith(f"# job {job_id} attempt {attempt} on ")
    for heading in ("## modules", "## python", "## pip freeze", "## mldist env"):
        assert heading in lines
    assert job.argvs("python3") == ENV_PYTHON_CALLS
    # The environment record asks the tasks' python: inside the container when there is one.
    if container:
        prefix = container[1:]  # apptainer's own argv: exec, options, image
        runs = job.argvs("apptainer")
        assert [a[: len(prefix)] for a in runs] == [prefix] * len(runs)
        expected = [["python3", *a] for a in ENV_PYTHON_CALLS] + [list(command)] * s.total_tasks
        assert sorted(a[len(prefix) :] for a in runs) == sorted(expected)
    else:
        assert job.calls("apptainer") == []

    assert job.calls("scontrol") == [] and job.calls("qsub") == [] and job.calls("sbatch") == []


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_script_runs_under_stand_ins(case: Case, tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(tmp_path, standin_bin, case.scheduler, job_env=case.env, **case.spec(tmp_path))
    syntax = subprocess.run(["bash", "-n", str(job.script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr

    directives = parsed_directives(job.text, case.scheduler)
    assert directives == case.directives(tmp_path)
    all_directives = [line for line in job.text.split("\n") if line.startswith(PREFIX[case.scheduler])]
    assert len(all_directives) == len(case.directives(tmp_path)), "directives after the first command are ignored"
    check_consistency(case.scheduler, directives, case.launch)

    job.run()
    check_job_ran(job, case.launch, case.container(tmp_path))

    for task in job.calls("argv-recorder"):
        for key, value in case.task_env(tmp_path).items():
            assert task["env"].get(key) == value, (key, task["env"])
        for key in case.absent:
            assert key not in task["env"]

    module_calls = job.argvs("module")
    loads = [["purge"], *(["load", m] for m in case.modules)] if case.modules else []
    assert module_calls == [*loads, ["list"]]
    order = [r["prog"] for r in job.records() if r["prog"] in ("module", LAUNCHER[case.scheduler])]
    assert order.index(LAUNCHER[case.scheduler]) == len(module_calls), "modules load before the launch"

    if job.spec.conda:
        assert job.argvs("conda") == [["shell.bash", "hook"], ["activate", job.spec.conda]]
    else:
        assert job.calls("conda") == []


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_environment_record_without_job_id_is_local(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(tmp_path, standin_bin, scheduler, output_dir=_out(tmp_path))
    del job.env[JOB_ID[scheduler][0]]
    assert job.run() == 0, job.explain()
    assert [p.name for p in job.jobdir.glob("environment-*.txt")] == ["environment-local.txt"]


def test_real_venv_activates_under_set_u(tmp_path: Path, standin_bin: Path) -> None:
    venv = tmp_path / "real venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    job = make_job(tmp_path, standin_bin, output_dir=_out(tmp_path), venv=str(venv))
    assert job.run() == 0, job.explain()
    (task,) = job.calls("argv-recorder")
    assert task["env"]["VIRTUAL_ENV"] == str(venv)
    assert task["env"]["PATH"].startswith(f"{venv}/bin:")


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_user_env_overrides_default_thread_count(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    """``--env OMP_NUM_THREADS=7`` reaches the tasks the same way on every scheduler."""
    job = make_job(tmp_path, standin_bin, scheduler, output_dir=_out(tmp_path), env=(("OMP_NUM_THREADS", "7"),))
    assert job.run() == 0, job.explain()
    assert [t["env"]["OMP_NUM_THREADS"] for t in job.calls("argv-recorder")] == ["7"]


# -- hostile input ---------------------------------------------------------------------------------


def hostile(canary: str) -> list[str]:
    """Strings that break a script if any of them reaches the shell unquoted (each may touch ``canary``)."""
    return [
        "it's",
        'say "hi"',
        "two  words ",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"a; touch {canary}",
        f"x && touch {canary}",
        f"y || touch {canary}",
        f"z | touch {canary}",
        f"line1\ntouch {canary}\n",
        f"x\n#SBATCH --wrap='touch {canary}'\n#PBS -l x=1\n#COBALT -n 9",
        f">{canary}",
        "*",
        "~",
        "~/x",
        "-n",
        "--help",
        "$HOME",
        "${PATH}",
        "\\",
        f"\\$(touch {canary})",
        "'\"'\"'",
        "",
        " ",
        "tab\there",
        "!bang",
        "#hash",
        "{a,b}",
        "%j",
        "h\u00e9llo \u2713",
        "$'\\x41'",
        "&",
    ]


@pytest.mark.parametrize("variant", ["venv-container", "conda"])
@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_hostile_values_arrive_verbatim(scheduler: str, variant: str, tmp_path: Path, standin_bin: Path) -> None:
    canary = tmp_path / "CANARY"
    h = hostile(str(canary))
    env = tuple((f"MY_H{i}", v) for i, v in enumerate(h))
    modules = tuple(h[i] for i in (0, 1, 2, 3, 4, 5, 9, 10, 12, 15))  # a sample: each load is a process
    nasty = f"a 'b\"c $(touch {canary}) `touch {canary}`; && * ~ \n x"
    kw: dict[str, Any] = dict(
        command=("argv-recorder", *h), tasks_per_node=2, output_dir=_out(tmp_path), env=env, modules=modules
    )
    container: list[str] = []
    if variant == "conda":
        kw["conda"] = f"env {nasty}"
    else:
        venv = tmp_path / f"venv {nasty}"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "activate").write_text("export STANDIN_VENV_MARKER=venv-ok\n")
        image = str(tmp_path / f"img {nasty}.sif")
        binds = (f"/data/it's {nasty}", f"/x/$(touch {canary})", f"/y/`touch {canary}`;&&*", "/z\nw")
        kw.update(venv=str(venv), container=image, binds=binds)
        container = ["apptainer", "exec", "--bind", str(tmp_path / "work"), "--bind", _out(tmp_path)]
        container += [a for b in binds for a in ("--bind", b)] + [image]

    job = make_job(tmp_path, standin_bin, scheduler, **kw)
    assert subprocess.run(["bash", "-n", str(job.script)]).returncode == 0
    expected = {
        "slurm": slurm_base(_out(tmp_path), tasks=2),
        "pbs": pbs_base(_out(tmp_path), "select=1:ncpus=2:mpiprocs=2"),
        "cobalt": cobalt_base(_out(tmp_path)),
    }[scheduler]
    assert parsed_directives(job.text, scheduler) == expected
    job.run()
    assert not canary.exists(), "a value was run as shell code"
    tasks_per_node = 2
    launch = {
        "slurm": ["--kill-on-bad-exit=1", "--nodes=1", "--ntasks=2", f"--ntasks-per-node={tasks_per_node}"],
        "pbs": ["-n", "2", "--ppn", "2", "--depth", "1", "--cpu-bind", "depth"],
        "cobalt": ["-n", "2", "-N", "2", "-d", "1", "-j", "1", "-cc", "depth", *aprun_env(2, 2, 1)],
    }[scheduler]
    check_job_ran(job, launch, container, command=("argv-recorder", *h))

    for task in job.calls("argv-recorder"):
        assert task["argv"] == h
        assert {k: v for k, v in task["env"].items() if k.startswith("MY_H")} == dict(env)
        if variant == "conda":
            assert task["env"]["STANDIN_CONDA_ENV"] == kw["conda"]
        else:
            assert task["env"]["STANDIN_VENV_MARKER"] == "venv-ok"
    assert job.argvs("module") == [["purge"], *(["load", m] for m in modules), ["list"]]
    if variant == "conda":
        assert job.argvs("conda") == [["shell.bash", "hook"], ["activate", kw["conda"]]]


def test_hostile_values_do_not_add_directives(tmp_path: Path) -> None:
    """Values in the body may hold directive-looking lines; schedulers stop reading at the first command."""
    h = tuple(hostile(str(tmp_path / "CANARY")))
    for scheduler in ("slurm", "pbs", "cobalt"):
        plain = render(JobSpec(command=CMD, scheduler=scheduler, output_dir="/o"))
        lookalike = next(v for v in h if "#SBATCH" in v)
        nasty = render(JobSpec(command=h, scheduler=scheduler, output_dir="/o", env=(("MY_X", lookalike),)))
        assert header(nasty) == header(plain)
        assert parsed_directives(nasty, scheduler) == BASE[scheduler]("/o")


SLURM_ODD_DIRS = ["out dir", "it's", "a#b", "x 'y' #z", "tab\there"]


@pytest.mark.parametrize("name", SLURM_ODD_DIRS, ids=["space", "quote", "hash", "mixed", "tab"])
def test_slurm_output_directive_reads_back_as_the_output_dir(name: str, tmp_path: Path) -> None:
    """sbatch reads ``--output`` with its own quoting rules; what it reads must be the job's directory."""
    out = str(tmp_path / name)
    text = render(JobSpec(command=CMD, output_dir=out))
    words = parsed_directives(text, "slurm")  # raises like sbatch on an unmatched quote
    assert f"--output={out}/job-%j.out" in words


def test_slurm_output_dir_with_space_and_shell_syntax_runs(tmp_path: Path, standin_bin: Path) -> None:
    canary = tmp_path / "CANARY"
    out = str(tmp_path / f"out dir $(touch {canary}) `touch {canary}`;&&*~")
    job = make_job(tmp_path, standin_bin, output_dir=out)
    assert f'#SBATCH --output="{out}/job-%j.out"' in header(job.text)
    assert parsed_directives(job.text, "slurm") == slurm_base(out)
    job.run()
    check_job_ran(job, LAUNCH_1["slurm"], [])
    assert (Path(out) / "rank-0.log").exists()
    assert job.calls("argv-recorder")[0]["env"]["MLDIST_JOB_DIR"] == out
    assert not canary.exists()


def test_leading_dash_venv_path_is_sourced(tmp_path: Path, standin_bin: Path) -> None:
    """A relative venv whose name starts with '-' must not be read as an option of ``source``."""
    (tmp_path / "work" / "-venv" / "bin").mkdir(parents=True)
    (tmp_path / "work" / "-venv" / "bin" / "activate").write_text("export STANDIN_VENV_MARKER=venv-ok\n")
    job = make_job(tmp_path, standin_bin, output_dir=_out(tmp_path), venv="-venv")
    assert job.run() == 0, job.explain()
    assert job.calls("argv-recorder")[0]["env"].get("STANDIN_VENV_MARKER") == "venv-ok", job.stderr


def test_leading_dash_container_path_is_the_image(tmp_path: Path, standin_bin: Path) -> None:
    """A relative image whose name starts with '-' must reach apptainer as the image, not as an option."""
    job = make_job(tmp_path, standin_bin, output_dir=_out(tmp_path), container="-image.sif")
    assert job.run() == 0, job.explain()
    assert len(job.calls("argv-recorder")) == 1


# -- refusals --------------------------------------------------------------------------------------

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


# -- signals and requeue ---------------------------------------------------------------------------


TRAP = {"STANDIN_TRAP_USR1": "1"}  # tasks wait for SIGUSR1, then exit 75


def test_slurm_usr1_saves_and_requeues(tmp_path: Path, standin_bin: Path) -> None:
    """Rank 1 saves a second longer than rank 0: rank 0's exit must not get it killed."""
    job = make_job(
        tmp_path,
        standin_bin,
        job_env=TRAP | {"STANDIN_STAGGER": "1"},
        output_dir=_out(tmp_path),
        tasks_per_node=2,
        requeue=True,
        time="10",
        grace=30,
    )
    job.start()
    assert job.proc is not None
    try:
        wait_for(lambda: len(job.calls("argv-recorder")) == 2, 10, "both tasks to start")
        os.kill(job.proc.pid, signal.SIGUSR1)
        assert job.wait(15) == 75, job.explain()
    finally:
        job.stop()
    assert [e["signal"] for e in job.events("srun", "signal")] == [signal.SIGUSR1]
    assert len(job.events("argv-recorder", "usr1")) == 2
    assert len(job.events("argv-recorder", "saved")) == 2  # both ranks finished saving
    assert job.events("srun", "kill-on-bad-exit") == []
    # The wrapper turns 75 into a marker and exit 0; the script turns the markers back into 75.
    assert job.events("srun", "exit")[0]["codes"] == [0, 0]
    assert sorted(p.name for p in Path(_out(tmp_path)).glob(".requeue-*")) == [
        ".requeue-4242-0.rank-0",
        ".requeue-4242-0.rank-1",
    ]
    assert job.argvs("scontrol") == [["requeue", "4242"]]
    assert "mldist: USR1" in job.stdout
    assert job.leftovers == []


@pytest.mark.parametrize(
    "scheduler, resubmit",
    [("pbs", ["-v", "MLDIST_ATTEMPT=1"]), ("cobalt", ["--env", "MLDIST_ATTEMPT=1"])],
)
def test_own_timer_signals_before_the_limit(
    scheduler: str, resubmit: list[str], tmp_path: Path, standin_bin: Path
) -> None:
    """time 1 min, grace 57 s: the script's own timer sends USR1 after ~3 s; workers save, job resubmits."""
    job = make_job(
        tmp_path,
        standin_bin,
        scheduler,
        job_env=TRAP,
        output_dir=_out(tmp_path),
        tasks_per_node=2,
        requeue=True,
        time="1",
        grace=57,
    )
    began = time.monotonic()
    job.start()
    code = job.wait(15)
    took = time.monotonic() - began
    assert code == 75, job.explain()
    assert 2.5 < took < 12, took
    assert len(job.events("argv-recorder", "usr1")) == 2
    assert [e["signal"] for e in job.events(LAUNCHER[scheduler], "signal")] == [signal.SIGUSR1]
    assert job.argvs("qsub") == [[*resubmit, f"{_out(tmp_path)}/job.sh"]]
    assert job.leftovers == []


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
def test_step_exit_75_requeues_with_next_attempt(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    env = {"STANDIN_EXIT": "75", "MLDIST_ATTEMPT": "4"}
    job = make_job(tmp_path, standin_bin, scheduler, job_env=env, output_dir=_out(tmp_path), requeue=True, time="10")
    assert job.run() == 75, job.explain()
    assert [t["env"]["MLDIST_ATTEMPT"] for t in job.calls("argv-recorder")] == ["4"]
    expected = {
        "slurm": ("scontrol", [["requeue", "4242"]]),
        "pbs": ("qsub", [["-v", "MLDIST_ATTEMPT=5", f"{_out(tmp_path)}/job.sh"]]),
        "cobalt": ("qsub", [["--env", "MLDIST_ATTEMPT=5", f"{_out(tmp_path)}/job.sh"]]),
    }[scheduler]
    assert job.argvs(expected[0]) == expected[1]
    assert job.leftovers == []  # PBS/Cobalt: the 9.5-minute timer is gone too


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "cobalt"])
@pytest.mark.parametrize("requeue", [True, False])
def test_other_exit_codes_pass_through_without_requeue(
    scheduler: str, requeue: bool, tmp_path: Path, standin_bin: Path
) -> None:
    kw: dict[str, Any] = {"requeue": True, "time": "10"} if requeue else {}
    job = make_job(tmp_path, standin_bin, scheduler, job_env={"STANDIN_EXIT": "3"}, output_dir=_out(tmp_path), **kw)
    assert job.run() == 3, job.explain()
    assert job.calls("scontrol") == [] and job.calls("qsub") == []
    assert job.stdout.splitlines()[-1] == "mldist: job step ended with exit code 3"
    assert job.leftovers == []


def test_requeue_disabled_exit_75_does_not_requeue(tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(tmp_path, standin_bin, job_env={"STANDIN_EXIT": "75"}, output_dir=_out(tmp_path), time="10")
    assert job.run() == 75, job.explain()
    assert job.calls("scontrol") == []
    assert "--requeue" not in parsed_directives(job.text, "slurm")


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_term_stops_the_step_without_requeue(scheduler: str, tmp_path: Path, standin_bin: Path) -> None:
    job = make_job(
        tmp_path,
        standin_bin,
        scheduler,
        job_env={"STANDIN_SLEEP": "30"},
        output_dir=_out(tmp_path),
        tasks_per_node=2,
        requeue=True,
        time="10",
    )
    job.start()
    assert job.proc is not None
    try:
        wait_for(lambda: len(job.calls("argv-recorder")) == 2, 10, "both tasks to start")
        os.kill(job.proc.pid, signal.SIGTERM)
        assert job.wait(10) == 128 + signal.SIGTERM, job.explain()
    finally:
        job.stop()
    assert [e["signal"] for e in job.events(LAUNCHER[scheduler], "signal")] == [signal.SIGTERM]
    assert job.calls("scontrol") == [] and job.calls("qsub") == []
    assert job.leftovers == []
