"""Weight pushes from the learner to the rollout actors: ``weights.transport = object_store | collective``.

The driver uses one :class:`WeightSync` (:func:`make_weight_sync`), the training loop's
:class:`~ziprl.loop.push.WeightPush` on Ray: ``push(version)`` after each learner step, ``for_job()`` with each
rollout job, ``rejoin(i, actor)`` when Ray restarted rollout actor ``i``, ``close()`` at the end. Both
transports move the same versioned buckets of raw 16-bit (or 32-bit) bytes (:mod:`ziprl.actors.weight_buckets`).

- ``object_store``: learner rank 0 ``ray.put`` s each bucket (a numpy uint8 buffer: numpy, not torch tensors,
  which the object store pickles ~4x slower) and every actor is sent the same :class:`WeightRef`. Actors on
  the learner's node read the buckets zero-copy from shared memory (one copy per node, whatever the number of
  actors); a CPU ``HFEngine`` of the wire dtype uses them as its parameters without copying. ``update_weights``
  runs in the actor's task queue, so it is applied between two generation batches.
- ``collective``: learner rank 0 and every rollout actor form ONE separate ``torch.distributed`` process
  group (a ``TCPStore`` rendezvous hosted by rank 0 and a ``ProcessGroupGloo`` on CPU / ``ProcessGroupNCCL``
  on GPU, built directly: it is not the learner's DeepSpeed world, nor a default group). For each bucket rank
  0 broadcasts its length, its JSON header (names, dtypes, shapes, offsets, version) and the flat buffer. The
  actors receive in a second thread (Ray concurrency group ``weights``), so a push never waits for a running
  generation batch; the weights are applied at once when the actor is idle, else right before its next batch
  (a batch never mixes versions). An engine whose ``weight_transfer`` is ``"vllm_nccl"`` (its registered
  spec's, read from the engine class: ``model.engine=vllm``) is the receiving end itself, inside vLLM's workers,
  through vLLM's weight-transfer API (``LLM.init_weight_transfer_engine`` / ``start_weight_update`` /
  ``update_weights`` / ``finish_weight_update`` with backend ``nccl``; the learner opens the sender end with
  ``vllm.distributed.weight_transfer.nccl_common.trainer_init`` and broadcasts tensor by tensor, as vLLM's
  ``NCCLTrainerWeightTransferEngine`` does unpacked); that receive blocks the actor until its running batch
  ends (vLLM's engine is driven by one thread).

Driver wiring::

    sync = make_weight_sync(cfg, learner_group, rollout_actors)   # once, after the actors are created
    stats = sync.push(version)       # after each step (and after a resume): {"seconds", "bytes"}
    actor.run_batch.remote(examples, seed, sync.for_job())         # what the job loads first, if anything
    sync.rejoin(i, actors[i])        # after a RayActorError from actor i (Ray restarted it)
    sync.close()                     # at the end

A group has a fixed membership. When Ray restarts a crashed rollout actor (a new process, no member of
the group), :meth:`WeightSync.rejoin` forms a NEW group (new rendezvous port, every member joins again;
the old group is dropped) and re-sends the latest version, so the restarted actor catches up at once;
the other actors ignore a version they already hold.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayError

from ziprl.actors.weight_buckets import (
    Bucket,
    TensorMeta,
    WeightRef,
    iter_packed,
    plan_for,
    unique_named_tensors,
    unpack,
)
from ziprl.config import ZipRLConfig
from ziprl.loop.push import WeightPush
from ziprl.registry import ENGINES

# ----------------------------------------------------------------------------- the group (any process)


class GroupMember:
    """This process's end of the weight group: rank 0 sends, every other rank receives.

    ``addr:port`` is the TCPStore rank 0 hosts; ``bind`` is the address this member's gloo connections use
    (127.0.0.1 when the whole group is on one node). CUDA tensors go over NCCL, others over gloo.
    """

    def __init__(self, addr: str, port: int, rank: int, world: int, timeout_s: float, bind: str, device: Any = "cpu"):
        import torch
        import torch.distributed as dist

        self.rank, self.world, self.device = rank, world, torch.device(device)
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
        if self.device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(self.store, rank, world, opts)
        else:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=bind)]
            self.pg = dist.ProcessGroupGloo(self.store, rank, world, opts)

    def broadcast(self, t: Any) -> Any:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()
        return t

    def send(self, version: int, count: int, buckets: Iterator[tuple[tuple[TensorMeta, ...], Any]]) -> int:
        """Rank 0: broadcast ``count`` (metas, flat uint8 buffer) pairs, each after its header; returns bytes sent."""
        sent = 0
        for i, (metas, buf) in enumerate(buckets):
            self._send_one(Bucket(version, i, count, metas).header(), buf, i == count - 1)
            sent += buf.numel()
        return sent

    def _send_one(self, header: bytes, buf: Any, last: bool) -> None:
        import torch

        lens = torch.tensor([len(header), buf.numel(), int(last)], dtype=torch.int64, device=self.device)
        self.broadcast(lens)
        self.broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))
        if buf.numel():
            self.broadcast(buf)

    def receive(self) -> tuple[int, dict[str, Any], int]:
        """Other ranks: every bucket of one push -> (version, name -> tensor views in wire dtype, bytes)."""
        import torch

        named: dict[str, Any] = {}
        version, nbytes = -1, 0
        while True:
            lens = self.broadcast(torch.zeros(3, dtype=torch.int64, device=self.device)).tolist()
            header = self.broadcast(torch.empty(lens[0], dtype=torch.uint8, device=self.device))
            bucket = Bucket.from_header(bytes(header.cpu().numpy()))
            version = bucket.version
            if lens[1]:
                buf = self.broadcast(torch.empty(lens[1], dtype=torch.uint8, device=self.device))
                named.update(unpack(bucket.metas, buf))
                nbytes += lens[1]
            if lens[2]:
                return version, named, nbytes


# ----------------------------------------------------------------------------- the rollout actor's end


class WeightReceiver:
    """The rollout actor's end of both transports; applies a version only when newer than the engine's.

    ``lock`` is held by the actor while it generates a batch; weights received meanwhile wait in
    ``pending`` and :meth:`apply_pending` installs them before the next batch.
    """

    def __init__(self, engine: Any):
        self.engine = engine
        self.lock = threading.Lock()  # held while a batch generates
        self._pending: tuple[int, dict[str, Any]] | None = None
        self._pending_lock = threading.Lock()
        self.member: GroupMember | None = None
        self.received_bytes = 0

    @property
    def version(self) -> int:
        """The newest version received (applied or pending)."""
        pending = self._pending
        return max(self.engine.version, pending[0] if pending else -1)

    def from_object_store(self, wref: WeightRef) -> int:
        """Object store: fetch the buckets and load them (the caller is between batches)."""
        if wref.version > self.engine.version:
            named: dict[str, Any] = {}
            for bucket in ray.get(list(wref.buckets)):
                named.update(unpack(bucket.metas, bucket.data))
                self.received_bytes += bucket.nbytes
            self.engine.load_weights(named, wref.version)
        return self.engine.version

    def join(self, addr: str, port: int, rank: int, world: int, timeout_s: float, bind: str) -> None:
        """Join (or re-join: the old membership is dropped) the group of the current rendezvous."""
        self.member = None
        if self.engine.weight_transfer == "vllm_nccl":  # vLLM: its workers are the receiving end
            self.engine.join_weight_transfer(addr, port, rank, world)
            return
        device = getattr(self.engine, "device", "cpu")
        self.member = GroupMember(addr, port, rank, world, timeout_s, bind, device)

    def receive(self, metas: list[tuple[str, str, list[int]]], version: int) -> int:
        """Collective: take part in one push; apply now if idle, else leave it pending. Returns its version.

        ``metas`` (name, wire dtype, shape per tensor, in send order) and ``version`` are only read by a
        ``vllm_nccl`` engine, whose workers receive tensor by tensor; the group's own headers carry them otherwise.
        """
        if self.member is None:
            if self.engine.weight_transfer != "vllm_nccl":
                raise RuntimeError("receive_weights before join_weight_group: this actor is no member of the group")
            with self.lock:  # vLLM loads in place inside its workers: only between batches
                self.engine.receive_weight_transfer(metas, version)
                return self.engine.version
        version, named, nbytes = self.member.receive()
        self.received_bytes += nbytes
        with self._pending_lock:
            if version > self.version:
                self._pending = (version, named)
        if self.lock.acquire(blocking=False):
            try:
                self.apply_pending()
            finally:
                self.lock.release()
        return version

    def apply_pending(self) -> None:
        """Install the newest pending version (call with ``lock`` held, between batches)."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None and pending[0] > self.engine.version:
            self.engine.load_weights(pending[1], pending[0])


