"""The learner on Ray: ``ray.learner_ranks`` DeepSpeed ranks, one actor each, forming one data-parallel group.

Every rank is handed the same trajectories (one object-store copy) and trains on its share of the turns
(:class:`~ziprl.learner.trainer.Trainer` splits the rows by rank; ZeRO partitions parameters, gradients and
optimizer state over the ranks), so a model too large for one GPU trains on several. Calls go to every rank
at once, since the collectives (gradient reduction, ZeRO-3 gathers, checkpoint writes) need all of them; rank 0
answers for the group: its statistics are already all-reduced, it puts the weights into the object store and
writes the checkpoints. The ranks are gang-scheduled in a placement group (packed onto as few nodes as
possible) and rendezvous at rank 0: on 127.0.0.1 when every rank shares its node, else at its node IP.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ziprl.actors.ray_utils import cpu_threads
from ziprl.config import ConfigError, ZipRLConfig, from_dict, resolve_engine_dtype
from ziprl.env.group import from_arrow
from ziprl.registry import ENGINES
from ziprl.weights import LearnerWeights, Transport

PLACEMENT_TIMEOUT_S = 300


class LearnerWorker:
    """One learner rank (a plain Python body; :data:`LearnerActor` is its Ray actor)."""

    def __init__(self, cfg: dict[str, Any], num_threads: int = 1):
        import torch

        torch.set_num_threads(max(1, num_threads))
        self.cfg: ZipRLConfig = from_dict(ZipRLConfig, cfg)
        self.trainer = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")  # background checkpoint writes
        self._writing: Future | None = None
        self.weights_end: Any = None  # rank 0's end of a grouped transport's weight group

    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()

    def free_port(self, loopback: bool) -> int:
        """A TCP port free on this node (on 127.0.0.1 only, when every rank is on this node)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1" if loopback else "", 0))
            return s.getsockname()[1]

    def join(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        """Set the torch.distributed rendezvous of this rank; the group forms when a Trainer is built.

        Ray gives each actor its own GPU as device 0 (CUDA_VISIBLE_DEVICES), so LOCAL_RANK is 0.
        """
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                          MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))

    def build_trainer(self, model_path: str, cfg: dict[str, Any] | None = None, num_threads: int | None = None) -> str:
        """The RL trainer over ``model_path``; returns the engines' dtype (``model.dtype``, auto resolved to this
        learner's compute dtype; it is also the weights' wire dtype). A rank that ran Stage 1 takes Stage 2's ``cfg``
        and ``num_threads``, and frees its SFT trainer first."""
        import torch

        from ziprl.learner.trainer import Trainer

        if cfg is not None:
            self.cfg = from_dict(ZipRLConfig, cfg)
        if num_threads is not None:
            torch.set_num_threads(max(1, num_threads))
        self.trainer = None
        gc.collect()  # the SFT trainer's weights and optimizer state go before the RL trainer's load
        self.trainer = Trainer(self.cfg, model_path)
        self.cfg = dataclasses.replace(self.cfg, model=resolve_engine_dtype(self.cfg.model, self.trainer.bf16))
        return self.cfg.model.dtype

    def build_sft_trainer(self) -> bool:
        """The Stage 1 trainer (model conversion and load, DeepSpeed set-up), ahead of the demos it will train on;
        returns whether it computes in bf16 (``learner.bf16`` as decided on this hardware)."""
        from ziprl.learner.sft import sft_trainer

        self.trainer = sft_trainer(self.cfg)
        return self.trainer.bf16

    def sft(self, demos: str, out_dir: str, resume: bool = False) -> str:
        """Stage 1: cold-start SFT on the demo file (with the trainer :meth:`build_sft_trainer` built, if it ran),
        continued from ``out_dir``'s checkpoint when ``resume``; returns the written model directory."""
        from ziprl.learner.sft import run_sft

        return str(run_sft(self.cfg, demos, out_dir, self.trainer, resume=resume))

    def version(self) -> int:
        return self.trainer.policy_version

    def train_step(self, tables: list[pa.Table], idle: tuple[int, Callable[[], bool]] | None = None
                   ) -> dict[str, float]:
        """One optimiser step of GRPO + HRR over the given groups of trajectories; + this rank's peak RSS.

        ``idle`` = (threads, rollouts_idle): from the first forward or backward before which ``rollouts_idle()`` is
        true, the step runs on ``threads`` torch threads (the cores the rollouts left idle), given back after it.
        Logs the threads it ended on (``cpu_threads``) and how many forwards and backwards ran on the idle cores
        (``idle_core_phases``: two per pass, and the step's shared-prefix forward).
        """
        import torch

        from ziprl.loop.source import peak_rss_mb

        base, wide = torch.get_num_threads(), [0]

        def before_compute() -> None:
            threads, rollouts_idle = idle
            if not wide[0]:
                if not rollouts_idle():
                    return
                torch.set_num_threads(threads)  # in this thread: torch's thread count is per calling thread
            wide[0] += 1

        try:
            stats = self.trainer.train_step([g for table in tables for g in from_arrow(table)],
                                            before_compute if idle is not None else None)
            ran_on = torch.get_num_threads()
        finally:
            torch.set_num_threads(base)
        return {**stats, "cpu_threads": float(ran_on), "idle_core_phases": float(wide[0]),
                "rss_peak_mb": peak_rss_mb()}

    def learner_weights(self) -> LearnerWeights:
        """The policy's parameters as a weight transport reads them (ZeRO-3: gathered per bucket), for the engines of
        ``model.engine`` in ``model.dtype`` (resolved by :meth:`build_trainer`)."""
        from ziprl.learner.distributed import rank

        t = self.trainer
        return LearnerWeights(list(t.engine.module.named_parameters()), lambda ps: t.gathered(params=ps), t.device,
                              rank(), t.zero_stage == 3, self.cfg.model.dtype,
                              ENGINES[self.cfg.model.engine].engine_class())

    def join_weights(self, transport: Transport, addr: str, port: int, world: int, timeout_s: float, bind: str
                     ) -> None:
        """Join a grouped transport's weight group (rank 0 hosts the rendezvous; other ranks: nothing)."""
        self.weights_end = None
        self.weights_end = transport.join(self.learner_weights(), addr, port, world, timeout_s, bind)

    def announce_weights(self, transport: Transport, version: int) -> Any:
        """The first half of a push of the current weights as ``version``: what every engine is handed."""
        return transport.announce(self.learner_weights(), version, ray)

    def send_weights(self, transport: Transport, version: int) -> None:
        """The second half, once every engine has the announcement."""
        transport.send(self.learner_weights(), version, self.weights_end)

    def leave_weights(self) -> None:
        self.weights_end = None

    def save_checkpoint(self, out_dir: str, data_position: dict[str, Any], background: bool = False) -> str:
        """Checkpoint the trainer; returns the checkpoint's path. With ``background`` (and ``run.background_checkpoints``
        on: by default on a GPU learner) rank 0 writes it in a thread while the next step runs (the copy is taken
        now); the next save or load waits for that write and raises its error, if any. ``latest`` names it once it
        is whole."""
        from ziprl.learner.checkpoint import save_checkpoint, snapshot, write_snapshot
        from ziprl.learner.distributed import rank

        self.finish_writes()
        allowed = self.cfg.run.background_checkpoints
        if not background or not (self.trainer.device.type == "cuda" if allowed is None else allowed):
            return str(save_checkpoint(self.trainer, out_dir, data_position))
        snap = snapshot(self.trainer, out_dir, data_position)
        if rank() == 0:
            self._writing = self._writer.submit(write_snapshot, snap)
        return str(snap.path)

    def finish_writes(self) -> None:
        """Wait for a background checkpoint write, re-raising its error."""
        pending, self._writing = self._writing, None
        if pending is not None:
            pending.result()

    def load_latest(self, out_dir: str) -> dict[str, Any] | None:
        """Resume from the newest checkpoint under ``out_dir``; returns its data position (None if none)."""
        import torch

        from ziprl.learner.checkpoint import latest_checkpoint, load_checkpoint
        from ziprl.learner.distributed import world_size

        self.finish_writes()
        if world_size() > 1:
            torch.distributed.barrier()  # rank 0's background write is whole before any rank reads
        ckpt = latest_checkpoint(out_dir)
        return None if ckpt is None else load_checkpoint(self.trainer, ckpt)


