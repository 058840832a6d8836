"""CPU generation engines for rollouts: tokens/s per batch size and weight-refresh cost against HFEngine.

Each candidate turns a named-weights dict of float32 numpy arrays (what ``Trainer.named_weights_numpy()``
gives the rollout side every RL step) into a ready engine ("refresh", timed: e.g. CTranslate2 = convert +
load), then generates from the chat prompts of ``engine_throughput.py`` (64 new tokens, greedy and sampled
at temperature 1.0, top-k/top-p off) and returns, per row, the tokens up to and including EOS and the
behaviour log-prob of each. Runs alternate between candidates so load from other processes hits all alike.

Reported per candidate and batch: median tokens/s (useful tokens, as ``engine_throughput.py`` counts them) and
tokens per CPU second of this process (all its threads; on a busy shared machine the steadier of the two),
the first call's seconds (includes torch.compile where used), refresh seconds, and at batch 8 the RL-step rate
``512 / (512 / tok_s + refresh_s)`` (one refresh per step of 8 x 64 tokens) and its ratio to HFEngine's.
Agreement with HFEngine (float32): greedy rows whose first 32 tokens match, and the mean / max absolute
difference between the candidate's behaviour log-probs of its sampled tokens and float32 HF's log-probs of
the same tokens (what the PPO ratio sees at the first step).

Prompts (``--prompts``): ``chat`` = the short chat questions of ``engine_throughput.py`` (~30 tokens); ``rollout`` =
the shape of a search agent's later turns: the adaptive strategy's system prompt, a question from the shipped sample,
a search call and 1-4 passages of the shipped corpus as the observation (~400-750 tokens, unequal lengths, the
system prompt shared), which is what an RL step's generation actually runs.

Candidates: hf (HFEngine float32: its decode steps one C++ call each where the CPU has AVX2 + FMA and no AVX-512 BF16,
``model.fused_decode``, else the model's forward; the ``decode`` column says which), hf-unfused (float32 through the
model's forward), hf-f32-fused-avx2 (float32, the AVX2 + FMA fused step on any CPU that runs it, as on one without
AVX-512 BF16), hf-bf16 (HFEngine in bfloat16, its decode steps one C++ call each where the CPU has AVX-512 BF16),
hf-bf16-unfused (the same through the model's forward), static-bf16 (transformers
``generate`` with ``cache_implementation="static"`` in bfloat16), static-bf16-compile (the same, forward
compiled by torch.compile), ct2-int8 / ct2-int8_float32 / ct2-float32 / ct2-bfloat16 (CTranslate2 Generator;
a ``-rows`` suffix decodes one prompt at a time: a CTranslate2 batch forwards its prompts at once only up to the
shortest one's length and decodes the other prompts' remaining tokens one step at a time).
llamacpp / llamacpp-bf16 / llamacpp-f16: ZipRL's ``llamacpp`` engine (llama.cpp through llama-cpp-python's C API,
batched sequences, weights written in place into its mapped GGUF file), weight matrices in float32 / bf16 / f16.
Use ``--threads 1`` on a shared machine: two torch threads on busy cores ran several times slower. To measure torch's
float32 as a CPU without AVX-512 runs it, set ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2`` (torch's kernels, oneDNN, MKL's GEMM; recorded in the results' meta).

Run: ``.venv/bin/python benchmarks/cpu_engines.py [--batches 1,8,32] [--new-tokens 64] [--repeats 3]
[--candidates hf,ct2-int8,...] [--modes greedy,sample] [--threads N] [--prompts chat|rollout] [--out NAME]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from _common import at_least, listed, one_of, results_name, write_results
from engine_throughput import QUESTIONS

from ziprl.config import ModelConfig, SamplingConfig
from ziprl.policy import HFEngine, resolve_model_path
from ziprl.policy.cpu.fused_decode import F32_AVX2, FusedDecode, cpu_runs, extension
from ziprl.policy.models import load_model

Rows = list[tuple[list[int], list[float]]]  # per prompt: (tokens up to and including EOS, log-prob of each)
MATCH_TOKENS = 32
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")  # env caps on torch's kernels
LLAMACPP_DTYPES = {"llamacpp": "float32", "llamacpp-bf16": "bfloat16", "llamacpp-f16": "float16"}
CT2_TYPES = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
MODES = ("greedy", "sample")


def _cut_at_eos(tokens: list[int], eos_ids: frozenset[int]) -> int:
    """Length of ``tokens`` up to and including the first EOS."""
    return next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))


class Candidate:
    """An engine under test: ``refresh`` installs float32 named arrays, ``generate`` returns Rows."""

    name = ""
    decode: str | None = None  # how its decode steps run, where that depends on the CPU

    def refresh(self, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], greedy: bool, new_tokens: int, seed: int) -> Rows:
        raise NotImplementedError


# name -> (dtype, the engine's own fused_decode); hf-f32-fused-avx2 gets the AVX2 kernel installed whatever the CPU
HF_CANDIDATES = {"hf": ("float32", True), "hf-unfused": ("float32", False), "hf-f32-fused-avx2": ("float32", False),
                 "hf-bf16": ("bfloat16", True), "hf-bf16-unfused": ("bfloat16", False)}


class HFCandidate(Candidate):
    """Today's HFEngine (its own prefill + KV-cache decode loop), as :data:`HF_CANDIDATES` names it."""

    def __init__(self, path: Path, name: str) -> None:
        dtype, fused = HF_CANDIDATES[name]
        self.name = name
        self.engine = HFEngine(path, dtype=dtype, device="cpu", fused_decode=fused)
        if name == "hf-f32-fused-avx2":  # the kernel a CPU without AVX-512 BF16 picks, on this one too
            self.engine.fused_decode = FusedDecode(self.engine.model, F32_AVX2, extension(F32_AVX2))
            self.engine.fused_decode_off = None
        fused_step = self.engine.fused_decode
        self.decode = fused_step.kernel.name if fused_step else f"model forward ({self.engine.fused_decode_off})"
        self.version = 0

    def refresh(self, arrays: dict[str, np.ndarray]) -> None:
        self.version += 1
        self.engine.load_weights(arrays, self.version)

    def generate(self, prompts: list[list[int]], greedy: bool, new_tokens: int, seed: int) -> Rows:
        sampling = SamplingConfig(greedy=greedy, temperature=1.0, top_p=1.0, max_new_tokens=new_tokens, stop=[])
        return [(g.token_ids, g.logprobs) for g in self.engine.generate(prompts, sampling, seed=seed)]


