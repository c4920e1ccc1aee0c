"""Commands that run on this host: ``mldist run`` (N local workers) and ``mldist env``.

Example:
    $ mldist run -n 2 -- python train.py
    $ mldist env --json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from ..base import envvalues
from ..errors import ConfigError
from ..launch.config import CONNECT_TIMEOUT
from .common import Handler, add_command, command_after_dashes, count, seconds, step_range
from .placing import executable, placement

RUN_EXAMPLE = """\
example:
  mldist run -n 2 -- python train.py --epochs 5
  mldist run -n 4 --log-dir logs/ python train.py
  mldist run -n 2 --run-dir runs/try1 -- python train.py   # then: mldist tensorboard runs/try1
  mldist run -n 2 --max-restarts 3 python train.py   # resumes from mldist.keras.Checkpoint
  mldist run -np 2 -H localhost:2 python train.py     # horovodrun's flags work too
  mldist run -H node1:2,node2:2 -- python train.py    # other hosts, over ssh (MPI engine)
  mldist run --hostfile hosts.txt --network-interface 10.1.0.0/16 -- python train.py
  mldist run -H n1:1,n2:1,n3:1 --min-np 2 -- python elastic_train.py   # lose a host, go on
  salloc -N 2 mldist run -- python train.py   # inside an allocation: over its nodes (srun); --local: here
  KERAS_BACKEND=jax mldist run -n 2 -- python keras_guide.py   # keras.distribution.initialize()
  mldist run -n 2 --tf-config -- python mwms_train.py   # TF_CONFIG per worker

Each worker gets MLDIST_RANK, MLDIST_SIZE, MLDIST_LOCAL_RANK, MLDIST_LOCAL_SIZE
and MLDIST_WORKERS; mldist.init() reads them. RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE and Keras's KERAS_DISTRIBUTION_* are set too (never over
yours). A run whose workers never formed a group says so at the end
(--require-group: exit 1). If one worker fails the others
are stopped and the exit code is that worker's (128+N for signal N); exit
code 75 means the workers saved a checkpoint and ask to be started again.
Every run leaves a run directory (MLDIST_RUN_DIR for the workers): config.json,
rank-R.log, RunLog's metrics, summary.json at the end (mldist status RUN_DIR shows it)."""

ENV_EXAMPLE = """\
example:
  mldist env            # what this process would be
  srun -n 2 mldist env --json   # what each task of a Slurm step sees"""


def _add_horovodrun_flags(run: Any) -> None:
    """horovodrun's -H, --hostfile, --network-interface, --gloo and --mpi (its -np is an alias of -n)."""
    hosts = run.add_mutually_exclusive_group()
    hosts.add_argument(
        "-H",
        "--hosts",
        help="host:slots,... (horovodrun's -H): other hosts start through mpiexec's ssh; sets -n if absent",
    )
    hosts.add_argument("--hostfile", help="a file of hosts, one per line: 'host', 'host:slots' or 'host slots=N'")
    run.add_argument(
        "--network-interface",
        metavar="IF",
        help="with -H/--hostfile: the interface or address/CIDR MPI uses between the hosts (e.g. ib0, 10.1.0.0/16)",
    )
    run.add_argument(
        "--connect-timeout",
        type=seconds,
        metavar="S",
        help=f"with -H/--hostfile: seconds each host has to answer over ssh before the workers start "
        f"(default {CONNECT_TIMEOUT:g}); one that does not is named",
    )
    engine = run.add_mutually_exclusive_group()
    engine.add_argument("--gloo", action="store_true", help="horovodrun's flag: TensorFlow's RING engine")
    engine.add_argument("--mpi", action="store_true", help="horovodrun's flag: the MPI engine")
    horovodrun = "horovodrun's flag: "
    run.add_argument("--mpi-args", type=_mpi_args, metavar="ARGS", help=horovodrun + "more mpiexec arguments")
    run.add_argument("--timeline-filename", metavar="FILE", help=horovodrun + "HOROVOD_TIMELINE=FILE for hvd.init()")
    run.add_argument("--log-level", type=_log_level, help=horovodrun + ", ".join(LOG_LEVELS) + " (TensorFlow's too)")
    run.add_argument("--start-timeout", type=seconds, help=horovodrun + "accepted; mldist needs no start timeout")
    _add_elastic_flags(run)