class ReceivesWeights:
    """The Ray methods of a rollout actor's end (mixed into RolloutWorker); needs ``self.weights``. Actors
    using it are created with ``concurrency_groups={"weights": 1}``: collective receives run in that thread."""

    weights: WeightReceiver

    def update_weights(self, wref: WeightRef) -> int:
        """Object store: load a newer pushed version (queued between generation batches); returns the version."""
        with self.weights.lock:
            return self.weights.from_object_store(wref)

    @ray.method(concurrency_group="weights")
    def join_weight_group(self, addr: str, port: int, rank: int, world: int, timeout_s: float, bind: str) -> None:
        """Collective: join the weight group of this rendezvous as ``rank`` (runs beside a generating batch)."""
        self.weights.join(addr, port, rank, world, timeout_s, bind)

    @ray.method(concurrency_group="weights")
    def receive_weights(self, metas: list[tuple[str, str, list[int]]], version: int) -> int:
        """Collective: receive one push (beside a generating batch); applied now if idle, else before the next batch."""
        return self.weights.receive(metas, version)

    @ray.method(concurrency_group="weights")
    def leave_weight_group(self) -> None:
        self.weights.member = None

    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()


# ----------------------------------------------------------------------------- the learner's end


@dataclass
class WeightSource:
    """What a sender pushes: named parameters (possibly ZeRO-3 partitions) and how to make them whole."""

    named: list[tuple[str, Any]]
    gather: Callable[[list[Any]], AbstractContextManager]  # whole inside (ZeRO-3), else a no-op
    device: Any  # where buckets are packed for the collective (CUDA: NCCL)
    rank: int  # the learner rank of this process; rank 0 sends
    all_ranks_gather: bool  # ZeRO-3: every rank must take part in the gathers
    version: int  # the policy version (publish's default tag)


