"""RolloutActor: a generation engine and SearchCompressEnvs, producing groups of trajectories."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import pyarrow as pa
import ray

from ziprl.actors.weights import WeightRef
from ziprl.config import ZipRLConfig, _from_dict
from ziprl.env.trajectory import to_table
from ziprl.env.types import QAExample


class RolloutWorker:
    """Plain-Python body of the rollout actor (constructed inside the Ray worker process)."""

    def __init__(self, cfg: dict[str, Any], model_path: str, retriever_handle: Any, actor_id: int, num_threads: int = 1):
        import torch

        from ziprl.actors.serve_retriever import ServeRetrieverClient
        from ziprl.policy import make_engine

        torch.set_num_threads(max(1, num_threads))
        self.cfg: ZipRLConfig = _from_dict(ZipRLConfig, cfg)
        self.actor_id = actor_id
        self.engine = make_engine(self.cfg.model, model_path)
        self.retriever = ServeRetrieverClient(retriever_handle, self.cfg.ray.retriever_timeout_s)
        self.batches = 0

    def update_weights(self, wref: WeightRef) -> int:
        """Load a newer published policy version (between generation batches); returns the loaded version."""
        if wref.version > self.engine.version:
            self.engine.load_weights(ray.get(wref.ref), wref.version)
        return self.engine.version

    def run_batch(self, examples: list[dict[str, Any]], seed: int, wref: WeightRef | None = None) -> tuple[pa.Table, dict]:
        """Roll out G trajectories per question with the newest weights; returns an Arrow table + stats."""
        from ziprl.env import SearchCompressEnv
        from ziprl.policy.rollout import rollout

        if wref is not None:
            self.update_weights(wref)
        exs = [QAExample(**e) for e in examples]
        tokens, secs, t0 = self.engine.tokens_generated, self.engine.generation_seconds, time.perf_counter()
        trajs = rollout(self.engine, lambda: SearchCompressEnv(self.cfg.env, retriever=self.retriever, examples=exs),
                        exs, self.cfg.sampling, group_size=self.cfg.rollout.group_size, seed=seed)
        self.batches += 1
        stats = {"actor_id": self.actor_id, "pid": os.getpid(), "version": self.engine.version,
                 "tokens": self.engine.tokens_generated - tokens, "gen_seconds": self.engine.generation_seconds - secs,
                 "seconds": time.perf_counter() - t0}
        return to_table(trajs), stats

    def pid(self) -> int:
        return os.getpid()


RolloutActor = ray.remote(max_restarts=-1, max_task_retries=0)(RolloutWorker)


def example_dicts(examples: list[QAExample]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(e) for e in examples]
