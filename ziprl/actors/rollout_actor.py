"""RolloutActor: a generation engine and SearchCompressEnvs, producing groups of trajectories."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import pyarrow as pa
import ray

from ziprl.actors.weight_buckets import WeightRef
from ziprl.actors.weight_sync import ReceivesWeights, WeightReceiver
from ziprl.config import ZipRLConfig, from_dict
from ziprl.env.trajectory import to_table
from ziprl.retrieval.types import QAExample


class RolloutWorker(ReceivesWeights):
    """Plain-Python body of the rollout actor (constructed inside the Ray worker process)."""

    def __init__(self, cfg: dict[str, Any], model_path: str, retriever_handle: Any, actor_id: int, num_threads: int = 1):
        import torch

        from ziprl.actors.serve_retriever import ServeRetrieverClient
        from ziprl.policy import make_engine

        torch.set_num_threads(max(1, num_threads))
        self.cfg: ZipRLConfig = from_dict(ZipRLConfig, cfg)
        self.actor_id = actor_id
        self.engine = make_engine(self.cfg.model, model_path)
        self.retriever = ServeRetrieverClient(retriever_handle, self.cfg.ray.retriever_timeout_s)
        self.weights = WeightReceiver(self.engine)
        self.batches = 0

    def run_batch(self, examples: list[dict[str, Any]], seed: int, wref: WeightRef | int | None = None
                  ) -> tuple[pa.Table, dict]:
        """Roll out G trajectories per question with the newest weights; returns an Arrow table + stats.

        ``wref`` may be an object-store :class:`WeightRef` (loaded first when newer) or a version number (the
        collective transport's weights arrive on their own; a version is only informative).
        """
        from ziprl.env import SearchCompressEnv
        from ziprl.loop.source import job_stats
        from ziprl.policy.rollout import rollout_groups

        if isinstance(wref, WeightRef):
            self.update_weights(wref)
        exs = [QAExample(**e) for e in examples]
        with self.weights.lock:  # weights received meanwhile wait; a batch never mixes versions
            self.weights.apply_pending()
            tokens, secs, t0 = self.engine.tokens_generated, self.engine.generation_seconds, time.perf_counter()
            groups = rollout_groups(self.engine, lambda: SearchCompressEnv(self.cfg.env, retriever=self.retriever,
                                                                           examples=exs),
                                    exs, self.cfg.sampling, self.cfg.rollout.group_size, seed)
            version = self.engine.version
        self.batches += 1
        stats = {"actor_id": self.actor_id, "pid": os.getpid(), "version": version,
                 "seconds": time.perf_counter() - t0, **job_stats(self.engine, tokens, secs)}
        return to_table([t for g in groups for t in g]), stats

    def pid(self) -> int:
        return os.getpid()


# "weights": collective receives run in their own thread, beside a generating batch
RolloutActor = ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"weights": 1})(RolloutWorker)


def example_dicts(examples: list[QAExample]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(e) for e in examples]
