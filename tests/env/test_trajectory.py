"""Per-turn fields are declared once, on ``Turn``: the Parquet schema follows them, a round trip keeps every one, and
the rollout copies every ``step`` field from the env's ``info``."""

from __future__ import annotations

from dataclasses import fields

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ziprl.config import EnvConfig
from ziprl.env import SearchCompressEnv
from ziprl.env.trajectory import SCHEMA, Trajectory, Turn, load_trajectories, save_trajectories
from ziprl.retrieval.types import QAExample
from ziprl.testing.word_retriever import PASSAGES, WordRetriever


def test_the_schema_is_the_dataclasses():
    assert SCHEMA.names == [f.name for f in fields(Trajectory)]
    turn = SCHEMA.field("turns").type.value_type
    assert [(f.name, f.type) for f in turn] == [(f.name, f.metadata["arrow"]) for f in fields(Turn)]


def odd_value(arrow: pa.DataType, i: int):
    """A value of the column's type that is no field's default."""
    if pa.types.is_list(arrow):
        return [odd_value(arrow.value_type, i), odd_value(arrow.value_type, i + 1)]
    if pa.types.is_string(arrow):
        return f"text {i}"
    if pa.types.is_boolean(arrow):
        return True
    if pa.types.is_floating(arrow):
        return i + 0.5
    return i + 1


def test_a_parquet_round_trip_keeps_every_field(tmp_path):
    turns = [Turn(**{f.name: odd_value(f.metadata["arrow"], i + k) for i, f in enumerate(fields(Turn))})
             for k in range(2)]
    record = {f.name: odd_value(f.metadata["arrow"], i) for i, f in enumerate(fields(Trajectory)) if f.name != "turns"}
    t = Trajectory(**record, turns=turns)
    assert all(getattr(u, f.name) not in (f.default, []) for u in turns for f in fields(Turn))
    (back,) = load_trajectories(save_trajectories([t], tmp_path / "t.parquet"))
    assert back == t


def test_a_file_with_foreign_columns_is_refused(tmp_path):
    pq.write_table(pa.table({"question_id": ["q"]}), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="not a ZipRL trajectory file"):
        load_trajectories(tmp_path / "x.parquet")


def test_the_env_reports_every_step_field_and_the_rollout_copies_it():
    env = SearchCompressEnv(EnvConfig(retrieval_noise=0.0), retriever=WordRetriever(PASSAGES),
                            examples=[QAExample("q", "Where does Scott Derrickson live?", ["Los Angeles"])])
    env.reset(seed=0)
    *_, info = env.step('<compress level="1">Find him.</compress><search>Scott Derrickson</search>')
    step = [f.name for f in fields(Turn) if f.metadata["step"]]
    assert set(step) <= set(info)
    turn = Turn.from_step(info, prompt_ids=[1, 2], context_chars=7)
    assert all(getattr(turn, name) == info[name] for name in step)
    assert turn.action == "search"
    assert turn.retrieved == 3
    assert turn.prompt_ids == [1, 2]
    assert turn.context_chars == 7
    assert turn.noise_doc_ids is not info["noise_doc_ids"]  # lists are copied, never shared with the env
