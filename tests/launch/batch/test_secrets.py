"""Secrets stay private: owner-only files, ``umask 077`` in the script, a redacted environment record.

``mldist submit`` runs in a subprocess under umask 022 and 077 with a fake ``sbatch`` first on
``PATH`` (it notes its umask and prints a job id); the script it wrote then runs under the
stand-ins (harness.py), so every file of the job can be checked: script, records, job
directory, environment record, rank logs.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import CMD, JOB_ID, LAUNCH_1, Job, base_env, check_job_ran, make_job
from helpers import check, clean_env, mldist
from mldist.base.files import atomic_write, make_dirs
from mldist.base.secrets import REDACTED, is_secret_name
from mldist.launch.batch.render import redaction_sed, render
from mldist.launch.batch.schedulers import SCHEDULERS
from mldist.launch.batch.spec import JobSpec

SECRET = "hunter2-s3cr3t"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """This process's umask set to ``mask`` meanwhile (for the processes it starts)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def private_tree(root: Path) -> dict[str, int]:
    """Modes of ``root`` and everything below it that anyone but the owner may use."""
    found = {str(p): mode(p) for p in [root, *root.rglob("*")] if mode(p) & 0o077}
    return found


# -- the script ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_the_script_sets_umask_077_before_it_writes_anything(scheduler: str) -> None:
    lines = render(JobSpec(command=CMD, scheduler=scheduler, env=(("WANDB_API_KEY", SECRET),))).split("\n")
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    at = lines.index("umask 077  # what the job writes is owner-only (logs, records, outputs)")
    assert lines[first_command] == "set -uo pipefail" and at == first_command + 1
    writes = [i for i, line in enumerate(lines) if ">" in line or "mkdir" in line or "rm -f" in line]
    assert writes and at < min(writes)


@pytest.mark.slow  # runs the script under the stand-ins
def test_a_script_creates_its_directory_logs_and_record_owner_only_under_umask_022(
    tmp_path: Path, standin_bin: Path
) -> None:
    job = make_job(tmp_path, standin_bin, output_dir=str(tmp_path / "out" / "run"))
    job.script = Path(shutil.copy(job.script, tmp_path / "job.sh"))
    shutil.rmtree(tmp_path / "out")  # the script makes its job directory itself
    with umask(0o022):
        job.start()
    job.wait(30)
    check_job_ran(job, LAUNCH_1["slurm"], [])
    assert mode(job.jobdir) == 0o700
    assert mode(job.jobdir / "environment-4242.txt") == 0o600 and mode(job.jobdir / "rank-0.log") == 0o600
    assert private_tree(job.jobdir) == {}


# -- what mldist submit writes ------------------------------------------------------------------


def fake_sbatch(tmp: Path) -> tuple[Path, Path]:
    """A directory with an ``sbatch`` that notes its umask in the returned file and prints job id 4242."""
    bindir, seen = tmp / "fake-bin", tmp / "sbatch-umask"
    bindir.mkdir()
    (bindir / "sbatch").write_text(f'#!/bin/sh\numask >"{seen}"\necho 4242\n')
    (bindir / "sbatch").chmod(0o755)
    return bindir, seen


@pytest.mark.slow  # runs the script under the stand-ins
@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_everything_submit_writes_is_owner_only(mask: int, tmp_path: Path, standin_bin: Path) -> None:
    bindir, seen = fake_sbatch(tmp_path)
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    env = clean_env(PATH=f"{bindir}:{standin_bin}:{os.environ['PATH']}", MLDIST_STATE_DIR=str(state))
    out = work / "jobs" / "run"  # "jobs" is made by submit too
    args = ["submit", "--scheduler", "slurm", "--output-dir", str(out), "--env", f"WANDB_API_KEY={SECRET}"]
    res = check(mldist([*args, "--", *CMD], env=env, cwd=work, umask=mask))
    assert "submitted job 4242 (slurm)" in res.stdout
    assert res.stderr.splitlines() == [
        "mldist submit: note: --env WANDB_API_KEY puts a secret in the job script (owner-only); "
        "prefer a file the job reads, e.g. --env WANDB_API_KEY_FILE=~/.wandb_api_key"
    ]
    assert SECRET not in res.stderr
    assert seen.read_text().strip() == "0077"  # the scheduler (and so the job's batch log) gets umask 077
    expected = {"work/jobs": 0o700, "work/jobs/run": 0o700, "work/jobs/run/job.sh": 0o700}  # Cobalt runs it: +x
    expected |= {"work/jobs/run/job.json": 0o600, "state": 0o700, "state/jobs": 0o700, "state/jobs/4242.json": 0o600}
    assert {name: mode(tmp_path / name) for name in expected} == expected
    assert f"export WANDB_API_KEY={SECRET}" in (out / "job.sh").read_text()

    text = (out / "job.sh").read_text()
    log = tmp_path / "standin.jsonl"
    job_env = base_env(standin_bin, log, tmp_path) | {"SLURM_JOB_ID": "4242"}
    job = Job(JobSpec(command=CMD, output_dir=str(out)), tmp_path, work, out, out / "job.sh", text, log, work, job_env)
    with umask(mask):  # as Slurm starts the job with the submitter's umask
        job.start()
    job.wait(30)
    check_job_ran(job, LAUNCH_1["slurm"], [])
    assert mode(out / "environment-4242.txt") == 0o600 and mode(out / "rank-0.log") == 0o600
    assert private_tree(work / "jobs") == {} and private_tree(state) == {}


def test_a_secret_env_file_or_a_plain_variable_gets_no_note(tmp_path: Path) -> None:
    args = ["submit", "--dry-run", "--scheduler", "slurm", "--output-dir", str(tmp_path / "o")]
    args += ["--env", "HF_TOKEN_FILE=~/.hf_token", "--env", "NCCL_DEBUG=INFO", "--", *CMD]
    res = check(mldist(args))
    assert res.stderr == "" and "export HF_TOKEN_FILE=" in res.stdout


def test_a_secret_env_in_a_dry_run_gets_the_note_once_and_the_script(tmp_path: Path) -> None:
    args = ["submit", "--dry-run", "--scheduler", "pbs", "--output-dir", str(tmp_path / "o")]
    res = check(mldist([*args, "--env", f"my_auth_token={SECRET}", "--", *CMD]))
    assert len(res.stderr.splitlines()) == 1 and "--env my_auth_token puts a secret" in res.stderr
    assert SECRET not in res.stderr and f"export my_auth_token={SECRET}" in res.stdout


def test_make_dirs_makes_every_missing_parent_private_and_leaves_existing_ones(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir(0o755)
    with umask(0o022):
        made = make_dirs(tmp_path / "old" / "a" / "b", 0o700)
    assert (mode(tmp_path / "old"), mode(made.parent), mode(made)) == (0o755, 0o700, 0o700)


@pytest.mark.parametrize(
    "mask, file_mode, dir_mode", [(0o022, 0o600, 0o700), (0o077, 0o600, 0o700), (0o277, 0o400, 0o500)]
)
def test_atomic_write_and_make_dirs_never_widen_the_umask(
    mask: int, file_mode: int, dir_mode: int, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    old.write_text("x")
    old.chmod(0o644)
    with umask(mask):
        made = make_dirs(tmp_path / "leaf", 0o700)
        written = atomic_write(old, "secret", 0o600)  # a new file replaces it, with the new mode
    assert (mode(made), mode(written), written.read_text()) == (dir_mode, file_mode, "secret")


# -- the environment record ---------------------------------------------------------------------


def python3_in_front(tmp: Path, standin_bin: Path, mldist_part: str) -> Path:
    """A ``python3`` that answers ``-m mldist`` with ``mldist_part`` (shell) and leaves the rest to the stand-in."""
    bindir = tmp / "py-bin"
    bindir.mkdir()
    script = f'#!/bin/sh\nif [ "$1 $2" = "-m mldist" ]; then\n{mldist_part}\nfi\nexec "{standin_bin}/python3" "$@"\n'
    (bindir / "python3").write_text(script)
    (bindir / "python3").chmod(0o755)
    return bindir


JOB_SECRETS = {
    "MLDIST_WANDB_API_KEY": SECRET + "-1",
    "HOROVOD_DB_PASSWORD": SECRET + "-2",
    "NCCL_auth_header": SECRET + "-3",
    "https_proxy": f"http://alice:{SECRET}-4@proxy.example:3128",
    "ALL_PROXY": f"socks5://bob:{SECRET}-5@socks.example:1080",
}


def run_with_secrets(tmp_path: Path, standin_bin: Path, mldist_part: str) -> tuple[Job, str]:
    bindir = python3_in_front(tmp_path, standin_bin, mldist_part)
    job = make_job(tmp_path, standin_bin, output_dir=str(tmp_path / "out"), job_env=JOB_SECRETS)
    job.env["PATH"] = f"{bindir}:{job.env['PATH']}"
    job.run()
    assert job.returncode == 0, job.explain()
    record = (job.jobdir / f"environment-{JOB_ID['slurm'][1]}.txt").read_text()
    assert SECRET not in record, record
    return job, record


@pytest.mark.slow  # runs the script and mldist env
def test_the_record_shows_mldist_env_with_secrets_redacted(tmp_path: Path, standin_bin: Path) -> None:
    _, record = run_with_secrets(tmp_path, standin_bin, f'exec "{sys.executable}" "$@"')
    report = json.loads(record.split("## mldist env\n", 1)[1])  # still valid JSON after the sed
    shown = report["variables"]
    assert {k: shown[k] for k in ("MLDIST_WANDB_API_KEY", "HOROVOD_DB_PASSWORD", "NCCL_auth_header")} == dict.fromkeys(
        ("MLDIST_WANDB_API_KEY", "HOROVOD_DB_PASSWORD", "NCCL_auth_header"), REDACTED
    )
    assert shown["https_proxy"] == "http://<redacted>@proxy.example:3128"
    assert shown["ALL_PROXY"] == "socks5://<redacted>@socks.example:1080"
    assert shown["MLDIST_ATTEMPT"] == "0"  # the rest stays visible


OLD_MLDIST = r"""cat <<EOF
{
  "variables": {
    "MLDIST_WANDB_API_KEY": "$MLDIST_WANDB_API_KEY",
    "https_proxy": "$https_proxy",
    "MLDIST_ATTEMPT": "0"
  }
}
env       TF_DB_PASSWORD=$TF_DB_PASSWORD
EOF
printf '%s\n' "NCCL_auth_header=$NCCL_auth_header" "ALL_PROXY=$ALL_PROXY" google-auth==2.29.0 oauthlib==3.2.2
exit 0"""


@pytest.mark.slow  # runs the script under the stand-ins
def test_the_record_is_redacted_by_the_script_even_when_the_jobs_mldist_is_not(
    tmp_path: Path, standin_bin: Path
) -> None:
    job, record = run_with_secrets(tmp_path, standin_bin, OLD_MLDIST)  # an mldist env that redacts nothing
    lines = record.split("## mldist env\n", 1)[1].splitlines()
    assert lines == [
        "{",
        '  "variables": {',
        '    "MLDIST_WANDB_API_KEY": "<redacted>",',
        '    "https_proxy": "http://<redacted>@proxy.example:3128",',
        '    "MLDIST_ATTEMPT": "0"',
        "  }",
        "}",
        "env       TF_DB_PASSWORD=<redacted>",
        "NCCL_auth_header=<redacted>",
        "ALL_PROXY=socks5://<redacted>@socks.example:1080",
        "google-auth==2.29.0",
        "oauthlib==3.2.2",
    ]
    assert "## pip freeze\nstandin-package==1.0\n" in record  # the stand-ins still answered the rest
    assert mode(job.jobdir / "environment-4242.txt") == 0o600


NAMES = [
    "WANDB_API_KEY", "wandb_api_key", "HF_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
    "Password", "MY_AUTH", "OAUTHLIB_INSECURE", "SSH_KEY", "MLDIST_TOKEN_FILE",
    "NCCL_DEBUG", "KEY", "AWS_ACCESS_KEY_ID", "KEYRING", "XKEY", "MONKEY", "PATH", "HOME", "no_proxy", "SLURM_JOB_ID",
]  # fmt: skip


def test_the_scripts_sed_and_mldist_env_agree_on_secret_names() -> None:
    text = "".join(f'  "{n}": "v1",\n{n}=v2\nexport {n}="v 3"\n' for n in NAMES)
    sed = ["sed", "-E", *(w for p in redaction_sed() for w in ("-e", p))]
    res = subprocess.run(sed, input=text, text=True, capture_output=True, check=True)
    expected = "".join(
        f'  "{n}": "{REDACTED}",\n{n}={REDACTED}\nexport {n}={REDACTED}\n'
        if is_secret_name(n)
        else f'  "{n}": "v1",\n{n}=v2\nexport {n}="v 3"\n'
        for n in NAMES
    )
    assert res.stdout == expected
    assert [n for n in NAMES if is_secret_name(n)] == NAMES[:11]