class LlamaCppCandidate(HFCandidate):
    """ZipRL's ``llamacpp`` engine (:class:`ziprl.policy.engines.llamacpp.engine.LlamaCppEngine`) with weight
    matrices in ``dtype``; refresh writes the arrays into its mapped GGUF file (no reload)."""

    def __init__(self, path: Path, dtype: str, threads: int) -> None:
        from ziprl.policy.engines.llamacpp.engine import LlamaCppEngine

        self.name = {"float32": "llamacpp", "bfloat16": "llamacpp-bf16", "float16": "llamacpp-f16"}[dtype]
        self.engine = LlamaCppEngine(path, dtype=dtype, threads=threads)
        self.version = 0


class StaticCacheCandidate(Candidate):
    """transformers ``generate`` with a static KV cache in bfloat16, optionally torch.compile'd (mode "default").

    Log-probs come from ``output_logits`` (raw logits, before temperature). Refresh copies into the existing
    parameters in place, so a compiled graph stays valid.
    """

    def __init__(self, path: Path, eos_ids: frozenset[int], pad_id: int, compile_: bool) -> None:
        from transformers import CompileConfig

        self.name = "static-bf16-compile" if compile_ else "static-bf16"
        self.model = load_model(path, dtype="bfloat16", device="cpu").eval()
        self.eos_ids, self.pad_id = eos_ids, pad_id
        self.kwargs: dict[str, Any] = {"cache_implementation": "static", "disable_compile": not compile_}
        if compile_:
            config = CompileConfig(mode="default")
            config._compile_all_devices = True  # transformers compiles on CUDA only unless this flag is set
            self.kwargs["compile_config"] = config

    def refresh(self, arrays: dict[str, np.ndarray]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in arrays.items():
                params[name].copy_(torch.from_numpy(value))

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], greedy: bool, new_tokens: int, seed: int) -> Rows:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        sample = {} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        torch.manual_seed(seed)
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=not greedy,
                                  pad_token_id=self.pad_id, eos_token_id=sorted(self.eos_ids),
                                  return_dict_in_generate=True, output_logits=True, **sample, **self.kwargs)
        new = out.sequences[:, width:]
        lp = torch.stack([torch.log_softmax(x.float(), -1) for x in out.logits], 1)  # (B, T, V)
        token_lp = lp.gather(2, new[:, : lp.shape[1], None]).squeeze(2)
        rows = []
        for toks, lps in zip(new.tolist(), token_lp.tolist(), strict=True):
            n = _cut_at_eos(toks, self.eos_ids)
            rows.append((toks[:n], lps[:n]))
        return rows


