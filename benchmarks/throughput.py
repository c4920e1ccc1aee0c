"""Weak scaling of mldist's CPU engines beside a bare prototype, side by side in one run.

    python benchmarks/throughput.py [--rounds 3] [--models cnn,mobilenetv2] [--backends tf,jax]
                                    [--no-table] [--no-breakdown]

Per model (the README's example CNN at batch 64 on 28x28x1; MobileNetV2 with weights=None
at batch 32 on 64x64x3), 1 thread per worker, Keras ``fit``, interleaved rounds
(A B C D E A B C D E ...) so drift hits every configuration alike, medians reported:

  alone      one mldist worker, pinned to one core: the reference
  apart      two plain Keras processes at once, one per core, no communication (the ceiling)
  prototype  2 ranks under mpiexec: plain Keras, an SGD whose ``apply`` all-reduces the
             concatenated gradient with one ``comm.Allreduce`` in a ``tf.numpy_function``;
             no callbacks, no checks (bench_worker.py's ``Proto``: the benchmark's own code)
  mpi        `mldist run -n 2 --communication mpi`: DistributedOptimizer + default_callbacks()
  ring       the same on TensorFlow's gRPC collectives

Keras 3 on JAX (``--backends jax``; KERAS_BACKEND=jax, engine jax.distributed):

  jax alone             one mldist worker, one core
  jax apart             two plain Keras-on-JAX processes at once, one per core (the JAX ceiling)
  jax 2 workers         `mldist run -n 2`: Keras's DataParallel, XLA's all-reduce over Gloo
  jax 2, busy Gloo loop the same with MLDIST_GLOO_IDLE=0: Gloo's event loop left at normal
                        priority, as before mldist moved it to SCHED_IDLE (mldist.runtime.engines.jax_cpu)

Goal: jax 2 workers >= 0.85 of jax apart on both models; then JAX's step breakdown from a
profiled run (JAX's profiler through ``--profile-steps``; the all-reduce's count and bytes
from XLA's dump of the compiled step).

Efficiency = per-worker images/s over alone. Goals: mldist MPI / prototype >= 0.95 on both
models (engine overhead issue); MPI >= 1.3x RING on the CNN. Then, per model and engine,
where a step's time goes, from one run with ``--profile-steps`` (mldist.tools.steptime) and
the callbacks' own timers. The CNN also runs plain Keras and 1 mldist worker with all cores
(goal: mldist >= 0.97 of plain). The table times mldist.allreduce on 2 workers from 4 B to
64 MB on both engines and raw mpi4py Allreduce on numpy arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve().parent
PY = sys.executable
WORKER = [PY, str(HERE / "bench_worker.py")]
STEPS = {"cnn": ["--steps", "200", "--warmup", "20"], "mobilenetv2": ["--steps", "30", "--warmup", "5"]}
#: Short profiled runs for the breakdown: (worker step arguments, --profile-steps).
PROFILED = {
    "cnn": (["--steps", "60", "--warmup", "20"], "40:59"),
    "mobilenetv2": (["--steps", "12", "--warmup", "4"], "8:13"),
}
ONE = {"MLDIST_CPUS_PER_TASK": "1", "OMP_NUM_THREADS": "1"}
JAX = {"KERAS_BACKEND": "jax"}
GOAL_OVER_PROTOTYPE = 0.95
GOAL_JAX_OVER_APART = 0.85
BUSY_LOOP = {"MLDIST_GLOO_IDLE": "0"}


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLDIST_", "SLURM_", "OMPI_", "PMI_"))}
    return env | {"TF_CPP_MIN_LOG_LEVEL": "2"} | extra


def _rows(out: str) -> list[dict[str, object]]:
    return [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]


def run(cmds: list[list[str]], extra: dict[str, str]) -> list[dict[str, object]]:
    """Run the commands at the same time; every RESULT row they print."""
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(extra)) for c in cmds
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode:
            raise SystemExit(f"benchmark run failed ({p.returncode}): {' '.join(p.args)}\n{err[-2000:]}")  # type: ignore[arg-type]
    return [row for out, _ in outs for row in _rows(out)]


def two(engine: str, *launcher: str) -> list[str]:
    """``mldist run`` of 2 workers on ``engine``, one core each, up to the worker's own arguments.

    No run directory unless ``launcher`` names one: a benchmark keeps nothing but its figures.
    """
    keep = launcher if "--run-dir" in launcher else (*launcher, "--no-run-dir")
    return [PY, "-m", "mldist", "run", "-n", "2", "--communication", engine, "--cpu-bind", "cores", *keep, "--"]


Configs = dict[str, tuple[list[list[str]], dict[str, str]]]


def configs(model: str, cores: int, backends: tuple[str, ...] = ("tf", "jax")) -> Configs:
    """Name -> (commands run at once, environment) for one model."""
    args = ["--model", model, *STEPS[model], "--threads", "1"]
    apart = [[*WORKER, "plain", *args, "--one-core", "--core", str(c)] for c in (0, 1)]
    out: Configs = {}
    if "tf" in backends:
        out |= {
            "alone": ([[*WORKER, "mldist", *args, "--one-core"]], ONE),
            "apart": (apart, ONE),
            "prototype": ([[*two("mpi"), *WORKER, "proto", *args]], ONE),
            "mpi": ([[*two("mpi"), *WORKER, "mldist", *args]], ONE),
            "ring": ([[*two("ring"), *WORKER, "mldist", *args]], ONE),
        }
    if "jax" in backends:  # Keras 3 on JAX: the same worker and launcher, KERAS_BACKEND=jax (engine: jax.distributed)
        out |= {
            "jax alone": ([[*WORKER, "mldist", *args, "--one-core"]], ONE | JAX),
            "jax apart": (apart, ONE | JAX),
            "jax 2 workers": ([[*two("auto"), *WORKER, "mldist", *args]], ONE | JAX),
            "jax 2, busy Gloo loop": ([[*two("auto"), *WORKER, "mldist", *args]], ONE | JAX | BUSY_LOOP),
        }
    if model == "cnn" and "tf" in backends:  # mldist's own cost with one worker, all cores
        full = ["--model", model, *STEPS[model], "--threads", str(cores)]
        out["plain, all cores"] = ([[*WORKER, "plain", *full]], {})
        out["mldist 1 worker, all cores"] = ([[*WORKER, "mldist", *full]], {})
    return out


Samples = dict[str, dict[str, list[dict[str, object]]]]


def weak_scaling(models: list[str], rounds: int, backends: tuple[str, ...] = ("tf", "jax")) -> Samples:
    """Every configuration's RESULT rows per model, round after round (interleaved)."""
    cores = len(os.sched_getaffinity(0))
    table = {m: configs(m, cores, backends) for m in models}
    samples: Samples = {m: {name: [] for name in table[m]} for m in models}
    for r in range(rounds):
        for model in models:
            for name, (cmds, extra) in table[model].items():
                rows = run(cmds, extra)
                ips = sum(float(row["images_per_second"]) for row in rows) / len(rows)  # type: ignore[arg-type]
                cb = [float(row.get("callback_ms_per_step", 0.0)) for row in rows]  # type: ignore[arg-type]
                samples[model][name].append({"ips": ips, "callback_ms": sum(cb) / len(cb)})
                print(f"round {r + 1} {model:12s} {name:28s} {ips:9.1f} img/s per worker")
    return samples