def _add_elastic_flags(run: Any) -> None:
    """horovodrun's elastic flags: a world that re-forms on the hosts that remain (mldist.launch.elastic)."""
    elastic = run.add_argument_group("elastic worlds (horovodrun's flags; with -H or --hostfile)")
    elastic.add_argument("--min-np", type=count(1), metavar="N", help="go on with N+ workers after a loss")
    elastic.add_argument("--max-np", type=count(1), metavar="N", help="at most N workers (default: every slot)")
    elastic.add_argument(
        "--elastic-timeout",
        type=seconds,
        metavar="S",
        help="below --min-np, wait this long for hosts to answer again (default 600)",
    )
    elastic.add_argument("--reset-limit", type=count(0), metavar="N", help="re-form the world at most N times")
    elastic.add_argument(
        "--host-discovery-script",
        metavar="FILE",
        help="prints the hosts to use, 'host' or 'host:slots' a line; hosts it adds join at the next commit",
    )
    elastic.add_argument(
        "--slots-per-host", "--slots", type=count(1), metavar="N", help="slots of a host the script lists without"
    )


def _add_output_flags(run: Any) -> None:
    """--log-dir, the run directory's --run-dir / --no-run-dir, --verbose and --profile-steps."""
    run.add_argument("--log-dir", help="write one rank-R.log per worker here instead of prefixed output")
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--run-dir",
        metavar="DIR",
        help="keep config.json, rank-R.log, metrics and summary.json here (default runs/<script>-<time>)",
    )
    where.add_argument("--no-run-dir", action="store_true", help="no run directory (RunLog() writes none either)")
    run.add_argument("--verbose", "-v", action="store_true", help="show TensorFlow's start-up notices of every rank")
    run.add_argument(
        "--tf-config",
        action="store_true",
        help="give each worker TF_CONFIG, for scripts written for tf.distribute.MultiWorkerMirroredStrategy",
    )
    run.add_argument(
        "--require-group",
        action="store_true",
        help="fail the run (exit code 1) when its workers never formed a group; also MLDIST_REQUIRE_GROUP=1",
    )
    run.add_argument(
        "--profile-steps",
        type=step_range,
        default=envvalues.PROFILE_STEPS.read(os.environ),
        metavar="A:B",
        help="record a timeline of train steps A..B on every rank: trace/rank-R and trace/merged.trace.json.gz",
    )


def _add_count_flags(run: Any) -> None:
    """-n and --local: how many workers, and whether an allocation's nodes get them."""
    run.add_argument(
        "-n",
        "-np",
        "--nprocs",
        type=count(1, 4096),
        help="number of workers (-np as in horovodrun; inside a batch allocation: its tasks by default)",
    )
    run.add_argument(
        "--local",
        action="store_true",
        help="inside a batch allocation (salloc, sbatch, qsub): start the workers on this node only",
    )
    run.add_argument(
        "--stage-env",
        action="store_true",
        help="inside a batch allocation: copy this Python's venv or conda environment to each node once and run "
        "the workers from there (sbcast on Slurm)",
    )
    run.add_argument("--stage-to", default="tmpdir", help="where on a node: tmpdir ($TMPDIR or /tmp), tmp, shm, a path")


