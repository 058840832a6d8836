"""``weights.transport=collective``: learner rank 0 broadcasts the buckets to a group of itself and every engine.

The group is ONE separate ``torch.distributed`` process group (a ``TCPStore`` rendezvous hosted by rank 0 and a
``ProcessGroupGloo`` on CPU / ``ProcessGroupNCCL`` on GPU, built directly: not the learner's DeepSpeed world, nor a
default group): learner rank 0 is rank 0, engine i is rank i + 1. For each bucket rank 0 broadcasts its length, its
JSON header (names, dtypes, shapes, offsets, version) and the flat buffer (:class:`Group`). An engine receives in a
thread of its own, so a push never waits for a generating batch (:meth:`WeightReceiver.receive_weights`); an engine
whose runtime receives by itself (vLLM) opens its own group instead, through ``join_weights`` / ``sender_end``.

A group has a fixed membership: when a member restarts, the driver forms a new group (a new rendezvous, every
member joins again) and sends the latest version once more; the others ignore a version they hold.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ziprl.registry import TRANSPORTS
from ziprl.weights import LearnerWeights, Transport, WeightReceiver
from ziprl.weights.buckets import Bucket, TensorMeta, buffer_size, unpack


def tcp_store(addr: str, port: int, world: int, is_master: bool, timeout: timedelta) -> Any:
    """A ``torch.distributed`` TCPStore at ``addr:port`` (the rendezvous of a process group); the master's listens on
    ``addr`` only (an address of this machine, as torch's master needs), so one on 127.0.0.1 is not reachable from
    other machines: torch's own listens on every interface. A host name that resolves to loopback here (Debian maps
    the machine's own name to 127.0.1.1) may name this machine's network address for the other ranks: its store
    listens on every interface, as torch's does."""
    import torch.distributed as dist

    fd = _listening(addr, port) if is_master else None
    return dist.TCPStore(addr, port, world, is_master=is_master, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=fd)


def _listening(addr: str, port: int) -> int | None:
    """The descriptor of a socket listening on ``addr:port``, which the store takes over; None for a host name that
    resolves to loopback (see :func:`tcp_store`)."""
    family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    if ipaddress.ip_address(where[0]).is_loopback and not _loopback_name(addr):
        return None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _loopback_name(addr: str) -> bool:
    """Whether ``addr`` itself says loopback: ``localhost``, or a loopback address."""
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


class Group:
    """This process's end of a weight group: rank 0 sends, every other rank receives.

    ``addr:port`` is the TCPStore rank 0 hosts; ``bind`` is the address this end's gloo connections use
    (127.0.0.1 when the whole group is on one node). CUDA tensors go over NCCL, others over gloo.
    """

    def __init__(self, addr: str, port: int, rank: int, world: int, timeout_s: float, bind: str, device: Any = "cpu"):
        import torch
        import torch.distributed as dist

        self.rank, self.world, self.device = rank, world, torch.device(device)
        timeout = timedelta(seconds=timeout_s)
        self.store = tcp_store(addr, port, world, rank == 0, timeout)
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

    def send(self, version: int, count: int, buckets: Any) -> int:
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

    def receive(self) -> tuple[int, dict[str, Any]]:
        """Other ranks: every bucket of one push -> (version, name -> tensor views in the wire dtype)."""
        import torch

        named: dict[str, Any] = {}
        version = -1
        while True:
            lens = self.broadcast(torch.zeros(3, dtype=torch.int64, device=self.device)).tolist()
            header = self.broadcast(torch.empty(lens[0], dtype=torch.uint8, device=self.device))
            bucket = Bucket.from_header(bytes(header.cpu().numpy()))
            version = bucket.version
            if lens[1]:
                buf = self.broadcast(torch.empty(lens[1], dtype=torch.uint8, device=self.device))
                named.update(unpack(bucket.metas, buf))
            if lens[2]:
                return version, named


@dataclass(frozen=True)
class Plan:
    """What every engine is told before a broadcast: the version and each tensor's (name, wire dtype, shape), in
    send order (an engine that receives tensor by tensor needs them; ZipRL's group reads its bucket headers)."""

    version: int
    metas: list[tuple[str, str, list[int]]]
    nbytes: int  # the bytes broadcast (whatever the number of engines)


@TRANSPORTS.register("collective", order=1)
class Collective(Transport):
    """Rank 0 broadcasts the buckets (packed on its device: NCCL on GPU) to a group of itself and every engine."""

    grouped = True

    def join(self, weights: LearnerWeights, addr: str, port: int, world: int, timeout_s: float, bind: str) -> Any:
        """Rank 0 hosts the rendezvous and opens the end of the group its engines receive on."""
        if weights.rank != 0:
            return None
        return weights.receiver.sender_end(addr, port, world, timeout_s, bind, weights.device)

    def announce(self, weights: LearnerWeights, version: int, store: Any) -> Plan | None:
        if weights.rank != 0:
            return None
        plan: list[tuple[TensorMeta, ...]] = weights.plan(self.bucket_bytes)
        return Plan(version, [(m.name, m.dtype, list(m.shape)) for metas in plan for m in metas],
                    sum(buffer_size(metas) for metas in plan))

    def send(self, weights: LearnerWeights, version: int, end: Any) -> None:
        """Rank 0 broadcasts every bucket of ``version``; ZeRO-3's other ranks take part in the gathers only."""
        if not weights.takes_part:
            return
        count, buckets = weights.packed(self.bucket_bytes, on_device=True)
        if end is None:
            for _ in buckets:
                pass
            return
        end.send(version, count, buckets)

    def receive(self, engine: WeightReceiver, announced: Plan, store: Any) -> int:
        return engine.receive_weights(announced.metas, announced.version)
