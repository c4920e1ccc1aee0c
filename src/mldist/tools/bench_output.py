"""``mldist bench``'s files: the rows as JSON and the scaling curve beside it as a PNG.

Example::

    write_json("bench.json", rows)   # also bench.png (with matplotlib)
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..base.files import atomic_write
from ..errors import ConfigError


def say(message: str) -> None:
    """One line on stderr, prefixed ``mldist bench:``."""
    print(f"mldist bench: {message}", file=sys.stderr, flush=True)


def png_path(json_path: str | os.PathLike[str]) -> Path:
    """Where the scaling plot goes: beside the JSON, ``.png`` for its suffix.

    Example:
        >>> str(png_path("out/bench.json")), str(png_path("bench"))
        ('out/bench.png', 'bench.png')
    """
    path = Path(json_path)
    return path.with_suffix(".png") if path.suffix else path.with_name(path.name + ".png")


def write_json(path: str, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
    """Write ``{"rows": [...]}`` atomically and the scaling plot beside it (one line if matplotlib is missing).

    Args:
        path: the JSON file.
        rows: the report's rows.
        extra: more top-level keys (``best`` of a thread sweep).

    Example::

        write_json("bench.json", rows)   # also bench.png
    """
    outputs: list[tuple[Path, str | bytes]] = [(Path(path), json.dumps({"rows": rows, **(extra or {})}, indent=2))]
    if not (extra and "best" in extra):  # a thread sweep has no scaling curve
        try:
            outputs.append((png_path(path), plot_scaling(rows)))
        except ImportError:
            say(f"matplotlib is not installed, so no scaling plot; {path} is written (pip install matplotlib)")
    for target, data in outputs:
        try:
            atomic_write(target, data)
        except OSError as exc:
            raise ConfigError(f"{target} cannot be written ({exc.strerror})") from None


def plot_scaling(rows: list[dict[str, Any]]) -> bytes:
    """The scaling curve as PNG bytes: total img/s by workers per engine, and the ideal line from 1 worker."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    ax = fig.add_subplot()
    base = [r for r in rows if r["workers"] == 1]
    for engine in sorted({r["engine"] for r in rows if r["workers"] > 1} or {r["engine"] for r in rows}):
        line = sorted((r for r in rows if r["engine"] == engine or r["workers"] == 1), key=lambda r: r["workers"])
        xs, ys = [r["workers"] for r in line], [r["img_per_sec"] for r in line]
        ax.errorbar(xs, ys, yerr=[r["ci95"] * r["workers"] for r in line], marker="o", capsize=3, label=engine)
    if base:
        counts = sorted({r["workers"] for r in rows})
        ideal = base[0]["img_per_sec_per_worker"]
        ax.plot(counts, [ideal * n for n in counts], linestyle=":", color="grey", label="ideal")
    ax.set_xticks(sorted({r["workers"] for r in rows}))
    ax.set_xlabel("workers")
    ax.set_ylabel("images / second (total)")
    ax.set_title(f"mldist bench: {rows[0]['model']}, batch {rows[0]['batch']} per worker")
    ax.legend()
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
