"""Operations one decode step dispatches: HFEngine's static-cache step against a transformers decode forward.

A GPU decode step at rollout batch sizes is many small kernels, each costing a launch and a pass over its tensors
whatever its size, so the count of operations a step dispatches bounds how close it can come to the memory-bound
ceiling (benchmarks/engine_throughput.py measures tokens/s on the GPU itself). This counts the ATen operations that
compute (views excluded) which one step of each dispatches on ``--device``, at each ``--arch`` shape (gpu_step.py's
shapes, random weights, a 1024-token vocabulary: the count does not depend on it), from models of one and of two
decoder layers: the difference is one layer's (``ops_per_layer``), and ``ops_per_step`` is the step at the
architecture's own depth. Operations are counted as torch dispatches them in inference mode (as the engine runs),
before any decomposition, so ``torch.rms_norm``, ``linear`` and ``scaled_dot_product_attention`` count one each (one
kernel or fused call each on CUDA). The count depends on neither the rows nor the span, which only size each
operation.

    python benchmarks/decode_ops.py [--arch smollm2-135m,qwen3-1.7b] [--rows 8] [--span 256] [--device cpu]
                                    [--name decode_ops]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import results_name, write_results  # noqa: E402
from gpu_step import ARCHS, arch_config, unknown_archs  # noqa: E402


class OpCount(TorchDispatchMode):
    """The ATen operations dispatched while active that compute, in order: a view is left out unless it had to copy
    (``to`` of another dtype, ``reshape`` of a strided tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view or not shares_memory(out, args[0]):
            self.ops.append(str(func))
        return out


def shares_memory(out, source) -> bool:
    """Whether ``out`` (a tensor, or the first of several) lives in ``source``'s storage (a view that copied nothing)."""
    out = out[0] if isinstance(out, (list, tuple)) and out else out
    return (isinstance(out, torch.Tensor) and isinstance(source, torch.Tensor)
            and out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr())


def model_of(arch: str, layers: int, device: str):
    """``arch``'s shape with ``layers`` decoder layers and a 1024-token vocabulary, random bfloat16 weights (a GPU
    rollout's dtype, whose casts a float32 model would skip)."""
    import transformers

    config = arch_config(arch, num_hidden_layers=layers, vocab_size=1024, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                              attn_implementation="sdpa")
    return model.eval()


@torch.inference_mode()
def step_ops(arch: str, layers: int, rows: int, span: int, device: str) -> dict[str, list[str]]:
    """The operations of one static step and one transformers decode forward over ``span`` cached positions."""
    from ziprl.policy.engines.hf.static_decode import StaticDecode
    from ziprl.policy.kv import cache_kwarg, output_cache

    model = model_of(arch, layers, device)
    ids = torch.randint(2, 1024, (rows, span), device=device)
    mask = torch.ones_like(ids)
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    static = StaticDecode(model, pad_id=0)
    static.capture = False  # one eager step, as the first run of each shape is
    static.load(output_cache(out), mask, torch.full((rows,), span, device=device), max_new_tokens=2)
    with OpCount() as counted_static:
        static._step(rows, static.buffers.bias.shape[1], "sample")
    with OpCount() as counted_plain:
        model(input_ids=ids[:, :1], attention_mask=torch.ones((rows, span + 1), dtype=torch.long, device=device),
              position_ids=torch.full((rows, 1), span, device=device), use_cache=True,
              **{cache_kwarg(model): output_cache(out)})
    return {"static": counted_static.ops, "plain": counted_plain.ops}


def measure(arch: str, rows: int, span: int, device: str) -> list[dict]:
    """Rows of ops per layer, fixed and per step for the static step and the transformers forward at ``arch``."""
    one, two = (step_ops(arch, n, rows, span, device) for n in (1, 2))
    depth = ARCHS[arch][1]["num_hidden_layers"]
    rows_out = []
    for loop in ("static", "plain"):
        layer_ops = collections.Counter(two[loop])
        layer_ops.subtract(one[loop])
        rows_out.append({"arch": arch, "loop": loop, "device": device, "rows": rows, "span": span, "layers": depth,
                         "ops_per_layer": len(two[loop]) - len(one[loop]),
                         "ops_per_step": at_depth(len(one[loop]), len(two[loop]), depth),
                         "layer_ops": ", ".join(f"{name.removeprefix('aten.')} x{n}"
                                                for name, n in layer_ops.most_common() if n)})
    return rows_out


def at_depth(one: int, two: int, depth: int) -> int:
    """A step's count at ``depth`` layers from its counts at one and two: the fixed part plus ``depth`` layers'."""
    return one - (two - one) + depth * (two - one)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="smollm2-135m,qwen3-1.7b", help=f"comma-separated shapes of {', '.join(ARCHS)}")
    ap.add_argument("--rows", type=int, default=8, help="rows decoded at once")
    ap.add_argument("--span", type=int, default=256, help="cached positions the step attends to")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the steps run")
    ap.add_argument("--name", type=results_name, default="decode_ops", help="results file name")
    args = ap.parse_args()
    if args.rows < 1 or args.span < 1:
        ap.error("--rows and --span must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU is visible to PyTorch here; use --device cpu")
    if unknown_archs(args.arch, "decode_ops"):
        return 2
    rows = [r for arch in args.arch.split(",") for r in measure(arch, args.rows, args.span, args.device)]
    write_results(args.name, rows, {"torch": torch.__version__})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