class CT2Candidate(Candidate):
    """CTranslate2 Generator; refresh = build the model spec from the arrays (its transformers converter with
    the HF model assembled from the arrays, no checkpoint read), save it as float32 to a temp dir (RAM-backed
    /dev/shm), load it with ``compute_type`` (CTranslate2 quantizes while loading, faster than the converter).

    The converter's Llama loader calls ``gc.collect()`` after every layer (0.4 s each on this process's
    heap, 13 s per refresh); that call is switched off during conversion.
    """

    def __init__(self, path: Path, tokenizer: Any, eos_ids: frozenset[int], compute_type: str, threads: int,
                 rows: bool = False) -> None:
        self.name = f"ct2-{compute_type}" + ("-rows" if rows else "")
        self.path, self.tokenizer, self.eos_ids = path, tokenizer, eos_ids
        self.compute_type, self.threads = compute_type, threads
        self.max_batch_size = 1 if rows else 0
        self.generator: Any = None

    def refresh(self, arrays: dict[str, np.ndarray]) -> None:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter

        tokenizer = self.tokenizer

        class ArraysConverter(TransformersConverter):
            def load_model(self, model_class, model_name_or_path, **kwargs):  # noqa: ANN001, ANN202
                with torch.device("meta"):
                    model = model_class(kwargs["config"])
                model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()}, strict=False, assign=True)
                model.tie_weights()
                return model

            def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):  # noqa: ANN001, ANN202
                return tokenizer

        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        no_gc = mock.patch("ctranslate2.converters.transformers.gc", SimpleNamespace(collect=lambda: 0))
        with tempfile.TemporaryDirectory(dir=shm) as tmp, no_gc:
            out = ArraysConverter(str(self.path)).convert(os.path.join(tmp, "ct2"), quantization=None)
            self.generator = ctranslate2.Generator(out, device="cpu", compute_type=self.compute_type,
                                                   intra_threads=self.threads)

    def generate(self, prompts: list[list[int]], greedy: bool, new_tokens: int, seed: int) -> Rows:
        import ctranslate2

        ctranslate2.set_random_seed(seed)
        steps: list[list[tuple[int, float]]] = [[] for _ in prompts]

        def collect(step: Any) -> bool:
            steps[step.batch_id].append((step.token_id, step.log_prob))
            return False

        results = self.generator.generate_batch(
            [self.tokenizer.convert_ids_to_tokens(p) for p in prompts], max_length=new_tokens,
            sampling_topk=1 if greedy else 0, sampling_temperature=1.0, end_token=sorted(self.eos_ids),
            return_end_token=True, include_prompt_in_result=False, return_scores=True, callback=collect,
            max_batch_size=self.max_batch_size)
        rows = []
        for res, got in zip(results, steps, strict=True):
            toks = [t for t, _ in got]
            if toks != res.sequences_ids[0]:
                raise RuntimeError(f"{self.name}: callback tokens {toks[:8]} differ from result {res.sequences_ids[0][:8]}")
            rows.append((toks, [float(lp) for _, lp in got]))
        return rows


def ct2_compute_type(name: str) -> str:
    """The CTranslate2 compute type a ``ct2-<type>[-rows]`` candidate name asks for."""
    return name.removeprefix("ct2-").removesuffix("-rows")


def build(name: str, path: Path, ref: HFEngine, threads: int) -> Candidate:
    """The candidate called ``name``."""
    if name in HF_CANDIDATES:
        return HFCandidate(path, name)
    if name in ("static-bf16", "static-bf16-compile"):
        return StaticCacheCandidate(path, ref.eos_ids, ref.pad_id, compile_=name.endswith("compile"))
    if name.startswith("llamacpp"):
        return LlamaCppCandidate(path, LLAMACPP_DTYPES[name], threads)
    if name.startswith("ct2-"):
        return CT2Candidate(path, ref.tokenizer, ref.eos_ids, ct2_compute_type(name), threads,
                            rows=name.endswith("-rows"))
    raise ValueError(name)


