"""CLI commands for batch jobs: submit, status, cancel, logs.

Example:
    $ mldist submit --nodes 2 --time 1:00:00 --venv .venv -- python train.py
    $ mldist logs 4242 --rank 0 --follow
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..launch.batch.images import PULL_MODES
from ..launch.batch.launchers import LAUNCHERS
from ..launch.batch.schedulers import SCHEDULERS
from ..launch.batch.spec import GPU_REQUESTS
from .common import MAX_SECONDS, Handler, add_command, command_after_dashes, count

SUBMIT_EXAMPLE = """\
example:
  mldist submit --nodes 2 --time 2:00:00 --venv .venv -- python train.py --epochs 10
  mldist submit --site polaris --nodes 4 --queue debug --account MYPROJ --dry-run -- python train.py
  mldist submit --site theta --nodes 8 --time 1:00:00 --requeue -- python train.py
  mldist submit --nodes 3 --min-nodes 2 --time 2:00:00 --venv .venv -- python elastic_train.py   # lose a node, go on
  mldist submit --requeue --time 4:00:00 --module tensorflow/2.21 -- python train.py
  mldist submit --module cuda --env 'XLA_FLAGS=--xla_gpu_cuda_data_dir=${CUDA_PATH}' -- python train.py
  mldist submit --container docker://tensorflow/tensorflow:2.16.1-gpu --gpus-per-node 4 -- python train.py
  mldist submit --wrap 'vtune -collect hotspots -r {job_dir}/vtune-{rank} --' -- python train.py
  mldist submit --array 0-9 --time 1:00:00 --wrap 'env TRIAL={array_index}' -- python sweep.py
  mldist submit --nodes 2 --backend jax --venv ~/venvs/jax -- python train.py   # Keras 3 on JAX

The script starts one process per task (srun, aprun, PALS mpiexec, Open MPI mpirun or
Hydra mpiexec), records the software environment in the output directory and writes one
rank-R.log per rank; each job gets a new mldist-jobs/NAME-TIME (-2, -3, ... when taken). An
--array task has its own array-I/ (logs, run/) and $MLDIST_ARRAY_INDEX. Without
--cpus-per-task the node's cores are shared among its ranks (the site's cores_per_node,
else measured when the job starts). In --env values $NAME and
${NAME} expand when the job starts, after the modules load; write $$ for a literal $.
With --requeue, the workers get SIGUSR1 --grace seconds before the time limit;
if they exit with code 75 the job requeues (Slurm) or resubmits itself (PBS, Cobalt).
--dry-run works on any machine: with no scheduler found it renders for Slurm (or --scheduler)
and missing --venv/--env-source files are warnings; submitting stops at them."""


#: The same meaning as mldist run's --grace: the time the workers get to save and exit, here before the limit.
GRACE_HELP = (
    "with --requeue: seconds the workers get to save and exit before the time limit, signalled "
    "(SIGUSR1) that long before it (default 90); the same meaning as mldist run's --grace"
)


_MODULE = re.compile(r"[^\s\x00-\x1f\x7f]+")


def _env_pair(text: str) -> tuple[str, str]:
    from ..base.secrets import is_secret_name

    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    if key.isascii() and key.isidentifier() and is_secret_name(key) and not key.upper().endswith("_FILE"):
        print(
            f"mldist submit: note: --env {key} puts a secret in the job script (owner-only); "
            f"prefer a file the job reads, e.g. --env {key}_FILE=~/.{key.lower()}",
            file=sys.stderr,
        )
    return key, value


def register(sub: Any) -> dict[str, Handler]:
    """Add ``submit``, ``status``, ``cancel`` and ``logs`` to the subcommands; their handlers by name."""
    _add_submit(sub)
    _add_follow_up(sub)
    return {"submit": _cmd_submit, "status": _cmd_status, "cancel": _cmd_cancel, "logs": _cmd_logs}


def _add_submit(sub: Any) -> None:
    p = add_command(
        sub,
        "submit",
        "write, submit and record a batch job (Slurm, PBS Pro, Cobalt)",
        SUBMIT_EXAMPLE,
        "Render a batch script for COMMAND, submit it, print the job id and log directory.",
    )
    add_job_options(p)
    p.add_argument(
        "--backend", dest="keras_backend", choices=("tensorflow", "jax"),
        help="Keras's backend in every task (KERAS_BACKEND; the venv needs the matching extra: mldist build-env "
        "--backend jax)",
    )  # fmt: skip
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND")


def module_name(text: str) -> str:
    """A module name: one word, no blanks or control characters (argparse type)."""
    if not _MODULE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a module name (one word, no blanks or newlines)")
    return text


class _Skipping:
    """A parser's ``add_argument`` that leaves out the flags in ``skip``."""

    def __init__(self, parser: argparse.ArgumentParser, skip: Collection[str]) -> None:
        self.parser, self.skip = parser, skip

    def add_argument(self, *flags: str, **kw: Any) -> None:
        if flags[0] not in self.skip:
            self.parser.add_argument(*flags, **kw)


