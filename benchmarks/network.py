"""Data-parallel training across 2 test hosts over a shaped link, side by side in one run.

    sudo python benchmarks/network.py [--rate none,10gbit,1gbit] [--models cnn,mobilenetv2]
                                      [--rounds 3] [--compression bf16] [--horovod /tmp/hvd/venv]
                                      [--backends tf,jax] [--ranks-per-host 1,2,4 [--fit]]

The hosts are the project's own (scripts/test-hosts.sh: network namespaces hx1 and hx2 on a
private bridge, each with an sshd); the script starts them if they do not answer and stops
what it started. Each rate shapes both hosts' eth0 (egress, so each direction of the link) with
``tc qdisc replace dev eth0 root tbf rate R burst 256kb latency 200ms`` inside the host's
namespace (netem is not in every kernel; tbf is); ``none`` leaves the link as it is (a veth
pair, gigabytes per second). The shaping is removed after each rate, on Ctrl-C, SIGTERM or a
failure too. Needs root (namespaces, tc).

Per model (models.py: the example CNN at batch 64 on 28x28x1; MobileNetV2, weights=None, batch 32
on 64x64x3) and rate, 1 worker per host, 1 thread per worker, each worker pinned to its own core
(rank r to CPU r: the two "hosts" share this machine's cores), interleaved rounds (medians); a
run's figure is its slower rank's images/s, the pace a synchronous job moves at:

  compute     `mldist run -H hx1:1,hx2:1` of bench_worker.py's ``compute`` mode: the same processes,
              callbacks and hosts with the all-reduce replaced by an identity (a plain optimizer;
              each rank applies its own gradient): compute alone, the ceiling
  mldist      bench_worker.py ``mldist``: Keras fit, DistributedOptimizer defaults (MPI engine)
  mldist+C    the same with DistributedOptimizer(compression=C), C from --compression (bf16)
  prototype   bench_worker.py ``proto``: plain Keras and one MPI Allreduce of the concatenated
              gradient in a numpy_function (the bare mpi4py prototype)
  mldist hvd  hvd_worker.py through mldist.horovod (a tf.function step, DistributedGradientTape)
  Horovod     the same hvd_worker.py on Horovod 0.28.1 itself (--horovod: its venv, built with
              ../shared/recipes/horovod-0.28.1; its own mpirun over the same hosts, its defaults)

Keras 3 on JAX (``--backends jax``, or ``tf,jax`` for both; KERAS_BACKEND=jax, the same worker and
hosts):

  jax compute  bench_worker.py ``plain`` under the same launcher: each rank trains alone (no group)
  jax          bench_worker.py ``mldist``: Keras's DataParallel, XLA's all-reduce over Gloo

XLA compiles the step whole: its CPU pipeline merges every gradient's all-reduce into one
(``cpu-all-reduce-combiner``) scheduled after the backward pass, and runs collectives in the
step's own thread, so on CPUs the transfer adds to the step; JAX's rows are printed over JAX's
compute alone and, with ``none`` among the rates, over JAX unshaped.

The overlap bound, per model and rate, as images/s: batch / max(compute + first, transfer),
where compute is the compute run's step time, transfer = W x 8 / rate with W the bytes each host
sends per step for one float32 all-reduce of the gradient, and first = the same for the bucket that
holds the first layers' gradients (mldist's plan_buckets at its default bucket size, backprop
order): it is produced last, so its transfer follows all compute, and the link cannot carry the
whole transfer faster than its rate. Open MPI's all-reduce of n
bytes on 2 ranks (ring or Rabenseifner: a reduce-scatter of halves, then an allgather of halves)
sends n/2 + n/2 = n bytes each way per host; W is measured on the wire (eth0's sent bytes over
the timed steps of the prototype, TCP/IP headers included), and printed beside n. Unshaped,
the bound is compute alone.

The table: per model and rate, images/s per worker of each run; in brackets the ratio over
compute alone, then over the bound; then mldist/Horovod, both on hvd_worker.py (the same program).

Several ranks per host (``--ranks-per-host R``, e.g. ``1,2,4``): instead of the table above, per rate,
model and R, the all-reduce of the model's gradient size (bench_worker.py ``allreduce``: mldist.allreduce
in a tf.function, 8 timed after 2 warm-ups, the slower rank's mean) on ``-H hx1:R,hx2:R``,
flat (``MLDIST_HIERARCHICAL=0``) and hierarchical (``=1``: reduce-scatter on the host, one all-reduce
per local rank across the hosts, allgather on the host) side by side, with the per-node bound: n bytes
each way per host at the link's rate (what crosses a host's link in tiers) plus the on-node all-reduce
measured alone (``-H hx1:R``: what the on-node steps cost together), and the default (``auto``: tiers
with R not a power of two, else flat; placement.hierarchy.tiers) over R=1's flat. ``--fit`` adds Keras
fit (bench_worker.py ``mldist``) flat and hierarchical with compute alone, images/s per worker, over the bound
batch / max(compute, transfer + on-node). R ranks on a host share the machine's cores (rank r pinned to
CPU r mod cores), so on the 2-core VM the compute-bound runs are slower than on real nodes.

A round takes about 5 minutes per rate (both models, 6 runs each, on the 2-core VM); Horovod's
column needs its venv (``--horovod none`` leaves it out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from horovod_synthetic import STEPS as HVD_STEPS
from throughput import ONE, PY, STEPS, WORKER, _env, _rows

from mldist.placement import hierarchy
from mldist.runtime.collect.buckets import DEFAULT_BUCKET_BYTES, WIRE_DTYPES, plan_buckets

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HOSTS_SCRIPT = ROOT / "scripts" / "test-hosts.sh"
HOSTS = "hx1:1,hx2:1"
NAMESPACES = ("mld-hx1", "mld-hx2")  # test-hosts.sh's names for hx1 and hx2
SUBNET = os.environ.get("MLDIST_HOSTS_NET", "172.31.77") + ".0/24"  # test-hosts.sh's bridge
HVD_WORKER = HERE / "hvd_worker.py"
PIN = ["--one-core", "--core", "rank"]  # each rank its own core, before TensorFlow starts
BATCHES = {"cnn": 64, "mobilenetv2": 32}  # models.py's defaults (bench_worker and hvd_worker use them)
UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
RATE = re.compile(r"([1-9][0-9]{0,5})(kbit|mbit|gbit)")
GOALS = (
    "goals (issue 49, 1gbit): MobileNetV2 mldist >= 0.85 of the bound, bf16 >= 0.9 of compute; CNN >= 0.9 of compute"
)


def fail(message: str) -> None:
    """One error line on stderr, exit code 2."""
    print(f"network.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_rates(text: str) -> list[str]:
    """``none,10gbit,1gbit`` -> the rates in order ("none": unshaped).

    Example:
        >>> parse_rates("none,1gbit")
        ['none', '1gbit']
    """
    rates = [r.strip() for r in text.split(",")]
    for r in rates:
        if r != "none" and not RATE.fullmatch(r):
            fail(f"--rate {text!r}: {r!r} is not a rate; write tc rates such as 1gbit,10gbit,500mbit, or none")
    if len(set(rates)) != len(rates):
        fail(f"--rate {text!r} names a rate twice; name each once")
    return rates


def bits_per_second(rate: str) -> float:
    """``1gbit`` -> 1e9; ``none`` -> infinity.

    Example:
        >>> bits_per_second("500mbit")
        500000000.0
    """
    m = RATE.fullmatch(rate)
    return float("inf") if m is None else int(m[1]) * UNITS[m[2]]


def _ip_netns(ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)


def unshape() -> None:
    """Remove any root qdisc from both hosts' eth0 (nothing there is fine)."""
    for ns in NAMESPACES:
        _ip_netns(ns, "tc", "qdisc", "del", "dev", "eth0", "root")


