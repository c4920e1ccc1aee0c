"""One rank of ``mldist bench``: time a training step on random data, print ``BENCH {json}``.

``mldist.init()``, then a model of :data:`mldist.tools.bench.MODELS` on random data made
once (different per rank), a ``tf.function`` step whose gradients go through
``mldist.DistributedGradientTape`` (the engine ``init`` chose: MPI, RING or NCCL),
variables broadcast from rank 0 after the first step, ``warmup`` untimed steps, then
``iters`` timed iterations of ``batches_per_iter`` steps. Every rank prints one line
``BENCH {"rank", "size", "engine", "model", "batch", "image_size", "rates", "img_per_sec"}``
(``rates``: images per second of each iteration).

Example::

    mldist run -n 2 -- python -m mldist.tools.bench_worker --model cnn --iters 3
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import runtime
from ..base import envvalues
from ..base.rundir import METRICS_FILE, write_json
from .bench import MODELS, BenchConfig, make_row


def build_model(name: str, image_size: int) -> tuple[Any, tuple[int, int, int], int]:
    """A fresh Keras model, its input shape and its number of classes.

    Args:
        name: "cnn" (a small convolutional network, 10 classes) or a key of ``MODELS``
            (a ``keras.applications`` model with ``weights=None``, 1000 classes).
        image_size: side of the square input images.

    Example::

        model, shape, classes = build_model("mobilenetv2", 64)
    """
    import keras

    if name != "cnn":
        shape3 = (image_size, image_size, 3)
        app = getattr(keras.applications, MODELS[name][0])
        return app(weights=None, input_shape=shape3, classes=1000), shape3, 1000
    shape = (image_size, image_size, 3)
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input(shape),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10, activation="softmax"),
        ]
    )
    return model, shape, 10


def _threads(tf: Any, intra_op: int | None, inter_op: int | None) -> None:
    """Override the thread pools ``init`` planned (``--tune-threads``); init has run no op yet."""
    if intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    if inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def _step_function(tf: Any, model: Any, opt: Any, data: Any, target: Any) -> Any:
    import keras

    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    @tf.function  # type: ignore[untyped-decorator]
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        grads = runtime.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return step


def _profiled(step: Any) -> Any:
    """``step`` recorded by :class:`mldist.runtime.collect.profiling.StepProfiler` when ``MLDIST_PROFILE_STEPS`` is set.

    Steps count every call from 0: the first (building) step and the warm-up included.
    """
    from ..runtime.collect.profiling import StepProfiler

    profiler = StepProfiler.from_env()
    if profiler is None:
        return step
    calls = [0]

    def run() -> Any:
        profiler.begin(calls[0])
        loss = step()
        profiler.end(calls[0])
        calls[0] += 1
        return loss

    return run


def _broadcast_from_root(variables: Sequence[Any]) -> None:
    """Give every rank rank 0's values (as Horovod's benchmark does after the first step)."""
    values = runtime.broadcast([v.value for v in variables], root=0)
    for var, value in zip(variables, values, strict=True):
        var.assign(value)


def measure(cfg: BenchConfig, engine: str | None = None, threads: tuple[int, int] | None = None) -> dict[str, Any]:
    """Run the benchmark in this process (one rank of the job); this rank's result.

    Args:
        cfg: model, batch and step counts.
        engine: "auto", "mpi", "ring" or "nccl" for ``mldist.init`` (default: ``MLDIST_COMMUNICATION``).
        threads: (intra-op, inter-op) thread pool sizes instead of mldist's plan.

    Example::

        result = measure(BenchConfig(iters=3))   # {"rank": 0, "rates": [...], ...}
    """
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads[0])  # before init: its plan and OpenMP follow
    ctx = runtime.init(engine)
    if not ctx.decision.traits.runs_tensorflow:
        return _result(ctx, cfg, _jax_rates(ctx, cfg))
    import numpy as np
    import tensorflow as tf

    _threads(tf, *(threads or (None, None)))
    import keras

    model, shape, classes = build_model(cfg.model, cfg.image)
    opt = keras.optimizers.SGD(0.01)
    rng = np.random.default_rng(ctx.rank)
    data = tf.constant(rng.random((cfg.batch_size, *shape), dtype=np.float32))
    target = tf.constant(rng.integers(0, classes, cfg.batch_size), dtype=tf.int64)
    step = _profiled(_step_function(tf, model, opt, data, target))
    step()
    _broadcast_from_root([*model.variables, *opt.variables])
    for _ in range(cfg.warmup):
        step()
    rates = []
    for _ in range(cfg.iters):
        start = time.perf_counter()
        for _ in range(cfg.batches_per_iter):
            loss = step()
        float(loss)  # the last step has finished
        rates.append(cfg.batch_size * cfg.batches_per_iter / (time.perf_counter() - start))
    return _result(ctx, cfg, rates)


def _jax_rates(ctx: Any, cfg: BenchConfig) -> list[float]:
    """Images per second of each timed iteration on KERAS_BACKEND=jax: Keras's own compiled step.

    ``train_on_batch`` on this rank's part of the global batch; the DataParallel distribution
    ``mldist.init()`` set averages the gradients in the step. Its returned loss ends each step.
    """
    import keras
    import numpy as np

    if envvalues.PROFILE_STEPS.read(os.environ) and ctx.rank == 0:
        print("mldist bench: --profile-steps records TensorFlow's profiler; not on KERAS_BACKEND=jax", flush=True)
    model, shape, classes = build_model(cfg.model, cfg.image)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy())
    rng = np.random.default_rng(ctx.rank)
    data = rng.random((cfg.batch_size, *shape), dtype=np.float32)
    target = rng.integers(0, classes, cfg.batch_size)
    for _ in range(1 + cfg.warmup):  # the first call compiles
        model.train_on_batch(data, target)
    rates = []
    for _ in range(cfg.iters):
        start = time.perf_counter()
        for _ in range(cfg.batches_per_iter):
            model.train_on_batch(data, target)
        rates.append(cfg.batch_size * cfg.batches_per_iter / (time.perf_counter() - start))
    return rates


def _result(ctx: Any, cfg: BenchConfig, rates: list[float]) -> dict[str, Any]:
    import numpy as np

    return {
        "rank": ctx.rank,
        "backend": ctx.backend,
        "size": ctx.size,
        "engine": ctx.communication,
        "model": cfg.model,
        "batch": cfg.batch_size,
        "image_size": cfg.image,
        "rates": rates,
        "img_per_sec": float(np.mean(rates)),
    }


def job_row(
    cfg: BenchConfig, engine: str, backend: str | None = None, profile_steps: str | None = None
) -> dict[str, Any] | None:
    """Run as one rank of a job (srun, mpiexec, ``mldist run``); on rank 0 the job's row, else None.

    Args:
        cfg: what every rank runs.
        engine: the collective engine for ``mldist.init``.
        backend: this rank's ``KERAS_BACKEND`` (set before Keras is imported), or None as it is.
        profile_steps: "A:B" to record those steps (``MLDIST_PROFILE_STEPS`` for ``mldist.init``), or None.

    Example::

        row = job_row(BenchConfig(), "auto")   # under: srun -n 4 mldist bench
    """
    own = {"KERAS_BACKEND": backend, envvalues.PROFILE_STEPS.name: profile_steps}
    os.environ.update({name: value for name, value in own.items() if value})  # this rank's own process
    result = measure(cfg, engine)
    import numpy as np

    gathered = np.asarray(runtime.allgather(np.array([result["rates"]], np.float64))).tolist()
    if result["rank"] != 0:
        return None
    return make_row(result["size"], result["engine"], cfg.model, cfg.batch_size, gathered, result["backend"])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the worker's flags, run :func:`measure`, print ``BENCH {json}``.

    Args:
        argv: flags without the program name (default ``sys.argv[1:]``).

    Example::

        python -m mldist.tools.bench_worker --model resnet50 --batch-size 16 --iters 3
    """
    p = argparse.ArgumentParser(prog="python -m mldist.tools.bench_worker", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=tuple(MODELS), default="cnn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=0)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--batches-per-iter", type=int, default=10)
    p.add_argument("--intra-op", type=int, default=0, help="intra-op threads instead of mldist's plan")
    p.add_argument("--inter-op", type=int, default=0, help="inter-op threads instead of mldist's plan")
    args = p.parse_args(argv)
    cfg = BenchConfig(args.model, args.batch_size, args.image_size, args.warmup, args.iters, args.batches_per_iter)
    threads = (args.intra_op, args.inter_op) if args.intra_op or args.inter_op else None
    result = measure(cfg, threads=threads)
    print("BENCH " + json.dumps(result), flush=True)
    if run_dir := envvalues.RUN_DIR.read(os.environ):  # mldist run's summary.json merges every rank's report
        report = {"rank": result["rank"], "size": result["size"], "batch_size": cfg.batch_size}
        report |= {"step_seconds": cfg.batch_size / result["img_per_sec"], "samples_per_second": result["img_per_sec"]}
        write_json(Path(run_dir) / METRICS_FILE.format(rank=result["rank"]), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
