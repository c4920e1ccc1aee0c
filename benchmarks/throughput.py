"""Weak scaling of mldist's CPU engines beside a bare prototype, side by side in one run.

    python benchmarks/throughput.py [--rounds 3] [--models cnn,mobilenetv2] [--no-table] [--no-breakdown]

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
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

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


def configs(model: str, cores: int, jax: bool = False) -> dict[str, tuple[list[list[str]], dict[str, str]]]:
    """Name -> (commands run at once, environment) for one model."""
    args = ["--model", model, *STEPS[model], "--threads", "1"]
    out = {
        "alone": ([[*WORKER, "mldist", *args, "--one-core"]], ONE),
        "apart": ([[*WORKER, "plain", *args, "--one-core", "--core", str(c)] for c in (0, 1)], ONE),
        "prototype": ([[*two("mpi"), *WORKER, "proto", *args]], ONE),
        "mpi": ([[*two("mpi"), *WORKER, "mldist", *args]], ONE),
        "ring": ([[*two("ring"), *WORKER, "mldist", *args]], ONE),
    }
    if jax:  # Keras 3 on JAX: the same worker and launcher, KERAS_BACKEND=jax (engine: jax.distributed)
        out["jax alone"] = ([[*WORKER, "mldist", *args, "--one-core"]], ONE | JAX)
        out["jax 2 workers"] = ([[*two("auto"), *WORKER, "mldist", *args]], ONE | JAX)
    if model == "cnn":  # mldist's own cost with one worker, all cores
        full = ["--model", model, *STEPS[model], "--threads", str(cores)]
        out["plain, all cores"] = ([[*WORKER, "plain", *full]], {})
        out["mldist 1 worker, all cores"] = ([[*WORKER, "mldist", *full]], {})
    return out


Samples = dict[str, dict[str, list[dict[str, object]]]]


def weak_scaling(models: list[str], rounds: int, jax: bool = False) -> Samples:
    """Every configuration's RESULT rows per model, round after round (interleaved)."""
    cores = len(os.sched_getaffinity(0))
    table = {m: configs(m, cores, jax) for m in models}
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


def report_backends(med: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Keras 3 on TensorFlow (MPI engine) beside Keras 3 on JAX: 1 and 2 workers, per worker and efficiency."""
    print("\nbackends (images/s per worker; efficiency = 2 workers / alone):")
    print(f"{'model':12s} | {'TF alone':>9s} | {'TF 2 (MPI)':>10s} | {'TF eff':>6s} | {'JAX alone':>9s} | "
          f"{'JAX 2':>9s} | {'JAX eff':>7s} | JAX/TF at 2")  # fmt: skip
    out = {}
    for model, m in med.items():
        tf_eff, jax_eff = m["mpi"] / m["alone"], m["jax 2 workers"] / m["jax alone"]
        print(f"{model:12s} | {m['alone']:9.1f} | {m['mpi']:10.1f} | {tf_eff:6.2f} | {m['jax alone']:9.1f} | "
              f"{m['jax 2 workers']:9.1f} | {jax_eff:7.2f} | {m['jax 2 workers'] / m['mpi']:.2f}")  # fmt: skip
        out[model] = {"tf_efficiency": tf_eff, "jax_efficiency": jax_eff, "jax_over_tf": m["jax 2 workers"] / m["mpi"]}
    return out


def step_breakdown(models: list[str], callbacks: dict[str, dict[str, float]]) -> dict[str, dict[str, object]]:
    """Per model and engine: one profiled run's mean breakdown (mldist.tools.steptime), printed."""
    from mldist.tools.steptime import breakdown, format_breakdown, load

    out: dict[str, dict[str, object]] = {}
    for model in models:
        steps, window = PROFILED[model]
        for engine in ("mpi", "ring"):
            with tempfile.TemporaryDirectory(prefix="mldist-breakdown-") as tmp:
                launcher = ("--profile-steps", window, "--run-dir", tmp)
                worker = [*WORKER, "mldist", "--model", model, *steps, "--threads", "1"]
                run([[*two(engine, *launcher), *worker]], ONE)
                mean = breakdown(load(Path(tmp) / "trace" / "merged.trace.json.gz"))["mean"]
            cb = callbacks[model][engine]
            title = f"\n{model}, mldist {engine.upper()}: where a step's time goes (profiled)"
            print(format_breakdown(mean, title))
            print(f"  of which mldist's callbacks (timers, unprofiled runs): {cb:.3f} ms per step")
            out[f"{model}/{engine}"] = mean | {"callbacks_ms": cb}
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default="cnn,mobilenetv2")
    p.add_argument("--no-table", action="store_true", help="skip the all-reduce table")
    p.add_argument("--no-jax", action="store_true", help="skip the Keras-on-JAX columns")
    p.add_argument("--no-breakdown", action="store_true", help="skip the profiled step-time breakdown")
    args = p.parse_args()
    models = args.models.split(",")
    samples = weak_scaling(models, args.rounds, not args.no_jax)
    med = medians(samples, "ips")
    summary: dict[str, object] = {"medians_img_per_s_per_worker": med, "efficiency": report_scaling(med)}
    if not args.no_jax:
        summary["backends"] = report_backends(med)
    if not args.no_breakdown:
        summary["breakdown_ms_per_step"] = step_breakdown(models, medians(samples, "callback_ms"))
    if not args.no_table:
        summary["allreduce"] = allreduce_table()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
