"""``weights.transport=object_store``: learner rank 0 puts each bucket into the cluster's object store once, and
every engine is handed the same :class:`Stored` version.

A bucket's bytes are a numpy uint8 buffer (numpy, not a torch tensor, which the object store pickles ~4x slower).
Engines on the learner's node read the buckets zero-copy from shared memory (one copy per node, whatever the number
of engines); a CPU ``HFEngine`` of the wire dtype uses them as its parameters without copying. An engine takes a
version between two generation batches (on Ray: in the rollout actor's task queue), and a job handed the latest
version loads it first when it is newer than the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ziprl.registry import TRANSPORTS
from ziprl.weights import LearnerWeights, Transport, WeightReceiver
from ziprl.weights.buckets import Bucket, unpack


@dataclass(frozen=True)
class Stored:
    """One version in the object store: what every engine is handed."""

    version: int
    buckets: tuple[Any, ...]  # object refs -> Bucket (with its data), in order
    nbytes: int  # bytes put (once, whatever the number of engines)


@TRANSPORTS.register("object_store", order=0)
class ObjectStore(Transport):
    """One ``put`` per bucket; one :class:`Stored` for all engines, fetched by each."""

    def announce(self, weights: LearnerWeights, version: int, store: Any) -> Stored | None:
        """Rank 0 puts the buckets of ``version``; under ZeRO-3 the other ranks take part in the gathers."""
        if not weights.takes_part:
            return None
        refs, nbytes = [], 0
        count, buckets = weights.packed(self.bucket_bytes, on_device=False)
        for i, (metas, buf) in enumerate(buckets):
            if buf is not None:
                data = buf.numpy()
                refs.append(store.put(Bucket(version, i, count, metas, data)))
                nbytes += data.nbytes
        if not refs:
            return None
        return Stored(version, tuple(refs), nbytes)

    def send(self, weights: LearnerWeights, version: int, end: Any) -> None:
        """Nothing left: the buckets are in the store."""

    def receive(self, engine: WeightReceiver, announced: Stored, store: Any) -> int:
        """Fetch the buckets and load them when newer than the engine's weights (the caller is between batches)."""
        if announced.version > engine.version:
            named: dict[str, Any] = {}
            for bucket in store.get(list(announced.buckets)):
                named.update(unpack(bucket.metas, bucket.data))
            engine.load_weights(named, announced.version)
        return engine.version