@contextlib.contextmanager
def shaped(rate: str) -> Iterator[None]:
    """Both hosts' eth0 at ``rate`` (tbf) inside the block, unshaped after it, whatever happens."""
    try:
        shape(rate)
        yield
    finally:
        unshape()


def shape(rate: str) -> None:
    """Both hosts' eth0 at ``rate`` (tbf); nothing for "none"."""
    if rate != "none":
        for ns in NAMESPACES:
            tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "200ms"]
            res = _ip_netns(ns, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf)
            if res.returncode:
                fail(f"tc in {ns} refused rate {rate!r}: {res.stderr.strip()}")


@contextlib.contextmanager
def test_hosts() -> Iterator[str]:
    """The ssh config of hx1 and hx2; starts them unless they answer, and stops only what it started."""
    up = subprocess.run(["bash", str(HOSTS_SCRIPT), "status"], capture_output=True, timeout=60).returncode == 0
    started = False
    try:
        if not up:
            res = subprocess.run(["bash", str(HOSTS_SCRIPT), "start"], capture_output=True, text=True, timeout=900)
            if res.returncode:
                fail(f"scripts/test-hosts.sh start failed: {res.stderr.strip().splitlines()[-1:]}")
            started = True
        yield str(Path(os.environ.get("MLDIST_HOSTS_DIR", "/tmp/mldist-hosts")) / "ssh_config")
    finally:
        if started:
            subprocess.run(["bash", str(HOSTS_SCRIPT), "stop"], capture_output=True, timeout=120)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the launcher's process group (mldist run and mpirun stop their ranks), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)


