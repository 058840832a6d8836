"""The weight-transfer contract: how the learner's new weights reach every generation engine. Four names:

- :class:`WeightSender`: what the training loop pushes through, ``push(version)`` after each learner step and
  ``close()`` at the end. In one process :class:`ziprl.weights.in_process.InProcess`; on Ray the driver's
  ``ziprl.actors.weight_sender.RaySender`` over the configured :class:`Transport`.
- :class:`WeightReceiver`: the receiving end every engine owns (:class:`~ziprl.policy.engine.GenerationEngine`
  inherits it), one method set for every engine and transport: ``load_weights`` installs a version,
  ``join_weights`` / ``receive_weights`` / ``leave_weights`` take part in a collective push, ``holding_weights``
  keeps a generating batch on one version, and the class method ``sender_end`` opens the learner's end of the
  group it receives on.
- :class:`Transport`: how one version crosses from learner rank 0 to the engines of other processes, one plug-in
  file each, registered in :data:`ziprl.registry.TRANSPORTS` under its ``weights.transport`` name
  (:mod:`~ziprl.weights.object_store`, :mod:`~ziprl.weights.collective`).
- :class:`LearnerWeights`: a learner rank's parameters as a transport reads them, cut into the buckets of the
  wire format (:mod:`ziprl.weights.buckets`).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ziprl.weights.buckets import TensorMeta, iter_packed, plan_for, unique_named_tensors


class WeightSender(ABC):
    """Gives every engine the learner's current weights, tagged with their policy version."""

    @abstractmethod
    def push(self, version: int) -> dict[str, float]:
        """Push the weights of ``version``; every engine applies them before its next batch. {"seconds", "bytes"},
        and "wait_seconds" where the push first waited for a generating job (not in "seconds")."""

    @abstractmethod
    def close(self) -> None:
        """Release the transport (the learner and the engines stay up)."""


@dataclass
class _Inbox:
    """A receiver's state between pushes, made on first use (an engine's constructor need not know of it)."""

    batch: threading.Lock = field(default_factory=threading.Lock)  # held while a batch generates
    staged: threading.Lock = field(default_factory=threading.Lock)  # guards ``pending``
    pending: tuple[int, dict[str, Any]] | None = None  # a version received during a batch: (version, name -> tensor)
    group: Any = None  # collective: this engine's member of the weight group


class WeightReceiver(ABC):
    """The receiving end of an engine: every transport ends in these methods.

    The defaults receive a collective push on ZipRL's own gloo/NCCL group (:mod:`ziprl.weights.collective`) and
    install it with :meth:`load_weights`; an engine whose runtime receives by itself (vLLM's workers) overrides
    ``join_weights``, ``receive_weights`` and ``sender_end``.
    """

    version: int = 0  # the policy version of the loaded weights (0 = initial)
    # Where and in what dtype load_weights takes a tensor as it is (no cast, no host copy); the in-process push
    # hands the learner's weights over so (an HFEngine on CUDA: on its GPU, in its dtype).
    weights_device: str = "cpu"
    weights_dtype: str = "float32"

    @abstractmethod
    def load_weights(self, named_arrays: dict[str, Any], version: int) -> None:
        """Replace the model weights (name -> numpy array or tensor, HF parameter names) and set ``version``."""

    def _inbox(self) -> _Inbox:
        # dict.setdefault is atomic: the batch thread and the weights thread get the same inbox
        return self.__dict__.get("_weights_inbox") or self.__dict__.setdefault("_weights_inbox", _Inbox())

    @contextmanager
    def holding_weights(self) -> Iterator[None]:
        """Held while a batch generates, so a batch never mixes versions: a version received meanwhile waits, and
        the newest one waiting is installed on entry."""
        with self._inbox().batch:
            self._install_pending()
            yield

    def join_weights(self, addr: str, port: int, rank: int, world: int, timeout_s: float, bind: str) -> None:
        """Collective: join (or re-join: the old membership is dropped) the weight group of this rendezvous as
        ``rank``. ``addr:port`` is the TCPStore learner rank 0 hosts; ``bind`` the address of this end's gloo
        connections."""
        from ziprl.weights.collective import Group

        inbox = self._inbox()
        inbox.group = None
        inbox.group = Group(addr, port, rank, world, timeout_s, bind, self.weights_device)

    def receive_weights(self, metas: list[tuple[str, str, list[int]]], version: int) -> int:
        """Collective: take part in one push, also while a batch generates; installed now when no batch holds the
        weights, else right before the next batch. Returns the version received.

        ``metas`` (name, wire dtype, shape per tensor, in send order) and ``version`` matter to an engine that
        receives tensor by tensor; the group's own bucket headers carry them here.
        """
        inbox = self._inbox()
        if inbox.group is None:
            raise RuntimeError("receive_weights before join_weights: this engine is no member of the weight group")
        version, named = inbox.group.receive()
        with inbox.staged:
            newest = max(self.version, inbox.pending[0] if inbox.pending else -1)
            if version > newest:
                inbox.pending = (version, named)
        if inbox.batch.acquire(blocking=False):
            try:
                self._install_pending()
            finally:
                inbox.batch.release()
        return version

    def leave_weights(self) -> None:
        """Collective: leave the weight group."""
        self._inbox().group = None

    @classmethod
    def sender_end(cls, addr: str, port: int, world: int, timeout_s: float, bind: str, device: Any) -> Any:
        """Learner rank 0's end of the group this engine class receives on (it hosts the rendezvous):
        ``send(version, count, buckets) -> bytes`` broadcasts ``count`` packed buckets."""
        from ziprl.weights.collective import Group

        return Group(addr, port, 0, world, timeout_s, bind, device)

    def _install_pending(self) -> None:
        """Install the newest version received during a batch (called with the batch lock held)."""
        inbox = self._inbox()
        with inbox.staged:
            pending, inbox.pending = inbox.pending, None
        if pending is not None and pending[0] > self.version:
            self.load_weights(pending[1], pending[0])


