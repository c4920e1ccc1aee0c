"""The small helpers of ``horovod.tensorflow.util`` that scripts and Horovod's own tests import.

Example::

    from mldist.horovod.tensorflow.util import _executing_eagerly
    _executing_eagerly()          # True outside tf.function
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: TensorFlow 2 always has eager execution.
_has_eager = True


def _executing_eagerly() -> bool:
    """Whether this code runs eagerly (False while a ``tf.function`` or a v1 graph is built)."""
    import tensorflow as tf

    return bool(tf.executing_eagerly())


def _make_subgraph(fn: Callable[..., Any]) -> Any:
    """``fn`` as one ``tf.function`` (eager callers then run it as a graph)."""
    import tensorflow as tf

    return tf.function(fn)


def _cache(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` memoised on its (hashable) arguments and on whether the caller runs eagerly."""
    results: dict[tuple[Any, ...], Any] = {}

    def cached(*args: Any) -> Any:
        key = (args, _executing_eagerly())
        if key not in results:
            results[key] = fn(*args)
        return results[key]

    return cached


def vars_to_refs(variables: Any) -> Any:
    """Hashable references of (nested lists of) variables: tuples of ``v.ref()``."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs: Any) -> Any:
    """The variables behind :func:`vars_to_refs`' references, as lists."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
