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

import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...base import envvalues
from ...errors import ConfigError, LaunchError, UnsupportedError
from ..pickled import pickler

_TASK, _RESULT = "task.pkl", "result-{round}-{rank}.pkl"


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    np: int = 1,
    min_np: int | None = None,
    max_np: int | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    network_interface: str | None = None,
    verbose: int | None = None,
    **ignored: Any,
) -> list[Any]:
    """``func(*args, **kwargs)`` on ``np`` workers; the results in rank order (Horovod's ``horovod.run``).

    ``hosts``/``hostfile`` naming other hosts start the workers there, as ``mldist run -H`` does; the
    function then travels through a directory in the current one, which the hosts must share.
    ``min_np``/``max_np`` (with other hosts) make the world elastic, as ``mldist run --min-np``: a lost
    host re-forms it on the rest, and the results are those of the world that finished (its size may
    differ from ``np``). ``slots`` is the slots of a host named without them. Other horovodrun settings
    (ssh, start timeout, output file, ...) are accepted and have no effect.
    """
    from ...launch.config import ElasticConfig
    from ...launch.hosts import parse_hosts, read_hostfile, this_host
    from ...launch.local import RunConfig
    from ...launch.local import run as launch

    if not isinstance(np, int) or np < 1:
        raise ConfigError(f"horovod.run(np={np!r}): give a number of workers >= 1")
    if hosts and slots:  # horovodrun's --slots: for hosts named without theirs
        hosts = ",".join(item if ":" in item else f"{item}:{slots}" for item in hosts.split(","))
    listed = read_hostfile(hostfile) if hostfile else parse_hosts(hosts, "hosts=") if hosts else ()
    remote = () if all(h in this_host() for h, _ in listed) else listed
    elastic = None
    if min_np is not None or max_np is not None:
        if not remote:
            raise UnsupportedError(
                "horovod.run(min_np=, max_np=): an elastic world needs other hosts to lose; give hosts= or hostfile="
            )
        most = sum(n for _, n in remote)
        elastic = ElasticConfig(min_np=min_np or np, max_np=max_np or max(most, np), reset_limit=reset_limit)
    engine = "ring" if use_gloo else "mpi" if use_mpi else "auto"
    # Other hosts read the task and write their results: a directory they share (the current one).
    with tempfile.TemporaryDirectory(prefix=".mldist-horovod-run-", dir=os.getcwd() if remote else None) as tmp:
        (Path(tmp) / _TASK).write_bytes(pickler().dumps((func, tuple(args), dict(kwargs or {}))))
        from ..alias import installed

        # A caller that imports horovod through the alias has functions that do too.
        command = (sys.executable, "-m", __name__, tmp, *(["--alias"] if installed() else []))
        cfg = RunConfig(np, command, communication=engine, verbose=bool(verbose), hosts=remote,
                        network_interface=network_interface if remote else None, elastic=elastic)  # fmt: skip
        code = launch(cfg)
        if code:
            raise LaunchError(f"horovod.run: the workers failed (exit code {code}); their output above names why")
        return _results(Path(tmp))


def _results(directory: Path) -> list[Any]:
    """The results of the last world that ran (``result-<round>-<rank>.pkl``), in rank order."""
    found = [p.name.split("-")[1:] for p in directory.glob("result-*-*.pkl")]
    last = max(int(round_) for round_, _ in found)
    ranks = sorted(int(rank[: -len(".pkl")]) for round_, rank in found if int(round_) == last)
    return [pickle.loads((directory / _RESULT.format(round=last, rank=r)).read_bytes()) for r in ranks]


def _worker(directory: str, alias: bool) -> None:
    """In each worker: call the task, leave this rank's pickled result."""
    if alias:
        from ..alias import install

        install()
    func, args, kwargs = pickle.loads((Path(directory) / _TASK).read_bytes())
    result = func(*args, **kwargs)
    rank = envvalues.RANK.read(os.environ)
    if rank is None:
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    round_ = envvalues.RESTART.read(os.environ)  # an elastic world's rounds number their results
    (Path(directory) / _RESULT.format(round=round_, rank=rank)).write_bytes(pickler().dumps(result))
