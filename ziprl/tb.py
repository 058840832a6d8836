"""TensorBoard scalars (and a JSONL copy a script can read) for training runs."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLogger:
    """Writes every scalar to TensorBoard under ``<out>/tb`` and appends it to ``<out>/metrics.jsonl``."""

    def __init__(self, out_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(self.out / "tb"))
        self._jsonl = open(self.out / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def log(self, step: int, metrics: dict[str, float], prefix: str = "") -> None:
        clean = {f"{prefix}{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        for k, v in clean.items():
            self.writer.add_scalar(k, v, step)
        self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self._jsonl.flush()
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        self._jsonl.close()
