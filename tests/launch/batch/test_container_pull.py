"""``mldist submit --container-pull login|job``: a registry image pulled on the login node, or by the job.

``mldist submit`` runs for real in a subprocess with the stand-in ``apptainer`` (it records its
argv and writes the pulled file) and a fake ``sbatch`` on PATH.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import clean_env, mldist

IMAGE = "docker://tensorflow/tensorflow:2.16.1-gpu"
SIF = "tensorflow_tensorflow_2.16.1-gpu.sif"


def _bin(tmp: Path, apptainer: str | None = None) -> Path:
    """``sbatch`` (prints job id 4242, notes that it ran) and, if given, an ``apptainer`` script."""
    bindir = tmp / "fake-bin"
    bindir.mkdir(exist_ok=True)
    scripts = {"sbatch": f'#!/bin/sh\n: >"{tmp}/sbatch-ran"\necho 4242\n'}
    scripts |= {"apptainer": apptainer} if apptainer else {}
    for name, text in scripts.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return bindir


def _submit(tmp: Path, path: str, *words: str) -> tuple[int, str, str, list[list[str]]]:
    """``mldist submit --container IMAGE WORDS -- python train.py``: exit code, stdout, stderr, apptainer calls."""
    log = tmp / "standin.jsonl"
    (tmp / "tmpdir").mkdir(exist_ok=True)
    env = clean_env(PATH=path, MLDIST_STANDIN_LOG=str(log), MLDIST_STATE_DIR=str(tmp / "state"))
    env = {k: v for k, v in env.items() if not k.startswith("APPTAINER")} | {"TMPDIR": str(tmp / "tmpdir")}
    argv = ["submit", "--scheduler", "slurm", "--container", IMAGE, *words, "--", "python", "train.py"]
    res = mldist(argv, env=env, cwd=tmp)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return res.returncode, res.stdout, res.stderr, [c for c in calls if c["prog"] == "apptainer"]


def test_the_login_node_pulls_by_default_and_the_job_runs_the_sif(tmp_path: Path, standin_bin: Path) -> None:
    out = tmp_path / "job"
    code, stdout, err, calls = _submit(tmp_path, f"{_bin(tmp_path)}:{standin_bin}", "--output-dir", str(out))
    assert code == 0, err
    (pull,) = calls
    assert pull["argv"][:2] == ["pull", "--force"] and pull["argv"][3] == IMAGE
    assert Path(pull["argv"][2]).parent == out and Path(pull["argv"][2]).name.startswith(f".{SIF}.part-")
    assert pull["env"]["APPTAINER_CACHEDIR"] == f"{tmp_path}/tmpdir/apptainer-cache-{os.getuid()}"  # not $HOME
    assert (out / SIF).read_text() == f"SIF of {IMAGE}\n" and sorted(p.name for p in out.iterdir()) == [
        "job.json",
        "job.sh",
        SIF,
    ]
    assert f"pulling {IMAGE} into {out / SIF}" in stdout and "submitted job 4242" in stdout
    script = (out / "job.sh").read_text()
    assert "apptainer pull" not in script and "mldist_sif" not in script
    assert f"{out / SIF} python train.py &" in script  # the ranks run the pulled file


def test_a_container_cache_is_pulled_into_once(tmp_path: Path, standin_bin: Path) -> None:
    path, cache = f"{_bin(tmp_path)}:{standin_bin}", tmp_path / "cache"
    for run in ("first", "second"):
        words = ["--container-cache", str(cache), "--output-dir", str(tmp_path / run)]
        code, stdout, err, calls = _submit(tmp_path, path, *words)
        assert code == 0, err
        assert f"{cache / SIF} python train.py &" in (tmp_path / run / "job.sh").read_text()
    assert len(calls) == 1 and "pulled before; remove it to pull" in stdout  # the log holds both runs' calls


def test_a_dry_run_pulls_nothing_and_says_what_it_would_pull(tmp_path: Path, standin_bin: Path) -> None:
    out = tmp_path / "job"
    code, stdout, err, calls = _submit(
        tmp_path, f"{_bin(tmp_path)}:{standin_bin}", "--output-dir", str(out), "--dry-run"
    )
    assert (code, calls, out.exists()) == (0, [], False), err
    would = f"{standin_bin}/apptainer pull {out / SIF} {IMAGE}"
    assert err.splitlines() == [f"mldist submit: dry run: the image is not pulled (it would be: {would})"]
    assert f"{out / SIF} python train.py &" in stdout and "apptainer pull" not in stdout


def test_the_job_pulls_with_the_proxies_still_set(tmp_path: Path, standin_bin: Path) -> None:
    words = ["--site", "apptainer-slurm", "--container-pull", "job", "--output-dir", str(tmp_path / "o"), "--dry-run"]
    code, script, err, calls = _submit(tmp_path, f"{_bin(tmp_path)}:{standin_bin}", *words)
    assert (code, calls) == (0, []), err
    assert "apptainer pull --force" in script and "unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY" in script
    assert script.index("apptainer pull --force") < script.index("unset http_proxy")  # pip and pulls need them
    assert script.index("unset http_proxy") < script.index("srun --kill-on-bad-exit")  # the ranks' gRPC does not


def test_without_a_pull_tool_the_job_pulls_unless_login_is_asked(tmp_path: Path) -> None:
    bindir = _bin(tmp_path)  # no apptainer, no singularity
    code, script, err, _ = _submit(tmp_path, str(bindir), "--output-dir", str(tmp_path / "o"), "--dry-run")
    assert code == 0 and err == "" and "apptainer pull --force" in script
    code, stdout, err, _ = _submit(tmp_path, str(bindir), "--container-pull", "login", "--output-dir", str(tmp_path))
    assert (code, stdout) == (2, "") and len(err.splitlines()) == 1, err
    assert "neither apptainer nor singularity is on PATH" in err and "--container-pull job" in err
    # A dry run says it in one warning and shows the script as a login-node pull would make it.
    words = ("--container-pull", "login", "--output-dir", str(tmp_path / "d"), "--dry-run")
    code, script, err, _ = _submit(tmp_path, str(bindir), *words)
    assert code == 0 and "a submission from here would stop" in err and "Traceback" not in err, err
    assert "apptainer pull --force" not in script and "tensorflow" in script  # the image is the pulled .sif


def test_a_failed_pull_submits_nothing_and_leaves_no_image(tmp_path: Path) -> None:
    bindir = _bin(tmp_path, apptainer='#!/bin/sh\necho "FATAL: no such image" >&2\n: >"$3"\nexit 3\n')
    out = tmp_path / "job"
    code, _, err, _ = _submit(tmp_path, str(bindir), "--output-dir", str(out))
    assert code == 2 and err.splitlines()[-1].startswith("mldist submit: error: ") and "(exit 3; see above)" in err
    assert "FATAL: no such image" in err and "Traceback" not in err
    assert list(out.iterdir()) == [] and not (tmp_path / "sbatch-ran").exists()