def launch(cmd: list[str], env: dict[str, str], ranks: int = 2) -> list[dict[str, object]]:
    """Run one launcher command to its end; every RESULT row its ``ranks`` print (stopped if this script stops)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        _stop(proc)
    rows = _rows(out)
    if proc.returncode or len(rows) != ranks:
        fail(
            f"run failed (exit code {proc.returncode}, {len(rows)} of {ranks} results): {' '.join(cmd)}\n{err[-2000:]}"
        )
    return rows


def configs(model: str, compression: str, horovod: str, backends: tuple[str, ...] = ("tf",)) -> dict[str, list[str]]:
    """Name -> launcher command of each run of ``model`` across the two hosts."""
    mldist = [PY, "-m", "mldist", "run", "-H", HOSTS, "--no-run-dir", "--"]
    args = ["--model", model, *STEPS[model], "--threads", "1", *PIN, "--wire", "eth0"]
    out: dict[str, list[str]] = {}
    if "jax" in backends:  # mldist run -H hands KERAS_BACKEND to every host's worker
        jax = ["env", "KERAS_BACKEND=jax", *mldist, *WORKER]
        out |= {"jax compute": [*jax, "plain", *args], "jax": [*jax, "mldist", *args]}
    if "tf" not in backends:
        return out
    hvd_args = [str(HVD_WORKER), "--model", model, *HVD_STEPS[model], *PIN]
    out |= {
        "compute": [*mldist, *WORKER, "compute", *args],
        "mldist": [*mldist, *WORKER, "mldist", *args],
        f"mldist {compression}": [*mldist, *WORKER, "mldist", *args, "--compression", compression],
        "prototype": [*mldist, *WORKER, "proto", *args],
        "mldist hvd": [*mldist, PY, *hvd_args],
    }
    if horovod != "none":
        venv = Path(horovod)
        forward = [
            w for name in ("PATH", "OMP_NUM_THREADS", "TF_CPP_MIN_LOG_LEVEL", "PYTHONUNBUFFERED") for w in ("-x", name)
        ]
        mpirun = [str(venv / "bin" / "mpirun"), "-n", "2", "--host", HOSTS, "--bind-to", "none", *forward]
        out["Horovod"] = [*mpirun, str(venv / "bin" / "python"), *hvd_args, "--horovod"]
    return out


def env_for(ssh_config: str, runs: str, horovod: str) -> dict[str, str]:
    """The launchers' environment: one thread per worker, the hosts' ssh, MPI over their bridge."""
    env = _env(ONE) | {
        "PRTE_MCA_plm_ssh_agent": f"ssh -F {ssh_config}",  # mpiexec's way to the hosts (both launchers)
        "MLDIST_RUNS_DIR": runs,  # RunLog's folder, away from the checkout
        "MLDIST_PLOT": "0",
        "PYTHONUNBUFFERED": "1",
    }
    if horovod != "none":  # Horovod's mpirun: the settings mldist run -H gives its own (launch/remote.py)
        env |= {
            "OMPI_MCA_btl": "^ofi",
            "OMPI_MCA_btl_tcp_if_include": SUBNET,
            "PRTE_MCA_oob_tcp_if_include": SUBNET,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
    return env


Samples = dict[str, dict[str, dict[str, list[float]]]]  # model -> rate -> config -> images/s per round


class Wire:
    """Per model: its variables' bytes, and per run the bytes the busier host sent per step (every sample)."""

    def __init__(self) -> None:
        self.sizes: dict[str, list[int]] = {}
        self.sent: dict[str, dict[str, list[float]]] = {}

    def add(self, model: str, name: str, rows: list[dict[str, object]]) -> None:
        if "wire_bytes_per_step" in rows[0]:
            self.sizes[model] = [int(n) for n in rows[0]["variable_bytes"]]  # type: ignore[attr-defined]
            # The host that sends more sets the transfer time (its egress is shaped).
            sent = max(float(r["wire_bytes_per_step"]) for r in rows)  # type: ignore[arg-type]
            self.sent.setdefault(model, {}).setdefault(name, []).append(sent)


