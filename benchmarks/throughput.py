"""Throughput of mldist against plain Keras, measured side by side in one run.

    python benchmarks/throughput.py [--repeats 3] [--steps 60]

Goals (issue: training engine): 1 worker with mldist >= 0.97 of plain Keras fit;
2 workers x 1 thread >= 0.90 weak-scaling efficiency against 1 worker x 1 thread.
Configurations are interleaved (A B C D A B C D ...) so drift hits all of them alike;
the median of the repeats is reported.
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
APART = "plain, 2 processes x 1 thread apart"


def run_rows(cmd: list[str], env_extra: dict[str, str]) -> list[dict[str, float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLDIST_", "SLURM_", "OMPI_", "PMI_"))}
    env.update(env_extra)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"benchmark run failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}")
    return [json.loads(line.split("RESULT ", 1)[1]) for line in res.stdout.splitlines() if "RESULT " in line]


def measure(cmd: list[str], env_extra: dict[str, str]) -> list[float]:
    return [float(r["images_per_second"]) for r in run_rows(cmd, env_extra)]


def measure_apart(cmds: list[list[str]], env_extra: dict[str, str]) -> list[float]:
    """Independent processes at the same time (no communication): what the cores give."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLDIST_", "SLURM_", "OMPI_", "PMI_"))}
    env.update(env_extra)
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) for c in cmds]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"benchmark run failed: {cmds[0]}")
    return [
        float(json.loads(line.split("RESULT ", 1)[1])["images_per_second"])
        for o in outs
        for line in o.splitlines()
        if "RESULT " in line
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    worker = [PY, str(HERE / "bench_worker.py")]
    steps = ["--steps", str(args.steps)]
    cores = len(os.sched_getaffinity(0))
    one = {"MLDIST_CPUS_PER_TASK": "1", "OMP_NUM_THREADS": "1"}
    configs = {
        "plain, 1 process": ([*worker, "plain", "--threads", str(cores), *steps], {}),
        "mldist, 1 worker": ([*worker, "mldist", "--threads", str(cores), *steps], {}),
        "mldist, 1 worker x 1 thread": ([*worker, "mldist", "--threads", "1", "--one-core", *steps], one),
        "mldist, 2 workers x 1 thread": (
            [
                PY,
                "-m",
                "mldist",
                "run",
                "-n",
                "2",
                "--cpu-bind",
                "cores",
                "--",
                *worker,
                "mldist",
                "--threads",
                "1",
                *steps,
            ],
            one,
        ),
    }
    run2 = [PY, "-m", "mldist", "run", "-n", "2", "--cpu-bind", "cores", "--"]
    configs["mldist, 2 workers x 1 thread, 4-byte collective"] = (
        [*run2, *worker, "mldist-tiny", "--threads", "1", *steps],
        one,
    )
    apart = [[*worker, "plain", "--threads", "1", "--one-core", "--core", str(c), *steps] for c in (0, 1)]
    samples: dict[str, list[float]] = {name: [] for name in [*configs, APART]}
    for rep in range(args.repeats):
        for name, (cmd, env) in [*configs.items(), (APART, ([], one))]:
            ips = measure_apart(apart, env) if name == APART else measure(cmd, env)
            samples[name].append(sum(ips) / len(ips))  # per-worker images/s
            print(f"repeat {rep + 1}: {name:32s} {samples[name][-1]:8.1f} images/s per worker", flush=True)
    med = {name: statistics.median(v) for name, v in samples.items()}
    overhead = med["mldist, 1 worker"] / med["plain, 1 process"]
    weak = med["mldist, 2 workers x 1 thread"] / med["mldist, 1 worker x 1 thread"]
    print()
    print(f"1 worker mldist / plain Keras fit:          {overhead:.3f}  (goal >= 0.97)")
    print(f"weak scaling, 2x1 thread vs 1x1 thread:     {weak:.3f}  (goal >= 0.90)")
    # Where the time goes: the cores alone, a collective's fixed cost, the collective alone.
    solo = med["mldist, 1 worker x 1 thread"]
    print(f"  2 plain processes x 1 thread, apart:      {med[APART] / solo:.3f}  (what the two cores give)")
    tiny = med["mldist, 2 workers x 1 thread, 4-byte collective"]
    print(f"  2 workers, 4-byte collective per step:    {tiny / solo:.3f}  (fixed cost of a collective in the step)")
    (ar, *_) = run_rows([*run2, *worker, "allreduce", "--threads", "1", *steps], one)
    step_1 = 64 / med["mldist, 1 worker x 1 thread"] * 1e3
    step_2 = 64 / med["mldist, 2 workers x 1 thread"] * 1e3
    print()
    print(f"step time, 1 worker x 1 thread:             {step_1:6.2f} ms")
    print(f"step time, 2 workers x 1 thread:            {step_2:6.2f} ms  (+{step_2 - step_1:.2f} ms)")
    print(f"allreduce of the {ar['gradient_bytes'] / 1e6:.2f} MB gradient alone:   {ar['allreduce_ms']:6.2f} ms")
    print(f"allreduce of 4 KB alone (fixed latency):    {ar['tiny_allreduce_ms']:6.2f} ms")
    summary = {"medians_images_per_second_per_worker": med, "ratio_1worker": overhead, "weak_scaling": weak}
    print(json.dumps(summary | {"allreduce": ar, "step_ms_1x1": step_1, "step_ms_2x1": step_2}))


if __name__ == "__main__":
    main()
