"""``mldist bench``: a Horovod-style synthetic benchmark of images per second.

A model (the package's small example CNN, or a ``keras.applications`` model with
``weights=None``) trains on random data; each rank times ``iters`` iterations of
``batches_per_iter`` steps after ``warmup`` steps and prints ``BENCH {json}``
(:mod:`mldist.tools.bench_worker`). This module holds the pure parts (flag parsing,
statistics, rows, efficiency, the report; its files: :mod:`bench_output`) and the orchestration: N local workers
through ``mldist run``'s launcher, a scaling sweep, a thread sweep, or the ranks of
a job this process is one of.

Example:
    >>> parse_scaling("4,1,2")
    (1, 2, 4)
    >>> row = make_row(2, "mpi", "cnn", 32, [[100.0, 100.0], [90.0, 110.0]])
    >>> row["img_per_sec"], row["img_per_sec_per_worker"]
    (200.0, 100.0)
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, LaunchError
from ..placement.backend import DEFAULT as DEFAULT_BACKEND
from .bench_output import say as _say
from .steptime import with_breakdown

#: Model name -> (``keras.applications`` class, smallest image side it accepts); "cnn" is mldist's own.
MODELS: dict[str, tuple[str, int]] = {
    "cnn": ("", 8),
    "resnet50": ("ResNet50", 32),
    "resnet101": ("ResNet101", 32),
    "resnet152": ("ResNet152", 32),
    "resnet50v2": ("ResNet50V2", 32),
    "mobilenet": ("MobileNet", 32),
    "mobilenetv2": ("MobileNetV2", 32),
    "mobilenetv3small": ("MobileNetV3Small", 32),
    "mobilenetv3large": ("MobileNetV3Large", 32),
    "vgg16": ("VGG16", 32),
    "vgg19": ("VGG19", 32),
    "densenet121": ("DenseNet121", 32),
    "efficientnetb0": ("EfficientNetB0", 32),
    "inceptionv3": ("InceptionV3", 75),
    "xception": ("Xception", 71),
}
#: Engines ``--engine`` may name (``nccl`` is for GPUs and chosen by ``auto`` there).
ENGINES = ("auto", "mpi", "ring")
#: The most workers one ``--scaling`` step or ``-n`` starts on this host.
MAX_WORKERS = 4096
WORKER_MODULE = "mldist.tools.bench_worker"
#: One report row (a JSON object).
Row = dict[str, Any]


@dataclass(frozen=True)
class BenchConfig:
    """What every rank runs.

    Args:
        model: a key of :data:`MODELS`.
        batch_size: images per step and worker.
        image_size: side of the square images (0: 32 for the CNN, 64 for applications).
        warmup: untimed steps first.
        iters: timed iterations.
        batches_per_iter: steps per timed iteration.

    Example:
        >>> BenchConfig(model="mobilenetv2").image
        64
    """

    model: str = "cnn"
    batch_size: int = 32
    image_size: int = 0
    warmup: int = 10
    iters: int = 10
    batches_per_iter: int = 10

    def __post_init__(self) -> None:
        check_model(self.model, self.image_size)

    @property
    def image(self) -> int:
        """The image side in use."""
        return self.image_size or (32 if self.model == "cnn" else 64)

    def worker_args(self) -> list[str]:
        """The flags of :mod:`mldist.tools.bench_worker` that say the same."""
        return [
            *("--model", self.model, "--batch-size", str(self.batch_size), "--image-size", str(self.image)),
            *("--warmup", str(self.warmup), "--iters", str(self.iters)),
            *("--batches-per-iter", str(self.batches_per_iter)),
        ]


def check_model(name: str, image_size: int = 0) -> None:
    """Raise ConfigError unless ``name`` is a known model that accepts ``image_size`` (0: its default).

    Example:
        >>> check_model("inceptionv3", 32)
        Traceback (most recent call last):
        ...
        mldist.errors.ConfigError: --image-size 32: inceptionv3 needs at least 75
    """
    if name not in MODELS:
        raise ConfigError(f"--model {name!r} is not known; choose one of {', '.join(MODELS)}")
    smallest = MODELS[name][1]
    if image_size and image_size < smallest:
        raise ConfigError(f"--image-size {image_size}: {name} needs at least {smallest}")


def parse_scaling(text: str) -> tuple[int, ...]:
    """Worker counts from ``--scaling 1,2,4``: sorted, each once; ConfigError names a bad one.

    Example:
        >>> parse_scaling("2, 1, 2")
        (1, 2)
    """
    counts = set()
    for item in text.split(","):
        word = item.strip()
        if not (word.isascii() and word.isdigit()) or not 1 <= int(word) <= MAX_WORKERS:
            raise ConfigError(f"--scaling {text!r}: {word!r} is not a worker count from 1 to {MAX_WORKERS}")
        counts.add(int(word))
    return tuple(sorted(counts))


def parse_engines(text: str) -> tuple[str, ...]:
    """Engines from ``--engine auto`` or ``--engine mpi,ring``, in the order given, each once.

    Example:
        >>> parse_engines("ring,mpi,ring")
        ('ring', 'mpi')
    """
    out: list[str] = []
    for item in text.split(","):
        word = item.strip().lower()
        if word not in ENGINES:
            raise ConfigError(f"--engine {text!r}: {word!r} is not one of {', '.join(ENGINES)}")
        if word not in out:
            out.append(word)
    return tuple(out)


def mean_ci95(rates: Sequence[float]) -> tuple[float, float]:
    """Mean and 1.96 standard deviations (population, as Horovod prints) of per-iteration rates.

    Example:
        >>> mean_ci95([90.0, 110.0])
        (100.0, 19.6)
    """
    if not rates:
        raise ValueError("no rates")
    return statistics.fmean(rates), round(1.96 * statistics.pstdev(rates), 9)


def make_row(
    workers: int, engine: str, model: str, batch: int, rates: Sequence[Sequence[float]], backend: str = DEFAULT_BACKEND
) -> dict[str, Any]:
    """One JSON row from every rank's per-iteration images per second (``rates[rank]``).

    Per worker: the mean of all ranks' iterations, ± ``ci95``; in total: that times the workers.
    ``efficiency`` is filled in by :func:`add_efficiency`.

    Example:
        >>> make_row(1, "none", "cnn", 32, [[50.0]])["ci95"]
        0.0
    """
    per_worker, ci95 = mean_ci95([r for rank in rates for r in rank])
    return {
        "workers": workers,
        "backend": backend,
        "engine": engine,
        "model": model,
        "batch": batch,
        "img_per_sec": per_worker * workers,
        "img_per_sec_per_worker": per_worker,
        "ci95": ci95,
        "efficiency": None,
    }


def add_efficiency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill ``efficiency``: per-worker img/s over that of the 1-worker row of the same backend, model and batch.

    Rows without such a row keep ``None``.

    Example:
        >>> rows = add_efficiency([make_row(1, "none", "cnn", 32, [[100.0]]), make_row(2, "mpi", "cnn", 32, [[80.0]])])
        >>> [r["efficiency"] for r in rows]
        [1.0, 0.8]
    """

    def key(r: dict[str, Any]) -> tuple[str, str, int]:
        return r.get("backend", "tensorflow"), r["model"], r["batch"]

    base = {key(r): r["img_per_sec_per_worker"] for r in rows if r["workers"] == 1}
    for row in rows:
        ref = base.get(key(row))
        row["efficiency"] = row["img_per_sec_per_worker"] / ref if ref else None
    return rows