def images_per_second(rows: list[dict[str, object]]) -> float:
    """The slowest rank's images/s of one run's rows (bench_worker's and hvd_worker's keys).

    A synchronous job moves at its slowest worker's pace, so that is what compute alone (ranks
    that never wait for each other) can promise it: unsynchronized, the two pinned ranks here
    differed by up to 10 %. In a synchronous run the ranks' figures agree to 0.1 %.
    """
    return min(float(r.get("images_per_second", r.get("img_per_sec", 0.0))) for r in rows)  # type: ignore[arg-type]


def measure(
    models: list[str],
    rates: list[str],
    rounds: int,
    compression: str,
    horovod: str,
    ssh_config: str,
    backends: tuple[str, ...] = ("tf",),
) -> tuple[Samples, Wire]:
    """Images/s per worker of every run, round after round (rates and models interleaved), and the wire facts."""
    samples: Samples = {m: {r: {} for r in rates} for m in models}
    wire = Wire()
    runs = {m: configs(m, compression, horovod, backends) for m in models}
    with tempfile.TemporaryDirectory(prefix="mldist-network-") as run_dirs:
        env = env_for(ssh_config, run_dirs, horovod)
        for rnd in range(1, rounds + 1):
            began = time.monotonic()
            for rate in rates:
                with shaped(rate):
                    for model, name, cmd in [(m, n, c) for m in models for n, c in runs[m].items()]:
                        t0 = time.monotonic()
                        rows = launch(cmd, env)
                        ips = images_per_second(rows)
                        samples[model][rate].setdefault(name, []).append(ips)
                        wire.add(model, name, rows)
                        took = time.monotonic() - t0
                        print(
                            f"round {rnd} {rate:>7s} {model:12s} {name:12s} {ips:9.1f} img/s per worker ({took:.0f} s)"
                        )
            print(f"round {rnd} took {time.monotonic() - began:.0f} s", flush=True)
    return samples, wire


