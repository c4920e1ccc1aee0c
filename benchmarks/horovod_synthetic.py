"""Horovod-style synthetic benchmark through mldist.horovod: 1 plain process vs 2 workers per engine.

    python benchmarks/horovod_synthetic.py [--rounds 3] [--models cnn,mobilenetv2] [--fp16-allreduce]

Per model (models.py: the README's example CNN at batch 64 on 28x28x1; MobileNetV2 with
weights=None at batch 32 on 64x64x3), hvd_worker.py (a custom loop with
hvd.DistributedGradientTape, timed with timeit) runs with 1 thread per worker in interleaved
rounds (A B C A B C ...) so drift hits every configuration alike; medians are reported:

  plain    one `python hvd_worker.py` process (hvd.size() == 1), pinned to one core: the reference
  mpi      `mldist run -n 2 --communication mpi`: the MPI engine
  ring     `mldist run -n 2 --communication ring`: TensorFlow's gRPC collectives

Printed per model: images/s per worker and in total, and the per-worker ratio over plain
(weak-scaling efficiency: 1.0 means the second worker and the averaging cost nothing).
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
WORKER = [PY, str(HERE / "hvd_worker.py")]
STEPS = {
    "cnn": ["--num-warmup-batches", "20", "--num-batches-per-iter", "20", "--num-iters", "10"],
    "mobilenetv2": ["--num-warmup-batches", "5", "--num-batches-per-iter", "5", "--num-iters", "6"],
}
ONE = {"MLDIST_CPUS_PER_TASK": "1", "OMP_NUM_THREADS": "1"}
CONFIGS = ("plain", "mpi", "ring")
LABELS = {"plain": "plain, 1 process", "mpi": "mldist run -n 2, MPI", "ring": "mldist run -n 2, RING"}


def _env() -> dict[str, str]:
    prefixes = ("MLDIST_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "TF_CONFIG", "TF_USE_LEGACY_KERAS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    return env | {"TF_CPP_MIN_LOG_LEVEL": "2"} | ONE


def command(config: str, model: str, fp16: bool) -> list[str]:
    """The command line of one configuration."""
    args = ["--model", model, *STEPS[model], *(["--fp16-allreduce"] if fp16 else [])]
    if config == "plain":
        return [*WORKER, *args, "--one-core"]
    launch = [PY, "-m", "mldist", "run", "-n", "2", "--communication", config, "--cpu-bind", "cores", "--"]
    return [*launch, *WORKER, *args]


def run(cmd: list[str]) -> list[float]:
    """Images per second of every worker of one run, by rank."""
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    if res.returncode:
        raise SystemExit(f"benchmark run failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}")
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in res.stdout.splitlines() if "RESULT " in line]
    return [float(r["img_per_sec"]) for r in sorted(rows, key=lambda r: int(r["rank"]))]


def measure(models: list[str], rounds: int, fp16: bool) -> dict[str, dict[str, dict[str, float]]]:
    """Median images/s per worker and in total, per model and configuration, over interleaved rounds."""
    per: dict[str, dict[str, list[float]]] = {m: {c: [] for c in CONFIGS} for m in models}
    total: dict[str, dict[str, list[float]]] = {m: {c: [] for c in CONFIGS} for m in models}
    for r in range(rounds):
        for model in models:
            for config in CONFIGS:
                ips = run(command(config, model, fp16))
                per[model][config].append(sum(ips) / len(ips))
                total[model][config].append(sum(ips))
                print(
                    f"round {r + 1} {model:12s} {config:6s} {per[model][config][-1]:9.1f} img/s per worker, "
                    f"{total[model][config][-1]:9.1f} in total ({len(ips)} worker(s))",
                    flush=True,
                )
    return {
        m: {c: {"per_worker": statistics.median(per[m][c]), "total": statistics.median(total[m][c])} for c in CONFIGS}
        for m in models
    }


def report(med: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Print the medians and the per-worker ratios over the plain process; the ratios."""
    ratios: dict[str, dict[str, float]] = {}
    for model, m in med.items():
        base = m["plain"]["per_worker"]
        ratios[model] = {c: m[c]["per_worker"] / base for c in ("mpi", "ring")}
        print(f"\n{model}: medians, 1 thread per worker")
        print(f"  {'':24s} {'img/s per worker':>17s} {'img/s total':>12s} {'per worker / plain':>19s}")
        for config, label in LABELS.items():
            ratio = m[config]["per_worker"] / base
            print(f"  {label:24s} {m[config]['per_worker']:17.1f} {m[config]['total']:12.1f} {ratio:19.3f}")
        print(f"  MPI / RING per worker: {m['mpi']['per_worker'] / m['ring']['per_worker']:.2f}x")
    return ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default="cnn,mobilenetv2")
    p.add_argument("--fp16-allreduce", action="store_true", help="workers send gradients as float16")
    args = p.parse_args()
    med = measure(args.models.split(","), args.rounds, args.fp16_allreduce)
    summary = {"medians_img_per_s": med, "per_worker_over_plain": report(med), "fp16_allreduce": args.fp16_allreduce}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