@dataclass
class LearnerWeights:
    """What a learner rank sends: its parameters (ZeRO-3 partitions, made whole one bucket at a time), where and
    for which engines."""

    named: list[tuple[str, Any]]  # (name, parameter)
    gather: Callable[[list[Any]], AbstractContextManager]  # makes the given parameters whole inside (ZeRO-3), else no-op
    device: Any  # where the collective packs its buckets (CUDA: NCCL)
    rank: int  # this learner rank; rank 0 sends
    all_ranks_gather: bool  # ZeRO-3: every rank takes part in the gathers
    engine_dtype: str  # the engines' dtype (``model.dtype``, resolved), hence the wire dtype
    receiver: type[WeightReceiver]  # the engines' class: its ``sender_end`` is a collective's rank-0 end

    @property
    def takes_part(self) -> bool:
        """Whether this rank sends or gathers for a push."""
        return self.rank == 0 or self.all_ranks_gather

    def plan(self, bucket_bytes: int) -> list[tuple[TensorMeta, ...]]:
        """The bucket plan of one push: tied parameters once, each tensor in its wire dtype."""
        return plan_for(unique_named_tensors(self.named), self.engine_dtype, bucket_bytes)

    def packed(self, bucket_bytes: int, on_device: bool) -> tuple[int, Iterator[tuple[tuple[TensorMeta, ...], Any]]]:
        """(bucket count, iterator of (metas, packed uint8 buffer)), packed on :attr:`device` or the CPU. Only rank 0
        packs (other ranks get None buffers); under ZeRO-3 every rank gathers one bucket's parameters at a time."""
        plan = self.plan(bucket_bytes)
        return len(plan), iter_packed(unique_named_tensors(self.named), plan, self.gather,
                                      self.device if on_device else "cpu", sender=self.rank == 0)


class Transport(ABC):
    """How one version travels from learner rank 0 to the engines of other processes (``weights.transport``).

    Built by the driver from the config and handed to every party with each call (picklable, holds no state): a
    learner rank keeps the end :meth:`join` returns, an engine its own membership. ``store`` is the object store
    of the cluster (``put(obj) -> ref``, ``get(refs) -> objs``: the ``ray`` module).
    """

    grouped: ClassVar[bool] = False  # the learner and the engines form a group first, and all take part in each push

    def __init__(self, bucket_mb: float):
        self.bucket_bytes = int(bucket_mb * 2**20)

    def join(self, weights: LearnerWeights, addr: str, port: int, world: int, timeout_s: float, bind: str) -> Any:
        """Learner side of a grouped transport: rank 0's end of the group (None on other ranks)."""
        return None

    @abstractmethod
    def announce(self, weights: LearnerWeights, version: int, store: Any) -> Any:
        """Learner side: what every engine is handed for the push of ``version`` (an object with ``nbytes``, the
        bytes one push moves), None on a rank other than 0."""

    @abstractmethod
    def send(self, weights: LearnerWeights, version: int, end: Any) -> None:
        """Learner side, once every engine has its announcement: whatever the push still has to move."""

    @abstractmethod
    def receive(self, engine: WeightReceiver, announced: Any, store: Any) -> int:
        """Engine side: take the push ``announced``; returns the version the engine then holds or received."""