def first_bucket_bytes(variable_bytes: list[int], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Bytes of the bucket holding the first variable, with gradients bucketed in backprop order (last first).

    Example:
        >>> first_bucket_bytes([10, 20, 30], 40)
        30
    """
    backprop = [("float32", n) for n in reversed(variable_bytes)]
    last = plan_buckets(backprop, bucket_bytes)[-1]  # the bucket made last holds variable 0
    return sum(backprop[i][1] for i in last.indices)


def bound_ips(batch: int, compute_ips: float, wire_bytes: float, first_bytes: float, bps: float) -> float:
    """Images/s of the overlap bound: batch / max(compute + the first layers' bucket's transfer, transfer).

    That bucket is made when backprop ends, so its transfer follows all compute; the link carries
    every byte at most at its rate, so a step takes at least the whole transfer.

    Example:
        >>> round(bound_ips(32, 100.0, 1.25e6, 0.125e6, 1e8), 1)  # compute 0.32 s; transfer 0.1 s; first 0.01 s
        97.0
        >>> round(bound_ips(64, 1e4, 1.4e6, 1.4e6, 1e9), 1)  # one bucket: compute 6.4 ms + its 11.2 ms
        3636.4
    """
    compute = batch / compute_ips
    return batch / max(compute + first_bytes * 8 / bps, wire_bytes * 8 / bps)


def report_jax(med: dict[str, dict[str, dict[str, float]]]) -> dict[str, object]:
    """Print Keras-on-JAX's rows (over JAX's compute alone, and over JAX unshaped when measured)."""
    print("\nKeras 3 on JAX, images/s per worker (medians; in brackets: over JAX's compute alone / over JAX unshaped)")
    table: dict[str, object] = {}
    for model, rs in med.items():
        unshaped = rs.get("none", {}).get("jax", 0.0)
        for rate, m in rs.items():
            over = f"{m['jax'] / unshaped:.2f}" if unshaped else "-"
            print(f"{model:12s} | {rate:>7s} | jax compute {m['jax compute']:9.1f} | jax {m['jax']:9.1f} "
                  f"({m['jax'] / m['jax compute']:.2f}/{over})")  # fmt: skip
            table[f"{model}/{rate}"] = {"jax compute": m["jax compute"], "jax": m["jax"]}
    return table


def report(samples: Samples, wire: Wire, horovod: str) -> dict[str, object]:
    """Print the wire facts and the side-by-side table(s); everything as one dict."""
    med = {m: {r: {n: statistics.median(v) for n, v in c.items()} for r, c in rs.items()} for m, rs in samples.items()}
    jax = {m: {r: {n: v for n, v in c.items() if n.startswith("jax")} for r, c in rs.items()} for m, rs in med.items()}
    med = {
        m: {r: {n: v for n, v in c.items() if not n.startswith("jax")} for r, c in rs.items()} for m, rs in med.items()
    }
    out: dict[str, object] = {"jax": report_jax(jax)} if any(c for rs in jax.values() for c in rs.values()) else {}
    if not any(c for rs in med.values() for c in rs.values()):  # --backends jax
        return out
    facts: dict[str, dict[str, float]] = {}
    print(f"\nbytes the busier host sends per step (eth0, timed steps); bucket size {DEFAULT_BUCKET_BYTES:,} B")
    for model, sizes in wire.sizes.items():
        sent = {n: statistics.median(v) for n, v in wire.sent[model].items()}
        facts[model] = {"gradient_bytes": sum(sizes), "first_bucket_bytes": first_bucket_bytes(sizes)} | sent
        said = ", ".join(f"{n} {b / 1e6:.3f} MB" for n, b in sent.items())
        print(f"  {model}: gradient {sum(sizes) / 1e6:.3f} MB (Open MPI, 2 ranks: n each way), first layers' bucket "
              f"{facts[model]['first_bucket_bytes'] / 1e6:.3f} MB; sent: {said}")  # fmt: skip
    names = [n for n in next(iter(next(iter(med.values())).values())) if n != "compute"]
    print("\nimages/s per worker, 2 hosts x 1 thread each (medians; in brackets: over compute alone / over the bound)")
    head = ["model", "rate", "compute", "bound", *names]
    widths = [12, 7, 9, 9] + [22] * len(names)
    print(" | ".join(f"{h:{'<' if h == 'model' else '>'}{w}s}" for h, w in zip(head, widths, strict=True)), end="")
    print(" | same program | fit/Horovod")
    table: dict[str, object] = {}
    for model, rs in med.items():
        for rate, m in rs.items():
            bps, f = bits_per_second(rate), facts[model]
            bound = bound_ips(BATCHES[model], m["compute"], f["prototype"], f["first_bucket_bytes"], bps)
            cells = [f"{m['compute']:9.1f}", f"{bound:9.1f}"]
            cells += [f"{m[n]:10.1f} ({m[n] / m['compute']:.2f}/{m[n] / bound:.2f})" for n in names]
            # mldist over Horovod: hvd_worker.py on each (the same program), and mldist's fit over it
            same, fit = (m["mldist hvd"] / m["Horovod"], m["mldist"] / m["Horovod"]) if "Horovod" in m else (0.0, 0.0)
            print(f"{model:12s} | {rate:>7s} | " + " | ".join(cells) + f" | {same:11.2f}x | {fit:10.2f}x")
            ratios = {"mldist_over_horovod_same_program": same, "mldist_fit_over_horovod": fit}
            table[f"{model}/{rate}"] = m | {"bound": bound} | ratios
    print(GOALS)
    return out | {"medians_img_per_s_per_worker": table, "wire": facts, "horovod": horovod}


#: Per-R runs of one model: name -> (MLDIST_HIERARCHICAL, hosts, bench_worker mode); ``{r}`` is R.
TIER_RUNS = {
    "on-node": ("0", "hx1:{r}", "allreduce"),
    "flat": ("0", "hx1:{r},hx2:{r}", "allreduce"),
    "tiers": ("1", "hx1:{r},hx2:{r}", "allreduce"),
}
TIER_FITS = {
    "fit compute": ("0", "hx1:{r},hx2:{r}", "compute"),
    "fit flat": ("0", "hx1:{r},hx2:{r}", "mldist"),
    "fit tiers": ("1", "hx1:{r},hx2:{r}", "mldist"),
}
TIER_STEPS = ["--steps", "8", "--warmup", "2"]  # the all-reduce: 8 timed after 2 warm-ups
TIER_GOALS = (
    "goals (issue 65, 1gbit, R=2): 1.4 MB (cnn) all-reduce, the default path, within 1.2x of R=1's flat; "
    "MobileNetV2 fit >= 0.9 of the per-node bound and >= 1.3x flat"
)


def parse_ranks(text: str) -> list[int]:
    """``1,2,4`` -> ranks per host, each 1 to 8.

    Example:
        >>> parse_ranks("1,2")
        [1, 2]
    """
    found = [r.strip() for r in text.split(",")]
    if not all(re.fullmatch(r"[1-8]", r) for r in found) or len(set(found)) != len(found):
        fail(f"--ranks-per-host {text!r}: give ranks per host from 1 to 8, comma-separated, each once (e.g. 1,2,4)")
    return [int(r) for r in found]


def tier_configs(model: str, r: int, fit: bool) -> dict[str, tuple[list[str], int]]:
    """Name -> (launcher command, ranks) of each run of ``model`` with ``r`` ranks per host."""
    runs = TIER_RUNS | (TIER_FITS if fit else {})
    out: dict[str, tuple[list[str], int]] = {}
    for name, (switch, hosts, mode) in runs.items():
        if r == 1 and name in ("on-node", "tiers", "fit tiers"):  # one rank per host: tiers are the flat path
            continue
        steps = TIER_STEPS if mode == "allreduce" else STEPS[model]
        args = ["--model", model, *steps, "--threads", "1", *PIN]
        host_list = hosts.format(r=r)
        cmd = ["env", f"MLDIST_HIERARCHICAL={switch}", PY, "-m", "mldist", "run", "-H", host_list, "--no-run-dir"]
        out[name] = ([*cmd, "--", *WORKER, mode, *args], r * host_list.count(":"))
    return out


def launch_again(cmd: list[str], env: dict[str, str], ranks: int, rate: str, tries: int = 3) -> list[dict[str, object]]:
    """:func:`launch`, again (up to ``tries`` times) when a run fails: the test hosts are shared, and other
    users' tests stop, freeze or restart them. Before each new try the hosts are started if they do not
    answer and shaped again (a restarted host comes back unshaped); each retry is said in one line."""
    for attempt in range(1, tries + 1):
        try:
            return launch(cmd, env, ranks)
        except SystemExit:
            if attempt == tries:
                raise
            print(f"network.py: run failed (try {attempt} of {tries}); starting the hosts if needed, trying again")
            subprocess.run(["bash", str(HOSTS_SCRIPT), "start"], capture_output=True, timeout=900)
            shape(rate)
    raise AssertionError("unreachable")


def tier_value(name: str, rows: list[dict[str, object]]) -> float:
    """A tier run's figure: the slower rank's all-reduce ms, or its images/s for a fit."""
    if name.startswith("fit"):
        return images_per_second(rows)
    return max(float(row["allreduce_ms"]) for row in rows)  # type: ignore[arg-type]


def measure_tiers(
    models: list[str], rates: list[str], ranks: list[int], rounds: int, fit: bool, ssh_config: str
) -> tuple[dict[str, dict[str, float]], dict[str, list[float]]]:
    """Medians per ``model/rate/R`` of every tier run, and each model's gradient bytes."""
    samples: dict[str, dict[str, list[float]]] = {}
    grads: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="mldist-network-") as run_dirs:
        env = env_for(ssh_config, run_dirs, "none")
        for rnd in range(1, rounds + 1):
            for rate in rates:
                with shaped(rate):
                    for model, r in [(m, r) for m in models for r in ranks]:
                        for name, (cmd, n) in tier_configs(model, r, fit).items():
                            rows = launch_again(cmd, env, n, rate)
                            value = tier_value(name, rows)
                            samples.setdefault(f"{model}/{rate}/{r}", {}).setdefault(name, []).append(value)
                            if "gradient_bytes" in rows[0]:
                                grads[model] = [float(rows[0]["gradient_bytes"])]  # type: ignore[arg-type]
                            print(f"round {rnd} {rate:>7s} {model:12s} R={r} {name:12s} {value:9.2f}")
    return {k: {n: statistics.median(v) for n, v in c.items()} for k, c in samples.items()}, grads


