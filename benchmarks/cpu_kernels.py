"""Where the default launch's compute goes on this CPU, kernel by kernel: the learner's attention and the engine's
decode step.

    python benchmarks/cpu_kernels.py [--model DIR] [--threads 1,2] [--seq 1000] [--name cpu_kernels]

- ``attention``: one layer's causal attention, forward + backward, at the embedded model's shape (2 rows x 9 heads x
  ``--seq`` tokens x 64), through torch's SDPA flash kernel and its math backend, bf16 and float32.
- ``decode``: one HFEngine decode step (bf16, as the launch's engines generate beside a bf16 learner) of ``--model``
  (default: the embedded model) after an 800-token prompt, at batch 1, 2 and 4, with the model's linear layers on
  torch's ``linear`` and with their weights pre-packed for oneDNN as the engine runs them
  (:mod:`ziprl.policy.cpu.linear`, repacked at every weight refresh), and the largest change packing makes to the
  prompts' last logits.

Milliseconds are the mean of timed repeats after a warm-up, on ``--threads`` torch threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import at_least, listed, results_name, write_results  # noqa: E402


def timed_ms(fn, repeats: int, warmup: int = 2) -> float:
    """Mean milliseconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1e3


def attention_ms(dtype, backend, seq: int, repeats: int = 5) -> float:
    """One causal attention layer's forward + backward at the embedded model's shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    q, k, v = (torch.randn(2, 9, seq, 64, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, 9, seq, 64, dtype=dtype)

    def step():
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    return timed_ms(step, repeats)


def torch_linears(model) -> None:
    """Undo :func:`ziprl.policy.cpu.linear.pack_linears`: every linear layer back on torch's own ``linear``."""
    for module in model.modules():
        module.__dict__.pop("forward", None)


def decode_ms(model_path: str, batch: int, prompt_tokens: int = 800, repeats: int = 20) -> tuple[float, float, float]:
    """One decode step of a bf16 HFEngine after ``prompt_tokens``-token prompts, ``batch`` rows: milliseconds on
    torch's linear, then with the engine's pre-packed oneDNN linears, and the largest change packing made to the
    prompts' last logits."""
    import torch

    from ziprl.config import load_config
    from ziprl.policy import make_engine
    from ziprl.policy.cpu.linear import pack_linears
    from ziprl.policy.kv import cache_kwarg

    cfg = load_config(None, ["model.dtype=bfloat16", "model.device=cpu"])
    engine = make_engine(cfg.model, model_path)
    model = engine.model
    torch_linears(model)
    prompts = [[1 + (i * 7 + j) % 1000 for j in range(prompt_tokens)] for i in range(batch)]

    def step_ms() -> tuple[float, torch.Tensor]:
        logits, cache, mask, pos = engine._prefill(prompts, room=repeats + 8)
        state = {"mask": mask, "pos": pos, "tok": logits.argmax(-1)}

        def step():
            state["mask"] = torch.cat([state["mask"], state["mask"].new_ones((batch, 1))], dim=1)
            out = model(input_ids=state["tok"][:, None], attention_mask=state["mask"],
                        position_ids=state["pos"][:, None], use_cache=True, **{cache_kwarg(model): cache})
            state["pos"] = state["pos"] + 1
            state["tok"] = out.logits[:, -1, :].float().argmax(-1)

        return timed_ms(step, repeats, warmup=3), logits.float()

    with torch.inference_mode():
        plain, before = step_ms()
        pack_linears(model)
        packed, after = step_ms()
    return plain, packed, float((after - before).abs().max())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF model directory (default: the embedded model)")
    ap.add_argument("--threads", type=listed(at_least(1)), default="1,2",
                    help="comma-separated torch thread counts, each measured in turn")
    ap.add_argument("--seq", type=at_least(1), default=1000, help="tokens per row of the attention layer")
    ap.add_argument("--name", type=results_name, default="cpu_kernels",
                    help="results name: benchmarks/results/<name>.{json,md}")
    args = ap.parse_args(argv)
    if args.model is not None and not Path(args.model).is_dir():
        ap.error(f"--model {args.model}: not a directory; give an HF model directory or leave --model out")

    import torch
    from torch.nn.attention import SDPBackend

    from ziprl.config import load_config
    from ziprl.policy.models import resolve_model_path

    model = args.model or str(resolve_model_path(load_config(None, []).model))
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for dtype in (torch.bfloat16, torch.float32):
            for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
                ms = attention_ms(dtype, backend, args.seq)
                rows.append({"kernel": "attention fwd+bwd, 1 layer", "threads": threads,
                             "variant": f"{str(dtype).removeprefix('torch.')} {backend.name.lower()}",
                             "shape": f"2x9x{args.seq}x64", "ms": ms})
                print(rows[-1], flush=True)
        for batch in (1, 2, 4):
            plain, packed, diff = decode_ms(model, batch)
            for variant, ms in (("torch linear", plain), ("pre-packed oneDNN linears (the engine's)", packed)):
                rows.append({"kernel": "HFEngine bf16 decode step", "threads": threads, "variant": variant,
                             "shape": f"batch {batch}, 800-token prompt", "ms": ms,
                             "prefill_logits_max_abs_diff": diff if variant != "torch linear" else 0.0})
                print(rows[-1], flush=True)
    write_results(args.name, rows, {"seq": args.seq, "model": "embedded" if args.model is None else "given"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
