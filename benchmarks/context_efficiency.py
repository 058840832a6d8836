"""Prompt tokens per turn up to 256 turns: adaptive (ZipRL) vs react (full history).

A scripted policy that never answers makes the long run deterministic: it alternates searching and opening
over the shipped sample with extractive notes at a relevance-chosen level. A short run with the real
default model (sampled turns, same envs) is measured too. Goal: adaptive at turn 32 <= 0.25x react, and
flat to 256.

    python benchmarks/context_efficiency.py [--turns 256] [--real-turns 6] [--questions 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, at_least, write_results  # noqa: E402

from ziprl.config import EnvConfig, ModelConfig, RetrieverConfig, SamplingConfig  # noqa: E402
from ziprl.env import SearchCompressEnv  # noqa: E402
from ziprl.env.scripted import ScriptedTeacher, extractive_note, relevance_level  # noqa: E402
from ziprl.plots import plot_tokens_per_turn, tokens_per_turn  # noqa: E402
from ziprl.retrieval.datasets import load_dataset  # noqa: E402
from ziprl.retrieval.retriever import Retriever  # noqa: E402
from ziprl.scoring import level_spec  # noqa: E402


class LoopingTeacher(ScriptedTeacher):
    """Never answers: searches the question's words in rotation and opens the top hit of each search."""

    def respond(self, env: SearchCompressEnv) -> str:
        pending, ex = env.context.pending, env.example
        level = 1
        note = f"Looking for: {ex.question}"
        if pending is not None:
            level = relevance_level(ex.question, ex.answers, pending.text)
            spec = level_spec(level, env.config.scoring.level_scale)
            note = extractive_note(ex.question, ex.answers, pending.text, spec.char_low, spec.char_high)
        if env.config.strategy == "react":
            head = "<think>keep searching</think>"
        else:
            head = f'<compress level="{level}">{note}</compress>'
        if pending is not None and pending.tool == "search" and "[" in pending.text:
            doc = pending.text.split("]", 1)[0].lstrip("[")
            return head + f"<open>{doc}</open>"
        words = ex.question.split()
        q = " ".join(words[(env.turn * 3) % len(words):][:4]) or ex.question
        return head + f"<search>{q}</search>"


def scripted_run(strategy: str, turns: int, questions, retriever, tokenizer) -> list[tuple[int, float]]:
    """Mean prompt tokens at each turn index over ``questions`` (chat template, the model's tokenizer)."""
    env = SearchCompressEnv(EnvConfig(strategy=strategy, max_turns=turns), retriever=retriever, examples=questions)
    per_turn: dict[int, list[int]] = {}
    teacher = LoopingTeacher()
    for i in range(len(questions)):
        _, info = env.reset(options={"index": i})
        done = False
        while not done:
            text = tokenizer.apply_chat_template(info["messages"], add_generation_prompt=True, tokenize=False)
            per_turn.setdefault(env.turn + 1, []).append(len(tokenizer(text)["input_ids"]))
            _, _, term, trunc, info = env.step(teacher.respond(env))
            done = term or trunc
    return [(t, sum(v) / len(v)) for t, v in sorted(per_turn.items())]


def real_model_run(turns: int, questions, retriever) -> dict[str, list[tuple[int, float]]]:
    from ziprl.policy import make_engine
    from ziprl.policy.rollout import rollout

    engine = make_engine(ModelConfig())
    out = {}
    for strategy in ("adaptive", "react"):
        cfg = EnvConfig(strategy=strategy, max_turns=turns)
        trajs = rollout(engine, lambda c=cfg: SearchCompressEnv(c, retriever=retriever, examples=questions),
                        questions, SamplingConfig(), group_size=1, seed=0)
        xs, ys = tokens_per_turn(trajs)
        out[strategy] = list(zip(xs, ys, strict=True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=at_least(1), default=256, help="turns of the scripted run")
    ap.add_argument("--real-turns", type=at_least(0), default=4, help="turns of the real model's run (0: none)")
    ap.add_argument("--questions", type=at_least(1), default=2, help="the first N questions of the shipped sample")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # measured faster than 2 on a shared 2-core machine
    from ziprl.policy.models import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(ModelConfig()))
    retriever = Retriever.from_config(RetrieverConfig())
    questions = load_dataset("sample")[: args.questions]
    series = {s: scripted_run(s, args.turns, questions, retriever, tokenizer) for s in ("adaptive", "react")}
    at = lambda s, t: dict(series[s]).get(t, float("nan"))  # noqa: E731
    rows = [{"run": "scripted", "turn": t, "adaptive_tokens": at("adaptive", t), "react_tokens": at("react", t),
             "ratio": at("adaptive", t) / at("react", t)} for t in (1, 8, 16, 32, 64, 128, args.turns) if t <= args.turns]
    late = [y for t, y in series["adaptive"] if t >= 32]
    meta = {"goal": "adaptive/react at turn 32 <= 0.25 and adaptive flat to the last turn",
            "adaptive_max_over_min_from_turn_32": max(late) / min(late) if late else None}
    if args.real_turns:
        real = real_model_run(args.real_turns, questions, retriever)
        for t in range(1, args.real_turns + 1):
            a, r = dict(real["adaptive"]).get(t), dict(real["react"]).get(t)
            if a and r:
                rows.append({"run": "real model", "turn": t, "adaptive_tokens": a, "react_tokens": r, "ratio": a / r})
    write_results("context_efficiency", rows, meta)
    plot_tokens_per_turn({f"{s} (scripted)": ([x for x, _ in v], [y for _, y in v]) for s, v in series.items()},
                         RESULTS / "context_efficiency.png", "Prompt tokens per turn")
    print(meta)


if __name__ == "__main__":
    main()
