"""The MPI engine's progress thread: every collective of this rank, one at a time, in the order TensorFlow starts them.

Each collective of :mod:`mldist.runtime.engines.mpi_engine` is a start op, which queues its buffers here and
returns at once, and a finish op, which takes the result: a bucket's all-reduce runs while backprop
computes the next bucket's gradients, and no TensorFlow thread waits in MPI meanwhile.

Example::

    job = PROGRESS.start_with(run, buffer)   # in the start op
    reduced = PROGRESS.finish(job)           # in the finish op
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported when the thread starts: concurrent.futures brings logging, unused by most jobs
    import queue
    from concurrent.futures import Future


class Progress:
    """The thread that issues this rank's MPI collectives, one at a time, in the order TensorFlow starts them.

    A collective is two ops: a start op hands its buffers to this thread and returns at once, a finish
    op later takes the result. So the all-reduce of the last layers' gradients moves while backprop
    still computes the first layers', and no TensorFlow thread waits in MPI meanwhile (with the one
    inter-op thread of a small worker, a blocking MPI call inside the op would stop the step). mpi4py
    releases the GIL in MPI calls. One thread keeps every collective of this rank in one order, the
    order TensorFlow runs the start ops (chained: stateful ops run in program order).
    """

    def __init__(self) -> None:
        self._jobs: dict[int, Future[list[np.ndarray[Any, Any]]]] = {}
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] | None = None
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None

    def start_with(self, run: Callable[..., list[np.ndarray[Any, Any]]], *arrays: Any) -> np.ndarray[Any, Any]:
        """Queue ``run(*arrays)``; the job's number for :meth:`finish`."""
        import queue
        from concurrent.futures import Future

        if self._queue is None or self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._serve, args=(self._queue,), name="mldist-mpi", daemon=True)
            self._thread.start()
        job = next(self._ids)
        future: Future[list[np.ndarray[Any, Any]]] = Future()
        self._jobs[job] = future
        self._queue.put((future, run, arrays))
        return np.array(job, np.int64)

    def finish(self, job: Any) -> list[np.ndarray[Any, Any]]:
        """The result of job ``job`` once it is done (its error raised here, in the caller's op)."""
        return self._jobs.pop(int(job)).result()

    def _serve(self, jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]) -> None:
        while True:
            future, run, arrays = jobs.get()
            try:
                future.set_result(run(*arrays))
            except BaseException as exc:  # raised again where the result is taken (the finish op)
                future.set_exception(exc)
            del future, run, arrays  # hold no buffer while idle


#: This process's progress thread (started by its first collective).
PROGRESS = Progress()
