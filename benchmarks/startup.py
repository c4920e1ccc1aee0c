"""Start-up at scale: what one worker's start asks of the file system, and `mldist run` against a bare `mpirun`.

    python benchmarks/startup.py [--parts files,launch,staged,hosts,silent] [--cases numpy,tensorflow,jax]
                                 [--ranks 16,32,64] [--rounds 2] [--hosts 16] [--ranks-per-host 2] [--json FILE]
    python benchmarks/startup.py --only run64     # just -n 64 against mpirun (--rounds applies), alone
    python benchmarks/startup.py --only hosts     # just 16 test hosts x 2 ranks against mpirun --host
    python benchmarks/startup.py --only silent    # just the -H check of 4,096 silent hosts

Parts (``--parts``, in this order):

  files    per-rank file-system calls of a worker's start: ``strace -f -c`` around each rank of a 2-rank
           ``mldist run`` of ``python -c "import X; import mldist; mldist.init()"``, X per case: ``numpy``
           (a numpy-only script, MPI engine), ``tensorflow`` (Keras's default backend, imported first, MPI
           engine) and ``jax`` (KERAS_BACKEND=jax, JAX's engine). Counted: the calls that name a path or
           read a directory (open, openat, the stat family, access, readlink, getdents, mkdir, unlink,
           rename), the ones that failed (a lookup that found nothing), and CPU seconds; rank 0's figures
           (the ranks' agree within a few calls). Each such call reaches the metadata servers of a shared
           parallel file system.
  launch   wall seconds of ``mldist run -n N`` of a numpy-only script (``mldist.init()``, one all-reduce of 3
           floats) against a bare ``mpirun -n N`` of the same mpi4py work (Open MPI from this Python's
           environment, as ``mldist run`` finds it; oversubscribed and unbound, as mldist starts it), for
           each N of ``--ranks``, in interleaved rounds (``--rounds``): medians, and their ratio; beside them
           the same bare run given ``OMP_NUM_THREADS`` as ``mldist run`` sets it for unbound ranks (each
           rank's share of the CPUs), and mldist's ratio to that (``ratio_threads``).

  staged   one worker's file-system calls off the node at start, from its environment and from a staged copy.
  hosts    ``mldist run -H hx1:R,...,hxH:R`` of the numpy-only script against a bare ``mpirun --host`` of the
           same hosts (``--hosts``, ``--ranks-per-host``; scripts/test-hosts.sh's network namespaces, each with
           its own sshd), interleaved rounds: medians, and their ratio. Needs root; starts the hosts unless
           they answer, and stops only what it started.
  silent   ``mldist run -H <4,096 silent one-slot hosts> --connect-timeout 2`` under ``ulimit -n 20000``:
           seconds until its one line, the line's length and the exit code, beside the goal (2 x the timeout
           + 5 s). The names resolve, in a network namespace of its own, to addresses whose packets are
           dropped: nothing leaves the machine. Needs root (``unshare -n -m``).

Parts register themselves in :data:`PARTS` (a name and a function of the parsed arguments that returns
rows). Each row is a dict; the table prints one per part. ``--only`` picks one comparison to run alone
(:data:`ONLY`), for a rerun on a quiet machine.

A bad flag is one line and exit code 2, before anything starts. Needs ``strace`` for ``files``
(``apt-get install strace``); without it that part says so in one line and the others run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]
PY = sys.executable
#: The Python environment's own Open MPI (the wheel in .venv), as mldist's launcher finds it first.
MPIRUN = str(Path(PY).with_name("mpirun"))
#: System calls that name a path or read a directory: on Lustre/GPFS each one is a metadata operation.
PATH_CALLS = frozenset(
    {"open", "openat", "openat2", "creat", "stat", "lstat", "newfstatat", "statx", "access", "faccessat"}
    | {"faccessat2", "readlink", "readlinkat", "getdents", "getdents64", "mkdir", "mkdirat", "unlink"}
    | {"unlinkat", "rename", "renameat", "renameat2"}
)
#: ``files`` cases: the import before ``import mldist; mldist.init()`` and the environment it adds.
CASES: dict[str, tuple[str, dict[str, str]]] = {
    "numpy": ("numpy", {}),
    "tensorflow": ("tensorflow", {"KERAS_BACKEND": "tensorflow"}),
    "jax": ("jax", {"KERAS_BACKEND": "jax"}),
}
#: ``files``: the engine of each case's run (JAX's own for Keras on JAX; else the MPI engine).
CASE_ENGINES = {"numpy": "mpi", "tensorflow": "mpi", "jax": "auto"}
#: The same work with mldist (its init and one all-reduce) and with mpi4py alone.
MLDIST_SCRIPT = """\
import numpy as np
import mldist
mldist.init()
assert mldist.allreduce(np.arange(3.0), op="sum").tolist() == [i * mldist.size() for i in range(3)]
"""
BARE_SCRIPT = """\
import numpy as np
from mpi4py import MPI
x = np.arange(3.0)
MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)
assert x.tolist() == [i * MPI.COMM_WORLD.Get_size() for i in range(3)]
"""
#: What Open MPI needs to start as root (mldist's launcher sets the same: launch/mpiexec.py).
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
#: Launcher variables a benchmark's own environment must not pass on to the runs it starts.
_FOREIGN = ("MLDIST_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "PALS_", "ALPS_", "PBS_", "PRTE_")


def bench_env(scratch: Path, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """This process's environment without launcher variables, run directories in ``scratch``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN) and k != "TF_CONFIG"}
    env["MLDIST_RUNS_DIR"] = str(scratch / "runs")
    env["PRTE_MCA_prte_tmpdir_base"] = tempfile.mkdtemp(dir=scratch)
    return {**env, **extra}


