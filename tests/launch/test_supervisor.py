"""The one elastic supervisor (mldist.launch.elastic.supervisor): its states, its loop over stand-in hooks,
the bounded probe, and the one re-forming record both sides write."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mldist.base import rejoin
from mldist.launch.elastic import onhosts, slurm
from mldist.launch.elastic.supervisor import (
    MOVES,
    Recovery,
    Reform,
    Supervisor,
    WorkerState,
    moved,
    named,
    probe,
    write_reforms,
)


def test_every_state_has_its_moves_and_the_ends_have_none() -> None:
    assert set(MOVES) == set(WorkerState)
    assert MOVES[WorkerState.SUCCEEDED] == MOVES[WorkerState.STOPPED] == frozenset()
    assert moved(WorkerState.FAILED, WorkerState.HEALTHY) is WorkerState.HEALTHY
    with pytest.raises(RuntimeError, match="no move from init to failed"):
        moved(WorkerState.INIT, WorkerState.FAILED)
    with pytest.raises(RuntimeError, match="no move from stopped to healthy"):
        moved(WorkerState.STOPPED, WorkerState.HEALTHY)


@dataclass
class Scripted:
    """Hooks whose rounds end as ``ends`` says, one a round; a failure re-forms while ``nodes`` >= 2."""

    ends: list[tuple[WorkerState, int]]
    nodes: int = 3
    started: list[tuple[int, Reform | None]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def start(self, number: int, reform: Reform | None) -> int:
        self.started.append((number, reform))
        return number

    def monitor(self, round_: int) -> tuple[WorkerState, int]:
        return self.ends[round_]

    def probe(self, round_: int) -> dict[str, bool]:
        self.calls.append(f"probe {round_}")
        return {f"n{i}": i < self.nodes for i in range(1, self.nodes + 1)}

    def stop(self, round_: int, answered: Mapping[str, bool], code: int) -> int:
        self.calls.append(f"stop {round_} {sorted(h for h, ok in answered.items() if not ok)}")
        return code

    def recover(
        self, round_: int, state: WorkerState, code: int, answered: Mapping[str, bool], reformed: int
    ) -> Recovery:
        assert reformed == round_  # every earlier failure re-formed
        self.calls.append(f"recover {round_} {state.value}")
        done = Reform([f"n{self.nodes}"], "it does not answer", self.nodes, time.monotonic() - 0.5)
        self.nodes -= 1
        done.after = self.nodes if self.nodes >= 2 else 0
        return Recovery(done, self.nodes >= 2, code)


def test_a_failure_re_forms_and_the_next_round_succeeds() -> None:
    hooks = Scripted([(WorkerState.FAILED, 1), (WorkerState.SUCCEEDED, 0)])
    written: list[int] = []
    sup = Supervisor(hooks, lambda reforms: written.append(len(reforms)))
    result = sup.run()
    assert (result.state, result.code) == (WorkerState.SUCCEEDED, 0)
    assert [(r.lost, r.before, r.after) for r in result.reforms] == [(["n3"], 3, 2)]
    assert hooks.started == [(0, None), (1, result.reforms[0])]  # the round knows the re-forming behind it
    restart_s = result.reforms[0].restart_s
    assert restart_s is not None and 0.5 <= restart_s < 5
    assert written == [1] and sup.state is WorkerState.SUCCEEDED
    assert hooks.calls == ["probe 0", "stop 0 ['n3']", "recover 0 failed"]  # probed, stopped, then decided


def test_below_the_minimum_the_run_ends_with_the_round_code_and_every_record() -> None:
    hooks = Scripted([(WorkerState.FAILED, 1), (WorkerState.LEAVING, 76)])
    result = Supervisor(hooks).run()
    assert (result.state, result.code) == (WorkerState.FAILED, 76)
    assert hooks.calls[3:] == ["stop 1 []", "recover 1 leaving"]  # workers that left at a commit: no probe
    assert [(r.lost, r.after) for r in result.reforms] == [(["n3"], 2), (["n2"], 0)]
    assert result.reforms[1].restart_s is None  # no round started after it


def test_a_stopped_round_ends_the_run_without_recovery() -> None:
    hooks = Scripted([(WorkerState.STOPPED, 143)])
    result = Supervisor(hooks).run()
    assert (result.state, result.code, result.reforms) == (WorkerState.STOPPED, 143, ())
    assert hooks.calls == []


def test_the_probe_is_bounded_and_a_failing_probe_is_silent() -> None:
    argv = {"up": ["true"], "down": ["false"], "frozen": [sys.executable, "-c", "import time; time.sleep(30)"]}
    t0 = time.monotonic()
    assert probe(list(argv), argv.__getitem__, {}, lambda _: 1.0) == {"up": True, "down": False, "frozen": False}
    assert time.monotonic() - t0 < 5
    assert probe(["x"], lambda _: ["/nonexistent/probe"], {}, lambda _: 1.0) == {"x": False}


def test_both_sides_read_lost_hosts_from_their_launchers_lines_one_way() -> None:
    lines = ["srun: error: Node failure on node3", "srun: error: node2: task 1: Exited with exit code 3"]
    assert named(lines, (slurm.TROUBLE,)) == ["node3", "node2"]
    said = ["  Remote daemon: [prterun-vm@0,3] on node hx3", "[1] mldist run: rank 1 exited with code 3 on hx2;"]
    assert onhosts.named_hosts(said) == named(said, (onhosts.LOST_DAEMON, onhosts.FAILED_ON)) == ["hx3", "hx2"]


def test_the_record_is_the_same_for_both_sides(tmp_path: Path) -> None:
    """-H runs keep it in summary.json (elastic.reforms), Slurm jobs in elastic.json: one record."""
    done = Reform(["node3"], "it does not answer", 3, 0.0, after=2, hosts_checked_s=2.1, restart_s=3.0)
    write_reforms(str(tmp_path / "run"), [done])
    path = tmp_path / "run" / "elastic.json"
    (kept,) = json.loads(path.read_text())["reforms"]
    assert kept == done.record() and path.stat().st_mode & 0o077 == 0
    assert set(kept) == {"lost", "why", "before", "joined", "after", "hosts_checked_s", "restart_s", "loss_to_resume_s"}
    write_reforms(None, [done])  # no run directory: nothing written, nothing raised


def test_a_failed_slurm_job_forgets_its_commits_on_its_nodes(tmp_path: Path) -> None:
    """slurm.ended: after a failure, one step on the nodes removes the run's commits (the id read through the
    contract table); a success, or a job without an elastic id, asks nothing."""
    log = tmp_path / "srun.log"
    srun = tmp_path / "srun"
    srun.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    srun.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", rejoin.RUN_ENV: "e0a1", rejoin.DIR_ENV: "/c"}
    assert slurm.ended(0, ["n1"], env) == 0 and not log.exists()
    assert slurm.ended(3, ["n1", "n2"], env) == 3
    said = log.read_text()
    assert '--nodelist=n1,n2 sh -c rm -rf -- /c/mldist-"$(id -u)"/e0a1\n' in said, said
    assert slurm.ended(3, ["n1"], {"PATH": env["PATH"]}) == 3 and len(log.read_text().splitlines()) == 1
