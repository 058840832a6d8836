"""TensorBoard scalars (and a JSONL copy a script can read) for training runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ziprl.paths import atomic_write_text


class MetricsLogger:
    """Writes every scalar to TensorBoard under ``<out>/tb`` and appends it to ``<out>/metrics.jsonl``.

    The first step it logs replaces whatever the run logged from that step on: a run resumed from an earlier
    checkpoint than its last logged step logs those steps again, and keeps one row per step (TensorBoard's
    ``purge_step`` hides the old events the same way)."""

    def __init__(self, out_dir: str | Path):
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.writer = None
        self._jsonl = None

    def open(self, first_step: int) -> None:
        """Open both outputs, dropping the rows of ``first_step`` on (and rows that are not UTF-8 JSON): called
        before a run's first step, so an output that cannot be written fails before any step runs."""
        from torch.utils.tensorboard import SummaryWriter

        path = self.out / "metrics.jsonl"
        if path.is_file():
            lines = path.read_bytes().splitlines()
            kept = [line for line in lines if _step_of(line) < first_step]
            if len(kept) < len(lines):  # rows from a resumed run's lost steps, or torn
                atomic_write_text(path, "".join(f"{line.decode()}\n" for line in kept))
        self._jsonl = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.writer = SummaryWriter(str(self.out / "tb"), purge_step=first_step)

    def log(self, step: int, metrics: dict[str, float], prefix: str = "") -> None:
        if self.writer is None:
            self.open(step)
        clean = {f"{prefix}{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        for k, v in clean.items():
            self.writer.add_scalar(k, v, step)
        self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self._jsonl.flush()
        self.writer.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self.writer is not None:
            self.writer.close()


def _step_of(line: bytes) -> float:
    """A metrics row's step; a row torn by a kill mid-write (or not UTF-8 JSON) reads as infinitely late, so it is
    dropped."""
    try:
        return float(json.loads(line.decode())["step"])
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
        return math.inf
