"""Horovod's module paths (horovod.tensorflow.util, mpi_ops, compression, functions, sync_batch_norm,
elastic, horovod.common) import through the alias, with the names scripts and Horovod's tests use."""

from __future__ import annotations

import json

from helpers import WORKERS, check, run_py


def test_horovod_module_paths_and_their_names() -> None:
    res = check(run_py("-m", "mldist.horovod.alias", str(WORKERS / "hvd_paths.py"), timeout=120))
    lines = [line for line in res.stdout.splitlines() if line.split(" ", 1)[0].isupper()]
    assert lines == [
        "EAGER True False",
        "FP16 True",
        "SUM [1.5] 0 (1, 2)",
        "OBJECTS {'a': 1} ['x']",
        "SYNCBN True",
        "REFS True False",
        "EXCEPTIONS True True",
        "MISSING horovod.torch RefusedModule",  # an ImportError: the script's fallback takes it
        "MISSING horovod.tensorflow.nosuch RefusedModule",
        "ELASTIC True True",
        "ELASTIC_ATTR True True",
    ], res.stdout


def test_horovod_run_returns_each_ranks_result() -> None:
    res = check(run_py("-m", "mldist.horovod.alias", str(WORKERS / "hvd_run.py"), timeout=180))
    (row,) = [json.loads(line.split("RESULT ", 1)[1]) for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert row["results"] == [{"rank": 0, "value": 1, "total": 3}, {"rank": 1, "value": 11, "total": 3}]
    # min_np without other hosts: nothing to lose (tests/launch/test_hosts.py runs it on 3 hosts).
    assert row["elastic"] == (
        "UnsupportedError: horovod.run(min_np=, max_np=): an elastic world needs other hosts to lose; "
        "give hosts= or hostfile="
    )
