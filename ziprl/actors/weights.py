"""Weight publishing from the learner to the rollout actors, and the staleness rule.

Object-store path (this module; CPU and small clusters): the learner turns its state dict into
plain numpy arrays, ``ray.put``s them ONCE per version and sends every subscriber the same
:class:`WeightRef`. A subscriber calls ``ray.get(weight_ref.ref)``: actors on the learner's node
read the arrays zero-copy from shared memory, other nodes pull one copy per node, and a CPU
``HFEngine`` uses those arrays as its parameters without copying them (all actors of a node share
one copy of each version). numpy, not torch
tensors: torch tensors through the object store measured ~4x slower here (they are pickled, numpy
arrays are stored as raw buffers). bfloat16 (which numpy lacks) is widened to float32 — lossless,
so a bf16 model reloads bit-exactly (``load_state_dict`` casts back), at twice the bytes.

NCCL path (GPU clusters; documented, not implemented here because it cannot be tested without
GPUs): OpenRLHF and verl skip the object store. Learner rank 0 and every vLLM worker join one
``torch.distributed`` process group (NCCL, rendezvous over TCP; vLLM workers are added with a
rank offset through a ``collective_rpc`` call that runs ``init_process_group`` inside each
worker). For each new version the learner gathers every parameter (ZeRO-3: one parameter at a
time with ``GatheredParameters``), tells the engines the name/dtype/shape over a Ray call
(``llm.collective_rpc("update_weight", args=(name, dtype, shape))``), and
``torch.distributed.broadcast``s the GPU tensor from rank 0; each worker receives into a buffer
and calls ``model.load_weights([(name, tensor)])``. Weights never leave GPU memory, so a
multi-billion-parameter model typically updates in seconds over NVLink. Co-located setups (verl's
hybrid engine, OpenRLHF's colocate mode) skip the broadcast: the learner hands its gathered
tensors to the vLLM worker on the same GPU directly, in-process or as CUDA IPC handles. This is the
path to add for ``model.engine=vllm`` on a GPU cluster; :class:`WeightPublisher` stays the fallback.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

if TYPE_CHECKING:
    import torch


def state_dict_to_numpy(model_or_state_dict: Any, copy: bool = True) -> dict[str, np.ndarray]:
    """Contiguous CPU numpy arrays of a module's (or a mapping's) tensors; bfloat16 becomes float32.

    Tied weights (e.g. ``lm_head.weight`` = ``embed_tokens.weight``) map to one array object, so
    ``ray.put`` stores them once. ``copy=False`` may share memory with CPU float parameters (fine
    right before ``ray.put``, which snapshots them); the default returns arrays the caller owns.
    """
    import torch  # lazy: subscribers that only read numpy never import torch

    sd = model_or_state_dict.state_dict() if hasattr(model_or_state_dict, "state_dict") else model_or_state_dict
    if not isinstance(sd, Mapping):
        raise TypeError(f"expected a torch module or a mapping of tensors, got {type(sd).__name__}")
    out: dict[str, np.ndarray] = {}
    seen: dict[tuple, np.ndarray] = {}
    for name, value in sd.items():
        if isinstance(value, torch.Tensor):
            key = (value.device, value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
            if value.numel() and key in seen:
                out[name] = seen[key]
                continue
            t = value.detach().cpu()
            if t.dtype == torch.bfloat16:
                t = t.float()  # numpy has no bfloat16; widening is exact
            arr = t.numpy()
        else:
            key, arr = None, np.asarray(value)
        out[name] = np.array(arr, copy=True, order="C") if copy else np.ascontiguousarray(arr)
        if key is not None:
            seen[key] = out[name]
    return out


def load_numpy_state_dict(model: torch.nn.Module, arrays: Mapping[str, np.ndarray], strict: bool = True) -> None:
    """Copy numpy weights into ``model`` in place, casting to each parameter's dtype (e.g. back to bf16)."""
    import torch

    with warnings.catch_warnings():
        # Arrays from ray.get are read-only views of shared memory; load_state_dict only reads them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    with torch.no_grad():
        model.load_state_dict(tensors, strict=strict)


@dataclass(frozen=True)
class WeightRef:
    """One published policy version: what every subscriber receives."""

    version: int
    ref: ray.ObjectRef  # -> dict[str, np.ndarray]
    seconds: float  # time to convert and ray.put
    nbytes: int


class WeightPublisher:
    """Puts each weight version into the object store once and hands the same ref to every subscriber.

    A subscriber is an actor handle with a method ``method(weight_ref: WeightRef)``; calls are
    asynchronous (the learner does not wait); :meth:`wait` blocks until all have acknowledged.
    Only the latest version's ref is held here, so older versions are freed once subscribers drop them.
    """

    def __init__(self, subscribers: Iterable[Any] = (), method: str = "update_weights", version: int = 0):
        self.method = method
        self._subscribers = list(subscribers)
        self._version = version
        self._latest: WeightRef | None = None
        self._acks: list[ray.ObjectRef] = []

    @property
    def version(self) -> int:
        """The version of the latest publish (the start version before any)."""
        return self._version

    @property
    def latest(self) -> WeightRef | None:
        return self._latest

    def subscribe(self, actor: Any) -> None:
        """Add a subscriber; it is sent the latest version at once if there is one."""
        self._subscribers.append(actor)
        if self._latest is not None:
            self._acks.append(getattr(actor, self.method).remote(self._latest))

    def publish(self, weights: Any) -> WeightRef:
        """Convert (a module, state dict or numpy dict), ``ray.put`` once, notify every subscriber."""
        start = time.perf_counter()
        arrays = state_dict_to_numpy(weights, copy=False)
        ref = ray.put(arrays)
        self._version += 1
        self._latest = WeightRef(
            version=self._version,
            ref=ref,
            seconds=time.perf_counter() - start,
            nbytes=sum(a.nbytes for a in {id(a): a for a in arrays.values()}.values()),  # tied ones once
        )
        self._acks = [getattr(a, self.method).remote(self._latest) for a in self._subscribers]
        return self._latest

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every subscriber has handled the latest publish; returns their replies."""
        acks, self._acks = self._acks, []
        return ray.get(acks, timeout=timeout)


def is_fresh(trajectory_version: int, current_version: int, max_staleness: int) -> bool:
    """Whether a trajectory sampled with ``trajectory_version`` may train the policy at ``current_version``.

    Allowed lag is ``current - trajectory <= max_staleness``; 0 = synchronous on-policy (only the
    current version). A trajectory from a future version or a negative bound is a bug: ValueError.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    lag = current_version - trajectory_version
    if lag < 0:
        raise ValueError(f"trajectory version {trajectory_version} is newer than the policy ({current_version})")
    return lag <= max_staleness
