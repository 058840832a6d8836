"""The learner's attention after a shared prefix, through torch's CPU kernels: what runs, and what else could.

    python benchmarks/prefix_attention.py [--threads 2] [--repeats 5] [--name prefix_attention]

A learner micro-batch (and an SFT step) runs its shared prefix (the system prompt) once; its rows' own tokens then
attend to all of the prefix and causally to themselves: queries L, keys P + L, the "lower-right" causal mask, which
transformers hands SDPA as a boolean mask. In the default launch attention is ~37% of an SFT step and of an RL step
(torch profiler; the matrix products, the rest, run at the machine's bf16 GEMM peak). Variants, forward + backward
(and forward alone, no grad), one layer at the embedded model's heads (9 x 64), bf16:

- ``sdpa mask``: what the learner runs (SDPA's CPU flash kernel with the mask);
- ``sdpa causal, padded query``: the query front-padded with P zero rows so the mask is the plain causal one (the
  kernel then skips key blocks past each query block, at its 512-key granularity), the padding's output dropped;
- ``prefix + causal, lse merge``: two flash calls (all of the prefix, unmasked; the rows' own keys, causal) merged
  by their log-sum-exp, the backward through the kernel's own backward with the merged output and log-sum-exp;
- ``query halves``: two SDPA calls, each half of the queries with only the keys it can see;
- ``math``: SDPA's math backend (bmm + softmax).

``max_abs_diff``: the largest difference of the output and of the q/k/v gradients from ``sdpa mask`` (bf16 rounding).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import at_least, results_name, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

SHAPES = {"SFT step (2 rows)": (2, 631, 305), "RL micro-batch (4 rows)": (4, 420, 330)}  # (rows, L, P) of the launch
_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class PrefixThenCausal(torch.autograd.Function):
    """Attention of queries at positions P .. P+L-1 over keys 0 .. P+L-1 as two flash calls merged by log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, p):
        o1, l1 = _fwd(q, k[:, :, :p], v[:, :, :p])
        o2, l2 = _fwd(q, k[:, :, p:], v[:, :, p:], is_causal=True)
        lse = torch.logaddexp(l1, l2)
        out = (o1.float() * (l1 - lse).exp()[..., None] + o2.float() * (l2 - lse).exp()[..., None]).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.p = p
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        p, grad = ctx.p, grad.contiguous()
        dq1, dk1, dv1 = _bwd(grad, q, k[:, :, :p], v[:, :, :p], out, lse, 0.0, False)
        dq2, dk2, dv2 = _bwd(grad, q, k[:, :, p:], v[:, :, p:], out, lse, 0.0, True)
        return dq1 + dq2, torch.cat([dk1, dk2], 2), torch.cat([dv1, dv2], 2), None


def variants(p: int, mask: torch.Tensor) -> dict:
    """name -> attention(q, k, v) for queries after a ``p``-token prefix (``mask``: the lower-right boolean mask)."""
    def padded(q, k, v):
        full = torch.cat([q.new_zeros(*q.shape[:2], p, q.shape[-1]), q], 2)
        return F.scaled_dot_product_attention(full, k, v, is_causal=True)[:, :, p:]

    def halves(q, k, v):
        n, outs = q.shape[2], []
        for a, b in ((0, n // 2), (n // 2, n)):
            outs.append(F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, :p + b], v[:, :, :p + b],
                                                       attn_mask=mask[..., a:b, :p + b]))
        return torch.cat(outs, 2)

    def math(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    return {"sdpa mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            "sdpa causal, padded query": padded,
            "prefix + causal, lse merge": lambda q, k, v: PrefixThenCausal.apply(q, k, v, p),
            "query halves": halves, "math": math}


def best_ms(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls after one warm-up, in milliseconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def measure(attend, q, k, v, grad, repeats: int) -> tuple[list[torch.Tensor], float, float]:
    """``attend``'s output and q/k/v gradients, and its forward + backward and forward-only milliseconds."""
    def step() -> list[torch.Tensor]:
        for t in (q, k, v):
            t.grad = None
        out = attend(q, k, v)
        out.backward(grad)
        return [out.detach(), q.grad, k.grad, v.grad]

    def forward() -> None:
        with torch.no_grad():
            attend(q, k, v)

    return step(), best_ms(step, repeats), best_ms(forward, repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=at_least(1), default=2, help="torch threads")
    ap.add_argument("--repeats", type=at_least(1), default=5,
                    help="timed calls per variant after one warm-up; the fastest is kept")
    ap.add_argument("--name", type=results_name, default="prefix_attention",
                    help="results name: benchmarks/results/<name>.{json,md}")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for label, (b, n, p) in SHAPES.items():
        q = torch.randn(b, 9, n, 64, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(b, 9, p + n, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        grad = torch.randn(b, 9, n, 64, dtype=torch.bfloat16)
        mask = torch.ones(n, p + n, dtype=torch.bool).tril(p).expand(b, 1, n, p + n)
        reference = None
        for name, attend in variants(p, mask).items():
            got, both_ms, fwd_ms = measure(attend, q, k, v, grad, args.repeats)
            reference = reference or got
            diff = max(float((a.float() - r.float()).abs().max()) for a, r in zip(got, reference, strict=True))
            rows.append({"shape": f"{label}: {b} x 9 heads x {n} queries, {p}-token prefix", "variant": name,
                         "fwd_bwd_ms": both_ms, "fwd_ms": fwd_ms, "max_abs_diff": diff})
            print(rows[-1], flush=True)
    write_results(args.name, rows, {"threads": args.threads, "repeats": args.repeats, "dtype": "bfloat16"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
