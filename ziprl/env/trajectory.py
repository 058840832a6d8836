"""Trajectory records (one per episode, a list of turns), saved to and loaded from Parquet."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ziprl.paths import atomic_path


@dataclass
class Turn:
    """One assistant turn: what the learner trains on plus what was observed and scored."""

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # behaviour log-probs, one per response token
    response_text: str = ""
    action: str = ""  # search | open | answer | invalid
    level: int | None = None
    q_com: float | None = None  # None when the turn had no pending observation (HRR term 0)
    q_ratio: float | None = None
    q_level: float | None = None
    q_info: float | None = None
    q_sem: float | None = None
    format_error: str | None = None
    observation_chars: int = 0  # size of the raw observation this turn compressed
    context_chars: int = 0  # size of the prompt's text context
    prompt_tokens: int = 0
    response_tokens: int = 0
    retrieved: int = 0  # passages in the observation this turn's action returned (k for search, 1 for open)
    noisy_hits: int = 0  # how many of them env.retrieval_noise replaced by random corpus passages
    noise_doc_ids: list[str] = field(default_factory=list)  # the injected passages' ids


@dataclass
class Trajectory:
    question_id: str
    question: str
    answers: list[str]
    group_id: str = ""
    sample_index: int = 0
    policy_version: int = 0
    reward: float = 0.0
    em: float = 0.0
    f1: float = 0.0
    finished: bool = False
    strategy: str = "adaptive"
    turns: list[Turn] = field(default_factory=list)

    @property
    def num_response_tokens(self) -> int:
        """|o_i|: the trajectory's own generated tokens (the paper's per-trajectory normaliser)."""
        return sum(len(t.response_ids) for t in self.turns)


_TURN_FIELDS_V1 = [
    ("prompt_ids", pa.list_(pa.int32())),
    ("response_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("response_text", pa.string()),
    ("action", pa.string()),
    ("level", pa.int8()),
    ("q_com", pa.float64()),
    ("q_ratio", pa.float64()),
    ("q_level", pa.float64()),
    ("q_info", pa.float64()),
    ("q_sem", pa.float64()),
    ("format_error", pa.string()),
    ("observation_chars", pa.int64()),
    ("context_chars", pa.int64()),
    ("prompt_tokens", pa.int64()),
    ("response_tokens", pa.int64()),
]
_NOISE_FIELDS = [("retrieved", pa.int64()), ("noisy_hits", pa.int64()), ("noise_doc_ids", pa.list_(pa.string()))]


def _schema(turn_fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema(
        [
            ("question_id", pa.string()),
            ("question", pa.string()),
            ("answers", pa.list_(pa.string())),
            ("group_id", pa.string()),
            ("sample_index", pa.int32()),
            ("policy_version", pa.int64()),
            ("reward", pa.float64()),
            ("em", pa.float64()),
            ("f1", pa.float64()),
            ("finished", pa.bool_()),
            ("strategy", pa.string()),
            ("turns", pa.list_(pa.struct(turn_fields))),
        ]
    )


SCHEMA = _schema(_TURN_FIELDS_V1 + _NOISE_FIELDS)
LEGACY_SCHEMAS = (_schema(_TURN_FIELDS_V1),)  # files written before the noise fields: they load with defaults


def to_table(trajectories: list[Trajectory]) -> pa.Table:
    return pa.Table.from_pylist([dataclasses.asdict(t) for t in trajectories], schema=SCHEMA)


def from_table(table: pa.Table) -> list[Trajectory]:
    out = []
    for row in table.to_pylist():
        row["turns"] = [Turn(**t) for t in row["turns"]]
        out.append(Trajectory(**row))
    return out


def save_trajectories(trajectories: list[Trajectory], path: str | Path) -> Path:
    """Write to Parquet atomically (temp file, then rename), so a crash never leaves a torn file."""
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(to_table(trajectories), tmp)
    return path


def load_trajectories(path: str | Path) -> list[Trajectory]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file {path} does not exist")
    table = pq.read_table(path)
    if not any(table.schema.equals(s, check_metadata=False) for s in (SCHEMA, *LEGACY_SCHEMAS)):
        raise ValueError(f"{path} is not a ZipRL trajectory file (schema differs: {table.schema.names})")
    return from_table(table)
