"""What every command shares: the one-line-error parser and the option parsers.

Example:
    >>> count(1)("3")
    3
    >>> command_after_dashes(["--", "python", "train.py"], "mldist run -n 2 -- python train.py")
    ['python', 'train.py']
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..errors import ConfigError

Handler = Callable[[argparse.Namespace], int]
FORMATTER = argparse.RawDescriptionHelpFormatter


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit code 2.

    ``commands``: the top-level parser's subcommand parsers by name (set by ``build_parser``).
    """

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


#: Upper bound of every count flag unless a flag says otherwise: far above any real job.
MAX_COUNT = 100_000
#: Upper bound of durations in seconds (grace periods): one week.
MAX_SECONDS = 7 * 24 * 3600
_DIGITS = re.compile(r"[0-9]{1,9}")


def count(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """A parser for count flags: ASCII digits only, between ``minimum`` and ``maximum``.

    Example:
        >>> count(0)("0")
        0
    """

    def parse(text: str) -> int:
        if not _DIGITS.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not at least {minimum}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{value} is more than {maximum}")
        return value

    return parse


def step_range(text: str) -> str:
    """A parser for ``--profile-steps``: ``A:B`` with A <= B (train steps counted from 0).

    Example:
        >>> step_range("10:12")
        '10:12'
    """
    from ..runtime.collect.profiling import parse_steps

    try:
        parse_steps(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def seconds(text: str) -> float:
    """A parser for durations in seconds: a finite number from 0 to a week.

    Example:
        >>> seconds("2.5")
        2.5
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not text.isascii() or "_" in text:  # float() reads '٥' and '1_0'; the count flags refuse them alike
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds: ASCII digits only (e.g. 2.5)")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value:g} is negative")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{value:g} seconds is more than a week ({MAX_SECONDS})")
    return value


def command_after_dashes(words: Sequence[str], example: str) -> list[str]:
    """The worker command after an optional ``--``; a ConfigError showing ``example`` if there is none."""
    cmd = list(words)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError(f"missing COMMAND, e.g. {example}")
    return cmd


def add_command(sub: Any, name: str, help: str, example: str, description: str | None = None) -> Parser:
    """A subcommand whose ``--help`` ends with ``example:`` lines."""
    parser: Parser = sub.add_parser(
        name,
        help=help,
        description=description or help[:1].upper() + help[1:] + ".",
        epilog=example,
        formatter_class=FORMATTER,
    )
    return parser