class SendsWeights:
    """The learner rank's end of both transports (mixed into LearnerWorker). Needs ``self.cfg`` (its
    ``model.dtype`` is the engines' dtype, hence the wire dtype) and :meth:`weight_source`."""

    cfg: ZipRLConfig
    weight_member: Any = None

    def weight_source(self) -> WeightSource:
        raise NotImplementedError

    def _plan(self, bucket_mb: float | None) -> tuple[WeightSource, list, list]:
        """(source, unique named parameters, bucket plan); ``bucket_mb`` None = the config's."""
        src = self.weight_source()
        named = unique_named_tensors(src.named)
        mb = self.cfg.weights.bucket_mb if bucket_mb is None else bucket_mb
        return src, named, plan_for(named, self.cfg.model.dtype, int(mb * 2**20))

    def _buckets(self, pack_on_device: bool, bucket_mb: float | None) -> tuple[WeightSource, int, Iterator]:
        """(source, bucket count, iterator of (metas, packed buffer or None)): only rank 0 packs; under ZeRO-3
        every rank takes part in gathering one bucket's parameters at a time."""
        src, named, plan = self._plan(bucket_mb)
        device = src.device if pack_on_device else "cpu"
        return src, len(plan), iter_packed(named, plan, src.gather, device, sender=src.rank == 0)

    def _vllm_nccl(self) -> bool:
        """Whether the engines receive through vLLM's NCCL communicator (their spec's ``weight_transfer``)."""
        return ENGINES[self.cfg.model.engine].weight_transfer == "vllm_nccl"

    def _takes_part(self) -> bool:
        src = self.weight_source()
        return src.rank == 0 or src.all_ranks_gather

    def weight_metas(self, bucket_mb: float | None = None) -> list[tuple[str, str, list[int]]]:
        """(name, wire dtype, shape) of every tensor a push sends, in order (what a vLLM receiver is told)."""
        _, _, plan = self._plan(bucket_mb)
        return [(m.name, m.dtype, list(m.shape)) for metas in plan for m in metas]

    def publish(self, version: int | None = None, bucket_mb: float | None = None) -> WeightRef | None:
        """Object store: rank 0 ``ray.put`` s the buckets of ``version`` (default: the policy version) as numpy
        uint8 buffers; returns their :class:`WeightRef` (None on other ranks)."""
        if not self._takes_part():
            return None
        t0, refs, nbytes = time.perf_counter(), [], 0
        src, count, buckets = self._buckets(False, bucket_mb)
        version = src.version if version is None else version
        for i, (metas, buf) in enumerate(buckets):
            if buf is not None:
                data = buf.numpy()
                refs.append(ray.put(Bucket(version, i, count, metas, data)))
                nbytes += data.nbytes
        if not refs:
            return None
        return WeightRef(version, tuple(refs), time.perf_counter() - t0, nbytes)

    def join_weight_group(self, addr: str, port: int, world: int, timeout_s: float, bind: str) -> None:
        """Rank 0 hosts the rendezvous and joins the weight group as its rank 0 (other ranks: nothing)."""
        self.weight_member = None
        src = self.weight_source()
        if src.rank != 0:
            return
        if self._vllm_nccl():  # vLLM's own NCCL communicator (its workers' receiving end)
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self.weight_member = trainer_init({"master_address": addr, "master_port": port, "world_size": world})
        else:
            self.weight_member = GroupMember(addr, port, 0, world, timeout_s, bind, src.device)

    def broadcast_weights(self, version: int, bucket_mb: float | None = None) -> int:
        """Collective: rank 0 broadcasts every bucket of ``version``; returns the bytes sent (0 on other ranks)."""
        import torch

        if not self._takes_part():
            return 0
        _, count, buckets = self._buckets(True, bucket_mb)
        member = self.weight_member
        if member is None:  # ZeRO-3 ranks > 0: only the gathers
            for _ in buckets:
                pass
            return 0
        if not self._vllm_nccl():
            return member.send(version, count, buckets)
        sent = 0  # vLLM's unpacked protocol: one broadcast per tensor, in weight_metas order
        for metas, buf in buckets:
            for t in unpack(metas, buf).values():
                member.broadcast(t, src=0, stream=torch.cuda.current_stream())
            sent += buf.numel()
        return sent

    def leave_weight_group(self) -> None:
        self.weight_member = None