def path_calls(summary: str) -> dict[str, int]:
    """From ``strace -c``'s table: calls that name a path or read a directory, how many failed, and openat/stat.

    Example:
        >>> table = "  1.00  0.1  1  20  3 openat\\n  0.5  0.1  2  40 newfstatat\\n  0.1  0.1  1  9 futex"
        >>> path_calls(table)
        {'calls': 60, 'failed': 3, 'open': 20, 'stat': 40, 'getdents': 0}
    """
    got = {"calls": 0, "failed": 0, "open": 0, "stat": 0, "getdents": 0}
    for line in summary.splitlines():
        fields = line.split()
        if len(fields) not in (5, 6) or fields[-1] not in PATH_CALLS or not fields[3].isdigit():
            continue
        calls, name = int(fields[3]), fields[-1]
        got["calls"] += calls
        got["failed"] += int(fields[4]) if len(fields) == 6 else 0
        kind = "open" if "open" in name or name == "creat" else "stat" if "stat" in name else name.rstrip("64")
        if kind in got:
            got[kind] += calls
    return got


def _cpu_seconds(text: str) -> float:
    match = re.search(r"^(?:\[0\] )?CPU ([0-9.]+)$", text, re.MULTILINE)  # (mldist run's rank prefix)
    return float(match.group(1)) if match else float("nan")


def files_part(args: argparse.Namespace) -> list[Row]:
    """Rank 0's file-system calls and CPU seconds at start, per case of ``--cases`` (see the module's docstring)."""
    strace = shutil.which("strace")
    if strace is None:
        print("startup.py: files: strace is not installed (apt-get install strace); part skipped", file=sys.stderr)
        return []
    rows = []
    for case in args.cases:
        module, extra = CASES[case]
        with tempfile.TemporaryDirectory(prefix="mldist-startup-") as tmp:
            scratch = Path(tmp)
            code = f"import {module}, mldist, resource; mldist.init(); u = resource.getrusage(resource.RUSAGE_SELF)"
            code += "; print(f'CPU {u.ru_utime + u.ru_stime:.2f}') if mldist.rank() == 0 else None"
            out = scratch / "strace"
            shell = f'exec {strace} -f -c -o {out}.$MLDIST_RANK "$@"'  # (the rank mldist run gives each worker)
            argv = [PY, "-m", "mldist", "run", "-n", "2", "--communication", CASE_ENGINES[case], "--no-run-dir", "--"]
            argv += ["sh", "-c", shell, "sh", PY, "-c", code]
            res = subprocess.run(argv, capture_output=True, text=True, env=bench_env(scratch, extra), timeout=900)
            if res.returncode != 0 or not Path(f"{out}.0").exists():
                why = f"exit {res.returncode}: {res.stderr[-500:]}"
                raise SystemExit(f"startup.py: files: the {case} run failed ({why})")
            counts = path_calls(Path(f"{out}.0").read_text())
            rows.append({"case": case, **counts, "cpu_s": _cpu_seconds(res.stdout)})
    return rows


