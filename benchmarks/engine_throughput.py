"""HFEngine generation throughput against bare ``model.generate`` on the same prompts.

Both sides get the same left-padded batch, max_new_tokens and sampling settings, and runs alternate
(engine, generate, engine, ...) so load from other processes hits both alike. Tokens counted are the
useful ones: each row's tokens up to and including its EOS. Greedy rows generate identical tokens on
both sides, so their ratio compares equal work; sampled rows compare tokens/s.

Tokens per CPU-second (with ``--threads 1``) is the steadier number on a shared machine.

Run: ``.venv/bin/python benchmarks/engine_throughput.py [--batch 8] [--new-tokens 64] [--repeats 5] [--threads 1]``

``--arch smollm2-135m,qwen3-1.7b`` (benchmarks/gpu_step.py's shapes, random weights, SmolLM2's tokenizer) instead
times HFEngine's static-cache decode (``model.static_decode``: CUDA graphs on CUDA) against its plain loop, bf16 on
CUDA (float32 on a CPU), ``--rows`` rows of ``--prompt-tokens`` tokens (each up to a quarter shorter) sampled at
T = 0.8 for ``--new-tokens``, alternating; beside them the memory-bound ceiling: rows x the measured copy bandwidth /
the weight bytes a step reads (and with each row's KV cache read too), the static side's prefill seconds and its
tokens/s over the rest of the call (the decode the ceilings bound), and the share of greedy rows whose tokens the
two loops agree on. ``--arch tiny --device cpu`` is the smoke run. Results: benchmarks/results/<--name>.{json,md}.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import at_least, results_name, write_results
from gpu_step import ARCHS, build_model, refuse_length, refuse_tokenizer, unknown_archs

from ziprl.config import ModelConfig, SamplingConfig
from ziprl.policy import HFEngine, load_tokenizer, resolve_model_path

QUESTIONS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works, step by step.",
    "Describe the history of the Roman Empire in a few paragraphs.",
    "What are the main differences between Python and C++? Give examples.",
    "Write a poem about autumn leaves falling in a quiet forest.",
    "Explain the theory of relativity to a high school student.",
    "List ten tips for staying productive while working from home, with explanations.",
    "Describe how a search engine ranks web pages.",
]


def _useful_tokens(rows: torch.Tensor, eos_ids: frozenset[int]) -> int:
    """Tokens per row up to and including the first EOS (what the engine returns)."""
    total = 0
    for row in rows.tolist():
        ends = [i for i, t in enumerate(row) if t in eos_ids]
        total += ends[0] + 1 if ends else len(row)
    return total


def _generate_baseline(engine: HFEngine, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> int:
    """One bare ``model.generate`` call on the left-padded batch; returns useful generated tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[engine.pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    greedy = sampling.greedy or sampling.temperature == 0
    kwargs = {"do_sample": False} if greedy else {"do_sample": True, "temperature": sampling.temperature,
                                                   "top_p": sampling.top_p, "top_k": 0}
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = engine.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens,
                                    pad_token_id=engine.pad_id, eos_token_id=sorted(engine.eos_ids), **kwargs)
    return _useful_tokens(out[:, width:], engine.eos_ids)


