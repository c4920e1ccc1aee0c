"""Worker: every mldist.horovod function against numpy, on each rank. Usage: hvd_api.py MODE [GRAPH_DTYPES].

MODE "collectives": each collective in eager mode and inside one tf.function, over
float16/float32/float64/int32/int64, with values that differ per rank; the expected
result is computed here with numpy from every rank's (known) input. GRAPH_DTYPES
(comma-separated) limits the tf.function checks to those dtypes. Prints
"CHECKED name" per passed check and RESULT {rank, size, checks} at the end.
MODE "refusals": one process; each refused feature must raise UnsupportedError with a
one-line message (printed as REFUSED name: message).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import mldist.horovod as hvd

DTYPES = ("float16", "float32", "float64", "int32", "int64")
MODE = sys.argv[1]
GRAPH_DTYPES = sys.argv[2].split(",") if len(sys.argv) > 2 else DTYPES
checks: list[str] = []


def same(name: str, got: Any, want: Any, tol: float = 0.0) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    ok = np.allclose(got, want, rtol=tol, atol=tol) if tol else np.array_equal(got, want)
    assert ok, f"{name}: {got.tolist()} != {want.tolist()}"
    checks.append(name)
    print("CHECKED", name, flush=True)


def refusals() -> None:
    import tensorflow as tf

    from mldist.errors import UnsupportedError

    hvd.init()
    cases: dict[str, Callable[[], Any]] = {
        "v1_optimizer": lambda: hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)),
        "global_variables": lambda: hvd.broadcast_global_variables(0),
        "init_sub_world": lambda: hvd.init(comm=[0, 1, 2]),
    }
    for name, call in cases.items():
        try:
            call()
        except UnsupportedError as exc:
            assert "\n" not in str(exc), str(exc)
            print(f"REFUSED {name}: {exc}", flush=True)
        else:
            raise AssertionError(f"{name} was not refused")
    paths_and_one_process(tf)
    hvd.shutdown()
    try:
        hvd.rank()
    except ValueError as exc:  # Horovod's type: old handlers keep working
        print(f"REFUSED not_initialized: {exc}", flush=True)


def paths_and_one_process(tf: Any) -> None:
    """Horovod's module paths lead to the same objects; one process reduces to itself."""
    import importlib

    from mldist.horovod import alias

    names = ["tensorflow", "keras", "tensorflow.keras", "keras.callbacks", "tensorflow.keras.callbacks"]
    mods = {n: importlib.import_module(f"mldist.horovod.{n}") for n in names}
    assert mods["tensorflow"].allreduce is hvd.allreduce
    assert mods["tensorflow.keras"].DistributedOptimizer is mods["keras"].DistributedOptimizer
    warm = mods["keras.callbacks"].LearningRateWarmupCallback
    assert mods["tensorflow.keras.callbacks"].LearningRateWarmupCallback is warm
    alias.install()
    import horovod.tensorflow.keras as aliased  # type: ignore[import-not-found]

    assert aliased is mods["tensorflow.keras"]
    try:
        import horovod.torch  # type: ignore[import-not-found]  # noqa: F401
    except NotImplementedError as exc:
        print(f"REFUSED horovod_torch: {exc}", flush=True)
    x = tf.constant([[1.0, 2.0]])
    assert np.array_equal(hvd.allreduce(x), x) and np.array_equal(hvd.allgather(x), x)
    assert np.array_equal(hvd.alltoall(x), x) and hvd.broadcast_object("o") == "o"
    assert (hvd.size(), hvd.cross_size(), hvd.mpi_enabled(), hvd.gloo_built()) == (1, 1, False, False)
    print("PATHS-OK", flush=True)


def data(rank: int, dtype: str, rows: int = 3) -> np.ndarray[Any, Any]:
    return ((np.arange(rows * 2).reshape(rows, 2) % 5) + rank + 1).astype(dtype)


def collectives(tf: Any, run: Callable[..., Any], mode: str, dtype: str) -> None:
    """One dtype: every reduction, gather, broadcast and all-to-all, checked against numpy."""
    r, n = hvd.rank(), hvd.size()
    every = [data(k, dtype) for k in range(n)]
    mine = tf.constant(every[r])
    tol = 1e-2 if dtype == "float16" else 1e-6
    tag = f"{dtype}-{mode}"
    total = np.sum(np.stack(every), axis=0, dtype=dtype)
    same(f"allreduce-sum-{tag}", run(lambda: hvd.allreduce(mine, op=hvd.Sum)), total, tol)
    same(f"allreduce-average-false-{tag}", run(lambda: hvd.allreduce(mine, average=False)), total, tol)
    mean = total / np.asarray(n, dtype) if dtype.startswith("float") else total / n  # ints: true division
    same(f"allreduce-average-{tag}", run(lambda: hvd.allreduce(mine)), mean, tol)
    same(f"allreduce-min-{tag}", run(lambda: hvd.allreduce(mine, op=hvd.Min)), np.min(every, axis=0))
    same(f"allreduce-max-{tag}", run(lambda: hvd.allreduce(mine, op=hvd.Max)), np.max(every, axis=0))
    product = np.prod(every, axis=0, dtype=dtype)
    same(f"allreduce-product-{tag}", run(lambda: hvd.allreduce(mine, op=hvd.Product)), product, tol)
    scaled = run(lambda: hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5))
    same(f"allreduce-scaled-{tag}", scaled, total, tol)
    pair = run(lambda: hvd.grouped_allreduce([mine, mine[:1]], op=hvd.Sum))
    same(f"grouped-allreduce-{tag}", pair[1], total[:1], tol)
    ragged = [data(k, dtype, rows=k + 1) for k in range(n)]  # the first dimension differs per rank
    same(f"allgather-{tag}", run(lambda: hvd.allgather(tf.constant(ragged[r]))), np.concatenate(ragged))
    both = run(lambda: hvd.grouped_allgather([mine, tf.constant(ragged[r])]))
    same(f"grouped-allgather-{tag}", both[0], np.concatenate(every))
    same(f"broadcast-{tag}", run(lambda: hvd.broadcast(mine, root_rank=n - 1)), every[n - 1])

    # alltoall: rank k sends (k + d) % 2 + 1 rows to rank d, numbered so the receiver can tell them apart.
    def rows_from(k: int) -> np.ndarray[Any, Any]:
        return np.arange(sum((k + d) % 2 + 1 for d in range(n)) * 2).reshape(-1, 2).astype(dtype) + 10 * k

    def sent(k: int, d: int) -> np.ndarray[Any, Any]:
        start = sum((k + e) % 2 + 1 for e in range(d))
        return rows_from(k)[start : start + (k + d) % 2 + 1]

    splits = [(r + d) % 2 + 1 for d in range(n)]
    got, counts = run(lambda: hvd.alltoall(tf.constant(rows_from(r)), splits=splits))
    same(f"alltoall-{tag}", got, np.concatenate([sent(k, r) for k in range(n)]))
    same(f"alltoall-splits-{tag}", counts, np.array([(k + r) % 2 + 1 for k in range(n)], np.int32))
    share = [len(a) for a in np.array_split(np.arange(3), n)]  # lower ranks take one more row
    start = sum(share[:r])
    scattered = run(lambda: hvd.reducescatter(mine, op=hvd.Sum))
    same(f"reducescatter-{tag}", scattered, total[start : start + share[r]], tol)


