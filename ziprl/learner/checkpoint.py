"""Checkpoints that resume a :class:`~ziprl.learner.trainer.Trainer` exactly, with no pickle anywhere.

``<out>/checkpoints/step_<n>-<id>/`` holds (``<id>`` is random per write, so names never collide across runs)

- ``model.safetensors``: the float32 master weights, whole tensors under their HF parameter names;
- ``optimizer.safetensors``: AdamW's moments per parameter (``exp_avg/<name>``, ``exp_avg_sq/<name>``);
- ``rng.safetensors``: torch's CPU (and CUDA) generator states and numpy's MT19937 key;
- ``state.json``: step, policy version, AdamW's step count and hyper-parameters, the LR scheduler state,
  the python and numpy RNG scalars, the ZeRO stage and compute dtype (bf16 or not) it was written under, and the
  caller's data position.

``<out>/checkpoints/latest`` names the newest complete checkpoint. A checkpoint is written beside its final
place (its tensor files with direct I/O: :mod:`ziprl.learner.tensor_file`), fsynced and renamed into it, then
``latest`` is replaced atomically, so a crash never leaves a torn one; :func:`clean_orphans` removes what a killed
write left behind. Pruning never removes what ``latest`` names.

Tensors are stored whole (gathered with DeepSpeed's ``safe_get_full_*`` API under ZeRO 1-3), not as
DeepSpeed's per-rank partitions, so DeepSpeed's own ``torch.save`` checkpoints are not needed and a
checkpoint resumes under any ZeRO stage or number of ranks. RNG states are rank 0's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ziprl.boundary import UserError
from ziprl.learner.distributed import rank, world_size
from ziprl.learner.tensor_file import write_tensors
from ziprl.outputs import MARKER, OutputError, normalise, read_marker, shown, write_marker
from ziprl.paths import atomic_dir, atomic_write_text
from ziprl.policy.models import check_safetensors

if TYPE_CHECKING:
    from ziprl.config import ZipRLConfig
    from ziprl.learner.trainer import Trainer

MOMENTS = ("exp_avg", "exp_avg_sq")
LATEST = "latest"
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json")
_NAME_RE = re.compile(r"^step_(\d+)(?:-[0-9a-f]+)?$")
# what a killed write leaves: atomic_dir's temporary checkpoint and the old one it moves aside, atomic_path's latest
_ORPHAN_RE = re.compile(r"\.(?:step_\d+(?:-[0-9a-f]+)?\.(?:[a-z0-9_]{8}(?:\.tmp)?|old-[0-9a-f]{8})|latest\.[0-9a-f]{8}\.tmp)")


class CheckpointError(UserError, ValueError):
    """A checkpoint is incomplete, unreadable or of another model; the message names it and the fix."""


def save_checkpoint(trainer: Trainer, out_dir: str | Path, data_position: dict[str, Any],
                    keep: int | None = None) -> Path:
    """Write ``<out_dir>/checkpoints/step_<n>/`` and point ``latest`` at it; keep the newest ``keep`` (None = the
    run's ``run.keep_checkpoints``, 0 = all).

    ``data_position`` is an opaque JSON-serialisable dict (e.g. dataset cursor and epoch) handed back by
    :func:`load_checkpoint`. Every rank must call this (ZeRO gathers are collective); rank 0 writes.
    """
    snap = snapshot(trainer, out_dir, data_position, keep, copy=False)  # written before the trainer moves on
    if rank() == 0:
        write_snapshot(snap)
    if world_size() > 1:
        torch.distributed.barrier()
    return snap.path


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A checkpoint copied out of the trainer (:func:`snapshot`), for :func:`write_snapshot` to write at once or in
    a thread while training goes on: nothing in it changes with the trainer."""

    path: Path  # <out>/checkpoints/step_<n>-<id>
    files: dict[str, dict[str, torch.Tensor]]  # safetensors file name -> its tensors
    state_json: str
    keep: int


def snapshot(trainer: Trainer, out_dir: str | Path, data_position: dict[str, Any], keep: int | None = None,
             copy: bool = True) -> Snapshot:
    """The trainer's checkpoint content, copied (see :func:`save_checkpoint`; every rank calls it: ZeRO gathers are
    collective). Only rank 0, which writes it, keeps the copies; the other ranks' snapshots hold no tensors. Without
    ``copy`` a CPU trainer's float32 tensors are held as they are (for a write that ends before the trainer steps)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    module, base = trainer.engine.module, trainer.optimizer
    weights, moments = {}, {}
    host = HostCopies(keep=rank() == 0, copy=copy)
    for name, p in module.named_parameters():
        full = safe_get_full_fp32_param(p)  # None without ZeRO: the parameter is its own master
        host(weights, name, p if full is None else full)
        for key in MOMENTS if base.state else ():
            full = safe_get_full_optimizer_state(p, key)
            host(moments, f"{key}/{name}", base.state[p][key] if full is None else full)
    host.wait()
    adam_steps = {float(s["step"]) for s in base.state.values()}
    if len(adam_steps) > 1:
        raise RuntimeError(f"AdamW parameters are at different step counts {sorted(adam_steps)}; cannot store one")
    py_state = random.getstate()
    np_state = np.random.get_state()
    state = {
        "step": trainer.global_step,
        "policy_version": trainer.policy_version,
        "zero_stage": trainer.zero_stage,
        "bf16": trainer.bf16,
        "world_size": world_size(),
        "optimizer": {
            "step": adam_steps.pop() if adam_steps else 0.0,
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in base.param_groups],
        },
        "scheduler": trainer.scheduler.state_dict(),
        "rng": {"python": [py_state[0], list(py_state[1]), py_state[2]], "numpy": [np_state[0], *np_state[2:]]},
        "data_position": data_position,
    }
    rng = {"torch": torch.get_rng_state(), "numpy_key": torch.from_numpy(np_state[1].astype(np.int64))}
    if torch.cuda.is_available():
        rng.update({f"cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    path = Path(out_dir) / "checkpoints" / f"step_{trainer.global_step}-{uuid.uuid4().hex[:8]}"
    files = {"model.safetensors": weights, "optimizer.safetensors": moments, "rng.safetensors": rng}
    return Snapshot(path, files, json.dumps(state, indent=1),
                    trainer.cfg.run.keep_checkpoints if keep is None else keep)


def write_snapshot(snap: Snapshot) -> Path:
    """Write ``snap`` beside its place, fsync and rename it there, point ``latest`` at it and prune (rank 0)."""
    with atomic_dir(snap.path) as tmp:
        for name, tensors in snap.files.items():
            write_tensors(tensors, tmp / name)
        (tmp / "state.json").write_text(snap.state_json)
    atomic_write_text(snap.path.parent / LATEST, snap.path.name + "\n")
    if snap.keep:
        prune(snap.path.parent, snap.keep)
    return snap.path


def _ours(path: Path) -> bool:
    """Whether the checkpoint directory ``path`` holds only the files a checkpoint write puts there (a checkpoint
    a user added a file to is kept whole)."""
    return all(p.name in FILES and p.is_file() and not p.is_symlink() for p in path.iterdir())


def complete_checkpoints(out_dir: str | Path) -> list[Path]:
    """The complete checkpoints (every file of :data:`FILES`) under ``<out_dir>/checkpoints``, oldest step first."""
    root = Path(out_dir) / "checkpoints"
    found = [p for p in root.iterdir() if _NAME_RE.match(p.name) and all((p / f).is_file() for f in FILES)] \
        if root.is_dir() else []
    return sorted(found, key=lambda p: int(_NAME_RE.match(p.name)[1]))


def prune(root: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest-written checkpoints under ``root``; never the one ``latest`` names, nor
    one holding anything a checkpoint write does not put there."""
    pointer = root / LATEST
    current = pointer.read_text().strip() if pointer.is_file() else None
    found = [p for p in root.iterdir() if _NAME_RE.match(p.name) and (p / "state.json").is_file()]
    found.sort(key=lambda p: ((p / "state.json").stat().st_mtime_ns, int(_NAME_RE.match(p.name)[1])))
    for old in found[: max(len(found) - keep, 0)]:
        if old.name != current and not old.is_symlink() and _ours(old):
            # renamed first: a delete a kill cuts short leaves an orphan that clean_orphans removes on resume
            try:
                doomed = old.rename(old.with_name(f".{old.name}.old-{uuid.uuid4().hex[:8]}"))
            except OSError:  # gone meanwhile, or not renamable: the delete below does what it can
                doomed = old
            shutil.rmtree(doomed, ignore_errors=True)


def remove_checkpoints(out_dir: str | Path) -> None:
    """Delete what checkpoint writes put under ``<out_dir>/checkpoints`` (an SFT's, once its model is written), and
    the directory once nothing else is left in it: a user's file there is kept, with the directory."""
    root = Path(out_dir) / "checkpoints"
    for p in root.iterdir():
        if p.is_symlink():
            continue
        if p.name == LATEST and p.is_file():
            p.unlink()
        elif (_NAME_RE.match(p.name) and p.is_dir() and _ours(p)) or _ORPHAN_RE.fullmatch(p.name):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    with contextlib.suppress(OSError):  # not empty: what is left is not ZipRL's
        root.rmdir()


def clean_orphans(out_dir: str | Path) -> list[Path]:
    """Remove the temporary files and directories of killed checkpoint writes under ``<out_dir>/checkpoints`` (only
    the names those writes give them).

    Call it only when no checkpoint write is running (at the start of a run); returns what it removed.
    """
    root = Path(out_dir) / "checkpoints"
    removed = [p for p in root.iterdir() if _ORPHAN_RE.fullmatch(p.name) and not p.is_symlink()] \
        if root.is_dir() else []
    for p in removed:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    if removed:
        print(f"[checkpoint] removed {len(removed)} leftover(s) of interrupted checkpoint writes in {root}", flush=True)
    return removed


def resumed_learner(cfg: ZipRLConfig) -> ZipRLConfig:
    """``cfg`` with ``learner.bf16`` null (decided by measuring the GEMMs) set to the decision the checkpoint it
    resumes was written under: a resumed run keeps its numerics, however the measurement would come out now (on a
    loaded machine it flipped, and the resumed run's loss left the straight run's). Unchanged when not resuming,
    when ``learner.bf16`` is set, or for a checkpoint written before the decision was stored."""
    return in_checkpoint_dtype(cfg, cfg.run.out_dir) if cfg.run.resume else cfg


def in_checkpoint_dtype(cfg: ZipRLConfig, out_dir: str | Path) -> ZipRLConfig:
    """``cfg`` with ``learner.bf16`` null set to what ``out_dir``'s latest checkpoint was written under (see
    :func:`resumed_learner`); unchanged when ``learner.bf16`` is set or the checkpoint does not say."""
    ckpt = latest_checkpoint(out_dir) if cfg.learner.bf16 is None else None
    decided = None if ckpt is None else json.loads((ckpt / "state.json").read_text(encoding="utf-8")).get("bf16")
    if decided is None:
        return cfg
    return dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, bf16=bool(decided)))


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The checkpoint ``<out_dir>/checkpoints/latest`` names, or None when none was written."""
    root = Path(out_dir) / "checkpoints"
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8", errors="replace").strip()
    if not _NAME_RE.match(name):
        raise FileNotFoundError(f"{pointer} holds {name[:80]!r}, not a checkpoint name")
    path = root / name
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is missing or incomplete")
    return path


def checkpoint_state(path: str | Path) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint directory, once it is checked complete and readable (without loading its
    tensors); CheckpointError if not."""
    path = Path(path)
    for name in FILES:
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} lacks {name}")
    for name in FILES[:3]:
        check_safetensors(path / name)
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: state.json is not valid JSON ({exc})") from None
    needed = {"step": int, "policy_version": int, "optimizer": dict, "scheduler": dict, "rng": dict,
              "data_position": dict}
    if not isinstance(state, dict) or any(k not in state for k in needed):
        raise CheckpointError(f"checkpoint {path}: state.json lacks the fields {tuple(needed)}")
    wrong = [k for k, kind in needed.items() if not isinstance(state[k], kind) or isinstance(state[k], bool)]
    if wrong or state["step"] < 0:
        raise CheckpointError(f"checkpoint {path}: state.json's {', '.join(wrong) or 'step'} "
                              f"{'is' if len(wrong) < 2 else 'are'} not what a checkpoint write puts there")
    return state


