"""The facade's public names stay what they were once ``import mldist`` loads them lazily."""

from __future__ import annotations

import json

from helpers import check, run_py


def test_the_public_names_are_the_functions_after_the_runtime_modules_load_first() -> None:
    """``mldist.runtime.context`` is also a submodule's name: imported first (as any runtime module does), it
    must not stand in for the public function ``mldist.context``."""
    code = (
        "import json, mldist.runtime.watch.stall, mldist\n"
        "names = ['context', 'init', 'rank', 'size', 'allreduce', 'current', 'is_chief']\n"
        "mldist.init()\n"
        "ctx = mldist.context()\n"
        "print(json.dumps([[n, callable(getattr(mldist, n))] for n in names] + [type(ctx).__name__, ctx.size]))\n"
    )
    said = json.loads(check(run_py("-c", code)).stdout.strip().splitlines()[-1])
    assert said == [[n, True] for n in ("context", "init", "rank", "size", "allreduce", "current", "is_chief")] + [
        "Context",
        1,
    ]
