"""Trajectory records (one per episode, a list of turns), saved to and loaded from Parquet."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ziprl.paths import atomic_path


def column(arrow: pa.DataType, default: Any = MISSING, *, factory: Any = MISSING, step: bool = False) -> Any:
    """A record field and its Parquet column type; ``step``: the env's ``step()`` reports it in ``info`` under the
    field's name, and the rollout copies it from there."""
    return field(default=default, default_factory=factory, metadata={"arrow": arrow, "step": step})


@dataclass
class Turn:
    """One assistant turn: what the learner trains on plus what was observed and scored.

    Every field is declared once, here: its Parquet column follows from ``column``, and a ``step`` field is copied
    from the env's ``info`` by the rollout (:meth:`from_step`), so a new per-turn number the env (or a tool's
    ``ToolResult.metrics``) reports is one line below. Files written before a field existed load with its default.
    """

    prompt_ids: list[int] = column(pa.list_(pa.int32()), factory=list)
    response_ids: list[int] = column(pa.list_(pa.int32()), factory=list)
    logprobs: list[float] = column(pa.list_(pa.float32()), factory=list)  # behaviour log-probs, one per response token
    response_text: str = column(pa.string(), "")
    action: str = column(pa.string(), "", step=True)  # a tool's name | invalid
    level: int | None = column(pa.int8(), None, step=True)
    q_com: float | None = column(pa.float64(), None, step=True)  # None: no pending observation (HRR term 0)
    q_ratio: float | None = column(pa.float64(), None, step=True)
    q_level: float | None = column(pa.float64(), None, step=True)
    q_info: float | None = column(pa.float64(), None, step=True)
    q_sem: float | None = column(pa.float64(), None, step=True)
    format_error: str | None = column(pa.string(), None, step=True)
    observation_chars: int = column(pa.int64(), 0, step=True)  # size of the raw observation this turn compressed
    context_chars: int = column(pa.int64(), 0)  # size of the prompt's text context
    prompt_tokens: int = column(pa.int64(), 0)
    response_tokens: int = column(pa.int64(), 0)
    retrieved: int = column(pa.int64(), 0, step=True)  # passages this turn's action returned (k for search, 1 for open)
    noisy_hits: int = column(pa.int64(), 0, step=True)  # how many of them env.retrieval_noise replaced by random ones
    noise_doc_ids: list[str] = column(pa.list_(pa.string()), factory=list, step=True)  # the injected passages' ids

    @classmethod
    def from_step(cls, info: dict[str, Any], **rest: Any) -> Turn:
        """The turn from a ``step()``'s ``info`` (every ``step`` field it reports, lists copied) and ``rest``."""
        reported = {f.name: copy.copy(info[f.name]) for f in fields(cls) if f.metadata["step"] and f.name in info}
        return cls(**reported, **rest)


@dataclass
class Trajectory:
    question_id: str = column(pa.string())
    question: str = column(pa.string())
    answers: list[str] = column(pa.list_(pa.string()))
    group_id: str = column(pa.string(), "")
    sample_index: int = column(pa.int32(), 0)
    policy_version: int = column(pa.int64(), 0)
    reward: float = column(pa.float64(), 0.0)
    em: float = column(pa.float64(), 0.0)
    f1: float = column(pa.float64(), 0.0)
    finished: bool = column(pa.bool_(), False)
    strategy: str = column(pa.string(), "adaptive")
    turns: list[Turn] = column(pa.list_(pa.struct([(f.name, f.metadata["arrow"]) for f in fields(Turn)])),
                               factory=list)

    @property
    def num_response_tokens(self) -> int:
        """|o_i|: the trajectory's own generated tokens (the paper's per-trajectory normaliser)."""
        return sum(len(t.response_ids) for t in self.turns)


SCHEMA = pa.schema([(f.name, f.metadata["arrow"]) for f in fields(Trajectory)])


def readable(schema: pa.Schema) -> bool:
    """A trajectory file of this or an earlier version: the same record columns, and turn columns that are a subset
    of today's (the missing ones load with their defaults)."""
    if schema.names != SCHEMA.names or any(schema.field(n).type != SCHEMA.field(n).type for n in SCHEMA.names
                                           if n != "turns"):
        return False
    turn = schema.field("turns").type
    if not pa.types.is_list(turn) or not pa.types.is_struct(turn.value_type):
        return False
    now = {f.name: f.type for f in SCHEMA.field("turns").type.value_type}
    return all(now.get(f.name) == f.type for f in turn.value_type)


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


def read_trajectory_table(path: str | Path) -> pa.Table:
    """A trajectory file's table, checked to be one (:func:`readable`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file {path} does not exist")
    table = pq.read_table(path)
    if not readable(table.schema):
        raise ValueError(f"{path} is not a ZipRL trajectory file (schema differs: {table.schema.names})")
    return table


def load_trajectories(path: str | Path) -> list[Trajectory]:
    return from_table(read_trajectory_table(path))
