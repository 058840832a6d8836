"""The weight push on Ray: the configured :class:`~ziprl.weights.Transport` between the learner ranks and the rollout
actors, driven from the driver.

The learner ranks and the rollout actors expose the transport's two halves as Ray methods (``join_weights``,
``announce_weights``, ``send_weights``, ``leave_weights`` on a learner rank; ``join_weights``, ``receive_weights``,
``leave_weights`` on a rollout actor, whose engine is the receiver). A push: every learner rank announces the
version (rank 0 answers), every actor is handed the announcement, the learner ranks send what is left. A grouped
transport (collective) forms its group first; its receives run in the actors' ``weights`` concurrency group, beside
a generating batch, and every push waits for all of them. Other transports' receives run in the actor's task queue,
between batches.

Driver wiring::

    sender = RaySender(cfg, learner_group, rollout_actors)     # once, after the actors are created
    stats = sender.push(version)     # after each step (and after a resume): {"seconds", "bytes"}
    actor.run_batch.remote(examples, seed, sender.for_job())   # what the job loads first, if anything
    sender.rejoin(i, actors[i])      # after a RayActorError from actor i (Ray restarted it)
    sender.close()                   # at the end

A grouped transport's group has a fixed membership: when Ray restarts a rollout actor (a new process, no member),
:meth:`RaySender.rejoin` forms a new group (a new rendezvous port, every member joins again) and re-sends the
latest version, which the other actors ignore; a push that meets an unreported crash does the same.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayError

from ziprl.config import ZipRLConfig
from ziprl.registry import TRANSPORTS
from ziprl.weights import WeightSender


class RaySender(WeightSender):
    """Pushes the learner's weights to every rollout actor over ``weights.transport``."""

    def __init__(self, cfg: ZipRLConfig, learner: Any, actors: list[Any]):
        self.cfg, self.learner, self.actors = cfg, learner, list(actors)
        self.transport = TRANSPORTS[cfg.weights.transport](cfg.weights.bucket_mb)
        self.version = 0  # the last version pushed
        self.announced: Any = None  # its announcement
        if self.transport.grouped:
            self.form()

    def _learner(self, method: str, *args: Any) -> list[Any]:
        """Start ``method`` on every learner rank (ZeRO-3 gathers need all); refs, rank 0's first."""
        return [getattr(a, method).remote(*args) for a in self.learner.actors]

    def _receive(self, actor: Any, announced: Any) -> Any:
        method = actor.receive_weights
        if self.transport.grouped:  # beside a generating batch: a broadcast does not wait for busy members
            method = method.options(concurrency_group="weights")
        return method.remote(self.transport, announced)

    def push(self, version: int, wait: bool = False) -> dict[str, float]:
        """Send the learner's current weights, tagged ``version``, to every actor; {"seconds", "bytes"}.

        After it returns every live actor will apply it before its next generation batch (object store: its task
        queue is in order, a busy actor is not waited for), or has applied it (``wait``; a grouped transport always
        waits: a broadcast completes on every member together). ``bytes`` is what one push moves, whatever the
        number of actors. If a member of a group died (Ray restarts it as a new process outside the group), the
        group is formed again and the push sent once more; that costs up to ``weights.rendezvous_timeout_s``,
        while the survivors' receives time out.
        """
        if not self.transport.grouped:
            return self._push(version, wait)
        try:
            return self._push(version, wait)
        except (RayError, RuntimeError):
            self.form()
            return self._push(version, wait)

    def _push(self, version: int, wait: bool) -> dict[str, float]:
        t0 = time.perf_counter()
        announced = ray.get(self._learner("announce_weights", self.transport, version))[0]
        acks = [self._receive(a, announced) for a in self.actors]
        ray.get(self._learner("send_weights", self.transport, version))
        if self.transport.grouped:
            got = ray.get(acks, timeout=self.cfg.weights.rendezvous_timeout_s + 30)
            if any(v < version for v in got):
                raise RuntimeError(f"weight push {version}: actors report versions {got}")
        elif wait:
            ray.get(acks)
        self.version, self.announced = max(self.version, version), announced
        return {"seconds": time.perf_counter() - t0, "bytes": float(announced.nbytes)}

    def for_job(self) -> tuple[Any, Any] | None:
        """What a rollout job is handed to load first when newer: (transport, the latest announcement); None before
        the first push, or when the transport delivers only by broadcast (its weights are already on their way)."""
        return None if self.transport.grouped or self.announced is None else (self.transport, self.announced)

    def form(self) -> None:
        """Form a new group (a fresh rendezvous): learner rank 0 is rank 0, actor i is rank i + 1."""
        ips = [ray.get(self.learner.actors[0].node_ip.remote()), *[self._alive_ip(a) for a in self.actors]]
        loopback = len(set(ips)) == 1
        addr = "127.0.0.1" if loopback else ips[0]
        port = ray.get(self.learner.actors[0].free_port.remote(loopback))
        world, timeout = 1 + len(self.actors), self.cfg.weights.rendezvous_timeout_s
        joins = [a.join_weights.remote(addr, port, i + 1, world, timeout, "127.0.0.1" if loopback else ips[i + 1])
                 for i, a in enumerate(self.actors)]
        joins += self._learner("join_weights", self.transport, addr, port, world, timeout, addr)
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

    def rejoin(self, index: int, actor: Any) -> None:
        """Actor ``index`` was restarted by Ray: it is handed the latest version at once (a grouped transport forms
        the group again with it and re-sends that version; the others ignore it)."""
        self.actors[index] = actor
        if self.transport.grouped:
            self.form()
            if self.version:
                self.push(self.version)
        elif self.announced is not None:
            ray.get(actor.receive_weights.remote(self.transport, self.announced))

    def close(self) -> None:
        """Every member leaves a group (best effort: a dead actor has nothing to leave); the actors and the learner
        stay up."""
        if not self.transport.grouped:
            return
        for ref in [a.leave_weights.remote() for a in self.actors] + self._learner("leave_weights"):
            with contextlib.suppress(RayError):
                ray.get(ref)