def _timed(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> float:
    start = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=dict(env), timeout=timeout)
    took = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"startup.py: {' '.join(argv[:6])} ... failed (exit {res.returncode}): {res.stderr[-800:]}")
    return took


def interleaved(
    cases: Mapping[str, Mapping[str, Sequence[str]]], env: Callable[[], Mapping[str, str]], rounds: int, timeout: float
) -> dict[str, dict[str, float]]:
    """Each case's ``mldist`` and ``mpirun`` command, in ``rounds`` interleaved rounds; the median seconds of each.

    Args:
        cases: label (e.g. ``-n 64``) -> ``{"mldist": argv, "mpirun": argv}``.
        env: gives each run its environment (a fresh one: prterun's session folder is its own).
        rounds: how many times each command runs; the two alternate which goes first.
        timeout: seconds one run may take.
    """
    times: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        for label, runs in cases.items():
            order = list(runs) if rnd % 2 == 0 else list(reversed(runs))  # neither always goes first
            for name in order:
                took = _timed(runs[name], env(), timeout=timeout)
                times.setdefault((label, name), []).append(took)
                print(f"startup.py: round {rnd + 1}, {label}, {name}: {took:.1f} s", file=sys.stderr, flush=True)
    return {label: {name: statistics.median(times[(label, name)]) for name in runs} for label, runs in cases.items()}


def _ratio_row(first: Row, medians: Mapping[str, float]) -> Row:
    mine, bare = medians["mldist"], medians["mpirun"]
    row = {**first, "mldist_s": round(mine, 2), "mpirun_s": round(bare, 2), "ratio": round(mine / bare, 2)}
    if "mpirun_threads" in medians:
        threads = medians["mpirun_threads"]
        row |= {"mpirun_threads_s": round(threads, 2), "ratio_threads": round(mine / threads, 2)}
    return row


def _share(ranks: int) -> int:
    """Each of ``ranks`` unbound ranks' share of this machine's CPUs (what ``mldist run`` sets, at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // ranks)


def _scripts(scratch: Path) -> tuple[str, str]:
    """The two scripts of the comparison, written in ``scratch``: mldist's and mpi4py's.

    mldist's modules are compiled first, as ``pip install`` leaves them: an editable checkout run with
    ``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile them again in every rank.
    """
    subprocess.run([PY, "-m", "compileall", "-q", str(Path(mldist_file()).parent)], capture_output=True, timeout=600)
    (scratch / "with_mldist.py").write_text(MLDIST_SCRIPT)
    (scratch / "bare.py").write_text(BARE_SCRIPT)
    return str(scratch / "with_mldist.py"), str(scratch / "bare.py")


def mldist_file() -> str:
    """Where this Python finds mldist's package (``__init__.py``), without importing it here."""
    spec = importlib.util.find_spec("mldist")
    if spec is None or spec.origin is None:
        raise SystemExit("startup.py: mldist is not installed in this Python (pip install -e .)")
    return spec.origin


def launch_part(args: argparse.Namespace) -> list[Row]:
    """``mldist run -n N`` against a bare ``mpirun -n N`` of the same work, interleaved rounds, medians."""
    if not os.access(MPIRUN, os.X_OK):
        raise SystemExit(f"startup.py: launch: no mpirun beside this Python ({MPIRUN}); pip install 'mldist[cpu]'")
    with tempfile.TemporaryDirectory(prefix="mldist-startup-") as tmp:
        scratch = Path(tmp)
        mine, bare = _scripts(scratch)
        unbound = [MPIRUN, "--bind-to", "none", "--map-by", ":OVERSUBSCRIBE"]
        cases = {
            f"-n {n}": {
                "mldist": [PY, "-m", "mldist", "run", "-n", str(n), "--", PY, mine],
                "mpirun": [*unbound, "-n", str(n), PY, bare],
                # The same bare run given the thread share mldist run gives its ranks (OMP_NUM_THREADS):
                # how much of the difference is that setting rather than the rest of mldist.
                "mpirun_threads": [*unbound, "-n", str(n), "-x", f"OMP_NUM_THREADS={_share(n)}", PY, bare],
            }
            for n in args.ranks
        }
        env = functools.partial(bench_env, scratch, AS_ROOT if os.geteuid() == 0 else {})
        medians = interleaved(cases, env, args.rounds, args.timeout)
    return [_ratio_row({"ranks": n}, medians[f"-n {n}"]) for n in args.ranks]


