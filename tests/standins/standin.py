#!/usr/bin/env python3
"""Stand-ins for the programs a rendered batch script calls (tests/launch/batch/harness.py).

Usage: ``standin.py NAME ARGS...`` where NAME is one of ``PROGRAMS``. The test
suite puts a small generated ``NAME`` wrapper per program on ``PATH`` that runs
this file with the test's Python, so neither the executable bit nor the
system's ``python3`` matter.

Every call appends one JSON line ``{"prog", "argv", "env", "pid", "cwd"}`` to
the file named by ``$MLDIST_STANDIN_LOG`` (later lines of the same program add
an ``"event"``: ``"signal"``, ``"exit"``, ``"usr1"``). ``env`` holds the
variables named in ``RECORDED_PREFIXES``.

- ``srun``, ``mpiexec``, ``aprun``: check their own options strictly (an
  unknown or malformed option exits 2), start the task command once per task
  with the launcher's rank variables, run the tasks concurrently, forward
  SIGUSR1/SIGTERM to all of them and exit with the highest task exit code
  (128+N for a task killed by signal N). ``srun --kill-on-bad-exit=1``
  SIGTERMs the other tasks once one exits non-zero, as Slurm does.
- ``mpirun`` (Open MPI): ``-np``, ``--map-by ppr:K:node:PE=D``, ``--bind-to``,
  ``--hostfile``, ``-x NAME``; like Open MPI, the tasks get only the variables ``-x``
  names (plus ``HOME`` and the stand-ins' own), and ``OMPI_COMM_WORLD_*``.
- ``mpiexec`` plays Cray PALS (``--ppn --depth --cpu-bind``) and Hydra (``-ppn -f``).
- ``apptainer``: ``exec [--nv|--rocm|--cleanenv|--bind P|-B P|--env K=V]... IMAGE CMD...``
  records, then execs ``CMD`` with ``APPTAINERENV_X`` applied as ``X``;
  ``pull [--force] DEST URI`` writes a small file at DEST.
- ``nproc``, ``lscpu -p=CORE,SOCKET``: ``$STANDIN_NPROC`` CPUs (default 8) and
  ``$STANDIN_CORES`` cores (default 4), so measured thread counts are known.
- ``conda``: ``shell.bash hook`` prints a ``conda`` shell function whose
  ``activate NAME`` exports ``STANDIN_CONDA_ENV=NAME``.
- ``python3``: answers the environment record's three questions; ``-c "import mldist"``
  fails when ``STANDIN_NO_MLDIST=1`` unless ``PYTHONPATH`` names the bound host mldist;
  ``-m mldist.launch.batch.decided`` runs the real one (this Python's mldist decides the
  engine for the job's ranks), or fails silently like a python3 without mldist.
- ``module``, ``scontrol``, ``qsub``, ``sbatch``: record only, exit 0.
- ``argv-recorder``: the task. Prints its record to stdout (the rank log),
  then: with ``STANDIN_TRAP_USR1=1`` waits up to 20 s for SIGUSR1 and exits 75
  (3 on timeout; with ``STANDIN_STAGGER=1`` rank R first sleeps R seconds);
  with ``STANDIN_SLEEP=S`` sleeps S seconds; exits ``$STANDIN_EXIT`` (default 0).
"""

from __future__ import annotations

import fcntl
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# json, signal and subprocess cost ~20 ms at start-up; the simple stand-ins run often, so they load lazily.

RECORDED_PREFIXES = (
    "MLDIST_",
    "STANDIN_",
    "MY_",
    "SLURM_",
    "PMI_",
    "PALS_",
    "MPI_",
    "ALPS_",
    "PBS_",
    "COBALT_",
    "OMP_",
    "OMPI_",
    "APPTAINER",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "XLA_",
    "LD_LIBRARY_PATH",
    "CONDA",
    "PATH",
)

CONDA_HOOK = 'conda() { if [ "$1" = activate ]; then export STANDIN_CONDA_ENV="$2"; fi; command conda "$@"; }'


def selected_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(RECORDED_PREFIXES) and k != "MLDIST_STANDIN_LOG"}