def variables_and_objects(tf: Any) -> None:
    r, n = hvd.rank(), hvd.size()
    v = [tf.Variable(np.full([2], r, np.float32)), tf.Variable(r, dtype=tf.int64)]
    hvd.broadcast_variables(v, root_rank=n - 1)
    same("broadcast-variables", v[0].numpy(), np.full([2], n - 1, np.float32))
    same("broadcast-variables-int64", v[1].numpy(), np.int64(n - 1))
    v[0].assign(np.full([2], r + 5, np.float32))
    hvd.broadcast_(v, root_rank=0)
    same("broadcast-inplace", v[0].numpy(), np.full([2], 5, np.float32))
    got = hvd.broadcast_object({"from": r, "payload": list(range(r + 3))}, root_rank=n - 1)
    assert got == {"from": n - 1, "payload": list(range(n + 2))}, got
    checks.append("broadcast-object")
    fn = hvd.broadcast_object_fn(root_rank=0)
    assert fn(f"rank {r}") == "rank 0"
    checks.append("broadcast-object-fn")
    assert hvd.allgather_object(("r", r)) == [("r", k) for k in range(n)]
    checks.append("allgather-object")
    hvd.barrier()
    last = int(hvd.join().numpy())
    assert 0 <= last < n
    checks.append("join")
    ops = [int(x.numpy()) for x in (hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op())]
    assert ops == [n, r, hvd.local_size(), hvd.local_rank()], ops
    checks.append("size-rank-ops")


def gradients_and_sparse(tf: Any) -> None:
    r, n = hvd.rank(), hvd.size()
    x = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.allreduce(x * (r + 1), op=hvd.Sum))
    same("allreduce-gradient", tape.gradient(y, x).numpy(), np.full([2], n * (r + 1), np.float32))
    with tf.GradientTape() as tape:
        z = tf.reduce_sum(hvd.allgather(x[None] * (r + 1)))
    same("allgather-gradient", tape.gradient(z, x).numpy(), np.full([2], r + 1, np.float32))  # averaged
    sl = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r]), tf.constant([n, 2]))
    out = hvd.allreduce(sl)
    same("sparse-average-values", out.values.numpy(), np.array([[k + 1] * 2 for k in range(n)], np.float32) / n)
    same("sparse-average-indices", out.indices.numpy(), np.arange(n, dtype=np.int32))
    half = hvd.allreduce(tf.constant([1.0, 3.0]) * (r + 1), compression=hvd.Compression.fp16)
    same("fp16-compression", half.numpy(), np.array([1.0, 3.0], np.float32) * (n + 1) / 2)
    brain = hvd.allreduce(tf.constant([1.0, 3.0]) * (r + 1), compression=hvd.Compression.bf16)
    same("bf16-compression", brain.numpy(), np.array([1.0, 3.0], np.float32) * (n + 1) / 2)
    w = tf.Variable(tf.ones([2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(r + 1))
    tape = hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0)
    same("tape-predivide", tape.gradient(loss, w).numpy(), np.full([2], (n + 1) / 2, np.float32))
    with tf.GradientTape() as tape2:
        loss = tf.reduce_sum(w * float(r + 1))
    summed = hvd.DistributedGradientTape(tape2, op=hvd.Sum).gradient(loss, [w])[0]
    same("tape-sum", summed.numpy(), np.full([2], n * (n + 1) / 2, np.float32))


def main() -> None:
    if MODE == "refusals":
        refusals()
        return
    hvd.init()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # graph mode below makes a tf.function per check, on purpose
    eager = lambda f: f()  # noqa: E731
    graph = lambda f: tf.function(f)()  # noqa: E731
    for dtype in DTYPES:
        collectives(tf, eager, "eager", dtype)
        if dtype in GRAPH_DTYPES:
            collectives(tf, graph, "graph", dtype)
    variables_and_objects(tf)
    gradients_and_sparse(tf)
    info = [hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous(), hvd.mpi_enabled()]
    print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "checks": checks, "info": info}), flush=True)


main()