LearnerActor = ray.remote(LearnerWorker)


class LearnerGroup:
    """``ranks`` learner actors with ``cpus``/``gpus`` each, joined into one process group; each runs ``threads`` torch
    threads (default: its whole CPUs, at least 1).

    Fails with a ConfigError, before any model loads, when the cluster cannot place them within
    ``timeout_s`` seconds.
    """

    def __init__(self, cfg: ZipRLConfig, ranks: int, cpus: float, gpus: float, timeout_s: float = PLACEMENT_TIMEOUT_S,
                 threads: int | None = None):
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        self.pg = placement_group([bundle] * ranks, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(self.pg)
            raise ConfigError(
                f"cannot place {ranks} learner rank(s) with {bundle} each on this cluster "
                f"(resources {ray.cluster_resources()}) within {timeout_s:g}s; lower ray.learner_ranks, "
                "ray.learner_cpus or ray.learner_gpus"
            )
        self.actors = [
            LearnerActor.options(
                num_cpus=cpus, num_gpus=gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
            ).remote(cfg.to_dict(), threads or cpu_threads(cpus))
            for i in range(ranks)
        ]
        ips = ray.get([a.node_ip.remote() for a in self.actors])
        loopback = len(set(ips)) == 1
        port = ray.get(self.actors[0].free_port.remote(loopback))
        addr = "127.0.0.1" if loopback else ips[0]
        ray.get([a.join.remote(r, ranks, addr, port) for r, a in enumerate(self.actors)])

    def start(self, method: str, *args: Any) -> list[ray.ObjectRef]:
        """Start ``method(*args)`` on every rank at once; returns each rank's result reference."""
        return [getattr(a, method).remote(*args) for a in self.actors]

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method(*args)`` on every rank at once; returns rank 0's result."""
        return ray.get(self.start(method, *args))[0]

    def shutdown(self) -> None:
        """Kill the ranks and free their resources."""
        for a in self.actors:
            ray.kill(a)
        remove_placement_group(self.pg)
