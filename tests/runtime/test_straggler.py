"""The slow rank, named while the job runs (mldist.runtime.watch.straggler): the account over records, the
settings, ``mldist status``, and real 2-rank runs, one with a rank 0.2 s slower per batch, one balanced."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import PY, USERS_GC, WORKERS, check, clean_env, engine_launch, mldist
from mldist.base import envvalues
from mldist.base.progress import Record
from mldist.cli import main
from mldist.errors import ConfigError
from mldist.runtime.watch import straggler, straggler_gather, straggler_watch

WORKER = WORKERS / "straggler.py"
SLEEP_LINE = next(i for i, line in enumerate(WORKER.read_text().splitlines(), 1) if "spends its time here" in line)
#: Small thresholds keep the runs short: 25 % of the others' time in each third of 6 s.
QUICK = {"MLDIST_STRAGGLER_PERCENT": "25", "MLDIST_STRAGGLER_SECONDS": "6"}
STEPS = "36"


def _records(waits: dict[int, list[float]], first: int, hosts: dict[int, str], written: float) -> dict[int, Record]:
    """Each rank's record with its waits in collectives first, first + 1, ... (0.25 s apart)."""
    out = {}
    for r, ws in waits.items():
        entries = tuple((first + i, w, 0.25) for i, w in enumerate(ws))
        out[r] = Record(r, hosts[r], 100 + r, first + len(ws), first + len(ws), None, None,
                        ("data.py:42 next_batch: time.sleep(0.2)",), written, waits=entries)  # fmt: skip
    return out


def _feed(tracker: straggler_watch.Tracker, per_second: list[dict[int, float]], hosts: dict[int, str]) -> list[object]:
    """Feed ``tracker`` 4 collectives a second (one step each), ``per_second[t]`` each rank's wait at second t."""
    found = []
    for t, waits in enumerate(per_second):
        first = 1 + 4 * t
        # Records repeat earlier collectives (a rank publishes its last KEPT): each must count once.
        records = _records({r: [waits[r]] * 4 for r in waits}, first, hosts, written=float(t))
        repeated = _records({r: [waits[r]] * 8 for r in waits}, max(1, first - 4), hosts, written=float(t))
        found.append(tracker.add(records if t % 2 else repeated, steps=4 * (t + 1), now=float(t)))
    return found


def test_a_rank_that_arrives_last_is_named_with_its_cost_per_step_and_its_line() -> None:
    hosts = {0: "n1", 1: "n1", 2: "n2"}
    tracker = straggler_watch.Tracker(3, 10, 9)
    found = _feed(tracker, [{0: 0.1, 1: 0.1, 2: 0.0}] * 15, hosts)
    assert found[:9] == [None] * 9  # not watched for 9 s yet
    f = found[-1]
    assert isinstance(f, straggler.Finding) and (f.rank, f.host, f.node, f.per) == (2, "n2", False, "step")
    # Each collective cost the others 0.1 s, one collective of 0.25 s a step: 100 ms a step, 40 %.
    assert f.last_share == 1.0 and f.cost == pytest.approx(0.1, rel=0.15) and f.share == pytest.approx(0.4)
    line = straggler.message(f)
    assert line.startswith("rank 2 (n2) arrives last at 100 % of collectives, costing the others 1")
    assert line.endswith("a step (40 %); it spends its time in data.py:42 next_batch")
    # Every collective counted once although records repeat them.
    assert len({s.number for _, s in tracker.stamped}) == len(tracker.stamped)


def test_a_balanced_run_and_a_one_off_delay_get_no_line() -> None:
    hosts = {0: "n1", 1: "n2"}
    # Who arrives last changes, and costs little: no line.
    balanced = [{0: 0.01 * (t % 2), 1: 0.01 * ((t + 1) % 2)} for t in range(40)]
    assert _feed(straggler_watch.Tracker(2, 10, 9), balanced, hosts)[-30:] == [None] * 30
    # One rank 2 s late once (start-up, a checkpoint): it fills one third, never all three.
    once = [{0: 2.0 if t == 12 else 0.0, 1: 0.0} for t in range(40)]
    assert _feed(straggler_watch.Tracker(2, 10, 9), once, hosts) == [None] * 40


