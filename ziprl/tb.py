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

    def _open(self, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        path = self.out / "metrics.jsonl"
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if _step_of(line) < first_step]
            if len(kept) < len(lines):  # rows from a resumed run's lost steps
                atomic_write_text(path, "".join(f"{line}\n" for line in kept))
        self.writer = SummaryWriter(str(self.out / "tb"), purge_step=first_step)
        self._jsonl = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def log(self, step: int, metrics: dict[str, float], prefix: str = "") -> None:
        if self.writer is None:
            self._open(step)
        clean = {f"{prefix}{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        for k, v in clean.items():
            self.writer.add_scalar(k, v, step)
        self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self._jsonl.flush()
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self._jsonl.close()


def _step_of(line: str) -> float:
    """A metrics row's step; a row torn by a kill mid-write reads as infinitely late, so it is dropped."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf
