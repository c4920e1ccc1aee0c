"""Weak scaling of mldist's CPU engines, side by side in one run, and an all-reduce table.

    python benchmarks/throughput.py [--rounds 3] [--models cnn,mobilenetv2] [--no-table]

Per model (the README's example CNN at batch 64 on 28x28x1; MobileNetV2 with weights=None
at batch 32 on 64x64x3), 1 thread per worker, interleaved rounds (A B C D A B C D ...) so
drift hits every configuration alike, medians reported:

  alone    one mldist worker, pinned to one core: the reference
  apart    two plain Keras processes at once, one per core, no communication (the ceiling)
  ring     `mldist run -n 2 --communication ring`: TensorFlow's gRPC collectives
  mpi      `mldist run -n 2 --communication mpi`: the MPI engine

Efficiency = per-worker images/s over alone. Goals (MPI engine issue): mpi >= 0.85 on the
CNN and >= 0.82 on MobileNetV2, and mpi >= 1.3x ring on the CNN. The CNN also runs plain
Keras and 1 mldist worker with all cores (goal: mldist >= 0.97 of plain). The table times
mldist.allreduce on 2 workers from 4 B to 64 MB on both engines and raw mpi4py Allreduce
on numpy arrays (goal: the MPI engine within 20% of raw from 1 MB up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
WORKER = [PY, str(HERE / "bench_worker.py")]
STEPS = {"cnn": ["--steps", "200", "--warmup", "20"], "mobilenetv2": ["--steps", "30", "--warmup", "5"]}
ONE = {"MLDIST_CPUS_PER_TASK": "1", "OMP_NUM_THREADS": "1"}
GOALS = {"cnn": 0.85, "mobilenetv2": 0.82}


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


def configs(model: str, cores: int) -> dict[str, tuple[list[list[str]], dict[str, str]]]:
    """Name -> (commands run at once, environment) for one model."""
    args = ["--model", model, *STEPS[model], "--threads", "1"]

    def two(engine: str) -> list[str]:
        return [PY, "-m", "mldist", "run", "-n", "2", "--communication", engine, "--cpu-bind", "cores", "--", *WORKER]

    out = {
        "alone": ([[*WORKER, "mldist", *args, "--one-core"]], ONE),
        "apart": ([[*WORKER, "plain", *args, "--one-core", "--core", str(c)] for c in (0, 1)], ONE),
        "ring": ([[*two("ring"), "mldist", *args]], ONE),
        "mpi": ([[*two("mpi"), "mldist", *args]], ONE),
    }
    if model == "cnn":  # mldist's own cost with one worker, all cores
        full = ["--model", model, *STEPS[model], "--threads", str(cores)]
        out["plain, all cores"] = ([[*WORKER, "plain", *full]], {})
        out["mldist 1 worker, all cores"] = ([[*WORKER, "mldist", *full]], {})
    return out


def weak_scaling(models: list[str], rounds: int) -> dict[str, dict[str, float]]:
    """Median per-worker images/s per model and configuration, interleaved rounds."""
    cores = len(os.sched_getaffinity(0))
    table = {m: configs(m, cores) for m in models}
    samples: dict[str, dict[str, list[float]]] = {m: {name: [] for name in table[m]} for m in models}
    for r in range(rounds):
        for model in models:
            for name, (cmds, extra) in table[model].items():
                ips = [float(row["images_per_second"]) for row in run(cmds, extra)]  # type: ignore[arg-type]
                samples[model][name].append(sum(ips) / len(ips))
                print(f"round {r + 1} {model:12s} {name:28s} {samples[model][name][-1]:9.1f} img/s per worker")
    return {m: {name: statistics.median(v) for name, v in s.items()} for m, s in samples.items()}


def report_scaling(med: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for model, m in med.items():
        eff = {name: m[name] / m["alone"] for name in ("apart", "ring", "mpi")}
        out[model] = eff | {"mpi_over_ring": m["mpi"] / m["ring"]}
        goal = GOALS[model]
        print(f"\n{model}: per-worker images/s over one worker alone (medians; alone {m['alone']:.1f} img/s)")
        print(f"  cores alone (2 apart) {eff['apart']:.3f}   RING {eff['ring']:.3f}   MPI {eff['mpi']:.3f}")
        verdict = "met" if eff["mpi"] >= goal else "MISSED"
        print(f"  MPI engine goal >= {goal}: {verdict};  MPI / RING throughput {m['mpi'] / m['ring']:.2f}x", end="")
        print(f" (goal >= 1.3x: {'met' if m['mpi'] / m['ring'] >= 1.3 else 'MISSED'})" if model == "cnn" else "")
        if "plain, all cores" in m:
            ratio = m["mldist 1 worker, all cores"] / m["plain, all cores"]
            out[model]["one_worker_over_plain"] = ratio
            print(f"  1 mldist worker / plain Keras, all cores: {ratio:.3f} (goal >= 0.97)")
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
    args = p.parse_args()
    med = weak_scaling(args.models.split(","), args.rounds)
    summary: dict[str, object] = {"medians_img_per_s_per_worker": med, "efficiency": report_scaling(med)}
    if not args.no_table:
        summary["allreduce"] = allreduce_table()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