def candidate_names() -> tuple[str, ...]:
    """Every name :func:`build` knows (ct2-<type> for each of CT2_TYPES, with and without -rows)."""
    ct2 = tuple(f"ct2-{t}{rows}" for t in CT2_TYPES for rows in ("", "-rows"))
    return (*HF_CANDIDATES, "static-bf16", "static-bf16-compile", *ct2, *LLAMACPP_DTYPES)


def skip_reason(name: str) -> str | None:
    """Why ``name`` cannot run here (package missing, compute type unsupported), or None."""
    if name == "hf-f32-fused-avx2" and not cpu_runs(F32_AVX2):
        return "this CPU has no AVX2 + FMA"
    if name.startswith("llamacpp"):
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            return "llama-cpp-python is not installed (bash scripts/setup.sh --llamacpp)"
    if name.startswith("ct2-"):
        try:
            import ctranslate2
        except ImportError:
            return "ctranslate2 is not installed (pip install ctranslate2)"
        ct = ct2_compute_type(name)
        if ct not in ctranslate2.get_supported_compute_types("cpu"):
            return f"compute type {ct} unsupported on this CPU by this ctranslate2 build " \
                   f"(supported: {sorted(ctranslate2.get_supported_compute_types('cpu'))})"
    return None


def rollout_prompts(ref: HFEngine, b: int) -> list[list[int]]:
    """``b`` later-turn prompts of a search agent: system prompt, question, a search, 1-4 passages observed."""
    from ziprl.config import EnvConfig
    from ziprl.registry import STRATEGIES
    from ziprl.retrieval.corpus import load_corpus
    from ziprl.retrieval.datasets import corpus_for, load_dataset

    system = STRATEGIES["adaptive"](EnvConfig()).system_prompt()
    questions = load_dataset("sample")
    corpus = load_corpus(corpus_for("sample"))
    prompts = []
    for i in range(b):
        q = questions[i % len(questions)].question
        passages = corpus[4 * i: 4 * i + 1 + i % 4]
        observation = "\n".join(f"[{p.doc_id}] {p.title}: {p.text[:500]}" for p in passages)
        prompts.append(ref.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": q},
                                        {"role": "assistant", "content": f"<search>{q}</search>"},
                                        {"role": "user", "content": observation}]))
    return prompts


