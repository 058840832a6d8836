"""GRPO steps on one CUDA GPU at real models' shapes: HFEngine rollouts in bf16, the DeepSpeed bf16 learner, the
weight push back into the engine. Random-initialised weights of each named architecture with SmolLM2's tokenizer
(nothing downloaded): the seconds, tokens and MFU are the real ones, the text is noise (every turn runs to its
token limit, the heaviest rollout).

    python benchmarks/gpu_step.py [--archs smollm2-135m,qwen3-0.6b,qwen3-1.7b] [--questions 8] [--group 8]
                                  [--turns 2] [--prompt-tokens 1024] [--new-tokens 256] [--prompt-spread 0.25]
                                  [--micro-batch 16]
                                  [--zero-stage 2] [--steps 2] [--tokenizer DIR] [--name gpu_step]
                                  [--set learner.FIELD=VALUE ...] [--profile] [--checkpoint]

``--set learner.micro_batch_tokens=16384`` fills each pass by tokens instead of ``--micro-batch`` turns (on an H200
the 1.7B step at 4 turns a pass was launch-bound: benchmarks/results/gpu_layout_h200.md).

Per architecture, the mean over the steps after the first (which warms up kernels and the allocator): rollout
tokens/s (one padded batch of questions x group rows per turn), the learner's forward, reference, backward and
optimizer seconds with its MFU (6 x parameters x tokens the forward ran / learner seconds against the bf16 GEMM
peak measured in the same run), and the push: ``push_s`` the in-process push (``InProcess``: the learner's
weights copied on the GPU in the engine's dtype), ``push_host_s`` the same weights through float32 host arrays
(``named_weights_numpy`` -> ``load_weights``, the in-process path before), both every step.
``--profile`` adds one more learner step, on the first question's group only (torch's profiler over a whole 64-row
step did not finish inside the 130 s a device call gave each run), under torch's profiler: where its GPU time went
(attention, GEMMs, collectives, copies, normalisation/elementwise/reductions, other; the GPU's busy fraction of the
learner's seconds) joins the row, the top kernels and host ops go to ``<name>_profile_<arch>.txt``.
``--checkpoint`` then times one checkpoint the way a GPU learner takes it in the background
(``run.background_checkpoints``): ``snapshot_s`` the copy off the GPU the step waits for, ``write_s`` the write and
fsync a thread does meanwhile, ``checkpoint_gb`` its size. This is the run's first snapshot, which pays for new pinned
host memory; later ones reuse it (benchmarks/gpu_checkpoint.py).
Results: benchmarks/results/<name>.{json,md}. Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, at_least, results_name, write_results  # noqa: E402

ARCHS = {  # name: (transformers config class, its published shape; tiny: a 2-layer smoke-test shape)
    "tiny": ("LlamaConfig", dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 max_position_embeddings=8192)),
    "smollm2-135m": ("LlamaConfig", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                         head_dim=64, rope_theta=100000.0, max_position_embeddings=8192)),
    "qwen3-0.6b": ("Qwen3Config", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                       head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960)),
    "qwen3-1.7b": ("Qwen3Config", dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                       head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960)),
}
KERNEL_KINDS = (  # (column, kernel-name pattern), first match wins; the rest is "other"
    ("attention", re.compile(r"flash|fmha|attention|attn", re.I)),  # before gemm: fmha_cutlass* are attention
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|_mma_", re.I)),
    ("collective", re.compile(r"nccl", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|cat_|catarray", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|reduce|softmax|norm|unrolled|index|scatter|gather", re.I)),
)
PARTS = ("forward_seconds", "reference_seconds", "backward_seconds", "optimizer_seconds", "seconds", "mfu",
         "passes", "gemm_peak_tflops", "computed_tokens", "trained_tokens")


def arch_config(arch: str, **overrides):
    """The transformers config of ``arch`` (tied embeddings), its fields replaced by ``overrides``."""
    import transformers

    cls_name, shape = ARCHS[arch]
    return getattr(transformers, cls_name)(**{**shape, "tie_word_embeddings": True, **overrides})


def build_model(arch: str, tokenizer, out: Path, device: str = "cuda") -> Path:
    """A random-initialised ``arch`` (tied embeddings, bf16 on disk; built on ``device``) with ``tokenizer``, saved to
    ``out``."""
    import torch
    import transformers

    config = arch_config(arch, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def rollout(engine, tokenizer, args, rng: random.Random, step: int) -> tuple[list, float, int]:
    """``questions`` groups of ``group`` trajectories of ``turns`` turns, each turn one padded batch of every row.

    Every prompt is the agent's system prompt (the default strategy's, shared by every row as in a real rollout)
    and a question over a context of up to ``prompt_tokens`` tokens, each row's ``prompt_spread`` shorter at random
    (real turns differ in length, so the learner pads them)."""
    from ziprl.config import EnvConfig, SamplingConfig
    from ziprl.env.group import Group
    from ziprl.env.trajectory import Trajectory, Turn
    from ziprl.learner.sft import chat_prompt_ids
    from ziprl.registry import STRATEGIES

    env = EnvConfig()
    system = STRATEGIES[env.strategy](env).system_prompt()
    base = args.prompt_tokens - 32 - len(tokenizer(system, add_special_tokens=False)["input_ids"])
    filler = " ".join(f"passage {i} says the river runs north of the old mill." for i in range(args.prompt_tokens))
    words = tokenizer(filler, add_special_tokens=False)["input_ids"][: max(base, 1)]
    rows = [(q, i) for q in range(args.questions) for i in range(args.group)]
    turns: dict[tuple[int, int], list] = {r: [] for r in rows}
    seconds, tokens = 0.0, 0
    for t in range(args.turns):
        prompts = []
        for q, _ in rows:
            context = tokenizer.decode(words[: len(words) - rng.randrange(int(len(words) * args.prompt_spread) + 1)])
            prompts.append(chat_prompt_ids(tokenizer, [{"role": "system", "content": system},
                                                       {"role": "user", "content": f"Question {q}, turn {t}: {context}"}]))
        t0 = time.perf_counter()
        gens = engine.generate(prompts, SamplingConfig(max_new_tokens=args.new_tokens, stop=[]),
                               seed=1000 * step + t)
        seconds += time.perf_counter() - t0
        for r, p, g in zip(rows, prompts, gens, strict=True):
            tokens += len(g.token_ids)
            turns[r].append(Turn(prompt_ids=p, response_ids=g.token_ids, logprobs=g.logprobs, response_text=g.text,
                                 q_com=rng.random() if t else None))
    groups = [Group(tuple(Trajectory(question_id=f"q{q}", question=f"Question {q}", answers=["north"],
                                     group_id=f"g{q}", sample_index=i, reward=float(rng.random() < 0.5),
                                     turns=turns[(q, i)]) for i in range(args.group)))
              for q in range(args.questions)]
    return groups, seconds, tokens


def kernel_split(averages, seconds: float) -> dict[str, float]:
    """A profile's GPU kernel seconds per KERNEL_KINDS column (and "other"), and the GPU's busy fraction of the
    ``seconds`` the profiled learner step took."""
    from torch.autograd import DeviceType

    split = dict.fromkeys([k for k, _ in KERNEL_KINDS] + ["other"], 0.0)
    for e in averages:
        if e.device_type == DeviceType.CUDA:
            split[next((k for k, pat in KERNEL_KINDS if pat.search(e.key)), "other")] += e.self_device_time_total / 1e6
    return {**{f"gpu_{k}_s": v for k, v in split.items()}, "gpu_busy_frac": sum(split.values()) / seconds}


def profiled_step(trainer, groups, out_txt: Path) -> dict:
    """``trainer.train_step`` under torch's profiler: its statistics plus :func:`kernel_split`; the top kernels and
    host ops written to ``out_txt``."""
    from torch.profiler import ProfilerActivity, profile

    from ziprl.paths import atomic_write_text

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = trainer.train_step(groups)
    averages = prof.key_averages()
    atomic_write_text(out_txt, "GPU kernels by time\n" + averages.table(sort_by="self_device_time_total", row_limit=40)
                      + "\nHost ops by self CPU time\n" + averages.table(sort_by="self_cpu_time_total", row_limit=30))
    return {**out, **kernel_split(averages, out["seconds"])}


def timed_checkpoint(trainer, out: Path) -> dict[str, float]:
    """One checkpoint of ``trainer`` under ``out``: the snapshot's and the write's seconds, and its size."""
    from ziprl.learner.checkpoint import snapshot, write_snapshot

    t0 = time.perf_counter()
    snap = snapshot(trainer, out, {})
    t1 = time.perf_counter()
    write_snapshot(snap)
    gb = sum(f.stat().st_size for f in snap.path.iterdir()) / 1e9
    return {"snapshot_s": t1 - t0, "write_s": time.perf_counter() - t1, "checkpoint_gb": gb}


def learner_config(args):
    """The config every architecture trains under: a bf16 learner at ``--zero-stage`` / ``--micro-batch``, then
    the ``--set`` overrides (ConfigError names a bad one)."""
    from ziprl.config import ZipRLConfig, apply_override

    cfg = ZipRLConfig()
    cfg.learner.bf16, cfg.learner.zero_stage, cfg.learner.micro_batch_turns = True, args.zero_stage, args.micro_batch
    for override in args.set:
        apply_override(cfg, override)
    return cfg.validate()


def measure(arch: str, tokenizer, args, workdir: Path) -> dict:
    """``args.steps`` rollout -> learner -> push steps on a fresh ``arch``; the mean of the steps after the first."""
    import torch

    from ziprl.learner.trainer import Trainer
    from ziprl.policy import HFEngine
    from ziprl.weights.in_process import InProcess

    path = build_model(arch, tokenizer, workdir / arch)
    trainer = Trainer(learner_config(args), path)
    engine = HFEngine(path, dtype="bfloat16", device="cuda")
    push = InProcess(trainer.named_weights, engine)
    rng, steps = random.Random(0), []
    for step in range(args.steps):
        groups, gen_s, gen_tokens = rollout(engine, tokenizer, args, rng, step)
        out = trainer.train_step(groups)
        t0 = time.perf_counter()
        engine.load_weights(trainer.named_weights_numpy(), trainer.policy_version)
        torch.cuda.synchronize()
        push_host_s = time.perf_counter() - t0
        push_s = push.push(trainer.policy_version)["seconds"]
        steps.append({"gen_s": gen_s, "gen_tokens_per_s": gen_tokens / gen_s, "push_s": push_s,
                      "push_host_s": push_host_s, **{k: out[k] for k in PARTS}})
        print(f"  {arch} step {step}: generation {gen_s:.1f} s ({gen_tokens / gen_s:.0f} tok/s), learner "
              f"{out['seconds']:.1f} s (MFU {out['mfu']:.3f}), push {push_s:.3f} s (through the host "
              f"{push_host_s:.2f} s)", flush=True)
    extra = timed_checkpoint(trainer, workdir / f"{arch}-checkpoint") if args.checkpoint else {}
    if args.profile:
        out = profiled_step(trainer, groups[:1], RESULTS / f"{args.name}_profile_{arch}.txt")
        extra.update({k: v for k, v in out.items() if k.startswith("gpu_")})
    kept = steps[1:] or steps
    row = {"arch": arch, "params_m": trainer.num_params / 1e6, "rows": args.questions * args.group,
           "turns": args.turns, "prompt_tokens": args.prompt_tokens, "prompt_spread": args.prompt_spread,
           "new_tokens": args.new_tokens,
           "zero_stage": args.zero_stage, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    row.update({k: statistics.mean(s[k] for s in kept) for k in kept[0]})
    row.update(extra)
    del trainer, engine
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return row


def refuse_tokenizer(ap: argparse.ArgumentParser, tokenizer: str | None) -> None:
    """``ap.error`` (exit 2) when ``--tokenizer`` is given and is not a directory."""
    if tokenizer and not Path(tokenizer).is_dir():
        ap.error(f"--tokenizer {tokenizer}: not a directory; give SmolLM2's tokenizer directory or leave --tokenizer out")


def refuse_length(ap: argparse.ArgumentParser, flag: str, archs: str, prompt: int, new: int) -> None:
    """``ap.error`` (exit 2) when ``prompt + new`` tokens exceed the positions of a shape in ``archs`` (``flag``)."""
    longest = min(ARCHS[a][1]["max_position_embeddings"] for a in archs.split(","))
    if prompt + new > longest:
        ap.error(f"--prompt-tokens {prompt} + --new-tokens {new}: longer than the {longest} positions of {flag} "
                 f"{archs}; give fewer tokens")


def unknown_archs(archs: str, prog: str) -> bool:
    """Whether the comma-separated ``archs`` name one not in ARCHS; if so ``prog``'s error names it and the choices."""
    unknown = [a for a in archs.split(",") if a not in ARCHS]
    if unknown:
        print(f"{prog}: unknown architecture {unknown}; choose from {', '.join(ARCHS)}", file=sys.stderr)
    return bool(unknown)


