"""LearnerActor: the DeepSpeed trainer; consumes trajectories, updates, publishes weights."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import ray

from ziprl.actors.weights import WeightRef
from ziprl.config import ZipRLConfig, _from_dict
from ziprl.env.trajectory import from_table


class LearnerWorker:
    """Plain-Python body of the learner actor."""

    def __init__(self, cfg: dict[str, Any], model_path: str, num_threads: int = 1):
        import torch

        from ziprl.learner.distributed import own_single_process_env
        from ziprl.learner.trainer import Trainer

        torch.set_num_threads(max(1, num_threads))
        own_single_process_env()
        self.cfg: ZipRLConfig = _from_dict(ZipRLConfig, cfg)
        self.trainer = Trainer(self.cfg, model_path)

    def version(self) -> int:
        return self.trainer.policy_version

    def train_step(self, tables: list[pa.Table]) -> dict[str, float]:
        """One optimiser step of GRPO + HRR over the given groups of trajectories."""
        trajs = [t for table in tables for t in from_table(table)]
        return self.trainer.train_step(trajs)

    def publish(self) -> WeightRef:
        """Put the current weights into the object store once (numpy arrays); every actor gets this ref."""
        t0 = time.perf_counter()
        arrays = self.trainer.named_weights_numpy()
        ref = ray.put(arrays)
        return WeightRef(self.trainer.policy_version, ref, time.perf_counter() - t0, sum(a.nbytes for a in arrays.values()))

    def save_checkpoint(self, out_dir: str, data_position: dict[str, Any]) -> str:
        from ziprl.learner.checkpoint import save_checkpoint

        return str(save_checkpoint(self.trainer, out_dir, data_position))

    def load_latest(self, out_dir: str) -> dict[str, Any] | None:
        """Resume from the newest checkpoint under ``out_dir``; returns its data position (None if none)."""
        from ziprl.learner.checkpoint import latest_checkpoint, load_checkpoint

        ckpt = latest_checkpoint(out_dir)
        return None if ckpt is None else load_checkpoint(self.trainer, ckpt)


LearnerActor = ray.remote(LearnerWorker)