def medians(samples: Samples, key: str) -> dict[str, dict[str, float]]:
    return {m: {n: statistics.median(float(x[key]) for x in v) for n, v in s.items()} for m, s in samples.items()}  # type: ignore[arg-type]


def report_scaling(med: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Print the side-by-side table and the goals; the ratios per model."""
    names = ("alone", "apart", "prototype", "mpi", "ring")
    print("\nper-worker images/s, 2 workers x 1 thread (medians; in brackets: over one worker alone)")
    print(f"{'model':12s} | " + " | ".join(f"{n:>16s}" for n in names) + " | MPI/prototype | MPI/RING")
    out: dict[str, dict[str, float]] = {}
    for model, m in med.items():
        eff = {n: m[n] / m["alone"] for n in names}
        cells = " | ".join(f"{m[n]:9.0f} ({eff[n]:.2f})" for n in names)
        proto, ring = m["mpi"] / m["prototype"], m["mpi"] / m["ring"]
        print(f"{model:12s} | {cells} | {proto:13.3f} | {ring:7.2f}x")
        out[model] = eff | {"mpi_over_prototype": proto, "mpi_over_ring": ring}
    for model, o in out.items():
        verdict = "met" if o["mpi_over_prototype"] >= GOAL_OVER_PROTOTYPE else "MISSED"
        ratio = o["mpi_over_prototype"]
        print(f"{model}: mldist MPI / prototype {ratio:.3f} (goal >= {GOAL_OVER_PROTOTYPE}: {verdict})")
        if model == "cnn":
            ring = o["mpi_over_ring"]
            print(f"cnn: MPI / RING {ring:.2f}x (goal >= 1.3x: {'met' if ring >= 1.3 else 'MISSED'})")
            m = med[model]
            if "plain, all cores" in m:
                o["one_worker_over_plain"] = m["mldist 1 worker, all cores"] / m["plain, all cores"]
                print(f"cnn: 1 mldist worker / plain Keras, all cores: {o['one_worker_over_plain']:.3f} (goal >= 0.97)")
    return out


def report_jax(med: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Keras 3 on JAX: alone, apart (the ceiling), 2 workers with and without the idle Gloo loop; the goal."""
    names = ("jax alone", "jax apart", "jax 2 workers", "jax 2, busy Gloo loop")
    print("\nKeras 3 on JAX, images/s per worker, 1 thread each (medians; in brackets: over jax apart, the ceiling)")
    print(f"{'model':12s} | " + " | ".join(f"{n:>22s}" for n in names))
    out = {}
    for model, m in med.items():
        ratio = {n: m[n] / m["jax apart"] for n in names}
        print(f"{model:12s} | " + " | ".join(f"{m[n]:14.1f} ({ratio[n]:.2f})" for n in names))
        out[model] = {"jax_over_apart": ratio["jax 2 workers"], "busy_loop_over_apart": ratio["jax 2, busy Gloo loop"]}
        if "mpi" in m:
            out[model] |= {"tf_mpi_over_apart": m["mpi"] / m["apart"], "jax_over_tf_mpi": m["jax 2 workers"] / m["mpi"]}
    for model, o in out.items():
        verdict = "met" if o["jax_over_apart"] >= GOAL_JAX_OVER_APART else "MISSED"
        tf = f"; TF on MPI: {o['tf_mpi_over_apart']:.2f} of its own" if "tf_mpi_over_apart" in o else ""
        ratio = o["jax_over_apart"]
        print(f"{model}: JAX 2 workers / JAX apart {ratio:.2f} (goal >= {GOAL_JAX_OVER_APART}: {verdict}{tf})")
    return out


#: Profiled runs: label -> (``mldist run --communication``, environment, the config whose callback timers apply).
BREAKDOWNS = {
    "tf": {"MPI": ("mpi", ONE, "mpi"), "RING": ("ring", ONE, "ring")},
    "jax": {"JAX": ("auto", ONE | JAX, "jax 2 workers")},
}


def _step_module(dump: Path) -> str:
    """XLA's optimized HLO of the compiled training step, from a ``--xla_dump_to`` folder ("" if none)."""
    found = sorted(dump.glob("*train_step*after_optimizations.txt"), key=lambda p: p.stat().st_size)
    return found[-1].read_text() if found else ""


def step_breakdown(
    models: list[str], callbacks: dict[str, dict[str, float]], backends: tuple[str, ...] = ("tf", "jax")
) -> dict[str, dict[str, object]]:
    """Per model and engine: one profiled run's mean breakdown (mldist.tools.steptime), printed."""
    from mldist.tools.steptime import breakdown, format_breakdown, hlo_collectives, load

    out: dict[str, dict[str, object]] = {}
    for model in models:
        steps, window = PROFILED[model]
        for label, (engine, extra, config) in [kv for b in backends for kv in BREAKDOWNS[b].items()]:
            with tempfile.TemporaryDirectory(prefix="mldist-breakdown-") as tmp:
                launcher = ("--profile-steps", window, "--run-dir", tmp)
                worker = [*WORKER, "mldist", "--model", model, *steps, "--threads", "1"]
                dump = {"XLA_FLAGS": f"--xla_dump_to={tmp}/hlo --xla_dump_hlo_module_re=.*train_step.*"}
                run([[*two(engine, *launcher), *worker]], extra | (dump if extra is not ONE else {}))
                mean = breakdown(load(Path(tmp) / "trace" / "merged.trace.json.gz"))["mean"]
                hlo = hlo_collectives(_step_module(Path(tmp) / "hlo"))
            if hlo["count"]:
                mean |= {"collective_bytes": hlo["bytes"], "hlo_collectives": hlo["count"]}
            cb = callbacks[model][config]
            print(format_breakdown(mean, f"\n{model}, mldist {label}: where a step's time goes (profiled)"))
            print(f"  of which mldist's callbacks (timers, unprofiled runs): {cb:.3f} ms per step")
            out[f"{model}/{label.lower()}"] = mean | {"callbacks_ms": cb}
    return out


def allreduce_table() -> list[dict[str, float]]:
    """Median seconds per all-reduce by size: MPI engine, RING engine, raw mpi4py."""
    base = [PY, "-m", "mldist", "run", "-n", "2", "--cpu-bind", "cores", "--communication"]
    found = {}
    for engine in ("mpi", "ring"):
        rows = run([[*base, engine, "--", *WORKER, "table", "--threads", "1", "--steps", "50", "--warmup", "5"]], ONE)
        found[engine] = rows[0]["rows"]  # rank 0's view
    print("\nall-reduce on 2 workers (median per call; bus bandwidth = 2(n-1)/n x bytes / time = bytes / time)")
    head = f"{'MPI engine':>12} {'GB/s':>6} | {'raw mpi4py':>12} {'GB/s':>6} | {'RING engine':>12}"
    print(f"{'bytes':>10} | {head} | MPI/raw")
    out = []
    for mpi, ring in zip(found["mpi"], found["ring"], strict=True):  # type: ignore[call-overload]
        b, e, raw, rg = mpi["bytes"], mpi["engine_s"], mpi["raw_s"], ring["engine_s"]
        print(f"{b:>10} | {e * 1e6:10.1f}us {b / e / 1e9:6.2f} | {raw * 1e6:10.1f}us {b / raw / 1e9:6.2f} | "
              f"{rg * 1e6:10.1f}us | {e / raw:5.2f}{'  (goal <= 1.2)' if b >= 1 << 20 else ''}")  # fmt: skip
        out.append({"bytes": b, "mpi_engine_s": e, "raw_mpi4py_s": raw, "ring_engine_s": rg})
    return out


class _Parser(argparse.ArgumentParser):
    """A refused flag is one line and exit code 2 (argparse's usage block would come first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _rounds(text: str) -> int:
    """``--rounds``: 1 to 100 (medians need one round at least)."""
    if not re.fullmatch(r"[0-9]{1,3}", text) or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of rounds from 1 to 100")
    return int(text)


def _among(known: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """A comma-separated list whose every item is one of ``known`` (``--models``, ``--backends``)."""

    def parse(text: str) -> list[str]:
        items = text.split(",")
        for item in items:
            if item not in known:
                raise argparse.ArgumentTypeError(f"{item!r} is not a {what}: give some of {','.join(known)}")
        return items

    return parse


def main() -> None:
    p = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=_rounds, default=3)
    p.add_argument("--models", type=_among(STEPS, "model"), default="cnn,mobilenetv2")
    p.add_argument("--no-table", action="store_true", help="skip the all-reduce table")
    p.add_argument(
        "--backends", type=_among(BREAKDOWNS, "backend"), default="tf,jax",
        help="tf (Keras on TensorFlow), jax (Keras on JAX), or both",
    )  # fmt: skip
    p.add_argument("--no-jax", action="store_true", help="the same as --backends tf")
    p.add_argument("--no-breakdown", action="store_true", help="skip the profiled step-time breakdown")
    args = p.parse_args()
    models = args.models
    backends = ("tf",) if args.no_jax else tuple(args.backends)
    samples = weak_scaling(models, args.rounds, backends)
    med = medians(samples, "ips")
    summary: dict[str, object] = {"medians_img_per_s_per_worker": med}
    if "tf" in backends:
        summary["efficiency"] = report_scaling(med)
    if "jax" in backends:
        summary["jax"] = report_jax(med)
    if not args.no_breakdown:
        summary["breakdown_ms_per_step"] = step_breakdown(models, medians(samples, "callback_ms"), backends)
    if not args.no_table and "tf" in backends:
        summary["allreduce"] = allreduce_table()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
