"""What ``RunLog`` writes of each epoch: the row, the table (CSV and JSONL), the plot and TensorBoard events.

Pure or file-only helpers, apart from the callback that decides when to call them
(:mod:`mldist.keras.runlog`). Rows are plain mappings: ``epoch`` (from 1), Keras's numeric
metrics (training, then ``val_``), then the timings.

Example:
    >>> epoch_row(1, {"loss": 0.5}, {"step_seconds": 0.1})
    {'epoch': 2, 'loss': 0.5, 'step_seconds': 0.1}
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Row fields that are timings, not model metrics (kept out of the plot's metric panel).
TIMINGS = ("epoch_seconds", "step_seconds", "samples_per_second")


def epoch_row(epoch: int, logs: Mapping[str, Any], timing: Mapping[str, float | None]) -> dict[str, Any]:
    """One row of metrics.csv: the epoch (from 1), numeric metrics (training, then ``val_``), timings.

    Example:
        >>> epoch_row(0, {"val_loss": 0.4, "loss": 0.5, "accuracy": 0.9, "note": "x"}, {"epoch_seconds": 2.0})
        {'epoch': 1, 'loss': 0.5, 'accuracy': 0.9, 'val_loss': 0.4, 'epoch_seconds': 2.0}
    """
    numbers = {k: float(v) for k, v in logs.items() if isinstance(v, int | float) and not isinstance(v, bool)}

    def order(key: str) -> tuple[bool, bool, str]:
        base = key.removeprefix("val_")
        return key.startswith("val_"), base != "loss", base

    row: dict[str, Any] = {"epoch": epoch + 1}
    row.update({k: numbers[k] for k in sorted(numbers, key=order)})
    row.update({k: v for k, v in timing.items() if v is not None})
    return row


def append_row(run_dir: Path, row: Mapping[str, Any]) -> None:
    """Append ``row`` to metrics.jsonl and metrics.csv (its header from the first row ever written).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> append_row(d, {"epoch": 1, "loss": 0.5}); append_row(d, {"epoch": 2, "loss": 0.4, "new": 1.0})
        >>> (d / "metrics.csv").read_text().splitlines()
        ['epoch,loss', '1,0.5', '2,0.4']
    """
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(row)) + "\n")
        fh.flush()
    path = run_dir / "metrics.csv"
    fields = list(row)
    if path.exists() and path.stat().st_size:
        with open(path, newline="", encoding="utf-8") as fh:
            fields = next(csv.reader(fh), fields)
    with open(path, "a", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fields, restval="", extrasaction="ignore")
        if not path.stat().st_size:
            writer.writeheader()
        writer.writerow(row)
        fh.flush()


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of an existing metrics.jsonl (a restarted run continues its plot); damaged lines skipped."""
    rows = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("epoch"), int):
            rows.append(row)
    return rows


def plot_png(rows: Sequence[Mapping[str, Any]], title: str) -> bytes:
    """A PNG of loss (left) and the other metrics (right) over the epochs; validation dashed.

    Uses matplotlib's Agg canvas directly: no pyplot, no change to the script's backend.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    last = {int(r["epoch"]): r for r in rows}  # a restarted epoch: its latest row
    epochs = sorted(last)
    keys = [k for k in dict.fromkeys(k for e in epochs for k in last[e]) if k != "epoch" and k not in TIMINGS]
    train = [k for k in keys if not k.startswith("val_")]
    panels = [[k for k in train if k.endswith("loss")], [k for k in train if not k.endswith("loss")]]
    panels = [p for p in panels if p] or [[]]
    marker = "o" if len(epochs) <= 40 else None  # dots while they stay apart
    fig = Figure(figsize=(5.2 * len(panels), 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    for i, names in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for j, name in enumerate(names):
            for k, (key, style, label) in enumerate(((name, "-", "train"), (f"val_{name}", "--", "validation"))):
                points = [(e, last[e][key]) for e in epochs if isinstance(last[e].get(key), int | float)]
                color = f"C{k}" if len(names) == 1 else f"C{j}"  # one metric: train blue, validation orange
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, style, marker=marker, markersize=4, color=color, label=f"{name} ({label})")
        ax.set_title(", ".join(names) if 0 < len(names) <= 3 else "metrics")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


class TensorBoardWriters:
    """TensorBoard writers of rank 0: ``tensorboard/train``, and ``tensorboard/validation`` once needed."""

    def __init__(self, root: Path) -> None:
        import tensorflow as tf

        self.tf, self.root = tf, root
        self.writers = {"train": tf.summary.create_file_writer(str(root / "train"))}

    def _writer(self, split: str) -> Any:
        if split not in self.writers:
            self.writers[split] = self.tf.summary.create_file_writer(str(self.root / split))
        return self.writers[split]

    def scalars(self, epoch: int, row: Mapping[str, Any]) -> None:
        """Write the numbers of ``row`` at step ``epoch`` (0-based, as Keras' TensorBoard callback)."""
        for key, value in row.items():
            if key == "epoch" or not isinstance(value, int | float):
                continue
            writer = self._writer("validation" if key.startswith("val_") else "train")
            tag = f"throughput/{key}" if key in TIMINGS else f"epoch_{key.removeprefix('val_')}"
            with writer.as_default():
                self.tf.summary.scalar(tag, float(value), step=epoch)
        for writer in self.writers.values():
            writer.flush()

    def close(self) -> None:
        """Flush and close the writers."""
        for writer in self.writers.values():
            writer.close()
