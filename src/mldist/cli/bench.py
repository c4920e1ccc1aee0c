"""``mldist bench``: the Horovod-style synthetic benchmark, images per second per worker and in total.

Example:
    $ mldist bench -n 2
    $ mldist bench --scaling 1,2 --engine mpi,ring --json bench.json
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..base.files import make_dirs
from ..errors import ConfigError
from .common import Handler, add_command, count, step_range

BENCH_EXAMPLE = """\
example:
  mldist bench                                   # the example CNN, 1 worker (or the job's ranks)
  mldist bench -n 2 --engine mpi,ring            # 2 local workers on each engine
  mldist bench --scaling 1,2 --json bench.json   # efficiency against 1 worker; also bench.png
  mldist bench --model resnet50 --batch-size 16 --image-size 64
  mldist bench --tune-threads                    # best intra-op/inter-op threads for 1 worker
  srun -n 4 mldist bench --model mobilenetv2     # inside a job: runs as the job's ranks
  mldist bench -n 2 --profile-steps 20:29        # timeline of steps 20..29 and where their time goes
  mldist bench --scaling 1,2 --backend tensorflow,jax   # Keras 3 on TensorFlow and on JAX side by side

Prints img/sec per worker (mean ± 1.96 sd over the timed iterations) and in total.
Models: cnn (mldist's example CNN), or keras.applications with weights=None: resnet50,
resnet101, resnet152, resnet50v2, mobilenet, mobilenetv2, mobilenetv3small,
mobilenetv3large, vgg16, vgg19, densenet121, efficientnetb0, inceptionv3, xception."""


def _model(text: str) -> str:
    from ..tools.bench import MODELS

    if text.lower() not in MODELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a known model; choose one of {', '.join(MODELS)}")
    return text.lower()


def _backends(text: str) -> tuple[str, ...]:
    words = tuple(dict.fromkeys(w.strip() for w in text.split(",")))
    for word in words:
        if word not in ("tensorflow", "jax"):
            raise argparse.ArgumentTypeError(f"{word!r} is not a backend mldist benchmarks: tensorflow, jax or both")
    return words


def register(sub: Any) -> dict[str, Handler]:
    """Add ``bench`` to the subcommands; its handler by name."""
    p = add_command(sub, "bench", "synthetic training benchmark: images per second per worker and total", BENCH_EXAMPLE)
    p.add_argument("--model", type=_model, default="cnn", help="cnn (default) or a keras.applications name")
    p.add_argument("--batch-size", type=count(1, 65536), default=32, help="images per step and worker (default 32)")
    p.add_argument("--image-size", type=count(1, 4096), default=0, help="image side (default 32 for cnn, else 64)")
    p.add_argument("--warmup", type=count(0), default=10, help="untimed steps first (default 10)")
    p.add_argument("--iters", type=count(1), default=10, help="timed iterations (default 10)")
    p.add_argument("--batches-per-iter", type=count(1), default=10, help="steps per iteration (default 10)")
    p.add_argument("-n", "--nprocs", type=count(1, 4096), help="local workers to start (default 1)")
    p.add_argument("--scaling", help="worker counts to run in turn, e.g. 1,2,4: efficiency against 1 worker")
    p.add_argument("--engine", default="auto", help="auto, mpi or ring, or a comma list to compare (default auto)")
    p.add_argument(
        "--backend",
        type=_backends,
        default=None,
        help="Keras's backend: tensorflow, jax, or tensorflow,jax to compare them (default: KERAS_BACKEND, "
        "else tensorflow); --engine applies to tensorflow",
    )
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON, and the scaling plot beside it (.png)")
    p.add_argument("--tune-threads", action="store_true", help="sweep intra-op/inter-op threads on 1 worker")
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        help="keep each run's directory (config, rank logs, summary) in DIR/n2-mpi/...; "
        "results in DIR/bench.json unless --json",
    )
    p.add_argument(
        "--profile-steps",
        type=step_range,
        metavar="A:B",
        help="record steps A..B (from 0, warm-up included) on every rank: the merged trace in the run "
        "directory's trace/ (default runs/bench-<time>), and where each step's time goes",
    )
    return {"bench": _cmd_bench}


def _check_json(path: str | None) -> None:
    """Refuse a ``--json`` path that cannot be written before the benchmark runs (creates its folder)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--json {path!r} is a directory; name a file")
    try:
        make_dirs(target.parent)
    except OSError as exc:
        raise ConfigError(f"--json {path!r}: {target.parent} cannot be created ({exc.strerror})") from None
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--json {path!r}: {target.parent} is not writable")


def _plan(args: argparse.Namespace, in_job: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Worker counts and engines from -n/--scaling/--engine; ConfigError for combinations that do not fit."""
    from ..tools.bench import parse_engines, parse_scaling

    engines = parse_engines(args.engine)
    if args.nprocs is not None and args.scaling is not None:
        raise ConfigError("give -n or --scaling, not both")
    counts = parse_scaling(args.scaling) if args.scaling is not None else (args.nprocs or 1,)
    if args.tune_threads and (args.scaling is not None or (args.nprocs or 1) > 1 or len(engines) > 1):
        raise ConfigError("--tune-threads runs 1 worker; drop -n, --scaling and the --engine list")
    if in_job and (args.scaling is not None or args.nprocs is not None or args.tune_threads or len(engines) > 1):
        raise ConfigError(
            "inside a job of several ranks mldist bench runs as those ranks: drop -n, --scaling, "
            "--tune-threads and the --engine list (or run it outside the job step)"
        )
    return counts, engines


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..placement import backend, detect
    from ..tools import bench, bench_output

    bench.check_model(args.model, args.image_size)
    in_job = detect(os.environ).size > 1
    counts, engines = _plan(args, in_job)
    if args.backend and (in_job or args.tune_threads) and len(args.backend) > 1:
        raise ConfigError("--backend tensorflow,jax compares local runs: give one inside a job or with --tune-threads")
    # The workers' Keras backends (and with them the launcher's engine decision): as asked, else as they would find it.
    backends = args.backend or (backend.keras_backend(os.environ, backend.read_config(os.environ)),)
    run_dir = _run_dir(args.run_dir, args.profile_steps is not None and not in_job)
    json_path = args.json or (str(run_dir / "bench.json") if run_dir else None)
    _check_json(json_path)
    cfg = bench.BenchConfig(
        args.model, args.batch_size, args.image_size, args.warmup, args.iters, args.batches_per_iter
    )
    if in_job:
        from ..tools.bench_worker import job_row

        row = job_row(cfg, engines[0], backend=backends[0], profile_steps=args.profile_steps)
        if row is not None:
            print(bench.format_row(row), flush=True)
            if args.profile_steps:
                from ..runtime.collect.profiling import trace_dir
                from ..tools.steptime import with_breakdown

                row = with_breakdown(row, trace_dir(os.environ) / "merged.trace.json.gz")
            if json_path:
                bench_output.write_json(json_path, [row])
        return 0

    def runner(name: str) -> bench.Runner:
        def run(n: int, engine: str, threads: tuple[int, int] | None) -> dict[str, Any]:
            return bench.run_workers(cfg, n, engine, threads, run_dir, backend=name, profile_steps=args.profile_steps)

        return run

    if args.tune_threads:
        from ..placement.resources import cpu_probe

        rows, best = bench.tune_threads(len(cpu_probe().allowed), runner(backends[0]))
        extra = {"best": {"intra_op": best["intra_op"], "inter_op": best["inter_op"]}}
    else:
        rows, extra = [], {}
        for name in backends:
            # A backend that averages inside its compiled step brings its own engine: no list to compare.
            chosen = ("auto",) if backend.traits(name).averages_in_step else engines
            rows += bench.sweep(counts, chosen, runner(name))
    if json_path:
        bench_output.write_json(json_path, rows, extra)
    return 0


def _run_dir(path: str | None, needed: bool) -> Path | None:
    """``--run-dir``, else ``runs/bench-<time>`` when ``needed`` (a trace must go somewhere), else None.

    Created (owner-only) before anything runs; each run gets a directory in it.
    """
    from ..base.rundir import default_run_dir, prepare_run_dir

    if path is None and needed:
        path = str(default_run_dir(["bench"]))
        print(f"mldist bench: run directory {path}", flush=True)
    return None if path is None else prepare_run_dir(path)
