"""A GPU learner's checkpoint snapshot at real shapes: the copy off the GPU that a step waits for before a background
write (``run.background_checkpoints``, on by default on a GPU learner).

    python benchmarks/gpu_checkpoint.py [--archs qwen3-0.6b,qwen3-1.7b] [--tokenizer DIR] [--name gpu_checkpoint]

Per architecture (random weights at its shape, DeepSpeed bf16 ZeRO-2 on one GPU, AdamW moments filled at random):
``gathers_s`` DeepSpeed's full-tensor gathers alone; ``pageable_s`` each gathered tensor copied to new pageable
host memory, one synchronous copy at a time (the snapshot before round 41); ``snapshot_s`` :func:`snapshot` (each
copy queued into pinned memory, one wait) the first time, ``snapshot_again_s`` the next time, when torch's caching
host allocator hands back the pinned memory the first one freed; whether the two copies are bitwise equal.
Results: benchmarks/results/<name>.{json,md}. Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import results_name, write_results  # noqa: E402
from gpu_step import ARCHS, build_model, gpu_setup, refuse_tokenizer, unknown_archs  # noqa: E402


def gathered(trainer, copy) -> None:
    """``copy(key, tensor)`` for each full float32 tensor a checkpoint holds (weights, then the moments)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    from ziprl.learner.checkpoint import MOMENTS

    for name, p in trainer.engine.module.named_parameters():
        full = safe_get_full_fp32_param(p)
        copy(name, p if full is None else full)
        for key in MOMENTS:
            full = safe_get_full_optimizer_state(p, key)
            copy(f"{key}/{name}", trainer.optimizer.state[p][key] if full is None else full)


def timed(fn):
    """``fn()`` and its seconds, the GPU synchronised on both sides."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def measure(arch: str, tokenizer, workdir: Path) -> dict:
    import torch

    from ziprl.config import ZipRLConfig
    from ziprl.learner.checkpoint import _ensure_adam_state, snapshot
    from ziprl.learner.trainer import Trainer

    cfg = ZipRLConfig()
    cfg.learner.bf16, cfg.learner.zero_stage = True, 2
    trainer = Trainer(cfg.validate(), build_model(arch, tokenizer, workdir / arch))
    _ensure_adam_state(trainer, 1.0)
    for state in trainer.optimizer.state.values():
        state["exp_avg"].normal_()
        state["exp_avg_sq"].uniform_()
    pageable: dict[str, torch.Tensor] = {}
    _, pageable_s = timed(lambda: gathered(trainer, lambda k, t: pageable.__setitem__(
        k, t.detach().to("cpu", torch.float32, copy=True).contiguous())))
    _, gathers_s = timed(lambda: gathered(trainer, lambda k, t: None))
    snap, snapshot_s = timed(lambda: snapshot(trainer, workdir, {}))
    pinned = {**snap.files["model.safetensors"], **snap.files["optimizer.safetensors"]}
    equal = pinned.keys() == pageable.keys() and all(torch.equal(pinned[k], pageable[k]) for k in pageable)
    row = {"arch": arch, "checkpoint_gb": sum(t.numel() * 4 for t in pageable.values()) / 1e9, "gathers_s": gathers_s,
           "pageable_s": pageable_s, "snapshot_s": snapshot_s, "pinned": all(t.is_pinned() for t in pinned.values()),
           "bitwise_equal": equal}
    del snap, pinned
    pageable.clear()
    _, row["snapshot_again_s"] = timed(lambda: snapshot(trainer, workdir, {}))
    print(f"  {arch}: {row['checkpoint_gb']:.2f} GB, gathers {gathers_s:.2f} s, pageable copies {pageable_s:.2f} s, "
          f"snapshot {snapshot_s:.2f} s then {row['snapshot_again_s']:.2f} s, equal {equal}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", default="qwen3-0.6b,qwen3-1.7b", help=f"of {', '.join(ARCHS)}")
    ap.add_argument("--tokenizer", help="a directory holding SmolLM2's tokenizer; default: the embedded model's")
    ap.add_argument("--name", type=results_name, default="gpu_checkpoint")
    args = ap.parse_args(argv)
    if unknown_archs(args.archs, "gpu_checkpoint"):
        return 2
    refuse_tokenizer(ap, args.tokenizer)
    setup = gpu_setup("gpu_checkpoint", args.tokenizer)
    if setup is None:
        return 0
    import torch

    tokenizer, meta = setup
    meta["model"] = "random init at each architecture's shape, DeepSpeed bf16 ZeRO-2, random AdamW moments"
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_checkpoint-") as tmp:
        for arch in args.archs.split(","):
            rows.append(measure(arch, tokenizer, Path(tmp)))
            torch.cuda.empty_cache()  # the trainer is gone with measure's frame
            write_results(args.name, rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