def _timed(fn) -> tuple[int, float, float]:
    """(useful tokens, wall seconds, CPU seconds of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    n = fn()
    return n, time.perf_counter() - wall, time.process_time() - cpu


def measure_generation(engine: HFEngine, prompts: list[list[int]], sampling: SamplingConfig,
                       repeats: int, label: str) -> dict:
    """Median tokens/s (wall clock and per CPU-second) of HFEngine.generate and model.generate, alternating."""
    runs: dict[str, list[tuple[int, float, float]]] = {"engine": [], "generate": []}
    for r in range(repeats):
        runs["engine"].append(_timed(lambda r=r: sum(len(g.token_ids) for g in engine.generate(prompts, sampling, seed=r))))
        runs["generate"].append(_timed(lambda r=r: _generate_baseline(engine, prompts, sampling, seed=r)))
    wall = {k: statistics.median(n / w for n, w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(n / c for n, _, c in v) for k, v in runs.items()}
    return {"measurement": label, "batch": len(prompts), "max_new_tokens": sampling.max_new_tokens,
            "repeats": repeats, "engine_tok_s": wall["engine"], "generate_tok_s": wall["generate"],
            "ratio_wall": wall["engine"] / wall["generate"], "engine_tok_per_cpu_s": cpu["engine"],
            "generate_tok_per_cpu_s": cpu["generate"], "ratio_cpu": cpu["engine"] / cpu["generate"],
            "engine_tokens_per_run": statistics.median(n for n, _, _ in runs["engine"]),
            "generate_tokens_per_run": statistics.median(n for n, _, _ in runs["generate"])}


def measure_env_share(engine: HFEngine, questions: int, turns: int) -> dict:
    """Share of a rollout turn spent in env.step (parse, Q_com scoring, FAISS search, rendering) vs generation."""
    import time

    from ziprl.config import EnvConfig, RetrieverConfig
    from ziprl.env import SearchCompressEnv
    from ziprl.policy.rollout import rollout
    from ziprl.retrieval.datasets import load_dataset
    from ziprl.retrieval.retriever import Retriever

    spent = {"env": 0.0}

    class TimedEnv(SearchCompressEnv):
        def step(self, action):
            t0 = time.perf_counter()
            try:
                return super().step(action)
            finally:
                spent["env"] += time.perf_counter() - t0

    retriever = Retriever.from_config(RetrieverConfig())
    exs = load_dataset("sample")[:questions]
    retriever.search(["warm-up"], 5)
    gen0, t0 = engine.generation_seconds, time.perf_counter()
    trajs = rollout(engine, lambda: TimedEnv(EnvConfig(max_turns=turns), retriever=retriever, examples=exs), exs,
                    SamplingConfig(), group_size=2, seed=0)
    total = time.perf_counter() - t0
    n_turns = sum(len(t.turns) for t in trajs)
    return {"mode": "rollout turn split", "turns": n_turns, "turn_seconds": total / n_turns,
            "generation_share": (engine.generation_seconds - gen0) / total, "env_scoring_share": spent["env"] / total}


def copy_bandwidth(device: str, mib: int = 512) -> float:
    """Bytes/s of the best of five copies of ``mib`` MiB on ``device`` (each reads and writes them)."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):  # the first warms up
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best


