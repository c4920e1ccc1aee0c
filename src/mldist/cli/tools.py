"""Commands that look at this machine: ``mldist doctor``.

Example:
    $ mldist doctor
    $ mldist doctor --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any

from .common import Handler, add_command

DOCTOR_EXAMPLE = """\
example:
  mldist doctor          # ok / warn / fail per check, with the fix
  mldist doctor --json   # for scripts; exit 0 all ok, 1 warnings, 2 failures"""


def register(sub: Any) -> dict[str, Handler]:
    """Add ``doctor`` to the subcommands; its handler by name."""
    doctor = add_command(sub, "doctor", "pre-flight checks of this machine and job, each with its fix", DOCTOR_EXAMPLE)
    doctor.add_argument("--json", action="store_true", help="print JSON")
    return {"doctor": _cmd_doctor}


def _cmd_doctor(args: argparse.Namespace) -> int:
    from ..tools.doctor import exit_code, format_checks, run_checks

    results = run_checks(os.environ)
    if args.json:
        print(json.dumps({"checks": [dataclasses.asdict(r) for r in results], "exit": exit_code(results)}, indent=2))
    else:
        print(format_checks(results))
    return exit_code(results)