def to_json(value: object) -> str:
    """``json.dumps`` for str/int/list/dict, without importing json (its ``re`` import is slow)."""
    if isinstance(value, str):
        out = []
        for c in value:
            if c in '"\\':
                out.append("\\" + c)
            elif c < " " or "\ud800" <= c <= "\udfff" or c == "\x7f":
                out.append(f"\\u{ord(c):04x}")
            else:
                out.append(c)
        return '"' + "".join(out) + '"'
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{to_json(str(k))}: {to_json(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot encode {type(value).__name__}")


def record(prog: str, **fields: object) -> dict[str, object]:
    entry: dict[str, object] = {"prog": prog, "pid": os.getpid(), **fields}
    path = os.environ.get("MLDIST_STANDIN_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, (to_json(entry) + "\n").encode("utf-8", "surrogatepass"))
        finally:
            os.close(fd)
    return entry


def record_call(prog: str, argv: list[str]) -> dict[str, object]:
    return record(prog, argv=argv, env=selected_env(), cwd=os.getcwd())


def refuse(prog: str, why: str) -> None:
    sys.stderr.write(f"{prog} (standin): {why}\n")
    sys.exit(2)


def positive(prog: str, flag: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        refuse(prog, f"{flag} needs a positive integer, got {value!r}")
    return int(value)


# -- launchers -------------------------------------------------------------------------------------

SRUN_OPTIONS = {
    "kill-on-bad-exit",
    "nodes",
    "ntasks",
    "ntasks-per-node",
    "cpus-per-task",
    "cpu-bind",
    "gpus-per-task",
}


def parse_srun(args: list[str]) -> tuple[int, list[dict[str, str]], list[str]]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if not arg.startswith("--") or "=" not in arg:
            refuse("srun", f"option {arg!r} is not of the form --x=y")
        key, value = arg[2:].split("=", 1)
        if key not in SRUN_OPTIONS:
            refuse("srun", f"unknown option {arg!r}")
        if key in opts:
            refuse("srun", f"option --{key} given twice")
        opts[key] = value
        i += 1
    if "ntasks" not in opts:
        refuse("srun", "--ntasks missing")
    n = positive("srun", "--ntasks", opts["ntasks"])
    for key in ("nodes", "ntasks-per-node", "cpus-per-task", "gpus-per-task"):
        if key in opts:
            positive("srun", f"--{key}", opts[key])
    if "nodes" in opts and "ntasks-per-node" in opts and int(opts["nodes"]) * int(opts["ntasks-per-node"]) != n:
        refuse("srun", "--ntasks is not --nodes times --ntasks-per-node")
    per_node = int(opts.get("ntasks-per-node", n))
    envs = [{"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r % per_node)} for r in range(n)]
    return n, envs, args[i:]


def parse_flags(prog: str, args: list[str], known: set[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """``-flag value`` pairs up to the first word that does not start with ``-``."""
    pairs = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] not in known:
            refuse(prog, f"unknown option {args[i]!r}")
        if i + 1 >= len(args):
            refuse(prog, f"option {args[i]!r} needs a value")
        pairs.append((args[i], args[i + 1]))
        i += 2
    return pairs, args[i:]


def parse_mpiexec(args: list[str]) -> tuple[int, list[dict[str, str]], list[str]]:
    """Cray PALS (``--ppn``, ``--depth``, ``--cpu-bind``) or Hydra (``-ppn``, ``-f``); not both."""
    pairs, cmd = parse_flags("mpiexec", args, {"-n", "--ppn", "--depth", "--cpu-bind", "-ppn", "-f"})
    opts = dict(pairs)
    if len(opts) != len(pairs):
        refuse("mpiexec", "an option was given twice")
    if "-n" not in opts:
        refuse("mpiexec", "-n missing")
    if {"--ppn", "--depth", "--cpu-bind"} & set(opts) and {"-ppn", "-f"} & set(opts):
        refuse("mpiexec", "PALS options (--ppn) mixed with Hydra options (-ppn)")
    n = positive("mpiexec", "-n", opts["-n"])
    for flag in ("--ppn", "--depth", "-ppn"):
        if flag in opts:
            positive("mpiexec", flag, opts[flag])
    ppn = int(opts.get("--ppn", opts.get("-ppn", n)))
    if n % ppn:
        refuse("mpiexec", "-n is not a multiple of the ranks per node")
    if opts.get("--cpu-bind", "depth") not in ("depth", "core", "numa", "none", "list"):
        refuse("mpiexec", f"unknown --cpu-bind {opts['--cpu-bind']!r}")
    if "-f" in opts and not os.path.isfile(opts["-f"]):
        refuse("mpiexec", f"-f {opts['-f']!r}: no such host file")
    local = "MPI_LOCALRANKID" if "-ppn" in opts else "PALS_LOCAL_RANKID"
    envs = [{"PMI_RANK": str(r), "PMI_SIZE": str(n), local: str(r % ppn)} for r in range(n)]
    return n, envs, cmd


def parse_mpirun(args: list[str]) -> tuple[int, list[dict[str, str]], list[str]]:
    """Open MPI: the tasks see only what ``-x`` forwards (checked by the tests that use it)."""
    import re

    pairs, cmd = parse_flags("mpirun", args, {"-np", "--map-by", "--bind-to", "--hostfile", "-x"})
    opts = dict(p for p in pairs if p[0] != "-x")
    if "-np" not in opts:
        refuse("mpirun", "-np missing")
    n = positive("mpirun", "-np", opts["-np"])
    m = re.fullmatch(r"ppr:([0-9]+):node:PE=([0-9]+)", opts.get("--map-by", f"ppr:{n}:node:PE=1"))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1 or n % int(m.group(1)):
        refuse("mpirun", f"--map-by {opts.get('--map-by')!r} is not ppr:K:node:PE=D dividing -np")
    if opts.get("--bind-to", "core") not in ("core", "hwthread", "none", "socket"):
        refuse("mpirun", f"unknown --bind-to {opts['--bind-to']!r}")
    if "--hostfile" in opts and not os.path.isfile(opts["--hostfile"]):
        refuse("mpirun", f"--hostfile {opts['--hostfile']!r}: no such file")
    names = [v for f, v in pairs if f == "-x"]
    for name in names:
        if name not in os.environ:
            refuse("mpirun", f"-x {name}: not set (Open MPI warns and the rank misses it)")
    per_node = int(m.group(1))
    keep = {
        k: v for k, v in os.environ.items() if k in names or k == "HOME" or k.startswith(("STANDIN_", "MLDIST_STANDIN"))
    }
    envs = [
        {**keep, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(n)}
        | {"OMPI_COMM_WORLD_LOCAL_RANK": str(r % per_node), "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_node)}
        for r in range(n)
    ]
    return n, envs, cmd


def parse_aprun(args: list[str]) -> tuple[int, list[dict[str, str]], list[str]]:
    pairs, cmd = parse_flags("aprun", args, {"-n", "-N", "-d", "-j", "-cc", "-e"})
    opts: dict[str, str] = {}
    extra: dict[str, str] = {}
    for flag, value in pairs:
        if flag == "-e":
            if "=" not in value:
                refuse("aprun", f"-e {value!r} is not K=V")
            key, val = value.split("=", 1)
            extra[key] = val
        elif flag in opts:
            refuse("aprun", f"option {flag} given twice")
        else:
            opts[flag] = value
    if "-n" not in opts:
        refuse("aprun", "-n missing")
    n = positive("aprun", "-n", opts["-n"])
    for flag in ("-N", "-d", "-j"):
        if flag in opts:
            positive("aprun", flag, opts[flag])
    if "-N" in opts and n % int(opts["-N"]):
        refuse("aprun", "-n is not a multiple of -N")
    if opts.get("-cc", "depth") not in ("depth", "none", "cpu", "numa_node"):
        refuse("aprun", f"unknown -cc {opts['-cc']!r}")
    envs = [{**extra, "ALPS_APP_PE": str(r)} for r in range(n)]
    return n, envs, cmd


LAUNCHERS: dict[str, Callable[[list[str]], tuple[int, list[dict[str, str]], list[str]]]] = {
    "srun": parse_srun,
    "mpiexec": parse_mpiexec,
    "aprun": parse_aprun,
    "mpirun": parse_mpirun,
}
#: Launchers that start tasks with only the environment they build (Open MPI's -x).
OWN_ENV = ("mpirun",)


def launcher(prog: str, args: list[str]) -> int:
    import signal
    import subprocess
    import time

    record_call(prog, args)
    _, envs, cmd = LAUNCHERS[prog](args)
    if not cmd:
        refuse(prog, "no command to run")
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        record(prog, event="signal", signal=signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGUSR1, forward)
    signal.signal(signal.SIGTERM, forward)
    codes = []
    for env in envs:
        try:
            procs.append(subprocess.Popen(cmd, env=env if prog in OWN_ENV else {**os.environ, **env}))
        except OSError as e:
            sys.stderr.write(f"{prog} (standin): cannot start {cmd[0]!r}: {e}\n")
            codes.append(127)
    # srun --kill-on-bad-exit=1: the first task to exit non-zero gets the others SIGTERMed, as Slurm does.
    kill_on_bad = prog == "srun" and "--kill-on-bad-exit=1" in args[: len(args) - len(cmd)]
    killed = False
    while any(p.poll() is None for p in procs):
        bad = [p for p in procs if p.returncode not in (None, 0)]
        if kill_on_bad and bad and not killed:
            killed = True
            record(prog, event="kill-on-bad-exit", pid=bad[0].pid)
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.02)
    for p in procs:
        rc = p.wait()
        codes.append(128 - rc if rc < 0 else rc)
    record(prog, event="exit", codes=codes)
    return max(codes)


# -- the rest --------------------------------------------------------------------------------------


APPTAINER_FLAGS = ("--nv", "--rocm", "--cleanenv", "--contain", "--writable-tmpfs")
APPTAINER_VALUED = ("--bind", "-B", "--env", "--home", "--pwd")


def apptainer(args: list[str]) -> int:
    record_call("apptainer", args)
    if args[:1] == ["pull"]:
        rest = [a for a in args[1:] if a != "--force"]
        if len(rest) != 2 or "://" not in rest[1]:
            refuse("apptainer", f"pull needs DEST URI, got {rest!r}")
        with open(rest[0], "w") as f:
            f.write(f"SIF of {rest[1]}\n")
        return 0
    if not args or args[0] != "exec":
        refuse("apptainer", f"expected 'exec' or 'pull', got {args[:1]!r}")
    i = 1
    while i < len(args) and args[i].startswith("-"):
        if args[i] in APPTAINER_FLAGS:
            i += 1
        elif args[i] in APPTAINER_VALUED and i + 1 < len(args):
            i += 2
        else:
            refuse("apptainer", f"unknown option {args[i]!r}")
    cmd = args[i + 1 :]
    if i >= len(args) or not cmd:
        refuse("apptainer", "exec needs an image and a command")
    if not os.path.exists(args[i]) and os.environ.get("STANDIN_IMAGE_MUST_EXIST") == "1":
        refuse("apptainer", f"image {args[i]!r} not found")
    inside = {k[len("APPTAINERENV_") :]: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}
    os.execvpe(cmd[0], cmd, {**os.environ, **inside})
    return 127  # not reached


def python3(args: list[str]) -> int:
    record_call("python3", args)
    if args == ["-c", "import mldist"]:
        bound = "/opt/mldist-host" in os.environ.get("PYTHONPATH", "").split(":")
        return 1 if os.environ.get("STANDIN_NO_MLDIST") == "1" and not bound else 0
    if args[:2] == ["-m", "mldist.launch.batch.decided"]:
        if os.environ.get("STANDIN_NO_MLDIST") == "1":
            return 1
        os.execv(sys.executable, [sys.executable, *args])
    if args[:1] == ["-c"]:
        print("standin-python3 3.0")
    elif args[:2] == ["-m", "pip"]:
        print("standin-package==1.0")
    elif args[:2] == ["-m", "mldist"]:
        print('{"standin": true}')
    return 0


def cpus(prog: str, args: list[str]) -> int:
    """``nproc``: CPUs; ``lscpu -p=CORE,SOCKET``: one line per CPU, cores shared by their threads."""
    n, cores = int(os.environ.get("STANDIN_NPROC", "8")), int(os.environ.get("STANDIN_CORES", "4"))
    if prog == "nproc":
        print(n)
    elif args == ["-p=CORE,SOCKET"]:
        print("# CPU topology (standin)")
        for cpu in range(n):
            print(f"{cpu % cores},0")
    else:
        refuse(prog, f"unexpected arguments {args!r}")
    return 0


def simple(prog: str, args: list[str]) -> int:
    record_call(prog, args)
    if prog == "module" and args[:1] == ["list"]:
        print("Currently Loaded Modules: (standin)")
    if prog == "conda" and args[:2] == ["shell.bash", "hook"]:
        print(CONDA_HOOK)
    return 0


def argv_recorder(args: list[str]) -> int:
    trap = os.environ.get("STANDIN_TRAP_USR1") == "1"
    if trap:
        import signal

        # blocked before we announce ourselves, so an early USR1 waits for sigtimedwait
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    entry = record_call("argv-recorder", args)
    print(to_json(entry), flush=True)
    if trap:
        got = signal.sigtimedwait({signal.SIGUSR1}, 20)
        if got is None:
            return 3
        record("argv-recorder", event="usr1")
        if os.environ.get("STANDIN_STAGGER") == "1":
            # Rank r saves for r seconds: the first rank's exit must not end the others.
            import time

            ranks = ("SLURM_PROCID", "PMI_RANK", "ALPS_APP_PE", "OMPI_COMM_WORLD_RANK")
            rank = next((os.environ[k] for k in ranks if k in os.environ), "0")
            time.sleep(float(rank))
            record("argv-recorder", event="saved")
        return 75
    if os.environ.get("STANDIN_SLEEP"):
        import time

        time.sleep(float(os.environ["STANDIN_SLEEP"]))
    return int(os.environ.get("STANDIN_EXIT", "0"))


PROGRAMS: tuple[str, ...] = ("argv-recorder", "srun", "mpiexec", "aprun", "mpirun", "apptainer", "python3")
PROGRAMS += ("module", "conda", "scontrol", "qsub", "sbatch", "nproc", "lscpu")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in PROGRAMS:
        sys.stderr.write(f"usage: standin.py {{{','.join(PROGRAMS)}}} ARGS...\n")
        return 2
    prog, args = argv[0], argv[1:]
    if prog in LAUNCHERS:
        return launcher(prog, args)
    if prog == "apptainer":
        return apptainer(args)
    if prog == "python3":
        return python3(args)
    if prog == "argv-recorder":
        return argv_recorder(args)
    if prog in ("nproc", "lscpu"):
        return cpus(prog, args)
    return simple(prog, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