def add_job_options(parser: argparse.ArgumentParser, skip: Collection[str] = ()) -> None:
    """Add ``submit``'s job options to ``parser``, but those in ``skip`` (``build-env`` shares them).

    Args:
        parser: the subcommand's parser.
        skip: flags left out (``build-env``: ``--nodes``, its own ``--venv``, ...).

    Example:
        >>> p = argparse.ArgumentParser(); add_job_options(p, skip={"--nodes"})
        >>> p.parse_args(["--module-purge"]).module_purge, hasattr(p.parse_args([]), "nodes")
        (True, False)
    """
    p = _Skipping(parser, skip)
    p.add_argument("--scheduler", choices=list(SCHEDULERS), help="default: the site's, else detected")
    p.add_argument("--site", help="a site profile (built-in, ~/.config/mldist/sites.toml, ./mldist-sites.toml)")
    _add_sizes(p)
    for flag, text in (
        ("--mem", "memory per node, e.g. 64G"),
        ("--mem-per-cpu", "memory per CPU (Slurm), e.g. 4G"),
        ("--time", "time limit: M, H:MM:SS or D-HH:MM:SS"),
        ("--dependency", "e.g. afterok:4242"),
        ("--array", "an array of jobs, e.g. 0-9 (Slurm, PBS); each task logs in array-INDEX/"),
        ("--account", "project to charge"),
        ("--constraint", "node features (Slurm), --attrs (Cobalt)"),
        ("--venv", "activate this virtual environment"),
        ("--conda", "activate this conda environment"),
        ("--container", "run every task in this Apptainer image: a .sif, or docker://... / library://... pulled once"),
        ("--container-cache", "keep pulled images here (default: the job directory)"),
        ("--wrap", "prefix each rank's command, e.g. 'nsys profile -o {job_dir}/r{rank} --' (also {local_rank}, ...)"),
        ("--job-name", "job name (default mldist)"),
        ("--output-dir", "script, logs and environment record, used as given (default: a new mldist-jobs/NAME-TIME)"),
        ("--srun-mpi", "srun's --mpi plugin (pmix, pmi2, none, ...); default auto: pmix for Open MPI if Slurm has it"),
        ("--network-interface", "interface or address/CIDR MPI uses between nodes (ib0, 10.1.0.0/16)"),
        ("--stage-to", "where --stage-env copies to on a node: tmpdir ($TMPDIR or /tmp; default), tmp, shm, a path"),
    ):
        p.add_argument(flag, help=text)
    p.add_argument("--partition", "--queue", dest="queue", help="partition (Slurm) or queue (PBS, Cobalt)")
    p.add_argument("--launcher", choices=list(LAUNCHERS), help="how ranks start (default: the site's or scheduler's)")
    p.add_argument("--gpu-request", choices=list(GPU_REQUESTS), help="Slurm GPUs per node, per task or in total")
    p.add_argument("--module", action="append", dest="modules", type=module_name, help="module to load (repeatable)")
    p.add_argument(
        "--module-purge",
        action=argparse.BooleanOptionalAction,
        help="'module purge' before the loads (default: the site's, else no: Cray's aprun and mpi4py need theirs)",
    )
    p.add_argument("--env-source", action="append", help="shell file to source after the modules (repeatable)")
    p.add_argument("--unset", action="append", help="variable to remove in the job, e.g. https_proxy (repeatable)")
    _add_container_options(p)
    p.add_argument("--env", action="append", type=_env_pair, help="KEY=VALUE for every task (repeatable)")
    p.add_argument("--directive", action="append", dest="directives", help="raw extra directive (repeatable)")
    for flag, text in (
        ("--requeue", "save and requeue before the limit"),
        ("--tf-config", "give each rank TF_CONFIG, for scripts written for tf.distribute.MultiWorkerMirroredStrategy"),
        ("--stage-env", "copy the --venv/--conda (else this mldist's) environment to node-local storage once per node"),
    ):
        p.add_argument(flag, action="store_true", default=None, help=text)
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")