# ----------------------------------------------------------------------------- the driver's end


class WeightSync(WeightPush):
    """Pushes the learner's weights to every rollout actor; see the module docstring for the transports."""

    def __init__(self, cfg: ZipRLConfig, learner: Any, actors: list[Any]):
        self.cfg, self.learner, self.actors = cfg, learner, list(actors)
        self.version = 0  # the last version pushed

    def _learner(self, method: str, *args: Any) -> list[Any]:
        """Start ``method`` on every learner rank (ZeRO-3 gathers need all); refs, rank 0's first."""
        return [getattr(a, method).remote(*args) for a in self.learner.actors]

    def push(self, version: int, wait: bool = False) -> dict[str, float]:
        """Send the learner's current weights, tagged ``version``, to every actor; {"seconds", "bytes"}."""
        raise NotImplementedError

    def for_job(self) -> WeightRef | int:
        """What a rollout job is handed: the version pushed last (its weights are already on their way)."""
        return self.version

    def rejoin(self, index: int, actor: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the transport (the actors and the learner stay up)."""


class ObjectStoreSync(WeightSync):
    """``weights.transport=object_store``: one ``ray.put`` per bucket, one :class:`WeightRef` for all actors."""

    def __init__(self, cfg: ZipRLConfig, learner: Any, actors: list[Any]):
        super().__init__(cfg, learner, actors)
        self.latest: WeightRef | None = None

    def push(self, version: int, wait: bool = False) -> dict[str, float]:
        """Put ``version``'s buckets and send every actor the ref. After it returns every live actor will apply
        it before its next generation batch (its task queue is in order; a busy actor is not waited for), or,
        with ``wait``, has applied it. ``bytes`` is what was put once, whatever the number of actors."""
        t0 = time.perf_counter()
        self.latest = ray.get(self._learner("publish", version, self.cfg.weights.bucket_mb))[0]
        acks = [a.update_weights.remote(self.latest) for a in self.actors]
        if wait:
            ray.get(acks)
        self.version = max(self.version, version)
        return {"seconds": time.perf_counter() - t0, "bytes": float(self.latest.nbytes),
                "put_seconds": self.latest.seconds}

    def for_job(self) -> WeightRef | int:
        """The latest ref, which the actor loads before the job when it is newer than its weights."""
        return self.latest or self.version

    def rejoin(self, index: int, actor: Any) -> None:
        """A restarted actor is handed the latest version at once."""
        self.actors[index] = actor
        if self.latest is not None:
            ray.get(actor.update_weights.remote(self.latest))


class CollectiveSync(WeightSync):
    """``weights.transport=collective``: rank 0 broadcasts the buckets to a group of learner rank 0 + actors."""

    def __init__(self, cfg: ZipRLConfig, learner: Any, actors: list[Any]):
        super().__init__(cfg, learner, actors)
        self.form()

    def form(self) -> None:
        """Form a new group (a fresh rendezvous): learner rank 0 is rank 0, actor i is rank i + 1."""
        ips = [ray.get(self.learner.actors[0].node_ip.remote()), *[self._alive_ip(a) for a in self.actors]]
        loopback = len(set(ips)) == 1
        addr = "127.0.0.1" if loopback else ips[0]
        port = ray.get(self.learner.actors[0].free_port.remote(loopback))
        world, timeout = 1 + len(self.actors), self.cfg.weights.rendezvous_timeout_s
        joins = [a.join_weight_group.remote(addr, port, i + 1, world, timeout, "127.0.0.1" if loopback else ips[i + 1])
                 for i, a in enumerate(self.actors)]
        joins += self._learner("join_weight_group", addr, port, world, timeout, addr)
        ray.get(joins, timeout=timeout + 30)

    def _alive_ip(self, actor: Any) -> str:
        """The actor's node IP, once it is up (a restarting actor answers ActorUnavailableError meanwhile)."""
        deadline = time.monotonic() + self.cfg.weights.rendezvous_timeout_s + 300  # a restart reloads the model
        while True:
            try:
                return ray.get(actor.node_ip.remote())
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def push(self, version: int, wait: bool = False) -> dict[str, float]:
        """Broadcast ``version``. After it returns every actor has received it: idle actors have applied it,
        busy ones apply it before their next generation batch (``wait`` changes nothing: a broadcast completes
        on every member together). If a member died (Ray restarts it, as a new process outside the group),
        the group is formed again and the push sent once more; that costs up to
        ``weights.rendezvous_timeout_s``, while the survivors' receives time out."""
        try:
            return self._push(version)
        except (RayError, RuntimeError):
            self.form()
            return self._push(version)

    def _push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        metas = ray.get(self.learner.actors[0].weight_metas.remote(self.cfg.weights.bucket_mb))
        recvs = [a.receive_weights.remote(metas, version) for a in self.actors]
        sent = ray.get(self._learner("broadcast_weights", version, self.cfg.weights.bucket_mb))[0]
        got = ray.get(recvs, timeout=self.cfg.weights.rendezvous_timeout_s + 30)
        if any(v < version for v in got):
            raise RuntimeError(f"weight push {version}: actors report versions {got}")
        self.version = max(self.version, version)
        return {"seconds": time.perf_counter() - t0, "bytes": float(sent)}

    def rejoin(self, index: int, actor: Any) -> None:
        """Re-form the group with the restarted actor and re-send the latest version (others ignore it)."""
        self.actors[index] = actor
        self.form()
        if self.version:
            self.push(self.version)

    def close(self) -> None:
        """Every member leaves the group (best effort: a dead actor has nothing to leave)."""
        for ref in [a.leave_weight_group.remote() for a in self.actors] + self._learner("leave_weight_group"):
            with contextlib.suppress(RayError):
                ray.get(ref)


def make_weight_sync(cfg: ZipRLConfig, learner: Any, actors: list[Any]) -> WeightSync:
    """The :class:`WeightSync` of ``cfg.weights.transport`` between a LearnerGroup and rollout actors."""
    return {"object_store": ObjectStoreSync, "collective": CollectiveSync}[cfg.weights.transport](cfg, learner, actors)
