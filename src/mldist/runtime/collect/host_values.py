"""What a collective on numpy gives back: the caller's own types, without TensorFlow or JAX.

``mldist.allreduce``, ``broadcast`` and ``allgather`` take numpy arrays and Python numbers too, alone or
in lists, tuples (named ones included) and dicts. On an engine with host collectives (the MPI engine,
one process, JAX's) they come back as they went in: a numpy array as an array, a numpy scalar as one,
a Python number as a Python number. Anything else (a tensor, a Keras variable, a string) is not a host
value: the collective runs in TensorFlow as before.

Example:
    >>> arrays, rebuild = split({"n": 3, "w": [np.ones(2)]})
    >>> rebuild([a * 2 for a in arrays])
    {'n': 6, 'w': [array([2., 2.])]}
    >>> split("text") is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["NUMBERS", "split"]

#: Python numbers a collective takes (bool is an int).
NUMBERS = (int, float, complex)
#: numpy dtype kinds MPI and JAX's host collectives reduce: bool, signed, unsigned, float, complex.
_KINDS = "biufc"

Rebuild = Callable[[Iterator[np.ndarray[Any, Any]]], Any]


def _leaf(value: Any, out: list[np.ndarray[Any, Any]]) -> Rebuild | None:
    if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in _KINDS:
        out.append(np.asarray(value))
        return (lambda it: next(it)) if isinstance(value, np.ndarray) else (lambda it: next(it)[()])
    if isinstance(value, NUMBERS):
        out.append(np.asarray(value))
        return lambda it: next(it).item()
    return None


def _walk(value: Any, out: list[np.ndarray[Any, Any]]) -> Rebuild | None:
    """How to put ``value`` back together from its arrays (appended to ``out``), or None if it is not host values."""
    if isinstance(value, dict):  # keys in sorted order on every rank, as tf.nest and jax.tree_util take them
        keys = sorted(value)
        parts = [_walk(value[k], out) for k in keys]
        if any(p is None for p in parts):
            return None
        return lambda it: _in_order(value, {k: p(it) for k, p in zip(keys, parts, strict=True)})  # type: ignore[misc]
    if isinstance(value, list | tuple):
        items = [_walk(v, out) for v in value]
        if any(p is None for p in items):
            return None
        if hasattr(value, "_fields"):  # a named tuple
            return lambda it: type(value)(*(p(it) for p in items))  # type: ignore[misc]
        return lambda it: type(value)(p(it) for p in items)  # type: ignore[misc]
    return _leaf(value, out)


def _in_order(original: dict[Any, Any], done: dict[Any, Any]) -> dict[Any, Any]:
    return {k: done[k] for k in original}


def split(values: Any) -> tuple[list[np.ndarray[Any, Any]], Callable[[list[np.ndarray[Any, Any]]], Any]] | None:
    """``values``' arrays and how to rebuild them in the caller's types; None unless every leaf is numpy or a number.

    Args:
        values: a numpy array, numpy scalar or Python number, or a list/tuple/dict of them.
    """
    arrays: list[np.ndarray[Any, Any]] = []
    rebuild = _walk(values, arrays)
    if rebuild is None:
        return None
    return arrays, lambda results: rebuild(iter(results))
