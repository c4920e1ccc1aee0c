"""Commands that look at runs: ``mldist tensorboard`` (TensorBoard over an ssh tunnel).

Example:
    $ mldist tensorboard runs/train-20261124-010203
    $ mldist tensorboard runs/* --login-host login.hpc.example.org
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import Handler, add_command, count

TENSORBOARD_EXAMPLE = """\
example:
  mldist tensorboard runs/train-20261124-010203     # prints: ssh -L PORT:localhost:PORT $USER@login-host
  mldist tensorboard runs/* --port 6006 --login-host login.hpc.example.org

TensorBoard listens on 127.0.0.1 only (it has no authentication); run the printed
ssh line on your own machine, then open http://localhost:PORT/. Ctrl-C stops it.
The login host comes from $SLURM_SUBMIT_HOST or $PBS_O_HOST inside a job, else this host."""


def register(sub: Any) -> dict[str, Handler]:
    """Add ``tensorboard`` to the subcommands; its handler by name."""
    board = add_command(
        sub,
        "tensorboard",
        "show run directories in TensorBoard on 127.0.0.1 and print the ssh tunnel to it",
        TENSORBOARD_EXAMPLE,
    )
    board.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (mldist run's --run-dir)")
    board.add_argument("--port", type=count(1, 65535), help="port on 127.0.0.1 (default: a free one)")
    board.add_argument("--local-port", type=count(1, 65535), help="port on your machine in the ssh line (default PORT)")
    board.add_argument("--login-host", help="the host you ssh to (default: the job's submit host, else this host)")
    return {"tensorboard": _cmd_tensorboard}


def _cmd_tensorboard(args: argparse.Namespace) -> int:
    from ..tools.tensorboard import serve

    return serve(args.run_dirs, port=args.port, login=args.login_host, local_port=args.local_port)