def report_tiers(med: dict[str, dict[str, float]], grads: dict[str, list[float]]) -> dict[str, object]:
    """Print the flat and hierarchical all-reduce (and fit) side by side with the per-node bound."""
    print("\nall-reduce of the gradient, ms (slower rank; in brackets: over the per-node bound), 2 hosts x R ranks")
    print(f"{'model':12s} | {'rate':>7s} | R | {'MB':>6s} | {'link':>7s} | {'on-node':>7s} | {'bound':>7s} | "
          f"{'flat':>14s} | {'tiers':>14s} | flat/tiers | tiers/R=1 | default/R=1")  # fmt: skip
    table: dict[str, object] = {}
    for key, m in med.items():
        model, rate, r = key.split("/")
        nbytes = grads[model][0]
        link = nbytes * 8 / bits_per_second(rate) * 1e3  # n each way per host, the leaders' all-reduce
        bound = link + m.get("on-node", 0.0)
        tiers = m.get("tiers", m["flat"])  # R=1: the flat path is the tiered one
        one = med.get(f"{model}/{rate}/1", {}).get("flat", 0.0)
        over_one = f"{tiers / one:9.2f}x" if one else f"{'-':>10s}"
        auto = hierarchy.tiers("auto", 2, int(r)).on  # what MLDIST_HIERARCHICAL unset takes on these hosts
        default = f"{(tiers if auto else m['flat']) / one:5.2f}x ({'tiers' if auto else 'flat'})" if one else "-"
        print(f"{model:12s} | {rate:>7s} | {r} | {nbytes / 1e6:6.2f} | {link:7.1f} | {m.get('on-node', 0.0):7.1f} | "
              f"{bound:7.1f} | {m['flat']:7.1f} ({m['flat'] / bound:4.2f}) | {tiers:7.1f} ({tiers / bound:4.2f}) | "
              f"{m['flat'] / tiers:9.2f}x | {over_one} | {default}")  # fmt: skip
        table[key] = m | {"bound_ms": bound, "link_ms": link, "gradient_bytes": nbytes}
    fits = {k: m for k, m in med.items() if "fit flat" in m}
    if fits:
        print("\nfit, images/s per worker (slower rank; in brackets: over the per-node bound batch / max(compute, "
              "link + on-node))")  # fmt: skip
        for key, m in fits.items():
            model, rate, r = key.split("/")
            step = max(BATCHES[model] / m["fit compute"], table[key]["bound_ms"] / 1e3)  # type: ignore[index]
            bound = BATCHES[model] / step
            tiers = m.get("fit tiers", m["fit flat"])
            print(f"{model:12s} | {rate:>7s} | R={r} | compute {m['fit compute']:8.1f} | bound {bound:8.1f} | "
                  f"flat {m['fit flat']:8.1f} ({m['fit flat'] / bound:.2f}) | tiers {tiers:8.1f} ({tiers / bound:.2f}) "
                  f"| tiers/flat {tiers / m['fit flat']:.2f}x")  # fmt: skip
            table[key] |= {"fit_bound_img_per_s": bound}  # type: ignore[operator]
    print(TIER_GOALS)
    return {"tiers": table}


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # the finally blocks remove the shaping, stop the runs and the hosts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="none", help="tc rates, comma-separated (none: unshaped), e.g. none,10gbit,1gbit")
    p.add_argument("--models", default="cnn,mobilenetv2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compression", default="bf16", help="the compressed mldist run's compression (fp16, bf16)")
    p.add_argument("--horovod", default="/tmp/hvd/venv", help="Horovod 0.28.1's venv, or none to leave it out")
    p.add_argument("--backends", default="tf", help="Keras's backends, comma-separated: tf, jax or tf,jax")
    p.add_argument("--ranks-per-host", default="", help="e.g. 1,2,4: flat and hierarchical all-reduce side by side")
    p.add_argument("--fit", action="store_true", help="with --ranks-per-host: Keras fit flat and hierarchical too")
    args = p.parse_args()
    ranks = parse_ranks(args.ranks_per_host) if args.ranks_per_host else []
    backends = tuple(b.strip() for b in args.backends.split(","))
    if not backends or any(b not in ("tf", "jax") for b in backends) or len(set(backends)) != len(backends):
        fail(f"--backends {args.backends!r}: name tf, jax or both (tf,jax), each once")
    rates = parse_rates(args.rate)
    models = args.models.split(",")
    if unknown := [m for m in models if m not in STEPS]:
        fail(f"--models {args.models!r}: {unknown[0]!r} is not a model; use {','.join(STEPS)}")
    if args.rounds < 1:
        fail(f"--rounds {args.rounds}: give 1 or more")
    if args.compression not in WIRE_DTYPES:  # before the hosts start: a typo must not cost a round of every run
        fail(f"--compression {args.compression!r} is not a compression; use {' or '.join(WIRE_DTYPES)}")
    horovod_missing = not (Path(args.horovod) / "bin" / "mpirun").exists()
    if not ranks and "tf" in backends and args.horovod != "none" and horovod_missing:
        fail(f"--horovod {args.horovod!r} has no bin/mpirun: build it (WORK=/tmp/hvd bash ../shared/recipes/"
             "horovod-0.28.1/build.sh), or --horovod none")  # fmt: skip
    if os.geteuid() != 0:
        fail("needs root (the test hosts' namespaces and tc); run it with sudo")
    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a background job may have inherited it ignored
        signal.signal(sig, _on_term)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # each run's line as it ends
    if ranks:
        with test_hosts() as ssh_config:
            unshape()
            med, grads = measure_tiers(models, rates, ranks, args.rounds, args.fit, ssh_config)
        print(json.dumps(report_tiers(med, grads)))
        return
    with test_hosts() as ssh_config:
        unshape()  # a run killed with SIGKILL may have left its shaping
        samples, wire = measure(models, rates, args.rounds, args.compression, args.horovod, ssh_config, backends)
    print(json.dumps(report(samples, wire, args.horovod)))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the shaping and the hosts it started are gone by now
        print("network.py: interrupted; the links are unshaped and the runs stopped", file=sys.stderr)
        raise SystemExit(130) from None
