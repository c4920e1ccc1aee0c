"""benchmarks/scale.py at 32 simulated ranks on 8 nodes: the control plane's goals hold, counted, not assumed.

issue 61: every waiting rank read every record (N (N - 1) reads for one stuck rank), each rank renamed a
record into the shared folder every second (one file a rank), joins listed the folder and exits sent
N (N - 1) messages. The benchmark drives the real code; here its counts are checked at small N.
"""

from __future__ import annotations

import json
import subprocess

from helpers import PY, ROOT, clean_env, tail

SCALE = str(ROOT / "benchmarks" / "scale.py")


def test_the_shared_folder_sees_nodes_one_rank_reads_and_joins_and_exits_are_linear() -> None:
    res = subprocess.run(
        [PY, SCALE, "--ranks", "32", "--rounds", "2", "--json", "--no-straggler"],
        capture_output=True, text=True, env=clean_env(), timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, tail(res)
    (row,) = json.loads(res.stdout)["control_plane"]
    size, nodes = 32, 8
    assert row["files"] == nodes and row["node_files_per_s"] <= nodes, row
    assert row["metadata_per_s"] == 0 and row["counts_per_s"].get("write", 0) <= nodes, row  # rewritten in place
    assert row["bytes_per_record"] < 1000, row
    assert row["all_named_right"] and row["named_after_s"] <= 30, row
    assert row["record_reads"] <= 4 * size, row
    assert row["join_listings"] == 0 and row["join_fsyncs"] == 0 and row["join_metadata"] <= 8 * size, row
    assert row["exit_messages"] == 2 * (size - 1), row
    assert row["stacks_lines"] < 20, row  # folded: one block for the 31 waiting ranks, one for the stuck rank


def test_a_bad_rank_count_is_one_line() -> None:
    res = subprocess.run([PY, SCALE, "--ranks", "30"], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("scale.py: error: --ranks '30'"), tail(res)
