"""Sharding ``tf.data`` (or numpy) input so every rank runs the same number of steps.

Uneven shards hang collectives: the rank with one batch more waits forever
for the others. The helpers here shard by file when there are at least as
many files as workers, else by element (never tf.data's AUTO policy, which
errors with fewer files than workers), drop the remainder, and cut every
rank to the smallest shard's number of full batches.

The datasets are resumable: a checkpoint that restores their position makes
the next epoch start at the exact batch where training stopped (``Stream``).

Example::

    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = mldist.data.shard(ds, batch_size=64, shuffle_buffer=10_000)
    model.fit(ds, epochs=5)   # mldist.data.shard((x, y), 64) does the same from the arrays
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import runtime
from ..errors import ConfigError
from ..runtime import allreduce


def equal_steps(counts: Sequence[int], batch_size: int) -> int:
    """Full batches every rank can run, given each rank's element count.

    Example:
        >>> equal_steps([101, 100], 10)
        10
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be at least 1")
    return min(counts) // batch_size


def _local_count(ds: Any) -> int:
    import tensorflow as tf

    n = int(ds.cardinality())
    if n >= 0:
        return n
    if n == int(tf.data.INFINITE_CARDINALITY):
        raise ConfigError("the dataset is infinite (.repeat()): shard before repeating; fit repeats")
    # Unknown size (e.g. after filter or reading files): one counting pass.
    return int(ds.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))


class Stream:
    """Where a sharded dataset stands, in batches since the first epoch.

    Every dataset made by :func:`shard` or :func:`shard_files` registers one.
    Each new iterator (one per epoch in ``fit``) starts at ``position`` and
    advances it by one epoch. ``mldist.keras.Checkpoint`` counts the batches
    trained on exactly, saves that count, and sets ``position`` back to it on
    resume, so a resumed run skips exactly the batches already trained on.

    Args:
        steps: batches per epoch (the same on every rank).
    """

    def __init__(self, steps: int) -> None:
        import tensorflow as tf

        self.steps = steps
        with tf.init_scope():
            self.position = tf.Variable(0, dtype=tf.int64, trainable=False, name="mldist_data_position")


#: Streams in creation order; a script makes them in the same order on every run.
STREAMS: list[Stream] = []


def _shuffled(ds: Any, window: int, seed: Any) -> Any:
    """``ds`` with each run of ``window`` elements permuted by a stateless RNG.

    A pure function of ``seed`` (a (seed, rank)/epoch pair), so any epoch
    can be replayed on its own. ``Dataset.shuffle`` cannot take a seed that
    is a tensor when a global seed of 0 is set (TensorFlow compares it with
    Python ``==``), and its order then depends on that global seed too.
    With ``window`` at least the shard size this is a full permutation.
    """
    import tensorflow as tf

    def permute(i: Any, block: Any) -> Any:
        n = tf.shape(tf.nest.flatten(block)[0])[0]
        window_seed = tf.random.experimental.stateless_fold_in(seed, i)
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=window_seed)
        return tf.nest.map_structure(lambda t: tf.gather(t, order), block)

    return ds.batch(window).enumerate().map(permute).unbatch()


