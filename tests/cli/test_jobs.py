"""``mldist submit`` options into a ``JobSpec`` (site profiles, merging, checks); a new directory per job."""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mldist.base.files import new_directory
from mldist.cli import build_parser, main
from mldist.errors import ConfigError
from mldist.launch.batch.build import build_spec
from mldist.launch.batch.records import load_record


def _args(*argv: str) -> argparse.Namespace:
    return build_parser()[0].parse_args(["submit", *argv])


def test_cli_options_override_the_site_and_env_merges(tmp_path: Path) -> None:
    args = _args("--site", "polaris", "--nodes", "3", "--env", "NCCL_NET=Socket", "--env", "A=1",
                 "--output-dir", str(tmp_path), "--", "python", "t.py")  # fmt: skip
    spec = build_spec(vars(args), ["python", "t.py"])
    env = dict(spec.env)
    assert (spec.scheduler, spec.nodes, spec.tasks, spec.gpus_per_node) == ("pbs", 3, 4, 4)
    assert env["NCCL_NET"] == "Socket" and env["A"] == "1" and env["NCCL_CROSS_NIC"] == "1"
    assert "-l filesystems=home:eagle" in spec.directives


def test_a_missing_venv_is_named(tmp_path: Path) -> None:
    args = _args("--scheduler", "slurm", "--venv", str(tmp_path / "nope"), "--", "x")
    with pytest.raises(ConfigError, match="has no bin/activate"):
        build_spec(vars(args), ["x"])


def test_two_submissions_in_the_same_second_get_their_own_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A stand-in sbatch that hands out job ids 4242, 4243, ... as `sbatch --parsable` prints them.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    sbatch = bindir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\nn=$(cat "{tmp_path}/n" 2>/dev/null || echo 4242)\necho $((n + 1)) >"{tmp_path}/n"\n'
                      'echo "$n;cluster"\n')  # fmt: skip
    sbatch.chmod(0o700)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("MLDIST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    second = time.localtime(1_700_000_000)
    monkeypatch.setattr(time, "localtime", lambda *_: second)  # both submissions see the same second

    for _ in range(2):
        assert main(["submit", "--scheduler", "slurm", "--", "python", "train.py"]) == 0
    base = tmp_path / "mldist-jobs" / f"mldist-{time.strftime('%Y%m%d-%H%M%S', second)}"
    records = [load_record(job_id) for job_id in ("4242", "4243")]
    assert [r.output_dir for r in records] == [str(base), f"{base}-2"]
    for record in records:
        assert f"export MLDIST_JOB_DIR={record.output_dir}\n" in Path(record.script).read_text()
        assert Path(record.output_dir, "job.json").is_file()
    assert capsys.readouterr().out.count("submitted job") == 2


def test_a_refused_job_leaves_no_new_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Invalid account' >&2\nexit 1\n")
    (bindir / "sbatch").chmod(0o700)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("MLDIST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    assert main(["submit", "--scheduler", "slurm", "--", "python", "train.py"]) == 2
    assert "sbatch refused the job: sbatch: error: Invalid account" in capsys.readouterr().err
    assert list(tmp_path.glob("mldist-jobs/*")) == []
    # A directory the user named is theirs: the script stays there to be read.
    assert main(["submit", "--scheduler", "slurm", "--output-dir", "mine", "--", "python", "train.py"]) == 2
    assert (tmp_path / "mine" / "job.sh").is_file()


def test_directories_claimed_at_once_are_all_different(tmp_path: Path) -> None:
    """``os.mkdir`` decides: threads racing for one name each get their own."""
    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda _: new_directory(tmp_path / "job", 0o700), range(16)))
    assert sorted(p.name for p in made) == sorted(["job", *(f"job-{n}" for n in range(2, 17))])
    assert new_directory(tmp_path / "job", create=False).name == "job-17"
    assert not (tmp_path / "job-17").exists()  # a dry run's preview creates nothing
