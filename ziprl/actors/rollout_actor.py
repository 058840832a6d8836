"""RolloutActor: a generation engine and SearchCompressEnvs, producing groups of trajectories."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import pyarrow as pa
import ray

from ziprl.config import ZipRLConfig, from_dict
from ziprl.env.group import to_arrow
from ziprl.retrieval.types import QAExample
from ziprl.weights import Transport


class RolloutWorker:
    """Plain-Python body of the rollout actor (constructed inside the Ray worker process); its engine is the weights'
    receiver."""

    def __init__(self, cfg: dict[str, Any], model_path: str, retriever_handle: Any, actor_id: int, num_threads: int = 1):
        import torch

        from ziprl.actors.serve_retriever import ServeRetrieverClient
        from ziprl.policy import make_engine

        torch.set_num_threads(max(1, num_threads))
        self.cfg: ZipRLConfig = from_dict(ZipRLConfig, cfg)
        self.actor_id = actor_id
        self.engine = make_engine(self.cfg.model, model_path)
        self.retriever = ServeRetrieverClient(retriever_handle, self.cfg.ray.retriever_timeout_s)
        self.batches = 0

    def run_batch(self, examples: list[dict[str, Any]], seed: int, weights: tuple[Transport, Any] | None = None
                  ) -> tuple[pa.Table, dict]:
        """Roll out one group per question with the newest weights; returns the groups as one Arrow table
        (:func:`~ziprl.env.group.to_arrow`) + stats.

        ``weights`` = (transport, its latest announcement), loaded first when newer; None when there is none or
        the transport's weights arrive on their own (collective).
        """
        from ziprl.env import SearchCompressEnv
        from ziprl.loop.source import job_stats
        from ziprl.policy.rollout import rollout_groups

        if weights is not None:
            self.receive_weights(*weights)
        exs = [QAExample(**e) for e in examples]
        with self.engine.holding_weights():  # weights received meanwhile wait; a batch never mixes versions
            tokens, secs, t0 = self.engine.tokens_generated, self.engine.generation_seconds, time.perf_counter()
            groups = rollout_groups(self.engine, lambda: SearchCompressEnv(self.cfg.env, retriever=self.retriever,
                                                                           examples=exs),
                                    exs, self.cfg, seed)
            version = self.engine.version
        self.batches += 1
        stats = {"actor_id": self.actor_id, "pid": os.getpid(), "version": version,
                 "seconds": time.perf_counter() - t0, **job_stats(self.engine, tokens, secs)}
        return to_arrow(groups), stats

    def receive_weights(self, transport: Transport, announced: Any) -> int:
        """Take one push (in the task queue, between batches; a grouped transport's run in the ``weights``
        concurrency group, beside a batch); returns the version the engine holds or received."""
        return transport.receive(self.engine, announced, ray)

    @ray.method(concurrency_group="weights")
    def join_weights(self, addr: str, port: int, rank: int, world: int, timeout_s: float, bind: str) -> None:
        """Join a grouped transport's weight group as ``rank`` (runs beside a generating batch)."""
        self.engine.join_weights(addr, port, rank, world, timeout_s, bind)

    @ray.method(concurrency_group="weights")
    def leave_weights(self) -> None:
        self.engine.leave_weights()

    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()

    def pid(self) -> int:
        return os.getpid()


# "weights": collective receives run in their own thread, beside a generating batch
RolloutActor = ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"weights": 1})(RolloutWorker)


def example_dicts(examples: list[QAExample]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(e) for e in examples]