def test_at_the_defaults_a_rank_10_percent_slower_is_named_within_5_minutes_and_a_loaded_balanced_run_is_not() -> None:
    """A rank computing 10 % longer costs the others 9 % of their time: the lasting rule (four windows) names it
    where one 30 s window at 10 % never did; ranks that take turns being late, as load makes them, are not named."""
    hosts, rng = {0: "n1", 1: "n2"}, np.random.default_rng(7)
    slow = [{0: 0.0225 * (1 + 0.1 * rng.standard_normal()), 1: 0.0} for _ in range(300)]  # 9 % of 0.25 s
    found = _feed(straggler_watch.Tracker(2, 10, 30), slow, hosts)
    first = next(t for t, f in enumerate(found) if f is not None)
    named = found[first]
    assert isinstance(named, straggler.Finding) and named.rank == 1 and not named.node, named
    assert 4 * 30 <= first <= 300 and named.last_share == 1.0 and 0.08 <= named.share <= 0.10, (first, named)
    # Load: the late rank changes each second, often by more than 10 % (15-30 % of the step), a rank at
    # random slower for a few seconds now and then; 55 % of the time one rank: no line in 5 minutes.
    loaded = []
    for t in range(300):
        late = int(rng.random() < 0.55) if t % 10 else int(rng.integers(2))
        loaded.append({late: 0.0, 1 - late: 0.25 * rng.uniform(0.15, 0.3)})
    assert _feed(straggler_watch.Tracker(2, 10, 30), loaded, hosts) == [None] * 300


def test_two_slow_ranks_of_many_that_share_the_last_arrivals_are_named() -> None:
    """Among 64 ranks, two throttled ranks each arrive last at half the collectives (32 times their fair share),
    costing the others 12 %: one of them is named, as two ranks of two that take turns are not."""
    hosts = {r: f"n{r // 4}" for r in range(64)}
    stamped = []
    for t in range(160):
        late = 9 if t % 2 else 40
        waits = {r: (0.0 if r == late else 0.06, 0.25) for r in range(64)}
        stamped.append((t / 4, straggler.sample(t, waits, hosts)))
    found = straggler.find(stamped, hosts, 10, 30, now=39.0, steps=120)
    assert found is not None and found.rank in (9, 40) and not found.node and found.last_share == 0.5, found
    two = {0: "a", 1: "b"}
    turns = [(t / 4, straggler.sample(t, {0: (0.06 * (t % 2), 0.25), 1: (0.06 * (1 - t % 2), 0.25)}, two))
             for t in range(160)]  # fmt: skip
    assert straggler.find(turns, two, 10, 30, now=39.0, steps=120) is None


