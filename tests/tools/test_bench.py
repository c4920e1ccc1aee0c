"""``mldist bench``: its pure parts (flags, statistics, rows, efficiency, output) and one real scaling run."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import check, clean_env, mldist, tail
from mldist.errors import ConfigError, LaunchError
from mldist.tools import bench, bench_output
from mldist.tools.bench import BenchConfig, add_efficiency, format_row, make_row
from mldist.tools.steptime import PARTS

ROW_KEYS = {
    "workers",
    "backend",
    "engine",
    "model",
    "batch",
    "img_per_sec",
    "img_per_sec_per_worker",
    "ci95",
    "efficiency",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_scaling_is_sorted_and_each_count_once() -> None:
    assert bench.parse_scaling("4,1,2,1") == (1, 2, 4)
    assert bench.parse_scaling(" 2 ") == (2,)


@pytest.mark.parametrize("text", ["0", "a", "1,,2", "-1", "1.5", "5000", "", "٣"])
def test_bad_scaling_names_the_bad_item(text: str) -> None:
    with pytest.raises(ConfigError, match="--scaling"):
        bench.parse_scaling(text)


def test_engines_keep_their_order_and_refuse_unknown_ones() -> None:
    assert bench.parse_engines("ring, MPI,ring") == ("ring", "mpi")
    with pytest.raises(ConfigError, match="'nccl' is not one of auto, mpi, ring"):
        bench.parse_engines("mpi,nccl")


def test_models_and_their_smallest_images() -> None:
    bench.check_model("resnet50", 32)
    assert BenchConfig().image == 32 and BenchConfig(model="resnet50").image == 64
    with pytest.raises(ConfigError, match="needs at least 75"):
        BenchConfig(model="inceptionv3", image_size=64)
    with pytest.raises(ConfigError, match="'nosuch' is not known"):
        bench.check_model("nosuch")


def test_worker_args_carry_every_setting() -> None:
    args = BenchConfig(model="mobilenetv2", batch_size=8, warmup=1, iters=2, batches_per_iter=3).worker_args()
    assert args == [
        *("--model", "mobilenetv2", "--batch-size", "8", "--image-size", "64"),
        *("--warmup", "1", "--iters", "2", "--batches-per-iter", "3"),
    ]


def test_mean_and_ci95_as_horovod_prints_them() -> None:
    mean, ci = bench.mean_ci95([90.0, 100.0, 110.0])
    assert mean == pytest.approx(100.0)
    assert ci == pytest.approx(1.96 * (200 / 3) ** 0.5)
    assert bench.mean_ci95([7.0]) == (7.0, 0.0)


def test_rows_pool_every_ranks_iterations() -> None:
    row = make_row(2, "mpi", "cnn", 32, [[100.0, 120.0], [80.0, 100.0]])
    assert set(row) == ROW_KEYS
    assert row["img_per_sec_per_worker"] == pytest.approx(100.0)
    assert row["img_per_sec"] == pytest.approx(200.0)
    assert row["efficiency"] is None


def test_efficiency_is_per_worker_over_one_worker_of_the_same_model_and_batch() -> None:
    rows = add_efficiency(
        [
            make_row(1, "none", "cnn", 32, [[200.0]]),
            make_row(2, "mpi", "cnn", 32, [[180.0], [180.0]]),
            make_row(2, "ring", "cnn", 32, [[150.0], [150.0]]),
            make_row(2, "mpi", "cnn", 64, [[300.0], [300.0]]),  # no 1-worker row at batch 64
        ]
    )
    assert [r["efficiency"] for r in rows] == [pytest.approx(1.0), pytest.approx(0.9), pytest.approx(0.75), None]
    # Each backend against its own 1-worker row.
    jax = add_efficiency(
        [*rows, make_row(1, "none", "cnn", 32, [[50.0]], "jax"), make_row(2, "jax", "cnn", 32, [[40.0]], "jax")]
    )
    assert [r["efficiency"] for r in jax[-2:]] == [pytest.approx(1.0), pytest.approx(0.8)]
    assert format_row(jax[-1]).startswith("cnn batch 32, 2 worker(s), jax, keras on jax: 40.0")


def test_results_are_read_from_plain_and_prefixed_output() -> None:
    text = 'I0000 noise BENCH in a log line\nBENCH {"rank": 0}\n[1] BENCH {"rank": 1}\n'
    assert bench.parse_results(text) == [{"rank": 0}, {"rank": 1}]


def test_thread_settings_on_small_and_large_machines() -> None:
    assert bench.thread_settings(1) == [(1, 1), (1, 2)]
    assert bench.thread_settings(2) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert [a for a, _ in bench.thread_settings(16)] == [1, 1, 8, 8, 16, 16]


def _fake(n: int, engine: str, threads: tuple[int, int] | None) -> dict[str, Any]:
    per_worker = 100.0 * (0.8 if n > 1 else 1.0) * (threads[0] + threads[1] / 10 if threads else 1)
    row = make_row(n, engine if n > 1 else "none", "cnn", 32, [[per_worker, per_worker]] * n)
    return row | ({"intra_op": threads[0], "inter_op": threads[1]} if threads else {})


def test_sweep_runs_one_worker_once_and_reports_progress(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench.sweep((1, 2), ("mpi", "ring"), _fake)
    assert [(r["workers"], r["engine"], r["efficiency"]) for r in rows] == [
        (1, "none", pytest.approx(1.0)),
        (2, "mpi", pytest.approx(0.8)),
        (2, "ring", pytest.approx(0.8)),
    ]
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "mldist bench: [1/3] 1 worker(s), engine none",
        "mldist bench: [2/3] 2 worker(s), engine mpi",
        "mldist bench: [3/3] 2 worker(s), engine ring",
    ]
    assert "80.0 ± 0.0 img/sec per worker, 160.0 img/sec in total, efficiency 0.80" in out


def test_tune_threads_picks_the_fastest_setting(capsys: pytest.CaptureFixture[str]) -> None:
    rows, best = bench.tune_threads(2, _fake)
    assert len(rows) == 4 and (best["intra_op"], best["inter_op"]) == (2, 2)
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 4 and out.splitlines()[-1].startswith("best: intra-op 2, inter-op 2")


def _fake_launcher(monkeypatch: pytest.MonkeyPatch, code: int = 0) -> list[Any]:
    """Replace the launcher: each rank's log gets a BENCH line; the RunConfigs it was given."""
    import mldist.launch.local

    seen: list[Any] = []

    def run(cfg: Any) -> int:
        seen.append(cfg)
        for rank in range(cfg.nprocs if not code else 1):
            line = json.dumps({"rank": rank, "size": cfg.nprocs, "engine": "mpi", "rates": [10.0 * (rank + 1)]})
            (Path(cfg.log_dir) / f"rank-{rank}.log").write_text(f"noise\nBENCH {line}\n")
        return code

    monkeypatch.setattr(mldist.launch.local, "run", run)
    return seen