def shape_prompts(vocab: int, rows: int, prompt_tokens: int, rng: random.Random) -> list[list[int]]:
    """``rows`` prompts of random ids (no special tokens), each up to a quarter shorter than ``prompt_tokens``."""
    lengths = [prompt_tokens - rng.randrange(prompt_tokens // 4 + 1) for _ in range(rows)]
    return [[rng.randrange(1000, vocab) for _ in range(n)] for n in lengths]


def tokens_per_second(engine: HFEngine, prompts: list[list[int]], sampling: SamplingConfig, seed: int
                      ) -> tuple[float, float, float]:
    """One ``generate``: tokens/s over its wall time, the seconds its prefill took, tokens/s over the rest (decode)."""
    before, prefill, start = engine.tokens_generated, engine.prefill_seconds, time.perf_counter()
    engine.generate(prompts, sampling, seed=seed)
    wall, tokens, prefill = time.perf_counter() - start, engine.tokens_generated - before, engine.prefill_seconds - prefill
    return tokens / wall, prefill, tokens / (wall - prefill)


def measure_shape(arch: str, rows: int, prompt_tokens: int, new_tokens: int, repeats: int, device: str,
                  workdir: Path, tokenizer_dir: str | None = None) -> dict:
    """Median tokens/s of the static and the plain decode loop at ``arch``'s shape (alternating, after a warm-up run
    each), the memory-bound ceilings and the greedy agreement (see the module docstring). SmolLM2's tokenizer from
    ``tokenizer_dir``, else the embedded model's."""
    tokenizer = load_tokenizer(tokenizer_dir or resolve_model_path(ModelConfig()))
    path = build_model(arch, tokenizer, workdir / arch, device)
    dtype = "bfloat16" if device == "cuda" else "float32"
    engines = {name: HFEngine(path, dtype=dtype, device=device, static_decode=name == "static")
               for name in ("static", "plain")}
    model = engines["static"].model
    prompts = shape_prompts(model.config.vocab_size, rows, prompt_tokens, random.Random(0))
    sampling = SamplingConfig(temperature=0.8, max_new_tokens=new_tokens, stop=[])
    rates: dict[str, list[tuple[float, float, float]]] = {name: [] for name in engines}
    for r in range(repeats + 1):
        for name, engine in engines.items():
            rate = tokens_per_second(engine, prompts, sampling, seed=r)
            if r:  # run 0 warms up (and captures the graphs)
                rates[name].append(rate)
    greedy = SamplingConfig(greedy=True, max_new_tokens=min(new_tokens, 16), stop=[])
    same = [a.token_ids == b.token_ids for a, b in zip(*(e.generate(prompts, greedy) for e in engines.values()),
                                                       strict=True)]
    attn = model.model.layers[0].self_attn
    kv_bytes = len(model.model.layers) * 2 * attn.k_proj.out_features * model.dtype.itemsize  # per cached token
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth(device, 512 if device == "cuda" else 64)
    context = statistics.mean(map(len, prompts)) + new_tokens / 2
    (static, prefill, decode), (plain, _, _) = ([statistics.median(col) for col in zip(*rates[name], strict=True)]
                                               for name in ("static", "plain"))
    row = {"arch": arch, "device": device, "dtype": dtype, "rows": rows, "prompt_tokens": prompt_tokens,
           "new_tokens": new_tokens, "static_tok_s": static, "plain_tok_s": plain, "speedup": static / plain,
           "static_prefill_s": prefill, "static_decode_tok_s": decode,
           "captures": engines["static"].static_decode.captures, "same_tokens": sum(same) / len(same),
           "weight_bytes": weight_bytes, "bandwidth_gb_s": bandwidth / 1e9,
           "ceiling_tok_s": rows * bandwidth / weight_bytes,
           "ceiling_with_kv_tok_s": rows * bandwidth / (weight_bytes + rows * context * kv_bytes)}
    print(f"{arch} x {rows} rows on {device}: static {static:,.0f} tok/s, plain {plain:,.0f} tok/s "
          f"({static / plain:.1f}x); memory-bound ceiling {row['ceiling_tok_s']:,.0f} tok/s ({weight_bytes / 1e9:.2f} "
          f"GB of weights a step at {bandwidth / 1e9:,.0f} GB/s, x {rows} rows), {row['ceiling_with_kv_tok_s']:,.0f} "
          f"with each row's KV cache read", flush=True)
    return row


def shapes_main(args: argparse.Namespace) -> int:
    """``--arch`` (checked by :func:`main`): :func:`measure_shape` per architecture, results written after each."""
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    meta = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "model": "random init at each architecture's shape, SmolLM2 tokenizer"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine_throughput-") as tmp:
        for arch in args.arch.split(","):
            rows.append(measure_shape(arch, args.rows, args.prompt_tokens, args.new_tokens, args.repeats, device,
                                      Path(tmp), args.tokenizer))
            write_results(args.name, rows, meta)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=at_least(1), default=8, help="prompts per generate call")
    ap.add_argument("--new-tokens", type=at_least(1), default=64, help="most tokens generated per row")
    ap.add_argument("--repeats", type=at_least(1), default=5, help="timed runs per side (with --arch: per loop)")
    ap.add_argument("--threads", type=at_least(0), default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--env-questions", type=at_least(0), default=2,
                    help="questions for the env-share rollout (0 skips it)")
    ap.add_argument("--arch", help=f"comma-separated shapes of {', '.join(ARCHS)}: static against plain decode")
    ap.add_argument("--rows", type=at_least(1), default=64, help="--arch: rows of one batch")
    ap.add_argument("--prompt-tokens", type=at_least(1), default=1024, help="--arch: prompt length")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="--arch: auto = CUDA if any")
    ap.add_argument("--name", type=results_name, default="engine_throughput_shapes", help="--arch: results file name")
    ap.add_argument("--tokenizer", help="--arch: a directory holding SmolLM2's tokenizer; default: the embedded model's")
    args = ap.parse_args(argv)
    if args.arch:
        if unknown_archs(args.arch, "engine_throughput"):
            return 2
        if args.device == "cuda" and not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA GPU is visible to PyTorch here; use --device cpu or auto")
        refuse_tokenizer(ap, args.tokenizer)
        refuse_length(ap, "--arch", args.arch, args.prompt_tokens, args.new_tokens)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.arch:
        return shapes_main(args)
    engine = HFEngine(resolve_model_path(ModelConfig()), device="cpu")
    questions = (QUESTIONS * (args.batch // len(QUESTIONS) + 1))[: args.batch]
    prompts = [engine.encode_chat([{"role": "user", "content": q}]) for q in questions]
    engine.generate(prompts[:1], SamplingConfig(greedy=True, max_new_tokens=4))  # warm-up
    rows = [
        measure_generation(engine, prompts, SamplingConfig(greedy=True, max_new_tokens=args.new_tokens, stop=[]),
                           args.repeats, "greedy"),
        measure_generation(engine, prompts, SamplingConfig(temperature=0.8, top_p=1.0, max_new_tokens=args.new_tokens,
                                                           stop=[]), args.repeats, "sample T=0.8"),
    ]
    if args.env_questions:
        rows.append(measure_env_share(engine, args.env_questions, turns=4))
    write_results("engine_throughput", rows, meta={"model": "SmolLM2-135M-Instruct (float32, CPU)",
                                                    "torch_threads": torch.get_num_threads()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
