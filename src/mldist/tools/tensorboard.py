"""``mldist tensorboard RUN_DIR...``: TensorBoard on this host's loopback, and the ssh line to see it.

TensorBoard has no authentication, so it listens on 127.0.0.1 only; you reach it
through an ssh tunnel. On the host you log in to (no batch job around) that is
``ssh -L LOCAL:localhost:PORT user@host``; on a compute node of a job the tunnel
jumps through the login host (``$SLURM_SUBMIT_HOST``, ``$PBS_O_HOST``, or ``--login-host``)
to this node: ``ssh -L LOCAL:localhost:PORT -J user@login user@node``.

Example:
    >>> logdir_spec(["runs/train-20261124-010203", "other/train-20261124-010203"])
    'train-20261124-010203:runs/train-20261124-010203,train-20261124-010203-2:other/train-20261124-010203'
    >>> ssh_line("ana", "login1.hpc.org", "login1", 6006, 41234)
    'ssh -L 6006:localhost:41234 ana@login1.hpc.org'
    >>> ssh_line("ana", "login1.hpc.org", "gpu07", 6006, 41234)
    'ssh -L 6006:localhost:41234 -J ana@login1.hpc.org ana@gpu07'
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ..base.procs import die_with_parent, free_ports
from ..errors import ConfigError, LaunchError

#: Where TensorBoard listens: never on a public interface (it has no authentication).
LOOPBACK = "127.0.0.1"
#: Variables naming the host a batch job was submitted from, in order of preference.
LOGIN_VARS = ("SLURM_SUBMIT_HOST", "PBS_O_HOST", "LSB_SUB_HOST", "COBALT_SUBMIT_HOST")


def logdir_spec(run_dirs: Sequence[str | os.PathLike[str]]) -> str:
    """TensorBoard's ``--logdir_spec``: ``name:dir,...``, each named after its directory (made unique).

    Example:
        >>> logdir_spec(["a/x", "b/y"])
        'x:a/x,y:b/y'
    """
    parts, seen = [], set()
    for run_dir in run_dirs:
        text = str(run_dir)
        if "," in text:
            raise ConfigError(f"RUN_DIR {text!r} contains a comma, which TensorBoard cannot take; rename it")
        base = (Path(text).resolve().name or "run").replace(":", "_")
        name, n = base, 1
        while name in seen:
            n += 1
            name = f"{base}-{n}"
        seen.add(name)
        parts.append(f"{name}:{text}")
    return ",".join(parts)


def login_host(env: Mapping[str, str], override: str | None = None) -> str:
    """The host to ssh to: ``override``, else the job's submit host, else this host's full name.

    Outside a job this host is taken for the login host (``socket.getfqdn()``, or the host
    name where that only gives ``localhost``).

    Example:
        >>> login_host({"SLURM_SUBMIT_HOST": "login2"}), login_host({}, "hpc.example.org")
        ('login2', 'hpc.example.org')
    """
    if override:
        return override
    for name in LOGIN_VARS:
        if env.get(name):
            return env[name]
    fqdn = socket.getfqdn()
    return socket.gethostname() if fqdn.startswith("localhost") else fqdn


def ssh_user(env: Mapping[str, str], uid: int | None = None) -> str:
    """Your user name for the ssh line: ``$USER``, ``$LOGNAME``, else the account of ``uid`` (this process's).

    Batch jobs and containers do not always set ``USER``; the account database still knows the
    name. A uid it does not know (a container without a passwd entry) gives the placeholder ``USER``.

    Example:
        >>> ssh_user({"USER": "ana"}), ssh_user({}, 0)
        ('ana', 'root')
    """
    for name in ("USER", "LOGNAME"):
        if env.get(name):
            return env[name]
    try:
        return pwd.getpwuid(os.getuid() if uid is None else uid).pw_name
    except KeyError:
        return "USER"


def ssh_line(user: str, login: str, here: str, local_port: int, port: int) -> str:
    """The ssh command that forwards ``local_port`` on your machine to TensorBoard's ``port`` on ``here``.

    When ``here`` is not the login host, the tunnel jumps through it (``-J``) to ``here``,
    because TensorBoard listens on ``here``'s loopback only.
    """
    forward = f"ssh -L {local_port}:localhost:{port}"
    if login.split(".")[0] == here.split(".")[0]:
        return f"{forward} {user}@{login}"
    return f"{forward} -J {user}@{login} {user}@{here}"


def check_run_dirs(run_dirs: Sequence[str]) -> None:
    """Raise ConfigError unless every RUN_DIR is an existing directory.

    Example:
        >>> check_run_dirs(["."])
    """
    if not run_dirs:
        raise ConfigError("name at least one run directory: mldist tensorboard runs/train-20261124-010203")
    for run_dir in run_dirs:
        if not Path(run_dir).is_dir():
            raise ConfigError(f"RUN_DIR {run_dir!r} is not a directory; name a run directory (see runs/)")


def choose_port(port: int | None) -> int:
    """``port`` if it is free on the loopback (else ConfigError), or a free one.

    Example:
        >>> 0 < choose_port(None) < 65536
        True
    """
    if port is None:
        return free_ports(1, LOOPBACK)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            raise ConfigError(f"--port {port}: {exc.strerror}; choose another or leave --port out") from None
    return port


def tensorboard_argv(run_dirs: Sequence[str], port: int) -> list[str]:
    """The command that starts TensorBoard on ``127.0.0.1:port`` for ``run_dirs``.

    Example:
        >>> tensorboard_argv(["runs/a"], 6006)[1:]
        ['-m', 'tensorboard.main', '--logdir_spec', 'a:runs/a', '--host', '127.0.0.1', '--port', '6006']
    """
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir_spec",
        logdir_spec(run_dirs),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
    ]


def answers(port: int, timeout: float = 2.0) -> bool:
    """Whether an HTTP server on ``127.0.0.1:port`` answers ``GET /``."""
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/", timeout=timeout) as resp:
            return 200 <= int(resp.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


def wait_until_ready(proc: subprocess.Popen[bytes], port: int, log: IO[bytes], timeout: float) -> None:
    """Return once TensorBoard answers; LaunchError with its last output if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while not answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            log.flush()
            log.seek(0)
            said = log.read()[-1500:].decode(errors="replace").strip()
            code = proc.returncode
            why = f"exited with code {code}" if code is not None else f"no answer in {timeout:g} s"
            raise LaunchError(f"TensorBoard {why}" + (f"; it said: {said.splitlines()[-1]}" if said else ""))
        time.sleep(0.25)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(
    run_dirs: Sequence[str],
    port: int | None = None,
    login: str | None = None,
    local_port: int | None = None,
    ready_timeout: float = 180.0,
) -> int:
    """Start TensorBoard for ``run_dirs``, print how to reach it, and run until Ctrl-C; the exit code.

    Args:
        run_dirs: run directories (or any TensorBoard log directories).
        port: the port on 127.0.0.1 (default: a free one).
        login: the host to ssh to (default: :func:`login_host`).
        local_port: the port on your machine in the ssh line (default: ``port``).
        ready_timeout: seconds TensorBoard gets to answer.

    Example::

        serve(["runs/train-20261124-010203"])   # prints the ssh line; Ctrl-C stops it
    """
    check_run_dirs(run_dirs)
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("TensorBoard is not installed here: pip install tensorboard (or mldist[cpu])")
    chosen = choose_port(port)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            tensorboard_argv(run_dirs, chosen),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
        )
        stop = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            wait_until_ready(proc, chosen, log, ready_timeout)
            _announce(run_dirs, chosen, login, local_port)
            return _wait(proc)
        except KeyboardInterrupt:
            return 0
        finally:
            signal.signal(signal.SIGTERM, stop)
            _stop(proc)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends TensorBoard as Ctrl-C does


def _wait(proc: subprocess.Popen[bytes]) -> int:
    code = proc.wait()
    print(f"mldist tensorboard: TensorBoard exited with code {code}", file=sys.stderr, flush=True)
    return 1 if code else 0


def _announce(run_dirs: Sequence[str], port: int, login: str | None, local_port: int | None) -> None:
    line = ssh_line(ssh_user(os.environ), login_host(os.environ, login), socket.gethostname(), local_port or port, port)
    print(
        f"TensorBoard for {len(run_dirs)} run(s) at http://{LOOPBACK}:{port}/ (this host only). On your machine run\n"
        f"  {line}\n"
        f"and open http://localhost:{local_port or port}/ ; Ctrl-C here stops TensorBoard.",
        flush=True,
    )