def _nodes(text: str) -> int | tuple[int, int]:
    """``--nodes``: a count, or ``MIN-MAX`` (an elastic job, as ``sbatch --nodes``).

    Example:
        >>> _nodes("2"), _nodes("2-4")
        (2, (2, 4))
    """
    if "-" not in text:
        return count(1)(text)
    low, _, high = text.partition("-")
    try:
        pair = count(1)(low), count(1)(high)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: give a count or MIN-MAX (e.g. 2-4): {exc}") from None
    if pair[0] > pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: give MIN-MAX with MIN <= MAX (e.g. 2-4)")
    return pair


def _add_sizes(p: _Skipping) -> None:
    """The job's numbers: nodes, tasks, GPUs, CPUs, threads, cores and the grace period."""
    for flag, kind, text in (
        ("--nodes", _nodes, "nodes (default 1); MIN-MAX: an elastic job on what Slurm gives (see --min-nodes)"),
        ("--min-nodes", count(1), "elastic (Slurm): keep the job when a node fails; train on while this many remain"),
        ("--tasks-per-node", count(1, 1024), "tasks per node (default: one per GPU, else 1)"),
        ("--gpus-per-node", count(0, 64), "GPUs per node"),
        ("--cpus-per-task", count(1, 4096), "CPUs per task (threads per rank)"),
        ("--hyperthreads", count(1, 8), "hardware threads used per core (aprun -j; default: the site's, else 1)"),
        ("--cores-per-node", count(1, 100_000), "physical cores per node (default: the site's, else measured)"),
        ("--grace", count(0, MAX_SECONDS), GRACE_HELP),
    ):
        p.add_argument(flag, type=kind, help=text)


def _add_container_options(p: _Skipping) -> None:
    p.add_argument("--bind", action="append", dest="binds", help="extra directory bound into the container")
    p.add_argument("--container-args", dest="container_args_text", help="extra 'apptainer exec' options ('--rocm')")
    p.add_argument(
        "--container-pull",
        choices=PULL_MODES,
        help="pull a docker://... image here before submitting (login: the default where apptainer or "
        "singularity is on PATH) or in the job (job)",
    )


JOB_ID = re.compile(r"[A-Za-z0-9_.\[\]-]{1,128}")


def _job_id(text: str) -> str:
    """A job id as schedulers print them (4242, 4242_3, 123.server, 123[].server)."""
    if not JOB_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (e.g. 4242; see 'mldist status')")
    return text


def _job_or_run_dir(text: str) -> str:
    """``mldist status``'s argument: a path that exists (a run directory), else a job id."""
    if os.path.exists(text) or JOB_ID.fullmatch(text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is neither a job id (e.g. 4242; see 'mldist status') nor an "
                                     "existing run directory (e.g. runs/train-20261124-010203)")  # fmt: skip


STATUS_EXAMPLE = """\
example:
  mldist status                               # every job of mldist submit
  mldist status 4242                          # one job
  mldist status runs/train-20261124-010203    # a run of mldist run, by its run directory

A run directory shows whether the run goes on or how it ended (summary.json: exit code, the
failed rank, when), the progress of fit (training.json) and the slow-rank line (straggler.json)."""


def _add_follow_up(sub: Any) -> None:
    s = add_command(
        sub, "status", "state of a job or run directory, or of all jobs submitted with mldist", STATUS_EXAMPLE
    )
    s.add_argument(
        "job", nargs="?", type=_job_or_run_dir, metavar="JOB|RUN_DIR",
        help="a job id, or a run directory of mldist run (a path that exists); default: every recorded job",
    )  # fmt: skip
    c = add_command(sub, "cancel", "cancel a job", "example:\n  mldist cancel 4242")
    c.add_argument("job", type=_job_id, help="job id")
    lg = add_command(
        sub,
        "logs",
        "print a job's logs: the batch log, then every rank's lines prefixed [R]",
        "example:\n  mldist logs 4242            # the whole job\n  mldist logs 4242 --follow   # as it runs"
        "\n  mldist logs 4242 --rank 1   # one rank",
    )
    lg.add_argument("job", type=_job_id, help="job id")
    lg.add_argument("--rank", type=count(0), help="only this rank's log")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")


# Each command imports what only it needs: status, logs and cancel skip submit's job builders (0.16
# instead of 0.205 CPU-s per call here; users run them in watch loops, often from a shared file system).


