"""The stall watch on JAX: a rank waiting in any computation across processes counts as in a collective.

Keras builds its model, evaluates, restores checkpoints and runs a user's jitted functions as XLA
computations over every process's devices; a rank that never arrives leaves the others waiting
inside JAX, where mldist marks nothing (``fit``'s steps are marked: ``mldist.keras.StallWatch``).
So the stall watch (:mod:`mldist.runtime.watch.stall`) reads the main thread's frames about twice a
second (:class:`Waits`): inside JAX's executable call, ``np.asarray`` of an array or
``jax.block_until_ready`` on devices of other processes, or calling a jitted function over such
arrays (JAX's C++ fast path: the caller's line says what it calls), it is in a collective since
the first sample that saw that call. Then the ranks that never reached it are named. No mark
from the user, and nothing on the hot path.

Example::

    stall.sample_with(Waits())   # the JAX engine's start does
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from .frames import calling

#: How many frames out from the main thread's innermost one JAX's own waits are looked for.
WAIT_DEPTH = 40


@functools.cache
def _waits() -> dict[CodeType, str]:
    """JAX's Python functions in which a thread waits for a computation: code -> the local that says on what.

    Its executable's call (the first call of a jitted function, every call where JAX's C++ fast
    path does not apply), ``np.asarray`` of an array and ``jax.block_until_ready``.
    """
    from jax._src import api, array
    from jax._src.interpreters import pxla

    return {
        inspect.unwrap(pxla.ExecuteReplicated.__call__).__code__: "self",
        inspect.unwrap(array.ArrayImpl._value.fget).__code__: "self",  # type: ignore[attr-defined]
        inspect.unwrap(api.block_until_ready).__code__: "x",
    }


def spans(value: Any) -> bool:
    """Whether ``value`` (JAX's executable, or a pytree of arrays) holds devices of other processes."""
    import jax

    handler = getattr(value, "in_handler", None)
    if handler is not None and hasattr(value, "out_handler"):
        shardings = [*handler.in_shardings, *value.out_handler.out_shardings]
        return any(getattr(s, "is_fully_addressable", True) is False for s in shardings)
    leaves = jax.tree_util.tree_leaves(value)
    return any(isinstance(leaf, jax.Array) and leaf.is_fully_addressable is False for leaf in leaves)


def computing(frame: FrameType | None) -> tuple[str, object] | None:
    """What JAX computation across processes the thread of ``frame`` (its innermost) waits in, or None.

    Returns (what, a token equal for the same call only: the frame held, where in it, and its
    locals, which change from one call to the next).

    A call through JAX's C++ fast path has no Python frame: the caller's line says what it calls
    (:func:`mldist.runtime.watch.frames.calling`) and its arguments' arrays whether other processes take part.
    """
    if frame is None:
        return None
    here: FrameType | None = frame
    for _ in range(WAIT_DEPTH):
        if here is None:
            break
        local = _waits().get(here.f_code)
        if local is not None:
            value = here.f_locals.get(local)
            if value is None or not spans(value):
                return None  # a wait on this process's devices only
            name = getattr(value, "name", None)
            what = f"JAX computation {name}" if isinstance(name, str) else "a wait for a JAX array"
            return f"{what} across processes", _token(here)
        here = here.f_back
    call = calling(frame)
    if call is None or type(call[0]).__name__ != "PjitFunction" or not any(spans(a) for a in call[1]):
        return None
    return f"JAX computation {getattr(call[0], '__name__', 'jit')} across processes", _token(frame)


def _token(frame: FrameType) -> object:
    """The same call of ``frame``'s: the frame (held, so that no later one takes its address), the
    instruction, and which objects its locals hold (a loop's next call has a new batch, a new result)."""
    return (frame, frame.f_lasti, tuple(map(id, frame.f_locals.values())))


class Waits:
    """The JAX computation across processes the main thread waits in, and since when (the stall watch's sampler).

    Args:
        find: what a frame waits in (see :func:`computing`; tests pass another).

    Example:
        >>> import sys
        >>> waits = Waits(lambda frame: ("JAX computation step across processes", 1))
        >>> waits(sys._getframe(), 5.0, 105.0), waits(sys._getframe(), 6.0, 106.0)[1:], waits(None, 7.0, 107.0)
        (('JAX computation step across processes', 5.0, 105.0), (5.0, 105.0), None)
    """

    def __init__(self, find: Callable[[Any], tuple[str, object] | None] | None = None) -> None:
        self.find = computing if find is None else find
        self._held: tuple[str, object, float, float] | None = None  # (what, token, since, since on the wall)

    def __call__(self, frame: FrameType | None, now: float, wall: float) -> tuple[str, float, float] | None:
        """(what, since, since on the wall) of the wait ``frame`` is in, from the first sample of its call; or None.

        ``frame`` None: not read this time (a mark covers it); the frame held is let go.
        """
        seen = self.find(frame) if frame is not None else None
        if seen is None:
            self._held = None  # no frame held past its call
            return None
        held = self._held
        if held is None or held[1] != seen[1]:
            held = self._held = (seen[0], seen[1], now, wall)
        return held[0], held[2], held[3]