def verify_checkpoint(path: str | Path) -> Path:
    """``path``, once :func:`checkpoint_state` finds the checkpoint complete and readable; CheckpointError if not."""
    checkpoint_state(path)
    return Path(path)



def export_model(checkpoint: str | Path, base_model: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """An HF model directory at ``out``: ``base_model``'s config and tokenizer files with ``checkpoint``'s weights.

    ``base_model`` is the directory the run started from (``run.sft_checkpoint`` or ``model.path``); the result
    loads with ``from_pretrained`` and as ``model.path`` (e.g. ``python -m ziprl.eval --model OUT``). ``out`` is new,
    or, with ``overwrite``, a directory an earlier export wrote (its marker) holding nothing else; anything else is
    refused (OutputError) before anything is written.
    """
    checkpoint, base_model = verify_checkpoint(checkpoint), Path(base_model)
    if not (base_model / "config.json").is_file():
        raise CheckpointError(f"{base_model} is not a model directory (no config.json); pass the run's base model")
    copied = [f for f in base_model.iterdir()
              if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json"))]  # weights: the checkpoint's
    out = export_target(out, overwrite, {MARKER, "model.safetensors", *(f.name for f in copied)})
    with atomic_dir(out) as tmp:
        for f in copied:
            shutil.copy2(f, tmp / f.name)
        save_file(load_file(checkpoint / "model.safetensors"), tmp / "model.safetensors", metadata={"format": "pt"})
        write_marker(tmp, "model")
    return out


def export_target(out: str | Path, overwrite: bool, writes: set[str]) -> Path:
    """``out`` normalised, once :func:`export_model` may write it: new, or with ``overwrite`` a directory marked as an
    export holding only the names in ``writes``; OutputError otherwise."""
    path = normalise(out)
    if not os.path.lexists(path):
        return path
    marker = read_marker(path) if path.is_dir() and not path.is_symlink() else None
    if marker is None or marker["kind"] != "model":
        raise OutputError(f"{out} exists and is not a model directory export_model wrote; nothing was written: "
                          "pass a new path")
    if not overwrite:
        raise OutputError(f"{out} exists (a model export_model wrote); pass overwrite=True to replace it, or a new path")
    other = sorted(p.name for p in path.iterdir() if p.name not in writes)
    if other:
        raise OutputError(f"{out} also holds {shown(other)}, which export_model did not write; nothing was written: "
                          "pass a new path")
    return path


def load_checkpoint(trainer: Trainer, path_or_out_dir: str | Path) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler, RNG, step and policy version; return the saved data position.

    ``path_or_out_dir`` is a ``step_<n>-<id>`` directory or a run directory (its ``latest`` checkpoint). Every rank
    must call this. Build ``trainer`` with the same model path as the run it resumes (the reference model).
    """
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    path = Path(path_or_out_dir)
    if not (path / "state.json").is_file():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"{path} is neither a checkpoint directory nor a run directory with checkpoints")
        path = found
    state = json.loads((path / "state.json").read_text())
    weights = load_file(path / "model.safetensors")
    moments = load_file(path / "optimizer.safetensors")
    module, base, device = trainer.engine.module, trainer.optimizer, trainer.device
    names = [name for name, _ in module.named_parameters()]
    if set(weights) != set(names):
        missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
        raise CheckpointError(f"checkpoint {path} does not fit this model: missing {missing[:3]}, unexpected {extra[:3]};"
                              " resume with the model the run started from")
    shapes = {name: tuple(getattr(p, "ds_shape", p.shape)) for name, p in module.named_parameters()}
    other = [f"{n} {tuple(weights[n].shape)} here {shapes[n]}" for n in names if tuple(weights[n].shape) != shapes[n]]
    if other:
        raise CheckpointError(f"checkpoint {path} does not fit this model: its shapes differ ({'; '.join(other[:2])}); "
                              "resume with the model the run started from")

    if moments:
        _ensure_adam_state(trainer, state["optimizer"]["step"])
    with trainer.gathered(modify=True):
        for name, p in module.named_parameters():
            value = weights[name].to(device)
            safe_set_full_fp32_param(p, value)  # ZeRO's float32 master (no-op without ZeRO)
            p.data.copy_(value)  # the module's own (compute-dtype) copy
            for key in MOMENTS if moments else ():
                m = moments[f"{key}/{name}"].to(device)
                if hasattr(p, "ds_id") or hasattr(p, "_hp_mapping"):
                    safe_set_full_optimizer_state(p, m, key)
                else:
                    base.state[p][key].copy_(m)
    for group, saved in zip(base.param_groups, state["optimizer"]["param_groups"], strict=True):
        group.update({k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.engine.global_steps = trainer.global_step = state["step"]
    trainer.at_reference = False
    trainer.policy_version = state["policy_version"]
    _set_rng(state["rng"], load_file(path / "rng.safetensors"))
    return state["data_position"]


class HostCopies:
    """Float32 host copies of tensors, made only when ``keep`` (a CPU float32 tensor is itself without ``copy``).
    A GPU tensor's copy is queued into pinned memory and all are waited for once (:meth:`wait`). Torch's caching host
    allocator keeps that memory (one checkpoint's size) for the next snapshot: on an H200 at Qwen3-1.7B's shape
    (20.6 GB) a snapshot took 0.40 s, against 11.7-14.3 s for new pageable memory each time
    (benchmarks/results/gpu_checkpoint_h200.md)."""

    def __init__(self, keep: bool, copy: bool = True) -> None:
        self.keep, self.copy, self._queued = keep, copy, False

    def __call__(self, into: dict[str, torch.Tensor], key: str, t: torch.Tensor) -> None:
        if not self.keep:
            return
        t = t.detach()
        if t.device.type != "cuda":
            into[key] = t.to("cpu", torch.float32, copy=self.copy).contiguous()
            return
        into[key] = torch.empty(t.shape, dtype=torch.float32, pin_memory=True)
        into[key].copy_(t, non_blocking=True)  # ordered on the stream before the gathers that reuse t's memory
        self._queued = True

    def wait(self) -> None:
        if self._queued:
            torch.cuda.synchronize()


def _ensure_adam_state(trainer: Trainer, step: float) -> None:
    """Give every AdamW parameter (ZeRO's flat partitions, or the parameters themselves) a state at ``step``.

    A fresh trainer has none yet (AdamW creates it lazily); the moments are then written into it.
    """
    base, zero = trainer.optimizer, trainer.engine.optimizer
    if trainer.zero_stage == 3:  # ZeRO-3 hands its flat fp32 sub-groups to AdamW only while stepping
        params = list(zero.fp32_partitioned_groups_flat)
    else:
        params = [p for group in base.param_groups for p in group["params"]]
    on_device = base.defaults["fused"] or base.defaults["capturable"]  # where AdamW itself keeps "step"
    for p in params:
        s = base.state[p]
        if not s:
            s.update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        s["step"] = torch.tensor(float(step), dtype=torch.float32, device=p.device if on_device else "cpu")
    if trainer.zero_stage in (1, 2):
        # ZeRO-1/2 map each parameter onto these flat states lazily at the first step; map them now.
        zero._lazy_init_hp_params_optimizer_state()


def _set_rng(saved: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    version, internal, gauss = saved["python"]
    random.setstate((version, tuple(internal), gauss))
    name, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((name, tensors["numpy_key"].numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[f"cuda_{i}"] for i in range(sum(k.startswith("cuda_") for k in tensors))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
