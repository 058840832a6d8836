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

``--time`` also times the static step at each shape's own depth and vocabulary, ``--rows`` rows attending to
``--span`` positions (rounded up to the engine's position chunk): HFEngine's decode loop over ``TIMED_STEPS`` tokens
after a prefill that leaves them room, its graphs captured by a first run (on CUDA), then eagerly; beside it the
memory-bound floor (the weights and the attended KV cache read once, at the measured copy bandwidth) and, from the
profiler over eager steps, the time the device computes per step and where (the kernels on CUDA, the operations on a
CPU). So a GPU run says how far a step is from its floor and which kernels make the gap.

    python benchmarks/decode_ops.py [--arch smollm2-135m,qwen3-1.7b] [--rows 8] [--span 256] [--device cpu]
                                    [--time] [--name decode_ops]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import results_name, write_results  # noqa: E402
from gpu_step import ARCHS, arch_config, unknown_archs  # noqa: E402

TIMED_STEPS = 48  # decode steps a timing covers: three of the engine's host reads (SYNC_EVERY = 16)
PROFILED_STEPS = 4  # eager steps the profiler sees
TOP_KERNELS = 8  # kernels (operations on a CPU) listed per shape


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


def model_of(arch: str, device: str, **overrides):
    """``arch``'s shape (its fields replaced by ``overrides``), random bfloat16 weights (a GPU rollout's dtype, whose
    casts a float32 model would skip)."""
    import transformers

    config = arch_config(arch, pad_token_id=0, eos_token_id=1, **overrides)
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

    model = model_of(arch, device, num_hidden_layers=layers, vocab_size=1024)
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


@torch.inference_mode()
def time_step(arch: str, rows: int, span: int, device: str) -> dict:
    """Milliseconds of one static decode step at ``arch``'s full shape, captured (CUDA) and eager, against the
    memory-bound floor, and the device's busy time per step by kernel (see the module docstring)."""
    from engine_throughput import copy_bandwidth

    from ziprl.config import SamplingConfig
    from ziprl.policy.decoding import DecodeRows
    from ziprl.policy.engines.hf.static_decode import POSITION_CHUNK, StaticDecode, round_up
    from ziprl.policy.kv import output_cache

    span = round_up(max(span, TIMED_STEPS + 1), POSITION_CHUNK)
    model = model_of(arch, device)
    width = span - TIMED_STEPS  # every timed step attends to the same ``span`` positions: one graph
    ids = torch.randint(2, model.config.vocab_size, (rows, width), device=device)
    mask = torch.ones_like(ids)
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    cache, logits = output_cache(out), out.logits[:, -1].float()
    static = StaticDecode(model, pad_id=0)
    gen = torch.Generator(device=device).manual_seed(0)

    def loaded(steps: int):
        """The engine's decode loop over ``steps`` tokens from the freshly loaded prefill (no row ends: no EOS)."""
        sampling = SamplingConfig(temperature=0.8, max_new_tokens=steps, stop=[])
        static.load(cache, mask, torch.full((rows,), width, device=device), steps)
        sync(device)
        return lambda: static.decode(DecodeRows(None, frozenset(), [[0]] * rows, sampling), logits, sampling, False,
                                     gen)

    def seconds_a_step() -> float:
        run = loaded(TIMED_STEPS)
        start = time.perf_counter()
        run()
        sync(device)
        return (time.perf_counter() - start) / (TIMED_STEPS - 1)  # the first token is drawn from the prefill's logits

    seconds_a_step()  # captures the graph on CUDA
    step_s = seconds_a_step()
    static.capture = False
    eager_s = seconds_a_step()
    busy_s, kernels = profile_steps(loaded(PROFILED_STEPS + 1), device)
    attn = model.model.layers[0].self_attn
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = rows * span * len(model.model.layers) * 2 * attn.k_proj.out_features * model.dtype.itemsize
    floor_s = (weight_bytes + kv_bytes) / copy_bandwidth(device, 512 if device == "cuda" else 64)
    row = {"arch": arch, "loop": "static", "device": device, "rows": rows, "span": span,
           "layers": len(model.model.layers), "captures": static.captures, "step_ms": 1e3 * step_s,
           "eager_step_ms": 1e3 * eager_s, "busy_ms": 1e3 * busy_s / PROFILED_STEPS, "floor_ms": 1e3 * floor_s,
           "step_over_floor": step_s / floor_s, "tok_s": rows / step_s, "weight_gb": weight_bytes / 1e9,
           "kv_gb": kv_bytes / 1e9,
           "top_kernels": ", ".join(f"{name} {1e6 * t / PROFILED_STEPS:.0f}us" for name, t in kernels[:TOP_KERNELS])}
    print(f"{arch} x {rows} rows, {span} positions on {device}: {row['step_ms']:.2f} ms a step "
          f"({'captured' if static.captures else 'eager'}; eager {row['eager_step_ms']:.2f}), device busy {row['busy_ms']:.2f}, "
          f"floor {row['floor_ms']:.2f} ms", flush=True)
    return row


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_steps(run, device: str) -> tuple[float, list[tuple[str, float]]]:
    """Seconds the device computed during ``run()`` (the kernels' own time on CUDA, the operations' own CPU time on a
    CPU), and each kernel's (operation's) share in seconds, largest first, names cut to 60 characters."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        run()
    totals: collections.Counter = collections.Counter()
    for event in prof.key_averages():
        if cuda and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        totals[event.key[:60]] += (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
    return sum(totals.values()), totals.most_common()


def at_depth(one: int, two: int, depth: int) -> int:
    """A step's count at ``depth`` layers from its counts at one and two: the fixed part plus ``depth`` layers'."""
    return one - (two - one) + depth * (two - one)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="smollm2-135m,qwen3-1.7b", help=f"comma-separated shapes of {', '.join(ARCHS)}")
    ap.add_argument("--rows", type=int, default=8, help="rows decoded at once")
    ap.add_argument("--span", type=int, default=256, help="cached positions the step attends to")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the steps run")
    ap.add_argument("--time", action="store_true",
                    help="also time the static step at each shape's full size against its memory-bound floor")
    ap.add_argument("--name", type=results_name, default="decode_ops", help="results file name")
    args = ap.parse_args()
    if args.rows < 1 or args.span < 1:
        ap.error("--rows and --span must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU is visible to PyTorch here; use --device cpu")
    if unknown_archs(args.arch, "decode_ops"):
        return 2
    rows = []
    for arch in args.arch.split(","):  # written after each, so a run cut short keeps the shapes it finished
        rows += measure(arch, args.rows, args.span, args.device)
        if args.time:
            rows.append(time_step(arch, args.rows, args.span, args.device))
        write_results(args.name, rows, {"torch": torch.__version__})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
