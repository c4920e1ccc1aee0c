"""What every command shares: the one-line-error parser and the option parsers.

Example:
    >>> count(1)("3")
    3
    >>> command_after_dashes(["--", "python", "train.py"], "mldist run -n 2 -- python train.py")
    ['python', 'train.py']
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..errors import ConfigError

Handler = Callable[[argparse.Namespace], int]
FORMATTER = argparse.RawDescriptionHelpFormatter


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def count(minimum: int) -> Callable[[str], int]:
    """A parser for count flags: a whole number of ASCII digits, at least ``minimum``.

    Example:
        >>> count(0)("0")
        0
    """

    def parse(text: str) -> int:
        if not (text.isascii() and text.strip().lstrip("+-").isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not at least {minimum}")
        return value

    return parse


def seconds(text: str) -> float:
    """A parser for durations in seconds: a finite, non-negative number.

    Example:
        >>> seconds("2.5")
        2.5
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value:g} is negative")
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
