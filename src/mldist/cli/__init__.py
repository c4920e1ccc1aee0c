"""The ``mldist`` command line (also ``python -m mldist``): argparse only.

One module per command group registers its subcommands (``run``: run, env;
``jobs``: submit, status, cancel, logs; ``buildenv``: build-env; ``tools``: doctor;
``bench``: bench; ``observe``: tensorboard; ``data``: data); ``common`` holds the shared
parser pieces. Bad input gets one clear line on stderr and exit code 2, never a traceback.

Example:
    $ mldist run -n 2 -- python train.py
    $ mldist env --json
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import MldistError
from . import bench, buildenv, data, jobs, observe, run, tools
from .common import FORMATTER, Handler, Parser

#: Command groups, in ``mldist --help`` order.
GROUPS = (run, jobs, buildenv, tools, bench, observe, data)


def build_parser() -> tuple[Parser, dict[str, Handler]]:
    """The top-level parser and every subcommand's handler by name."""

    parser = Parser(
        prog="mldist",
        description="Data-parallel TensorFlow/Keras on workstations and HPC clusters.",
        epilog="example:\n  mldist run -n 2 -- python train.py\n  mldist submit --nodes 2 -- python train.py",
        formatter_class=FORMATTER,
    )
    parser.add_argument("--version", action="version", version=f"mldist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    handlers: dict[str, Handler] = {}
    for group in GROUPS:
        handlers.update(group.register(sub))
    parser.commands = dict(sub.choices)
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
    """
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's flush at exit
    except BrokenPipeError:
        if not stdout_reader_gone():  # another pipe (a worker's, a socket): a real error
            raise
        return reader_gone()
    except SystemExit:  # argparse's --help and --version print, then exit: the same check
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            return reader_gone()
        raise
    return code


def _dispatch(argv: Sequence[str] | None) -> int:
    parser, handlers = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own parser says it, so the line points at its --help, not mldist's
        parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return handlers[args.command](args)
    except MldistError as exc:
        print(f"mldist {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


#: The exit code when stdout's reader has gone (``mldist status | head -1``): 128 + SIGPIPE, what the
#: shell reports for ``cat``, ``grep`` or ``git log`` killed by SIGPIPE there. Not 0: a script under
#: ``set -o pipefail`` learns that the output was cut, as it would from those tools.
EXIT_READER_GONE = 128 + signal.SIGPIPE


def stdout_reader_gone() -> bool:
    """True when stdout is a pipe whose reading end is closed (Linux's poll reports POLLERR then).

    Example:
        >>> import io, contextlib
        >>> with contextlib.redirect_stdout(io.StringIO()):  # no file behind stdout: no pipe to lose
        ...     gone = stdout_reader_gone()
        >>> gone
        False
    """
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file behind stdout, or no poll() here
        return False


def reader_gone() -> int:
    """End quietly after stdout's reader closed the pipe; :data:`EXIT_READER_GONE`.

    Python ignores SIGPIPE and raises BrokenPipeError instead; mldist keeps it that way (a
    launcher must not die when a worker's socket closes), so the command line does here what
    SIGPIPE does to other tools: no message, no traceback. stdout then points at /dev/null so
    that the interpreter's last flush finds nothing to complain about (the Python docs' recipe,
    "Note on SIGPIPE" in the signal module).

    Example::

        except BrokenPipeError:
            return reader_gone()  # 141
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (an in-process caller's stand-in): nothing to redirect
        pass
    finally:
        os.close(devnull)
    return EXIT_READER_GONE