@torch.inference_mode()
def reference_logprobs(ref: HFEngine, prompts: list[list[int]], rows: Rows) -> list[list[float]]:
    """float32 HF log-probs (raw logits) of each row's tokens, teacher-forced after its prompt."""
    out = []
    for p, (toks, _) in zip(prompts, rows, strict=True):
        ids = torch.tensor([p + toks])
        logits = ref.model(input_ids=ids).logits[0, len(p) - 1: -1].float()
        out.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(toks)[:, None]).squeeze(1).tolist())
    return out


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """(fn(*args), wall seconds)."""
    t0 = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=listed(at_least(1)), default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--new-tokens", type=at_least(1), default=64, help="most tokens generated per row")
    ap.add_argument("--repeats", type=at_least(1), default=3,
                    help="timed runs per candidate, batch and mode (and timed refreshes per candidate)")
    ap.add_argument("--candidates", type=listed(one_of(candidate_names())),
                    default="hf,hf-bf16,static-bf16,ct2-int8,ct2-float32,ct2-bfloat16",
                    help="comma-separated engines under test (see above)")
    ap.add_argument("--modes", type=listed(one_of(MODES)), default=",".join(MODES),
                    help="greedy and/or sample (temperature 1.0)")
    ap.add_argument("--threads", type=at_least(0), default=0,
                    help="torch and CTranslate2 threads (0 = torch's default)")
    ap.add_argument("--prompts", default="chat", choices=("chat", "rollout"), help="prompt shape (see above)")
    ap.add_argument("--out", type=results_name, default="cpu_engines", help="results name: benchmarks/results/<out>.{json,md}")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()  # what else ran: on a shared machine tokens/s are as fair as this is low
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    batches, modes = list(dict.fromkeys(args.batches)), list(dict.fromkeys(args.modes))
    path = resolve_model_path(ModelConfig())
    ref = HFEngine(path, device="cpu")
    arrays = {n: p.detach().to(torch.float32, copy=True).numpy() for n, p in ref.model.named_parameters()}

    cands: dict[str, Candidate] = {}
    refresh_s: dict[str, float] = {}
    rows: list[dict] = []
    for name in dict.fromkeys(args.candidates):
        reason = skip_reason(name)
        if reason:
            print(f"[skip] {name}: {reason}", flush=True)
            rows.append({"candidate": name, "skipped": reason})
            continue
        cand, load_s = timed(build, name, path, ref, threads)
        cands[name] = cand
        refresh_s[name] = statistics.median(timed(cand.refresh, arrays)[1] for _ in range(args.repeats))
        print(f"[load] {name}: build {load_s:.2f}s, refresh {refresh_s[name]:.3f}s", flush=True)

    results: dict[tuple[str, int, str], list[float]] = {}
    per_cpu: dict[tuple[str, int, str], list[float]] = {}
    first_call: dict[tuple[str, int], float] = {}
    agree: dict[tuple[str, int], dict] = {}
    for b in batches:
        prompts = rollout_prompts(ref, b) if args.prompts == "rollout" else [
            ref.encode_chat([{"role": "user", "content": q}]) for q in (QUESTIONS * (b // len(QUESTIONS) + 1))[:b]]
        print(f"[prompts] b={b}: {min(map(len, prompts))}-{max(map(len, prompts))} tokens", flush=True)
        hf_greedy = cands["hf"].generate(prompts, True, args.new_tokens, 0) if "hf" in cands else None
        for name, cand in cands.items():  # first call: warm-up, compile, greedy agreement, log-prob agreement
            greedy, first_call[(name, b)] = timed(cand.generate, prompts, True, args.new_tokens, 0)
            sampled = cand.generate(prompts, False, args.new_tokens, 0)
            ref_lp = reference_logprobs(ref, prompts, sampled)
            diffs = [abs(a - c) for (_, lps), rl in zip(sampled, ref_lp, strict=True) for a, c in zip(lps, rl, strict=True)]
            agree[(name, b)] = {
                "lp_mean_abs_diff": statistics.fmean(diffs), "lp_max_abs_diff": max(diffs),
                "lp_finite_nonpositive": all(np.isfinite(x) and x <= 1e-6 for _, lps in sampled for x in lps),
                "greedy_rows_match32": (sum(g[0][:MATCH_TOKENS] == h[0][:MATCH_TOKENS]
                                            for g, h in zip(greedy, hf_greedy, strict=True)) if hf_greedy else None)}
            print(f"[first] {name} b={b}: {first_call[(name, b)]:.2f}s {agree[(name, b)]}", flush=True)
        for r in range(args.repeats):
            for mode in modes:
                for name, cand in cands.items():
                    cpu = time.process_time()
                    out, secs = timed(cand.generate, prompts, mode == "greedy", args.new_tokens, r + 1)
                    cpu = time.process_time() - cpu
                    n = sum(len(t) for t, _ in out)
                    results.setdefault((name, b, mode), []).append(n / secs)
                    per_cpu.setdefault((name, b, mode), []).append(n / cpu)
                    print(f"[run] b={b} r={r} {mode} {name}: {n} tok {secs:.2f}s {n / secs:.1f} tok/s, {n / cpu:.1f} per CPU s", flush=True)

    hf_step = None
    for name in cands:
        for b in batches:
            row = {"candidate": name, "batch": b, "first_call_s": first_call[(name, b)], "refresh_s": refresh_s[name]}
            if cands[name].decode:
                row["decode"] = cands[name].decode
            for mode in modes:
                row[f"{mode}_tok_s"] = statistics.median(results[(name, b, mode)])
                row[f"{mode}_tok_per_cpu_s"] = statistics.median(per_cpu[(name, b, mode)])
            tps = row.get("sample_tok_s", row.get("greedy_tok_s"))
            if b == 8:
                row["rl_step_tok_s"] = 512 / (512 / tps + refresh_s[name])
                if name == "hf":
                    hf_step = row["rl_step_tok_s"]
            row.update(agree[(name, b)])
            rows.append(row)
    for row in rows:
        if "rl_step_tok_s" in row and hf_step:
            row["rl_step_vs_hf"] = row["rl_step_tok_s"] / hf_step
    write_results(args.out, rows, meta={
        "model": "SmolLM2-135M-Instruct (embedded, plain safetensors)", "threads": threads,
        "new_tokens": args.new_tokens, "repeats": args.repeats, "prompts": args.prompts, "sampling": "temperature 1.0, top-k/top-p off",
        "isa_limits": {v: os.environ.get(v) for v in ISA_LIMITS},
        "load_average_1_5_15_min": {"start": load_start, "end": os.getloadavg()},
        "versions": {m: sys.modules[m].__version__ for m in ("torch", "transformers", "ctranslate2") if m in sys.modules}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