ROOT = Path(__file__).resolve().parents[1]
HOSTS_SCRIPT = ROOT / "scripts" / "test-hosts.sh"
#: test-hosts.sh's bridge: Open MPI's TCP between the hosts goes there (as mldist run -H tells its own).
SUBNET = os.environ.get("MLDIST_HOSTS_NET", "172.31.77") + ".0/24"


def _answers(ssh_config: Path, index: int) -> bool:
    """Whether test host hx<index> answers over ssh."""
    argv = ["timeout", "10", "ssh", "-F", str(ssh_config), f"hx{index}", "hostname"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip() == f"hx{index}"


@contextlib.contextmanager
def test_hosts(count: int) -> Iterator[str]:
    """The ssh config of hx1..hx<count>. Hosts already up (another run's, a test's) are used as they are and the
    missing ones added beside them (``revive N``), which stay until the next ``test-hosts.sh stop``; with none up
    it starts all ``count`` and stops them at the end."""
    knobs = {**os.environ, "MLDIST_HOSTS": str(count)}
    script = ["bash", str(HOSTS_SCRIPT)]
    config = Path(os.environ.get("MLDIST_HOSTS_DIR", "/tmp/mldist-hosts")) / "ssh_config"
    base_up = subprocess.run([*script, "status"], capture_output=True, timeout=120, env=os.environ).returncode == 0
    started = False
    try:
        if base_up:
            for index in (i for i in range(1, count + 1) if not _answers(config, i)):
                res = subprocess.run([*script, "revive", str(index)], capture_output=True, text=True, timeout=300)
                if res.returncode:
                    raise SystemExit(f"startup.py: hosts: test-hosts.sh revive {index} failed: {res.stderr[-300:]}")
        else:
            res = subprocess.run([*script, "start"], capture_output=True, text=True, timeout=900, env=knobs)
            if res.returncode:
                raise SystemExit(f"startup.py: hosts: test-hosts.sh start failed: {res.stderr.strip()[-300:]}")
            started = True
        yield str(config)
    finally:
        if started:
            subprocess.run([*script, "stop"], capture_output=True, timeout=300, env=knobs)


def hosts_part(args: argparse.Namespace) -> list[Row]:
    """``mldist run -H`` over ``--hosts`` test hosts x ``--ranks-per-host`` against a bare ``mpirun --host``."""
    if os.geteuid() != 0:
        print("startup.py: hosts: the test hosts need root (namespaces, sshd); part skipped", file=sys.stderr)
        return []
    hosts = ",".join(f"hx{i}:{args.ranks_per_host}" for i in range(1, args.hosts + 1))
    n = args.hosts * args.ranks_per_host
    with tempfile.TemporaryDirectory(prefix="mldist-startup-") as tmp, test_hosts(args.hosts) as ssh_config:
        scratch = Path(tmp)
        mine, bare = _scripts(scratch)
        forward = [word for name in ("PATH", "PYTHONUNBUFFERED") for word in ("-x", name)]
        label = f"-H {args.hosts} x {args.ranks_per_host}"
        cases = {
            label: {
                # (a longer check timeout than the default 10 s: sshd answers slowly on a loaded machine)
                "mldist": [PY, "-m", "mldist", "run", "-H", hosts, "--connect-timeout", "30", "--", PY, mine],
                "mpirun": [MPIRUN, "-n", str(n), "--host", hosts, "--bind-to", "none", *forward, PY, bare],
            }
        }
        # Both launchers reach the hosts with the same ssh; mpirun gets what mldist run -H sets for itself.
        over_ssh = {"PRTE_MCA_plm_ssh_agent": f"ssh -F {ssh_config}", "PYTHONUNBUFFERED": "1", **AS_ROOT}
        over_ssh |= {"OMPI_MCA_btl": "^ofi", "OMPI_MCA_btl_tcp_if_include": SUBNET}
        over_ssh |= {"PRTE_MCA_oob_tcp_if_include": SUBNET}
        env = functools.partial(bench_env, scratch, over_ssh)
        medians = interleaved(cases, env, args.rounds, args.timeout)
    return [_ratio_row({"hosts": args.hosts, "ranks_per_host": args.ranks_per_host, "ranks": n}, medians[label])]


def silent_part(args: argparse.Namespace) -> list[Row]:
    """The ``-H`` check of ``--silent`` silent one-slot hosts at ``--connect-timeout 2`` (see the docstring)."""
    count, timeout = args.silent, 2
    with tempfile.TemporaryDirectory(prefix="mldist-startup-") as tmp:
        scratch = Path(tmp)
        names = [f"s{i:04d}" for i in range(count)]
        lines = ["127.0.0.1 localhost", *(f"192.0.2.{i % 250 + 2} {name}" for i, name in enumerate(names))]
        (scratch / "hosts").write_text("\n".join(lines) + "\n")
        run = [PY, "-m", "mldist", "run", "-H", ",".join(f"{name}:1" for name in names)]
        run += ["--connect-timeout", str(timeout), "--no-run-dir", "--", PY, "-c", "print('WORKER RAN')"]
        limited = ["bash", "-c", 'ulimit -n 20000 && exec "$@"', "-", *run]
        argv = [
            "unshare",
            "-n",
            "-m",
            "--",
            "bash",
            str(ROOT / "scripts" / "dropping-net.sh"),
            str(scratch / "hosts"),
            *limited,
        ]
        env = bench_env(scratch, {"PRTE_MCA_plm_ssh_agent": "ssh -F /dev/null -o StrictHostKeyChecking=no"})
        started = time.perf_counter()
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=args.timeout)
        took = time.perf_counter() - started
    said = res.stderr.strip().splitlines()
    if res.returncode != 2 or len(said) != 1 or "WORKER RAN" in res.stdout:
        raise SystemExit(f"startup.py: silent: expected one line and exit 2, got exit {res.returncode}: {said[-5:]}")
    row = {"hosts": count, "connect_timeout_s": timeout, "seconds": round(took, 2), "goal_s": 2 * timeout + 5}
    return [{**row, "exit_code": res.returncode, "line_chars": len(said[0])}]