def test_run_workers_reads_every_ranks_line_from_the_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fake_launcher(monkeypatch)
    row = bench.run_workers(BenchConfig(iters=2), 2, "mpi", (1, 2))
    assert (row["workers"], row["engine"], row["img_per_sec_per_worker"]) == (2, "mpi", pytest.approx(15.0))
    assert (row["intra_op"], row["inter_op"]) == (1, 2)
    cfg = seen[0]
    assert (cfg.nprocs, cfg.communication, cfg.cpu_bind, cfg.run_dir) == (2, "mpi", "cores", None)
    assert cfg.command[1:3] == ("-m", "mldist.tools.bench_worker") and cfg.command[-4:] == (
        *("--intra-op", "1", "--inter-op", "2"),
    )


def test_run_workers_keeps_each_run_in_the_run_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _fake_launcher(monkeypatch)
    (tmp_path / "n2-ring").mkdir()
    bench.run_workers(BenchConfig(), 2, "ring", run_dir=tmp_path)
    assert seen[0].run_dir == seen[0].log_dir == str(tmp_path / "n2-ring")
    assert (tmp_path / "n2-ring" / "rank-1.log").exists()


def test_failed_workers_show_their_last_lines_and_raise(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_launcher(monkeypatch, code=1)
    with pytest.raises(LaunchError, match=re.escape("2 worker(s) on mpi failed (exit code 1)")):
        bench.run_workers(BenchConfig(), 2, "mpi")
    assert "[0] noise" in capsys.readouterr().err


def test_json_and_png_are_written_side_by_side(tmp_path: Path) -> None:
    rows = add_efficiency([_fake(1, "auto", None), _fake(2, "mpi", None)])
    bench_output.write_json(str(tmp_path / "out" / "bench.json"), rows)
    assert json.loads((tmp_path / "out" / "bench.json").read_text()) == {"rows": rows}
    assert (tmp_path / "out" / "bench.png").read_bytes().startswith(PNG_MAGIC)


def test_without_matplotlib_the_json_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    bench_output.write_json(str(tmp_path / "b.json"), [_fake(1, "auto", None)])
    assert json.loads((tmp_path / "b.json").read_text())["rows"][0]["workers"] == 1
    assert not (tmp_path / "b.png").exists()
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scaling", "0"], "--scaling '0'"),
        (["--scaling", "a"], "--scaling 'a'"),
        (["--model", "nosuch"], "'nosuch' is not a known model"),
        (["--engine", "gloo"], "'gloo' is not one of"),
        (["-n", "2", "--scaling", "1,2"], "give -n or --scaling, not both"),
        (["--tune-threads", "--scaling", "1,2"], "--tune-threads runs 1 worker"),
        (["--model", "xception", "--image-size", "32"], "xception needs at least 71"),
        (["--iters", "0"], "argument --iters"),
        (["--profile-steps", "9:3"], "FIRST <= LAST"),
        (["--profile-steps", "3"], "write FIRST:LAST"),
        (["--backend", "torch"], "'torch' is not a backend mldist benchmarks"),
        (["--backend", "tensorflow,jax", "--tune-threads"], "give one inside a job or with --tune-threads"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    res = mldist(["bench", *args], timeout=60)
    assert res.returncode == 2, tail(res)
    assert res.stdout == "" and len(res.stderr.splitlines()) == 1, tail(res)
    assert res.stderr.startswith("mldist bench: error: ") and message in res.stderr, tail(res)


def test_json_into_a_directory_is_refused_before_running(tmp_path: Path) -> None:
    res = mldist(["bench", "--json", str(tmp_path)], timeout=60)
    assert res.returncode == 2 and "is a directory" in res.stderr and len(res.stderr.splitlines()) == 1, tail(res)


def test_help_shows_examples() -> None:
    out = check(mldist(["bench", "--help"], timeout=60)).stdout
    assert "example:" in out and "mldist bench --scaling 1,2" in out


@pytest.mark.slow
def test_scaling_run_prints_both_rows_and_writes_json_and_png(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "--scaling", "1,2", "--json", str(out), "--iters", "2", "--batches-per-iter", "2", "--warmup", "1"]
    res = check(mldist(args, timeout=180))
    summary = res.stdout.split("summary:")[-1].splitlines()
    assert [line for line in summary if "1 worker(s)" in line and "efficiency 1.00" in line], tail(res)
    assert [line for line in summary if "2 worker(s)" in line and "efficiency" in line], tail(res)
    assert res.stderr.count("mldist bench: [") == 2, tail(res)
    rows = json.loads(out.read_text())["rows"]
    assert [r["workers"] for r in rows] == [1, 2]
    for row in rows:
        assert set(row) >= ROW_KEYS
        assert row["img_per_sec"] > 0 and row["efficiency"] > 0 and row["model"] == "cnn"
    png = out.with_suffix(".png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1024


@pytest.mark.slow
def test_profile_steps_leave_the_merged_trace_and_the_breakdown(tmp_path: Path) -> None:
    args = ["bench", "-n", "2", "--engine", "mpi", "--iters", "1", "--batches-per-iter", "4", "--warmup", "2"]
    env = clean_env(MLDIST_RUNS_DIR=str(tmp_path / "runs"))
    res = check(mldist([*args, "--profile-steps", "3:5"], timeout=240, env=env))
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("bench-") and f"run directory {run_dir}" in res.stdout, tail(res)
    trace = run_dir / "n2-mpi" / "trace" / "merged.trace.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    assert any("mpi_allreduce" in e["name"] for e in events if e.get("ph") == "X")
    assert "where a step's time goes" in res.stdout and "(3 steps, ms per step)" in res.stdout, tail(res)
    assert all(f"  {part} " in res.stdout for part in PARTS), tail(res)
    parts = json.loads((run_dir / "bench.json").read_text())["rows"][0]["breakdown_ms"]
    assert parts["steps"] == 3 and parts["step_ms"] > 0 and parts["compute_ms"] > 0 and parts["collective_ms"] > 0


@pytest.mark.slow
def test_backends_side_by_side_on_two_workers(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "-n", "2", "--backend", "tensorflow,jax", "--json", str(out)]
    res = check(mldist([*args, "--iters", "2", "--batches-per-iter", "2", "--warmup", "1"], timeout=300))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["workers"], r["engine"]) for r in rows] == [("tensorflow", 2, "mpi"), ("jax", 2, "jax")]
    assert all(r["img_per_sec"] > 0 for r in rows), tail(res)