def _cmd_submit(args: argparse.Namespace) -> int:
    from ..base.files import new_directory
    from ..launch.batch.build import build_spec
    from ..launch.batch.images import plan_pull, pull_image
    from ..launch.batch.records import PRIVATE_DIR, UnrecordedJob, check_index, submit
    from ..launch.batch.render import render

    notes: list[str] = []
    spec = build_spec(
        vars(args), command_after_dashes(args.cmd, "mldist submit --nodes 2 -- python train.py"), notes=notes
    )
    render(spec)  # every refusal comes before anything is created or noted: one error line only
    try:  # before the image pull and the job: the job must be found again (records.check_index)
        check_index(create=not args.dry_run)
    except ConfigError as exc:
        if not args.dry_run:
            raise
        notes.append(f"mldist submit: warning: {exc} (a dry run goes on; submitting stops here)")
    for note in notes:
        print(note, file=sys.stderr)
    if args.output_dir is None:  # a default name is made unique (-2, -3, ...); a dry run only looks
        out = new_directory(spec.output_dir, PRIVATE_DIR, create=not args.dry_run)
        spec = dataclasses.replace(spec, output_dir=str(out))
    say = (lambda line: print(line, file=sys.stderr)) if args.dry_run else None
    spec, pull = plan_pull(spec, args.container_pull, shutil.which, say)
    if args.dry_run:
        if pull:
            print(f"mldist submit: dry run: the image is not pulled (it would be: {pull.shell()})", file=sys.stderr)
        sys.stdout.write(render(spec))
        return 0
    if pull:
        pull_image(pull)
    try:
        record = submit(spec, fresh=args.output_dir is None)
    except UnrecordedJob as exc:  # the scheduler has the job: its id is printed all the same
        print(f"submitted job {exc.record.job_id} ({exc.record.scheduler})")
        print(f"mldist submit: error: {exc}", file=sys.stderr)
        return 1
    print(f"submitted job {record.job_id} ({record.scheduler})")
    print(f"logs: {record.output_dir}  (mldist logs {record.job_id} [--rank R] [--follow])")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    if args.job is not None and os.path.exists(args.job):  # a run directory of mldist run
        from ..tools import runstatus

        run = runstatus.read(args.job)
        print(runstatus.line(run))
        return 1 if run.problems else 0  # a file it could not use: the state is not all known
    from ..launch.batch.records import job_status, list_records, load_record

    records = [load_record(args.job)] if args.job is not None else list_records()[-20:]
    if not records:
        print("no jobs submitted with mldist yet")
    for record in records:
        try:
            st = job_status(record)
            code = "" if st.exit_code is None else f" exit {st.exit_code}"
            extra = f" restarts {st.restarts}" if st.restarts else ""
            shown = _progress(record, st.state, st.final)
            print(f"{record.job_id:>14}  {st.state:<12}{code}{extra}  {record.output_dir}{shown}")
        except ConfigError as exc:
            if args.job:
                raise
            print(f"{record.job_id:>14}  {'UNKNOWN':<12}  {exc}{_progress(record, 'UNKNOWN', True)}")
    return 0


def _progress(record: Any, state: str, final: bool) -> str:
    """After a job's state: a queued job's expected start; a started training job's progress (training.json)."""
    from ..base import training
    from ..launch.batch.records import start_estimate

    if state == "PENDING":
        when = start_estimate(record)
        return f"  (expected to start {when})" if when else ""
    if record.array:  # each task has its own run directory: mldist logs shows them
        return ""
    from ..runtime.watch import straggler_watch

    shown = training.progress_line(Path(record.output_dir) / "run", ended=final)  # or why training.json is no use
    slow = straggler_watch.status(Path(record.output_dir) / "run")  # the slow rank rank 0 named, if any
    if shown is None:
        return ("  (no training progress yet)" if state == "RUNNING" else "") + slow
    return "  " + shown + slow


def _cmd_cancel(args: argparse.Namespace) -> int:
    from ..launch.batch.records import cancel, load_record

    cancel(load_record(args.job))
    print(f"cancelled job {args.job}")
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    from ..launch.batch.joblogs import follow_logs, log_sources, print_logs
    from ..launch.batch.records import job_status, load_record

    record = load_record(args.job)
    if args.rank is not None and record.tasks and args.rank >= record.tasks:
        raise ConfigError(f"--rank {args.rank}: job {args.job} has ranks 0-{record.tasks - 1}")

    def sources() -> list[tuple[Path, str]]:
        tasks = (lambda index: record.log_path(None, index)) if record.array else None
        return log_sources(Path(record.output_dir), record.log_path(None), args.rank, tasks)

    if args.follow:

        def finished() -> bool:
            try:
                return job_status(record).final
            except ConfigError:
                return True

        follow_logs(sources, finished)
        return 0
    if not print_logs(sources()):
        what = f"rank {args.rank}" if args.rank is not None else "the batch script or any rank"
        raise ConfigError(f"no log yet for {what} of job {args.job} ({record.output_dir}); it may still be pending")
    return 0