def register(sub: Any) -> dict[str, Handler]:
    """Add ``run`` and ``env`` to the subcommands; their handlers by name."""
    run = add_command(
        sub,
        "run",
        "start N workers of a training script on this host",
        RUN_EXAMPLE,
        "Start N workers of COMMAND on this host, all-or-nothing.",
    )
    _add_count_flags(run)
    _add_horovodrun_flags(run)
    _add_output_flags(run)
    run.add_argument(
        "--grace",
        type=seconds,
        default=60.0,
        help="seconds the workers get to save and exit after SIGINT/SIGTERM, then SIGKILL (default 60; "
        "mldist submit's --grace is the same time, before the job's time limit)",
    )
    run.add_argument(
        "--failure-grace", type=seconds, default=5.0, help="seconds the others get after one worker failed (default 5)"
    )
    run.add_argument(
        "--cpu-bind",
        choices=("none", "cores"),
        default="none",
        help="'cores' gives each worker its own share of this process's CPUs",
    )
    run.add_argument(
        "--max-restarts",
        type=count(0, 1000),
        default=0,
        help="after a worker failure, restart the group up to K times (resumes from mldist checkpoints)",
    )
    run.add_argument(
        "--communication",
        choices=("auto", "mpi", "ring", "nccl"),
        default=envvalues.COMMUNICATION.read(os.environ) or "auto",
        help="collective engine: auto (MPI on CPUs through mpiexec when available, NCCL on GPUs, else RING)",
    )
    run.add_argument(
        "--network",
        choices=("auto", "private", "host"),
        default="auto",
        help="TensorFlow's engines: 'private' runs the workers in their own network namespace (unreachable "
        "from elsewhere, no other network), 'host' on this host's; auto: private where allowed",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND", help="the worker command")
    env = add_command(
        sub,
        "env",
        "show what mldist detects and what mldist.init() would set",
        ENV_EXAMPLE,
        "Show the launcher, ranks, workers, threads, GPUs and versions.",
    )
    env.add_argument("--json", action="store_true", help="print JSON")
    env.add_argument("--no-tensorflow", action="store_true", help="skip the GPU query (no TF import)")
    return {"run": _cmd_run, "env": _cmd_env}


#: horovodrun's --log-level, and the TF_CPP_MIN_LOG_LEVEL that shows the same.
LOG_LEVELS = {"TRACE": "0", "DEBUG": "0", "INFO": "0", "WARNING": "1", "ERROR": "2", "FATAL": "3"}


def _log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def _mpi_args(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _horovodrun_env(args: argparse.Namespace) -> dict[str, str]:
    """--tf-config, --require-group, and horovodrun's --timeline-filename and --log-level, as the variables
    the workers read (``RunConfig.env``)."""
    env = {}
    if args.tf_config:
        env[envvalues.TF_CONFIG.name] = "1"
    if args.require_group:
        env[envvalues.REQUIRE_GROUP.name] = "1"
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = os.path.abspath(args.timeline_filename)
    if args.log_level:
        env["HOROVOD_LOG_LEVEL"] = args.log_level
        env["TF_CPP_MIN_LOG_LEVEL"] = LOG_LEVELS[args.log_level]
    if args.start_timeout is not None:
        print("mldist run: --start-timeout has no effect (workers do not wait for a rendezvous)", file=sys.stderr)
    return env


def _cmd_run(args: argparse.Namespace) -> int:
    from ..base import envvalues
    from ..base.rundir import default_run_dir, prepare_run_dir, runs_root
    from ..launch.local import RunConfig, run

    envvalues.check(os.environ)  # a bad MLDIST_* value of the workers stops here, before any worker starts
    if not (args.no_run_dir or args.run_dir):  # the default's parent: named as the user gave it, not as --run-dir
        prepare_run_dir(*runs_root(), create=False)  # made when the run starts: a refused one leaves none
    nprocs, hosts, found = placement(args)
    engine = "ring" if args.gloo else "mpi" if args.mpi else args.communication
    command = tuple(command_after_dashes(args.cmd, "mldist run -n 2 -- python train.py"))
    cfg = RunConfig(
        nprocs=nprocs,
        command=command,
        log_dir=args.log_dir,
        grace=args.grace,
        failure_grace=args.failure_grace,
        cpu_bind=args.cpu_bind,
        max_restarts=args.max_restarts,
        communication=engine,
        network=args.network,
        verbose=args.verbose,
        profile_steps=args.profile_steps,
        run_dir=None if args.no_run_dir else args.run_dir or str(default_run_dir(command)),
        hosts=hosts,
        network_interface=args.network_interface,
        mpi_args=args.mpi_args or (),
        env=_horovodrun_env(args),
        elastic=_elastic(args, nprocs, hosts),
        allocation=found,
        connect_timeout=CONNECT_TIMEOUT if args.connect_timeout is None else args.connect_timeout,
        stage_to=_stage_to(args, found),
    )
    return run(cfg)


def _stage_to(args: argparse.Namespace, found: Any) -> str | None:
    """``--stage-to`` with ``--stage-env`` inside an allocation (None without); one line where it cannot apply."""
    from ..launch.batch.staging import check_stage_to

    check_stage_to(args.stage_to)
    if not args.stage_env:
        return None
    if found is None:
        raise ConfigError(
            "--stage-env copies the environment to the nodes of a batch allocation (salloc, sbatch, "
            "qsub) and there is none here (or --local): drop --stage-env"
        )
    return str(args.stage_to)


def _elastic(args: argparse.Namespace, nprocs: int, hosts: tuple[tuple[str, int], ...]) -> Any:
    """The ``ElasticConfig`` of --min-np/--max-np/--host-discovery-script (None without them); horovodrun's
    defaults."""
    from ..launch.config import MAX_WORKERS, ElasticConfig

    discovery = executable(args.host_discovery_script) if args.host_discovery_script else None
    if args.min_np is None and args.max_np is None and discovery is None:
        return None
    slots = sum(n for _, n in hosts) or nprocs
    return ElasticConfig(
        min_np=args.min_np or nprocs,
        max_np=args.max_np or (MAX_WORKERS if discovery else max(slots, nprocs)),
        timeout=600.0 if args.elastic_timeout is None else args.elastic_timeout,
        reset_limit=args.reset_limit,
        discovery=discovery,
        slots=args.slots_per_host or 1,
    )


def _cmd_env(args: argparse.Namespace) -> int:
    from ..tools.report import build_report, format_report

    report = build_report(os.environ, with_tensorflow=not args.no_tensorflow)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
    if report["refused"]:  # the report shows everything; then what init() or run would refuse: one line, exit 2
        raise ConfigError(report["refused"][0])
    return 0
