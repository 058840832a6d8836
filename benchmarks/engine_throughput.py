"""HFEngine generation throughput against bare ``model.generate`` on the same prompts.

Both sides get the same left-padded batch, max_new_tokens and sampling settings, and runs alternate
(engine, generate, engine, ...) so load from other processes hits both alike. Tokens counted are the
useful ones: each row's tokens up to and including its EOS. Greedy rows generate identical tokens on
both sides, so their ratio compares equal work; sampled rows compare tokens/s.

Tokens per CPU-second (with ``--threads 1``) is the steadier number on a shared machine.

Run: ``.venv/bin/python benchmarks/engine_throughput.py [--batch 8] [--new-tokens 64] [--repeats 5] [--threads 1]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import write_results

from ziprl.config import ModelConfig, SamplingConfig
from ziprl.policy import HFEngine, resolve_model_path

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--env-questions", type=int, default=2, help="questions for the env-share rollout (0 skips it)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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


if __name__ == "__main__":
    main()
