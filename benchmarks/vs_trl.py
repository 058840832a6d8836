"""One single-turn GRPO step, ZipRL against TRL's ``GRPOTrainer``, on this CPU with the same default model.

Same work on both sides: 2 chat prompts x G = 4 sampled completions (temperature 1, top-p 1, at most 32 new
tokens), a keyword + length reward, GRPO advantages, beta = 0.001 KL to a frozen reference, AdamW at lr 1e-6,
one optimiser step. ZipRL runs its defaults but one: the update probe (``learner.probe_update``, a forward after
the update that logs how it moved the trained tokens' log-probs: diagnostic work TRL has no counterpart for) is off,
so both sides do the same work; ``--engines hf,hf+probe`` adds a side with it on. ZipRL trains with
``Trainer.train_step`` (DeepSpeed, ZeRO-0; bf16 compute where the CPU's bf16 products pay), generates with
``HFEngine`` in the learner's compute dtype (``model.dtype=auto``) and pushes the new weights into the engine; TRL does its own generation and update
(``GRPOConfig`` defaults otherwise, which include gradient checkpointing). Both sides compute at the same precision:
TRL gets ``bf16=True`` (CPU autocast) where ZipRL's learner chooses bf16 on this CPU (its measured choice,
:func:`ziprl.learner.hardware.bf16_pays`), float32 where it does not; ``--trl-precision float32`` keeps TRL in
float32 whatever ZipRL picks. Each row names its precision.

Each side runs in its own subprocess, so its peak RSS (``ru_maxrss``) is its own. A step's time is wall time
of the whole step (generation + update [+ weight push]); start-up (imports, model load, DeepSpeed init) is
excluded and each subprocess's first step is warm-up. The per-step figure is the median of the other steps
over ``--rounds`` rounds whose side order alternates, because on a shared machine the load drifts a lot (and
with it the cost of torch's multi-threaded kernels: pass ``--threads 1`` on a busy 2-core box).

``--engines hf,llamacpp`` adds a ZipRL side per generation engine (each in the learner's dtype; ``NAME+probe``: with
the update probe), run in the same rounds.

Run: ``.venv/bin/python benchmarks/vs_trl.py [--steps 3] [--rounds 2] [--threads N] [--engines hf,...]
[--trl-precision match|float32] [--out NAME]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import at_least, results_name, write_results

PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Name one famous landmark in Paris and say why it is famous."]
G, NEW_TOKENS, BETA, LR = 4, 32, 0.001, 1e-6


def reward(text: str) -> float:
    """Keyword + length: 1 if the text mentions Paris, plus up to 1 for length (200 characters)."""
    return float("paris" in text.lower()) + min(len(text), 200) / 200


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_ziprl(steps: int, engine_name: str = "hf", probe: bool = False) -> dict:
    from ziprl.config import ModelConfig, SamplingConfig, ZipRLConfig, resolve_engine_dtype
    from ziprl.env.group import Group
    from ziprl.env.trajectory import Trajectory, Turn
    from ziprl.learner.trainer import Trainer
    from ziprl.policy import make_engine, resolve_model_path
    from ziprl.weights.in_process import InProcess

    path = resolve_model_path(ModelConfig())
    cfg = ZipRLConfig()
    cfg.learner.lr, cfg.learner.beta, cfg.learner.micro_batch_turns = LR, BETA, len(PROMPTS) * G
    cfg.learner.probe_update = probe
    trainer = Trainer(cfg, path)
    dtype = resolve_engine_dtype(cfg.model, trainer.bf16).dtype
    engine = make_engine(ModelConfig(engine=engine_name, dtype=dtype, device="cpu"), path)
    push = InProcess(trainer.named_weights, engine)  # ziprl.train's push
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=NEW_TOKENS, stop=[])
    prompts = [engine.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    times, tokens, parts = [], [], {"generate_s": [], "train_s": [], "push_s": []}
    for step in range(steps):
        start = time.perf_counter()
        gens = engine.generate([p for p in prompts for _ in range(G)], sampling, seed=step)
        generated = time.perf_counter()
        trajectories = [
            Trajectory(question_id=f"p{k // G}", question=PROMPTS[k // G], answers=[], group_id=f"{step}-{k // G}",
                       sample_index=k % G, reward=reward(gen.text),
                       turns=[Turn(prompt_ids=gen.prompt_ids, response_ids=gen.token_ids, logprobs=gen.logprobs,
                                   response_text=gen.text)])
            for k, gen in enumerate(gens)
        ]
        trainer.train_step([Group(tuple(trajectories[p * G:(p + 1) * G])) for p in range(len(PROMPTS))])
        trained = time.perf_counter()
        push.push(trainer.policy_version)
        end = time.perf_counter()
        times.append(end - start)
        tokens.append(sum(len(g.token_ids) for g in gens))
        for part, seconds in zip(parts, (generated - start, trained - generated, end - trained), strict=True):
            parts[part].append(seconds)
    return {"step_seconds": times, "completion_tokens": tokens, **parts,
            "precision": f"learner {'bf16' if trainer.bf16 else 'float32'}, {engine_name} engine {dtype}"
                         + (", update probe on" if probe else "")}


def run_trl(steps: int, bf16: bool) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ziprl.config import ModelConfig
    from ziprl.policy import resolve_model_path

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.start)

    tokens: list[int] = []

    def trl_reward(completions, completion_ids, **kwargs) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        return [reward(c[0]["content"]) for c in completions]

    out = Path(os.environ.get("TMPDIR", "/tmp")) / "ziprl-vs-trl"
    args = GRPOConfig(output_dir=str(out), use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                      per_device_train_batch_size=len(PROMPTS) * G, num_generations=G,
                      max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, beta=BETA, learning_rate=LR,
                      max_steps=steps, gradient_accumulation_steps=1, bf16=bf16, seed=0)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])
    timer = StepTimer()
    trainer = GRPOTrainer(model=str(resolve_model_path(ModelConfig())), reward_funcs=trl_reward, args=args,
                          train_dataset=dataset, callbacks=[timer])
    trainer.train()
    return {"step_seconds": timer.times, "completion_tokens": tokens,
            "precision": "bf16 (CPU autocast)" if bf16 else "float32"}


def side_in_subprocess(side: str, steps: int, threads: int | None, trl_bf16: bool) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, __file__, "--side", side, "--steps", str(steps)] + (["--trl-bf16"] if trl_bf16 else [])
    proc = subprocess.run(cmd + (["--threads", str(threads)] if threads else []), env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} side failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def engine_sides(text: str) -> list[str]:
    """An argparse ``type``: comma-separated ZipRL sides, each a registered engine name optionally with ``+probe``."""
    from ziprl.registry import ENGINES

    sides = list(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
    bad = [e for e in sides if e.partition("+")[0] not in ENGINES.names() or e.partition("+")[2] not in ("", "probe")]
    if bad or not sides:
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: each side is an engine name ({', '.join(ENGINES.names())}), "
                                         "optionally with +probe, e.g. hf,hf+probe")
    return sides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3,
                        help="steps per side and round (at least 3: the first is warm-up)")
    parser.add_argument("--rounds", type=at_least(1), default=2,
                        help="rounds of one subprocess per side, order alternating")
    parser.add_argument("--threads", type=at_least(0), default=None,
                        help="torch threads on both sides (0 or unset: torch's default)")
    parser.add_argument("--engines", type=engine_sides, default="hf",
                        help="ZipRL sides, one per generation engine (e.g. hf,llamacpp; NAME+probe: the update probe "
                             "on); the first is the headline ratio")
    parser.add_argument("--out", type=results_name, default="vs_trl", help="results name: benchmarks/results/<out>.{json,md}")
    parser.add_argument("--trl-precision", choices=("match", "float32"), default="match",
                        help="TRL's precision: match (bf16 where ZipRL's learner chooses it here) or float32")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # trl | ziprl:<engine>[+probe] (one subprocess's side)
    parser.add_argument("--trl-bf16", action="store_true", help=argparse.SUPPRESS)  # the trl side in bf16
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be >= 3: one warm-up step and at least two measured ones")
    if args.side:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        load = os.getloadavg()[0]
        engine, _, probe = args.side.partition(":")[2].partition("+")
        result = (run_trl(args.steps, args.trl_bf16) if args.side == "trl"
                  else run_ziprl(args.steps, engine, probe == "probe"))
        print(json.dumps({**result, "peak_rss_mb": peak_rss_mb(), "threads": torch.get_num_threads(),
                          "load_1m": [load, os.getloadavg()[0]]}))
        return 0

    from ziprl.learner.hardware import bf16_pays

    trl_bf16 = args.trl_precision == "match" and bf16_pays("cpu")  # ZipRL's learner's own choice on this CPU
    runs: dict[str, list[dict]] = {**{f"ziprl:{e}": [] for e in args.engines}, "trl": []}
    for r in range(args.rounds):  # alternate the order so drifting machine load hits all sides alike
        for side in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            runs[side].append(side_in_subprocess(side, args.steps, args.threads, trl_bf16))
            print(f"round {r} {side}: {json.dumps(runs[side][-1])}", flush=True)
    rows = []
    for side, results in runs.items():
        measured = [t for res in results for t in res["step_seconds"][1:]]
        tokens = [n for res in results for n in res["completion_tokens"]]
        row = {"framework": side, "precision": results[0]["precision"], "threads": results[0]["threads"],
               "warmup_step_s": statistics.median(res["step_seconds"][0] for res in results),
               "step_s": statistics.median(measured), "step_s_min": min(measured), "step_s_max": max(measured),
               "measured_steps": len(measured), "completion_tokens_per_step": statistics.mean(tokens),
               "peak_rss_mb": max(res["peak_rss_mb"] for res in results)}
        for part in ("generate_s", "train_s", "push_s"):
            if part in results[0]:
                row[part] = statistics.median(t for res in results for t in res[part][1:])
        rows.append(row)
    ratio = rows[0]["step_s"] / rows[-1]["step_s"]
    for row in rows:
        row["time_vs_trl"] = row["step_s"] / rows[-1]["step_s"]
    loads = [x for results in runs.values() for res in results for x in res["load_1m"]]
    meta = {"prompts": len(PROMPTS), "group_size": G, "max_new_tokens": NEW_TOKENS, "beta": BETA, "lr": LR,
            "steps_per_side_and_round": args.steps, "rounds": args.rounds, "statistic": "median of measured steps",
            "load_1m_range": [min(loads), max(loads)], "ziprl_time_vs_trl": ratio,
            "trl_precision": args.trl_precision, "goal": "ziprl_time_vs_trl <= 0.5 at equal precision"}
    write_results(args.out, rows, meta)
    for row in rows[:-1]:
        print(f"ZipRL ({row['framework']}) step time = {row['time_vs_trl']:.3f} x TRL's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
