"""``mldist submit`` options into a ``JobSpec`` (site profiles, merging, checks); a new directory per job."""

from __future__ import annotations

import argparse
import json
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


# issue 47: the job index is checked before the job is submitted; a job's state and exit code


def _stand_in(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + body)
    (bindir / name).chmod(0o700)


@pytest.fixture
def slurm_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in sbatch (job 4242; it notes each call in ``sbatch-ran``) on PATH, in ``tmp_path``."""
    _stand_in(tmp_path / "bin", "sbatch", f'echo "$@" >>"{tmp_path}/sbatch-ran"\necho "4242;cluster"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("where", ["XDG_STATE_HOME", "MLDIST_STATE_DIR"])
def test_an_unwritable_job_index_stops_the_submission_before_sbatch(
    where: str, slurm_here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``XDG_STATE_HOME=/proc/xyz``: sbatch took the job, then recording it failed with a traceback."""
    monkeypatch.delenv("MLDIST_STATE_DIR", raising=False)
    monkeypatch.setenv(where, str(slurm_here / "a-file"))
    (slurm_here / "a-file").write_text("not a directory\n")
    assert main(["submit", "--scheduler", "slurm", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "which cannot be written (Not a directory)" in err[0], err
    assert f"{where}={str(slurm_here / 'a-file')!r}" in err[0] and "set MLDIST_STATE_DIR" in err[0]
    assert not (slurm_here / "sbatch-ran").exists() and not (slurm_here / "mldist-jobs").exists()

    # A dry run shows the script and says once what submitting would stop at.
    assert main(["submit", "--scheduler", "slurm", "--dry-run", "--", "python", "train.py"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/bin/bash\n") and len(err.splitlines()) == 1
    assert "mldist submit: warning: job records go to" in err and "submitting stops here" in err
    assert not (slurm_here / "mldist-jobs").exists()


def test_a_job_whose_record_fails_after_sbatch_still_shows_its_id(
    slurm_here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index checked fine, then went away while sbatch ran: the job id is printed, then one error line."""
    state = slurm_here / "state"
    monkeypatch.setenv("MLDIST_STATE_DIR", str(state))
    _stand_in(slurm_here / "bin", "sbatch", f'rm -rf "{state}/jobs"; echo x >"{state}/jobs"\necho "4242;cluster"\n')
    assert main(["submit", "--scheduler", "slurm", "--", "python", "train.py"]) == 1
    out, err = capsys.readouterr()
    assert out == "submitted job 4242 (slurm)\n"
    assert len(err.splitlines()) == 1, err
    assert err.startswith("mldist submit: error: job 4242 was submitted (slurm), but its record could not be written")
    assert "mldist status, logs and cancel will not know it" in err and "Traceback" not in err
    (job_dir,) = slurm_here.glob("mldist-jobs/*")
    assert str(job_dir) in err and (job_dir / "job.sh").is_file()


@pytest.mark.parametrize(
    ("scontrol", "shown"),
    [
        ("JobState=RUNNING Restarts=0 ExitCode=0:0", "RUNNING     "),
        ("JobState=PENDING Restarts=1 ExitCode=0:15", "PENDING     "),
        ("JobState=COMPLETED Restarts=0 ExitCode=0:0", "COMPLETED    exit 0"),
        ("JobState=FAILED Restarts=0 ExitCode=3:0", "FAILED       exit 3"),
        ("JobState=CANCELLED Restarts=0 ExitCode=0:15", "CANCELLED    exit 143"),
    ],
    ids=["running", "requeued-pending", "completed", "failed", "killed-by-sigterm"],
)
def test_status_shows_an_exit_code_once_the_job_ended(
    scontrol: str, shown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slurm says ``ExitCode=0:0`` while a job runs: that was shown as "RUNNING exit 0"."""
    _stand_in(tmp_path / "bin", "scontrol", f'echo "JobId=4242 JobName=mldist {scontrol}"\n')
    _stand_in(tmp_path / "bin", "squeue", "echo N/A\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("MLDIST_STATE_DIR", str(tmp_path / "state"))
    record = {"job_id": "4242", "scheduler": "slurm", "output_dir": str(tmp_path / "job"), "submitted_at": 1.0,
              "script": str(tmp_path / "job" / "job.sh"), "command": ["python", "train.py"], "tasks": 2}  # fmt: skip
    (tmp_path / "state" / "jobs").mkdir(parents=True)
    (tmp_path / "state" / "jobs" / "4242.json").write_text(json.dumps(record))
    assert main(["status", "4242"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    state = shown.split()[0]
    assert f"4242  {shown}" in line and (" exit " in line) == ("exit" in shown), line
    assert line.split()[1] == state


@pytest.mark.parametrize(
    ("scheduler", "dependency", "directive"),
    [
        ("slurm", "afterok:4242:4243,afterany:4244", "#SBATCH --dependency=afterok:4242:4243,afterany:4244"),
        ("slurm", "after:4242+10", "#SBATCH --dependency=after:4242+10"),
        ("slurm", "afternotok:4242_3", "#SBATCH --dependency=afternotok:4242_3"),
        ("slurm", "singleton", "#SBATCH --dependency=singleton"),
        ("slurm", "4242:4243", "#SBATCH --dependency=4242:4243"),  # the old form Slurm still takes
        ("pbs", "afterok:1234.server:1235.server", "#PBS -W depend=afterok:1234.server:1235.server"),
        ("pbs", "beforeany:1234,on:2", "#PBS -W depend=beforeany:1234,on:2"),
        ("cobalt", "1234:1235", "#COBALT --dependencies 1234:1235"),
    ],
)
def test_each_scheduler_takes_its_own_dependency_forms(
    scheduler: str,
    dependency: str,
    directive: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The counterpart of the refused ones (``afterok:``, a Slurm type on Cobalt): these reach the script."""
    monkeypatch.setenv("MLDIST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    argv = ["submit", "--scheduler", scheduler, "--dry-run", "--dependency", dependency, "--", "true"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert directive in out.splitlines() and err == ""
