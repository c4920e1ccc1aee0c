"""``horovod.tensorflow.util``'s path (see :mod:`mldist.horovod.util`)."""

from ..util import _cache, _executing_eagerly, _has_eager, _make_subgraph, refs_to_vars, vars_to_refs

__all__ = ["_cache", "_executing_eagerly", "_has_eager", "_make_subgraph", "refs_to_vars", "vars_to_refs"]
