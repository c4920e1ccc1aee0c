"""``horovod.run(fn, np=N)``: run a Python function on N local workers and return each rank's result.

The function and its arguments travel pickled (cloudpickle when installed, so lambdas and
local functions work) in a private temporary directory; ``mldist run``'s launcher starts the
workers (this package's ``__main__``), each calls the function and leaves its pickled result
there. A failing worker fails the call with mldist's one line naming the rank.

Example::

    import mldist.horovod as horovod
    def fn(scale):
        import mldist.horovod as hvd
        hvd.init()
        return hvd.rank() * scale
    horovod.run(fn, args=(10,), np=2)     # [0, 10]
"""

from __future__ import annotations

import pickle
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, LaunchError, UnsupportedError
from ..pickled import pickler

_TASK, _RESULT = "task.pkl", "result-{rank}.pkl"


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    np: int = 1,
    min_np: int | None = None,
    max_np: int | None = None,
    hosts: str | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    verbose: int | None = None,
    **ignored: Any,
) -> list[Any]:
    """``func(*args, **kwargs)`` on ``np`` local workers; the results in rank order (Horovod's ``horovod.run``).

    ``hosts`` may only name this host (``localhost:N``); ``min_np``/``max_np`` (elastic) are refused: an
    elastic world loses and takes in hosts, so it starts with ``mldist run -H ... --min-np N``.
    Other horovodrun settings (ssh, start timeout, output file, ...) are accepted and have no effect.
    """
    from ...launch.local import RunConfig
    from ...launch.local import run as launch

    if min_np is not None or max_np is not None:
        raise UnsupportedError(
            "horovod.run(min_np=, max_np=): functions run on this host only, where no host can be lost; "
            "start an elastic script with mldist run -H ... --min-np N (or --host-discovery-script)"
        )
    if hosts and not all(h.split(":")[0] in ("localhost", "127.0.0.1") for h in hosts.split(",")):
        raise UnsupportedError(f"horovod.run(hosts={hosts!r}): functions run on this host only; use mldist run -H")
    if not isinstance(np, int) or np < 1:
        raise ConfigError(f"horovod.run(np={np!r}): give a number of workers >= 1")
    engine = "ring" if use_gloo else "mpi" if use_mpi else "auto"
    with tempfile.TemporaryDirectory(prefix="mldist-horovod-run-") as tmp:
        (Path(tmp) / _TASK).write_bytes(pickler().dumps((func, tuple(args), dict(kwargs or {}))))
        from ..alias import installed

        # A caller that imports horovod through the alias has functions that do too.
        command = (sys.executable, "-m", __name__, tmp, *(["--alias"] if installed() else []))
        code = launch(RunConfig(np, command, communication=engine, verbose=bool(verbose)))
        if code:
            raise LaunchError(f"horovod.run: the workers failed (exit code {code}); their output above names why")
        return [pickle.loads((Path(tmp) / _RESULT.format(rank=r)).read_bytes()) for r in range(np)]


def _worker(directory: str, alias: bool) -> None:
    """In each worker: call the task, leave this rank's pickled result."""
    import os

    if alias:
        from ..alias import install

        install()
    func, args, kwargs = pickle.loads((Path(directory) / _TASK).read_bytes())
    result = func(*args, **kwargs)
    rank = int(os.environ.get("MLDIST_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    (Path(directory) / _RESULT.format(rank=rank)).write_bytes(pickler().dumps(result))