def parse_results(text: str) -> list[dict[str, Any]]:
    """The ``BENCH {json}`` lines in a worker's output (``[rank]`` prefixes allowed).

    Example:
        >>> parse_results('noise\\n[1] BENCH {"rank": 1, "rates": [5.0]}\\n')
        [{'rank': 1, 'rates': [5.0]}]
    """
    found = []
    for line in text.splitlines():
        head, sep, tail = line.partition("BENCH ")
        if sep and (not head or head.startswith("[")):
            found.append(json.loads(tail))
    return found


def format_row(row: dict[str, Any]) -> str:
    """One report line: per worker ± ci95, in total, efficiency.

    Example:
        >>> format_row(make_row(2, "mpi", "cnn", 32, [[100.0], [100.0]]))
        'cnn batch 32, 2 worker(s), mpi: 100.0 ± 0.0 img/sec per worker, 200.0 img/sec in total'
    """
    head = f"{row['model']} batch {row['batch']}, {row['workers']} worker(s), {row['engine']}"
    if row.get("backend", DEFAULT_BACKEND) != DEFAULT_BACKEND:
        head += f", keras on {row['backend']}"
    if "intra_op" in row:
        head += f", intra-op {row['intra_op']} inter-op {row['inter_op']}"
    text = f"{head}: {row['img_per_sec_per_worker']:.1f} ± {row['ci95']:.1f} img/sec per worker, "
    text += f"{row['img_per_sec']:.1f} img/sec in total"
    return text + (f", efficiency {row['efficiency']:.2f}" if row.get("efficiency") is not None else "")