def gpu_setup(prog: str, tokenizer_dir: str | None) -> tuple[object, dict] | None:
    """SmolLM2's tokenizer (from ``tokenizer_dir``, else the embedded model's) and the run's device metadata; None,
    once ``prog`` has said so, without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA GPU visible to PyTorch: nothing to measure")
        return None
    from ziprl.config import ModelConfig
    from ziprl.policy.models import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(tokenizer_dir or resolve_model_path(ModelConfig()))
    return tokenizer, {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda}


def fraction(text: str) -> float:
    """An argparse ``type``: a number from 0 to 1."""
    value = at_least(0.0, float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be between 0 and 1")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", default="smollm2-135m,qwen3-0.6b,qwen3-1.7b",
                    help=f"comma-separated architectures, of {', '.join(ARCHS)}")
    ap.add_argument("--questions", type=at_least(1), default=8, help="questions (groups) per step")
    ap.add_argument("--group", type=at_least(1), default=8, help="trajectories per question")
    ap.add_argument("--turns", type=at_least(1), default=2, help="turns per trajectory")
    ap.add_argument("--prompt-tokens", type=at_least(1), default=1024, help="longest prompt of a turn, in tokens")
    ap.add_argument("--new-tokens", type=at_least(1), default=256, help="tokens generated per turn")
    ap.add_argument("--prompt-spread", type=fraction, default=0.25,
                    help="each row's context up to this fraction shorter, at random (0: every prompt alike)")
    ap.add_argument("--micro-batch", type=at_least(1), default=16, help="learner.micro_batch_turns")
    ap.add_argument("--zero-stage", type=int, default=2, choices=(1, 2, 3),
                    help="DeepSpeed ZeRO stage (its bf16 mode needs ZeRO >= 1)")
    ap.add_argument("--steps", type=at_least(1), default=2,
                    help="rollout -> learner -> push steps per architecture (the first warms up)")
    ap.add_argument("--tokenizer", help="a directory holding SmolLM2's tokenizer; default: the embedded model's")
    ap.add_argument("--name", type=results_name, default="gpu_step", help="results name: benchmarks/results/<name>.{json,md}")
    ap.add_argument("--set", action="append", default=[], metavar="learner.FIELD=VALUE",
                    help="config overrides on top of the bf16 learner the flags describe")
    ap.add_argument("--profile", action="store_true", help="one more learner step on one group, profiled (see above)")
    ap.add_argument("--checkpoint", action="store_true", help="time one checkpoint after the steps (see above)")
    args = ap.parse_args(argv)
    if unknown_archs(args.archs, "gpu_step"):
        return 2
    refuse_length(ap, "--archs", args.archs, args.prompt_tokens, args.new_tokens)
    refuse_tokenizer(ap, args.tokenizer)
    from ziprl.config import ConfigError

    try:
        learner_config(args)
    except ConfigError as exc:
        print(f"gpu_step: {exc}", file=sys.stderr)
        return 2
    setup = gpu_setup("gpu_step", args.tokenizer)
    if setup is None:
        return 0
    tokenizer, meta = setup
    meta.update({"steps": args.steps, "overrides": args.set,
                 "model": "random init at each architecture's shape, SmolLM2 tokenizer"})
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_step-") as tmp:
        for arch in args.archs.split(","):
            print(f"gpu_step: {arch}", flush=True)
            rows.append(measure(arch, tokenizer, args, Path(tmp)))
            write_results(args.name, rows, meta)  # after each architecture: a cut-short run keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