def _resumable(base: Any, steps: int, batch_size: int, shuffle_buffer: int, seed: int, rank: int) -> Any:
    import tensorflow as tf

    stream = Stream(steps)
    pos = stream.position

    def epoch_batches(epoch: Any) -> Any:
        d = base
        if shuffle_buffer:
            d = _shuffled(d, shuffle_buffer, tf.stack([tf.constant(seed * 1_000_003 + rank, tf.int64), epoch]))
        return d.batch(batch_size, drop_remainder=True)

    def from_position(_: Any) -> Any:
        # Runs when an epoch's iterator starts: begin at the position, claim one epoch.
        g = pos.assign_add(steps) - steps
        batches = tf.data.Dataset.range(g // steps, 1 << 40).flat_map(epoch_batches)
        return batches.skip(g % steps).prefetch(tf.data.AUTOTUNE)

    ds = tf.data.Dataset.range(1).flat_map(from_position).take(steps)
    STREAMS.append(stream)
    return ds.apply(tf.data.experimental.assert_cardinality(steps))


def _finish(ds: Any, batch_size: int, shuffle_buffer: int, seed: int) -> Any:
    import tensorflow as tf

    ctx = runtime.init()
    local = _local_count(ds)
    smallest = int(allreduce(tf.constant(local, tf.int64), op="min"))
    steps = equal_steps([smallest], batch_size)
    if steps == 0:
        raise ConfigError(
            f"rank {ctx.rank}: a shard of {smallest} examples gives no full batch of {batch_size}; "
            "lower batch_size or use fewer workers"
        )
    ds = _resumable(ds.take(steps * batch_size), steps, batch_size, shuffle_buffer, seed, ctx.rank)
    options = tf.data.Options()
    # Already sharded: a strategy must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


#: What :func:`shard` takes, for its error messages.
TAKES = (
    "a tf.data.Dataset or numpy arrays (an array, or a tuple or dict of arrays, "
    "as tf.data.Dataset.from_tensor_slices takes)"
)


def _leaves(data: Any, path: str = "") -> list[tuple[str, Any]]:
    """(where, array) of every array in numpy ``data``; ConfigError naming the first thing that is not one."""
    import numpy as np

    if isinstance(data, np.ndarray):
        if data.ndim == 0:
            raise ConfigError(
                f"shard got a 0-dimensional array{path} (one value, no elements to shard); "
                "give arrays with one row per example"
            )
        return [(path, data)]
    if isinstance(data, tuple) and data:
        return [leaf for i, item in enumerate(data) for leaf in _leaves(item, f"{path}[{i}]")]
    if isinstance(data, dict) and data:
        return [leaf for key, item in data.items() for leaf in _leaves(item, f"{path}[{key!r}]")]
    where = f" at {path}" if path else ""
    hint = " (a list: give a tuple of arrays, or np.asarray(...) it)" if isinstance(data, list) else ""
    raise ConfigError(f"shard takes {TAKES}; got {_type_name(data)}{where}{hint}")


def numpy_part(data: Any, rank: int, size: int) -> Any:
    """Rank ``rank``'s elements of numpy ``data`` among ``size``: every ``size``-th row from row ``rank``.

    The same rows ``tf.data.Dataset.shard(size, rank)`` keeps, taken before the data becomes a
    dataset, so each rank copies only its part into TensorFlow.

    Args:
        data: an array, or a tuple or dict of arrays (nested as you like) with the same number of rows.
        rank, size: this rank and the number of ranks.

    Example:
        >>> import numpy as np
        >>> numpy_part((np.arange(5), np.arange(5) * 10), 1, 2)
        (array([1, 3]), array([10, 30]))
    """
    rows = {len(array) for _, array in _leaves(data)}
    if len(rows) > 1:
        counts = ", ".join(f"{where or 'the array'}: {len(array)}" for where, array in _leaves(data))
        raise ConfigError(f"shard got arrays of different lengths ({counts}); give one row per example in each")
    if isinstance(data, tuple):
        return tuple(numpy_part(item, rank, size) for item in data)
    if isinstance(data, dict):
        return {key: numpy_part(item, rank, size) for key, item in data.items()}
    return data[rank::size]


def shard(dataset: Any, batch_size: int, *, shuffle_buffer: int = 0, seed: int = 0) -> Any:
    """This rank's part of ``dataset`` by element, batched, equal steps on every rank.

    Args:
        dataset: un-batched ``tf.data.Dataset`` (same order on every rank), or numpy arrays:
            an array, or a tuple or dict of arrays (what ``tf.data.Dataset.from_tensor_slices`` takes).
        batch_size: per-worker batch size.
        shuffle_buffer: permute this rank's shard each epoch in windows of this many
            elements (0: no; at least the shard size: a full shuffle).
        seed: shuffle seed; each (seed, rank, epoch) has its own fixed order, so a
            resumed run replays the same batches.

    Example::

        ds = mldist.data.shard(tf.data.Dataset.from_tensor_slices((x, y)), 64)
        ds = mldist.data.shard((x, y), 64)  # the same from numpy arrays
    """
    import tensorflow as tf

    ctx = runtime.init()
    if not isinstance(dataset, tf.data.Dataset):
        part = numpy_part(dataset, ctx.rank, ctx.size)
        return _finish(tf.data.Dataset.from_tensor_slices(part), batch_size, shuffle_buffer, seed)
    ds = dataset.shard(ctx.size, ctx.rank) if ctx.size > 1 else dataset
    return _finish(ds, batch_size, shuffle_buffer, seed)


def shard_files(
    files: Sequence[str],
    reader: Callable[[Any], Any],
    batch_size: int,
    *,
    shuffle_buffer: int = 0,
    seed: int = 0,
) -> Any:
    """Read ``files`` with ``reader`` and shard by file (or by element if too few files).

    Args:
        files: every rank's full, identically ordered list of file names (not a pattern).
        reader: maps a file name tensor to a dataset (e.g. ``tf.data.TFRecordDataset``).
        batch_size: per-worker batch size.
        shuffle_buffer: permute this rank's examples each epoch in windows of this size (0: no).
        seed: shuffle seed (each rank adds its rank).

    Example::

        ds = mldist.data.shard_files(sorted(glob("data/*.tfrecord")), tf.data.TFRecordDataset, 64)
    """
    import tensorflow as tf

    if isinstance(files, str | bytes | os.PathLike) or not isinstance(files, Iterable):
        # A string is iterable too: each of its characters would be read as a file name.
        given = repr(files) if isinstance(files, str | bytes) else _type_name(files)
        raise ConfigError(
            f"shard_files takes a list of file names, got {given}; for a pattern give sorted(glob.glob(pattern))"
        )
    names = [os.fspath(f) if isinstance(f, os.PathLike) else f for f in files]  # pathlib's glob gives Paths
    if not names:
        raise ConfigError("shard_files got no files; check the glob pattern or the data directory")
    ctx = runtime.init()
    by_file = len(names) >= ctx.size
    mine = names[ctx.rank :: ctx.size] if by_file else names
    ds = tf.data.Dataset.from_tensor_slices(mine).interleave(reader, cycle_length=1)
    if not by_file and ctx.size > 1:
        ds = ds.shard(ctx.size, ctx.rank)
    return _finish(ds, batch_size, shuffle_buffer, seed)