#: Parts by name, in the order they run: each takes the parsed arguments and returns its table's rows.
#: Other measurements (staged environments, the -H check of silent hosts) add an entry here.
PARTS: dict[str, Callable[[argparse.Namespace], list[Row]]] = {"files": files_part, "launch": launch_part}


#: staged: directories of the node itself (as tests/slurm/test_slurm_stage_env.py counts them).
NODE_DIRS = (
    "/usr/",
    "/lib/",
    "/lib64/",
    "/bin/",
    "/sbin/",
    "/etc/",
    "/opt/",
    "/proc/",
    "/sys/",
    "/dev/",
    "/run/",
    "/var/",
)
_TRACED = re.compile(r'^\d+\s+(\w+)\((?:AT_FDCWD, |\d+, )?"([^"]*)"')


def off_node(trace: str, local: tuple[str, ...]) -> int:
    """Calls of an ``strace -e trace=%file`` log on paths outside ``local`` ("", / and /tmp not counted, nor
    ``getcwd``, which reads the kernel's cache of the working directory's name).

    Example:
        >>> off_node('1 openat(AT_FDCWD, "/usr/x", O_RDONLY) = 3\\n1 stat("/home/u/t.py", {}) = 0', NODE_DIRS)
        1
    """
    hits = [m for m in map(_TRACED.match, trace.splitlines()) if m and m.group(1) != "getcwd"]
    return sum(1 for m in hits if m.group(2) not in ("", "/", "/tmp") and not (m.group(2) + "/").startswith(local))