def thread_settings(cores: int) -> list[tuple[int, int]]:
    """(intra-op, inter-op) pairs ``--tune-threads`` tries: intra in {1, cores/2, cores}, inter in {1, 2}.

    Example:
        >>> thread_settings(4)
        [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
    """
    intra = sorted({1, max(1, cores // 2), max(1, cores)})
    return [(a, b) for a in intra for b in (1, 2)]


def run_workers(
    cfg: BenchConfig,
    workers: int,
    engine: str,
    threads: tuple[int, int] | None = None,
    run_dir: Path | None = None,
    *,
    backend: str | None = None,
    profile_steps: str | None = None,
) -> Row:
    """Start ``workers`` bench workers on this host through ``mldist run``'s launcher; their row.

    Args:
        cfg: what every rank runs.
        workers: how many.
        engine: "auto", "mpi" or "ring".
        threads: (intra-op, inter-op) for every worker, or None for mldist's plan.
        run_dir: where each run gets its run directory (``n2-mpi``: config.json, rank logs,
            summary.json), or None for temporary logs only. With ``profile_steps`` the run's
            ``trace/`` stays there and the row gets the step-time breakdown.
        backend: the workers' ``KERAS_BACKEND``, or None for what they find.
        profile_steps: "A:B" to record those steps on every rank (``mldist run --profile-steps``).

    Example::

        row = run_workers(BenchConfig(iters=2), 2, "mpi")
    """
    from ..launch.local import RunConfig, run

    extra = ["--intra-op", str(threads[0]), "--inter-op", str(threads[1])] if threads else []
    command = (sys.executable, "-m", WORKER_MODULE, *cfg.worker_args(), *extra)
    step = f"n{workers}-{engine}" + (f"-intra{threads[0]}-inter{threads[1]}" if threads else "")
    with tempfile.TemporaryDirectory(prefix="mldist-bench-") as tmp:
        where = str(run_dir / step) if run_dir else tmp
        env = {"KERAS_BACKEND": backend} if backend else {}
        rc = RunConfig(workers, command, log_dir=where, cpu_bind="cores", communication=engine, env=env)
        code = run(dataclasses.replace(rc, run_dir=where if run_dir else None, profile_steps=profile_steps))
        logs = [Path(where) / f"rank-{i}.log" for i in range(workers)]
        results = [r for log in logs if log.exists() for r in parse_results(log.read_text(errors="replace"))]
        if code or len(results) != workers:
            for rank, log in enumerate(logs):
                for line in log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []:
                    print(f"[{rank}] {line}", file=sys.stderr)
            raise LaunchError(f"{workers} worker(s) on {engine} failed (exit code {code}); their last lines are above")
    results.sort(key=lambda r: int(r["rank"]))
    rates = [r["rates"] for r in results]
    backend_used = str(results[0].get("backend", DEFAULT_BACKEND))
    row = make_row(workers, str(results[0]["engine"]), cfg.model, cfg.batch_size, rates, backend_used)
    row |= {"intra_op": threads[0], "inter_op": threads[1]} if threads else {}
    if profile_steps and run_dir is not None:
        row = with_breakdown(row, run_dir / step / "trace" / "merged.trace.json.gz")
    return row


#: What runs one step of a sweep: (workers, engine, threads) -> row.
Runner = Callable[[int, str, "tuple[int, int] | None"], dict[str, Any]]


def sweep(counts: Sequence[int], engines: Sequence[str], runner: Runner) -> list[Row]:
    """Run every worker count on every engine (one 1-worker run serves all engines); rows with efficiency.

    Args:
        counts: worker counts, e.g. (1, 2).
        engines: engines to compare.
        runner: runs one step, e.g. :func:`run_workers` with its ``cfg`` bound (tests pass a fake).

    Example::

        rows = sweep((1, 2), ("mpi", "ring"), lambda n, e, t: run_workers(cfg, n, e, t))   # 3 runs
    """
    steps = [(n, e) for n in counts for e in (engines if n > 1 else engines[:1])]
    rows = []
    for i, (n, engine) in enumerate(steps, 1):
        _say(f"[{i}/{len(steps)}] {n} worker(s), engine {engine if n > 1 else 'none'}")
        rows.append(runner(n, engine, None))
        print(format_row(rows[-1]), flush=True)
    add_efficiency(rows)
    if len(rows) > 1:
        print("\n".join(["", "summary:", *(f"  {format_row(r)}" for r in rows)]), flush=True)
    return rows


def tune_threads(cores: int, runner: Runner) -> tuple[list[Row], Row]:
    """One worker per (intra-op, inter-op) setting of :func:`thread_settings`; the rows and the best.

    Example::

        rows, best = tune_threads(4, lambda n, e, t: run_workers(cfg, n, e, t))   # 6 runs; best["intra_op"]
    """
    settings = thread_settings(cores)
    rows = []
    for i, threads in enumerate(settings, 1):
        _say(f"[{i}/{len(settings)}] 1 worker, intra-op {threads[0]}, inter-op {threads[1]}")
        rows.append(runner(1, "auto", threads))
        print(format_row(rows[-1]), flush=True)
    best = max(rows, key=lambda r: r["img_per_sec"])
    print(f"best: intra-op {best['intra_op']}, inter-op {best['inter_op']}: {best['img_per_sec']:.1f} img/sec")
    return rows, best