def test_a_slow_node_is_named_when_no_one_of_its_ranks_is() -> None:
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    # Node b's two ranks arrive last in turn: each costs the others about half of what the node costs.
    waits = [{0: 0.2, 1: 0.2, 2: 0.05 * (t % 2), 3: 0.05 * ((t + 1) % 2)} for t in range(15)]
    found = _feed(straggler_watch.Tracker(4, 30, 9), waits, hosts)[-1]
    assert isinstance(found, straggler.Finding) and found.node and found.ranks == (2, 3)
    assert straggler.message(found).startswith("node b (ranks 2, 3) arrives last at 100 % of collectives")


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("MLDIST_STRAGGLER_PERCENT", "abc", "is not a percentage below 100: set it to e.g. 10"),
        ("MLDIST_STRAGGLER_PERCENT", "100", "is not a percentage below 100"),
        ("MLDIST_STRAGGLER_PERCENT", "-5", "is not a percentage below 100"),
        ("MLDIST_STRAGGLER_SECONDS", "0", "is not a number of seconds above 0: set it to e.g. 30"),
        ("MLDIST_STRAGGLER_SECONDS", "1e3", "is not a number of seconds above 0"),
    ],
)
def test_a_bad_threshold_is_one_line_before_any_worker_starts(name: str, raw: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{name}={raw!r} {says}")):
        envvalues.check({name: raw})
    res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", "print('STARTED')"], env=clean_env(**{name: raw}))
    assert res.returncode == 2 and "STARTED" not in res.stdout, res.stderr
    assert f"{name}={raw!r} {says}" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_status_shows_the_slow_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("scontrol", 'echo "JobId=4242 JobName=mldist JobState=RUNNING Restarts=0 ExitCode=0:0"\n'),
                       ("squeue", "echo N/A\n")):  # fmt: skip
        (bindir / name).write_text(f"#!/bin/sh\n{body}")
        (bindir / name).chmod(0o700)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("MLDIST_STATE_DIR", str(tmp_path / "state"))
    record = {"job_id": "4242", "scheduler": "slurm", "output_dir": str(tmp_path / "job"), "submitted_at": 1.0,
              "script": str(tmp_path / "job" / "job.sh"), "command": ["python", "train.py"], "tasks": 2}  # fmt: skip
    (tmp_path / "state" / "jobs").mkdir(parents=True)
    (tmp_path / "state" / "jobs" / "4242.json").write_text(json.dumps(record))
    assert main(["status", "4242"]) == 0
    assert "; slow:" not in capsys.readouterr().out
    tracker = straggler_watch.Tracker(2, 10, 30, run_dir=tmp_path / "job" / "run", plot=False)
    (tmp_path / "job" / "run").mkdir(parents=True)
    found = straggler.Finding(1, "n2", (1,), False, 0.96, 0.18, 0.31, "step", "data.py:42 next_batch")
    tracker.say(found, 1000.0)
    assert main(["status", "4242"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "; slow: rank 1 (n2) arrives last at 96 % of collectives, costing the others 180 ms a step (31 %)" in line


def _run(tmp_path: Path, name: str, *argv: str) -> tuple[str, Path]:
    run_dir = tmp_path / name
    env = clean_env(**USERS_GC, **QUICK, MLDIST_PLOT="1")  # the tests' default is 0
    res = check(mldist(["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, str(WORKER), *argv], env=env))
    return res.stderr, run_dir


@pytest.mark.slow
def test_a_rank_slower_by_0_3_s_a_batch_is_named_once_by_rank_0(tmp_path: Path) -> None:
    # 0.3 s: the line is where the slow rank spends most of its time outside collectives, sampled once a
    # second; under a loaded suite a step's own compute grew to rival a 0.2 s sleep (the fit's line won).
    stderr, run_dir = _run(tmp_path, "slow", "1", "0.3", STEPS, "0.02")
    lines = [line for line in stderr.splitlines() if "arrives last" in line]
    assert len(lines) == 1 and lines[0].startswith("[0] mldist: rank 1 ("), stderr[-3000:]
    cost = re.search(r"costing the others (\d+) ms a step \((\d+) %\)", lines[0])
    assert cost and 200 <= int(cost.group(1)) <= 550 and int(cost.group(2)) >= 25, lines[0]
    assert lines[0].endswith(f"it spends its time in tests/workers/straggler.py:{SLEEP_LINE} on_train_batch_begin")
    kept = json.loads((run_dir / straggler_watch.FILE).read_text())
    assert kept["rank"] == 1 and kept["line"] in lines[0]
    assert (run_dir / straggler_watch.PICTURE).read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_rank_10_percent_slower_is_named_at_the_default_percent_by_the_lasting_rule(tmp_path: Path) -> None:
    """Real ranks, the default 10 %, a 6 s window: rank 1 sleeps 10 % longer a batch (0.22 s, 0.2 s), which costs
    rank 0 under 10 % of its time; it is named after four windows (24 s) of arriving last."""
    run_dir = tmp_path / "ten"
    env = clean_env(**USERS_GC, MLDIST_STRAGGLER_SECONDS="6")
    argv = ["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, str(WORKER), "1", "0.02", "200", "0.2"]
    stderr = check(mldist(argv, env=env, timeout=300)).stderr
    lines = [line for line in stderr.splitlines() if "arrives last" in line]
    assert len(lines) == 1 and lines[0].startswith("[0] mldist: rank 1 ("), stderr[-3000:]
    share = re.search(r"costing the others \d+ ms a step \((\d+) %\)", lines[0])
    assert share and 5 <= int(share.group(1)) <= 10, lines[0]
    kept = json.loads((run_dir / straggler_watch.FILE).read_text())
    assert kept["rank"] == 1 and kept["at_end"] is False


@pytest.mark.slow
def test_a_balanced_run_of_as_many_steps_gets_no_line(tmp_path: Path) -> None:
    stderr, run_dir = _run(tmp_path, "balanced", "-1", "0.2", STEPS, "0.22")
    assert "arrives last" not in stderr and not (run_dir / straggler_watch.FILE).exists(), stderr[-3000:]
    assert (run_dir / straggler_watch.PICTURE).read_bytes().startswith(b"\x89PNG")  # the picture all the same


@pytest.mark.slow
def test_a_slow_rank_in_a_fit_shorter_than_the_window_is_named_at_its_end(tmp_path: Path) -> None:
    """The defaults (10 % in each third of 30 s) and a fit of about 4 s: the window never fills while the job
    runs, so rank 0 names rank 1 at its exit, over the whole run."""
    run_dir = tmp_path / "short"
    env = clean_env(**USERS_GC)
    argv = ["run", "-n", "2", "--run-dir", str(run_dir), "--", PY, str(WORKER), "1", "0.15", "24", "0.02"]
    stderr = check(mldist(argv, env=env)).stderr
    lines = [line for line in stderr.splitlines() if "arrives last" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("[0] mldist: over the whole run, shorter than MLDIST_STRAGGLER_SECONDS=30: rank 1 (")
    cost = re.search(r"costing the others (\d+) ms a step \((\d+) %\)", lines[0])
    assert cost and 90 <= int(cost.group(1)) <= 400 and int(cost.group(2)) >= 25, lines[0]
    assert lines[0].endswith(f"it spends its time in tests/workers/straggler.py:{SLEEP_LINE} on_train_batch_begin")
    kept = json.loads((run_dir / straggler_watch.FILE).read_text())
    assert kept["rank"] == 1 and kept["at_end"] is True and kept["line"] in lines[0]


def test_a_balanced_or_short_run_is_not_named_at_its_end() -> None:
    hosts = {0: "n1", 1: "n2"}
    balanced = straggler_watch.Tracker(2, 10, 30)
    _feed(balanced, [{0: 0.01 * (t % 2), 1: 0.01 * ((t + 1) % 2)} for t in range(12)], hosts)
    balanced._first_steps, balanced._last_steps, balanced._last_turn = 4, 48, 11.0
    assert balanced.at_end(12.0) is None
    once = straggler_watch.Tracker(2, 10, 30)  # rank 1 late once (start-up): one third at most
    _feed(once, [{0: 2.0 if t == 1 else 0.0, 1: 0.0} for t in range(12)], hosts)
    once._first_steps, once._last_steps, once._last_turn = 4, 48, 11.0
    assert once.at_end(12.0) is None
    # Rank 1 last at 55 % of the collectives, rank 0 at 45 %, each costing the other more than 10 %: no clear
    # slow rank (as rank 0, which runs the callbacks, in the digits run under load).
    mixed = straggler_watch.Tracker(2, 10, 30)
    _feed(mixed, [{0: 0.1, 1: 0.0} if t % 20 in (0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 19) else {0: 0.0, 1: 0.1}
                  for t in range(20)], hosts)  # fmt: skip
    mixed._first_steps, mixed._last_steps, mixed._last_turn = 4, 80, 19.0
    assert mixed.at_end(20.0) is None
    slow = straggler_watch.Tracker(2, 10, 30)
    _feed(slow, [{0: 0.1, 1: 0.0}] * 12, hosts)
    slow._first_steps, slow._last_steps, slow._last_turn = 4, 48, 11.0
    found = slow.at_end(12.0)
    assert found is not None and found.rank == 1 and found.last_share == 1.0
    slow._last_turn = 30.0  # the window filled while the job ran: the line was the live watch's to say
    assert slow.at_end(31.0) is None


@pytest.mark.parametrize("raw", ["0.001", "0.1", "0.5", "1.5", "5.9"])
def test_a_window_the_watch_cannot_fill_is_refused_naming_the_smallest_that_works(raw: str) -> None:
    """The watch takes a round a second and needs two in each third: below 6 s no slow rank was ever named
    (0.1, 0.5, 1.5), or a 5 s run was called shorter than its 0.001 s window."""
    says = f"MLDIST_STRAGGLER_SECONDS={raw!r} is shorter than the slow-rank watch can fill"
    with pytest.raises(ConfigError, match=re.escape(says) + ".*set it to 6 or more"):
        envvalues.check({"MLDIST_STRAGGLER_SECONDS": raw})
    if raw == "1.5":
        env = clean_env(MLDIST_STRAGGLER_SECONDS=raw)
        res = mldist(["run", "-n", "2", "--no-run-dir", "--", PY, "-c", "print('STARTED')"], env=env)
        assert res.returncode == 2 and "STARTED" not in res.stdout, res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert says in line and "set it to 6 or more" in line, line
    assert envvalues.STRAGGLER_SECONDS.read({"MLDIST_STRAGGLER_SECONDS": "6"}) == 6.0


def _round(size: int, first: int, per_rank: dict[int, float], hosts: dict[int, str], count: int = 4) -> np.ndarray:
    """Every rank's row holding collectives first .. first + count - 1, each rank waiting per_rank[r] in each."""
    frames = {2: "data.py:42 next_batch"}
    entries = {r: [(first + i, per_rank[r], 0.25) for i in range(count)] for r in range(size)}
    return np.stack([straggler_gather.row(hosts[r], frames.get(r, ""), entries[r], size) for r in range(size)])


def test_the_rounds_name_the_slow_rank_and_its_line_without_a_file() -> None:
    """Rank 0's account from the engine's rounds (no progress folder at all): the same finding as from records."""
    hosts = {0: "n1", 1: "n1", 2: "n2"}
    tracker = straggler_watch.Tracker(3, 10, 9)
    found = [tracker.take([_round(3, 1 + 4 * t, {0: 0.1, 1: 0.1, 2: 0.0}, hosts)], 4 * (t + 1), float(t))
             for t in range(15)]  # fmt: skip
    assert found[:9] == [None] * 9
    f = found[-1]
    assert isinstance(f, straggler.Finding) and (f.rank, f.host, f.node, f.per) == (2, "n2", False, "step")
    assert f.last_share == 1.0 and f.cost == pytest.approx(0.1, rel=0.15) and f.share == pytest.approx(0.4)
    assert straggler.message(f).endswith("a step (40 %); it spends its time in data.py:42 next_batch")
    balanced = straggler_watch.Tracker(2, 10, 9)
    for t in range(40):
        waits = {0: 0.01 * (t % 2), 1: 0.01 * ((t + 1) % 2)}
        assert balanced.take([_round(2, 1 + 4 * t, waits, {0: "a", 1: "b"})], 4 * (t + 1), float(t)) is None


def test_the_rounds_pair_ranks_that_post_out_of_step_or_pick_other_strides() -> None:
    """Rank 1 sends a collective a round after rank 0 did; rank 0 picked every second collective, rank 1 every
    fourth (powers of two nest): the multiples of 4 pair, once each, and a slow node is still named."""
    pool = straggler_gather.Pool(2, straggler_gather.slots(2))
    row = straggler_gather.row
    first = np.stack([row("a", "", [(2, 0.3, 0.5), (4, 0.3, 0.5), (6, 0.3, 0.5)], 2), row("b", "", [], 2)])
    numbers, _, _ = pool.add(first)
    assert numbers.tolist() == []
    numbers, waits, _ = pool.add(np.stack([row("a", "", [(8, 0.3, 0.5)], 2), row("b", "", [(4, 0.0, 0.5)], 2)]))
    assert numbers.tolist() == [4] and waits.tolist() == [[0.3, 0.0]]
    numbers, _, _ = pool.add(np.stack([row("a", "", [], 2), row("b", "", [(4, 0.0, 0.5), (8, 0.0, 0.5)], 2)]))
    assert numbers.tolist() == [8]  # 4 again (a repeated row) is not counted twice; 6 never will pair
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    tracker = straggler_watch.Tracker(4, 30, 9)
    for t in range(15):
        waits = {0: 0.2, 1: 0.2, 2: 0.05 * (t % 2), 3: 0.05 * ((t + 1) % 2)}
        found = tracker.take([_round(4, 1 + 4 * t, waits, hosts)], 4 * (t + 1), float(t))
    assert isinstance(found, straggler.Finding) and found.node and found.ranks == (2, 3)


def test_a_rank_picks_fewer_collectives_as_they_come_faster_and_more_as_they_slow() -> None:
    picker = straggler_gather.Picker(16)
    for n in range(1, 1001):
        picker.ended((n, 0.0, 0.001))
    assert len(picker.take()) <= 16 and picker.mask == 63  # 1,000 in a round of 16: every 64th
    for n in range(1001, 2001):
        picker.ended((n, 0.0, 0.001))
    assert [e[0] for e in picker.take()] == [n for n in range(1001, 2001) if n % 64 == 0]
    for n in range(2001, 2005):
        picker.ended((n, 0.0, 0.5))
    picker.take()
    assert picker.mask < 63  # slower: it picks more again


@pytest.mark.slow
def test_on_jax_a_slow_rank_is_named_through_the_coordination_service(tmp_path: Path) -> None:
    """Keras on JAX: the rounds go through jax.distributed's key-value store; the same line as on MPI."""
    run_dir = tmp_path / "jax"
    args, env = engine_launch("jax")
    env.update(USERS_GC, **QUICK, MLDIST_PLOT="0")
    argv = ["run", "-n", "2", *args, "--run-dir", str(run_dir), "--", PY, str(WORKER), "1", "0.2", STEPS, "0.02"]
    stderr = check(mldist(argv, env=env, timeout=300)).stderr
    lines = [line for line in stderr.splitlines() if "arrives last" in line]
    assert len(lines) == 1 and lines[0].startswith("[0] mldist: rank 1 ("), stderr[-3000:]
    assert lines[0].endswith(f"it spends its time in tests/workers/straggler.py:{SLEEP_LINE} on_train_batch_begin")
    assert json.loads((run_dir / straggler_watch.FILE).read_text())["rank"] == 1


@pytest.mark.parametrize("engine", ["mpi", "jax"])
def test_the_engine_carries_the_rounds_and_a_rank_out_of_step_holds_no_one_at_the_end(engine: str) -> None:
    """3 real ranks: rounds pair by number on the engine's own channel (MPI_Igather; JAX's key-value store),
    and a rank that posted two rounds more than the others leaves with them, exit 0."""
    args, env = engine_launch(engine)
    env["MLDIST_STRAGGLER_PERCENT"] = "0"  # the worker's own rounds are the only ones on the channel
    argv = ["run", "-n", "3", *args, "--no-run-dir", "--", PY, str(WORKERS / "straggler_rounds.py"), "3"]
    res = check(mldist(argv, env=env, timeout=240))
    assert sorted(line.split()[-1] for line in res.stdout.splitlines() if " DONE " in line) == ["0", "1", "2"]
    (paired,) = [line for line in res.stdout.splitlines() if "PAIRED" in line]
    numbers = json.loads(paired.split("PAIRED True ", 1)[1])
    assert numbers == sorted(numbers) and set(numbers) <= set(range(1, 10)) and {1, 2, 3} <= set(numbers), paired