def staged_part(args: argparse.Namespace) -> list[Row]:
    """One worker's file-system calls off the node at start, from its environment and from a staged copy.

    ``--stage-venv`` (default: this Python's environment; mldist must be installed in it, not editable, for
    the copy's import finder) is packed and unpacked on this node with ``--stage-env``'s own program and
    started through its rank wrapper; ``import X, mldist; mldist.init()`` per case runs under ``strace -f -e
    trace=%file``; calls on paths outside the copy and the system's directories are counted.
    """
    from mldist.launch.batch.staging import STAGED_WRAPPER, UNPACK

    strace, env_dir = shutil.which("strace"), Path(args.stage_venv or sys.prefix)
    if strace is None:
        print("startup.py: staged: strace is not installed (apt-get install strace); part skipped", file=sys.stderr)
        return []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="mldist-startup-") as tmp:
        scratch, start = Path(tmp), time.perf_counter()
        stage, archive = scratch / "node" / "mldist-env-bench", scratch / "env.tar"
        subprocess.run(["tar", "-C", str(env_dir), "-cf", str(archive), "."], check=True, timeout=args.timeout)
        (scratch / "node").mkdir()
        unpack = ["bash", "-c", UNPACK, "mldist-unpack", str(stage), str(archive), str(env_dir), "1"]
        subprocess.run(unpack, check=True, timeout=args.timeout)
        took = round(time.perf_counter() - start, 1)
        wrapper = ["/bin/bash", "-c", STAGED_WRAPPER, "mldist-staged", str(stage), str(env_dir), "python"]
        for case in args.cases:
            module, extra = CASES[case]
            env = bench_env(scratch, {**extra, "PATH": f"{env_dir}/bin:{os.environ['PATH']}"})
            for where, words, local in (("shared", [str(env_dir / "bin" / "python")], NODE_DIRS),
                                        ("staged", wrapper, (*NODE_DIRS, f"{stage}/"))):  # fmt: skip
                out = scratch / f"trace-{case}-{where}"
                argv = [strace, "-f", "-e", "trace=%file", "-o", str(out), "--", *words, "-c"]
                res = subprocess.run([*argv, f"import {module}, mldist; mldist.init()"], capture_output=True,
                                     text=True, env=env, timeout=args.timeout)  # fmt: skip
                calls = off_node(out.read_text(), local) if res.returncode == 0 else f"failed: {res.stderr[-80:]!r}"
                rows.append({"case": case, "env": where, "calls_off_node": calls, "stage_s": took})
    return rows


PARTS["staged"] = staged_part
PARTS["hosts"] = hosts_part
PARTS["silent"] = silent_part
#: ``--only NAME``: one comparison alone (the parts and ranks it sets), e.g. for a rerun on a quiet machine.
ONLY: dict[str, dict[str, Any]] = {
    "run64": {"parts": ["launch"], "ranks": [64]},
    "hosts": {"parts": ["hosts"]},
    "silent": {"parts": ["silent"]},
}


def table(name: str, rows: Sequence[Row]) -> str:
    """A Markdown table of ``rows`` under the part's name.

    Example:
        >>> print(table("launch", [{"ranks": 2, "ratio": 1.1}]))
        ### launch
        | ranks | ratio |
        |---|---|
        | 2 | 1.1 |
    """
    if not rows:
        return f"### {name}\n(no rows)"
    keys = list(rows[0])
    lines = [f"### {name}", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        print(f"startup.py: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _listed(choices: Sequence[str], what: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",")]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{bad[0] if bad else text!r} is not a {what}; use {','.join(choices)}")
        return items

    return parse


def _counts(text: str) -> list[int]:
    values = [t.strip() for t in text.split(",")]
    if not all(re.fullmatch(r"[1-9][0-9]{0,4}", v) for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give rank counts such as 16,32,64")
    return [int(v) for v in values]


def _positive(text: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]{0,3}", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 or more")
    return int(text)


def _test_hosts(text: str) -> int:
    if not re.fullmatch(r"[1-9]|[12][0-9]|3[0-2]", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to 32 test hosts (scripts/test-hosts.sh makes at most 32)")
    return int(text)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags; a bad one is one line and exit code 2."""
    p = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", type=_listed(list(PARTS), "part"), default=list(PARTS))
    p.add_argument("--cases", type=_listed(list(CASES), "case"), default=list(CASES), help="files: what workers import")
    p.add_argument("--ranks", type=_counts, default=[16, 32, 64], help="launch: rank counts")
    p.add_argument("--rounds", type=_positive, default=2, help="launch: interleaved rounds (medians)")
    p.add_argument("--timeout", type=_positive, default=900, help="seconds one run may take")
    p.add_argument("--stage-venv", help="staged: the environment to stage (default: this Python's)")
    p.add_argument("--hosts", type=_test_hosts, default=16, help="hosts: how many test hosts (1-32)")
    p.add_argument("--ranks-per-host", type=_positive, default=2, help="hosts: ranks on each")
    p.add_argument("--silent", type=_positive, default=4096, help="silent: how many silent hosts")
    p.add_argument("--only", choices=list(ONLY), help="run just this comparison (its parts and ranks)")
    p.add_argument("--json", type=Path, help="also write the rows here, by part")
    args = p.parse_args(argv)
    for name, value in ONLY.get(args.only or "", {}).items():
        setattr(args, name, value)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    results = {name: PARTS[name](args) for name in PARTS if name in args.parts}
    print("\n\n".join(table(name, rows) for name, rows in results.items()))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
