"""The group carrier (ziprl/env/group.py): G trajectories of one question, formed once by ``rollout_groups`` (the one
place training reads G) and carried intact to the advantages; its Arrow form is undone exactly."""

from __future__ import annotations

import ast
import dataclasses

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from ziprl.config import load_config
from ziprl.env.group import Group, from_arrow, load_groups, save_groups, to_arrow
from ziprl.env.trajectory import Trajectory, Turn, load_trajectories
from ziprl.policy import rollout as rollout_module
from ziprl.retrieval.types import QAExample

PACKAGE = REPO / "ziprl"
# the modules that may read G (``<...>.group_size``), and why; training forms its groups in the first alone
READS_GROUP_SIZE = {
    "policy/rollout.py": "rollout_groups: where training forms its groups",
    "config/schema.py": "cross-field validation of the setting",
    "evaluation/harness.py": "evaluation: samples per question",
    "loop/summary.py": "the run's one-line description names G",
    "testing/loop.py": "the tests' simulated rollout source forms its groups like rollout_groups",
}


def values(arrow: pa.DataType) -> st.SearchStrategy:
    """Values of one Parquet column type that survive it unchanged."""
    if pa.types.is_list(arrow):
        return st.lists(values(arrow.value_type), max_size=3)
    if pa.types.is_integer(arrow):
        bits = arrow.bit_width - 1
        return st.integers(-(2**bits), 2**bits - 1)
    if pa.types.is_floating(arrow):
        return st.floats(width=arrow.bit_width, allow_nan=False)
    if pa.types.is_boolean(arrow):
        return st.booleans()
    assert pa.types.is_string(arrow), arrow
    return st.text(max_size=8)


def fields_of(cls: type, skip: tuple[str, ...] = ()) -> dict[str, st.SearchStrategy]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in skip:
            s = values(f.metadata["arrow"])
            out[f.name] = st.one_of(st.none(), s) if f.default is None else s
    return out


turns = st.builds(Turn, **fields_of(Turn))
members = st.builds(Trajectory, turns=st.lists(turns, max_size=3),
                    **fields_of(Trajectory, skip=("turns", "question_id", "group_id")))


@st.composite
def batches(draw) -> list[Group]:
    """Groups of 1-4 trajectories, each group its own id and question (two may ask the same question)."""
    out = []
    for i in range(draw(st.integers(0, 4))):
        question = draw(st.sampled_from(["q0", "q1", "#q"]))
        out.append(Group(tuple(dataclasses.replace(t, question_id=question, group_id=f"{question}#{i}")
                               for t in draw(st.lists(members, min_size=1, max_size=4)))))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=batches())
def test_the_arrow_round_trip_of_groups_is_the_identity(groups):
    assert from_arrow(to_arrow(groups)) == groups


@pytest.mark.parametrize("sizes", [[], [1], [3], [2, 1, 4], [1, 1, 1]])
def test_a_step_file_holds_its_groups_one_row_per_trajectory(tmp_path, sizes):
    groups = [Group(tuple(Trajectory(question_id=f"q{g}", question="?", answers=["a"], group_id=f"g{g}",
                                     sample_index=s, reward=float(s % 2), turns=[Turn(q_com=0.5)])
                          for s in range(n))) for g, n in enumerate(sizes)]
    path = save_groups(groups, tmp_path / "step.parquet")
    assert load_groups(path) == groups
    assert load_trajectories(path) == [t for g in groups for t in g]  # the viewer's flat reading of the same file


def test_a_table_whose_group_rows_are_not_consecutive_is_refused():
    def row(gid: str) -> Trajectory:
        return Trajectory(question_id="q", question="?", answers=["a"], group_id=gid)

    table = to_arrow([Group((row("a"),)), Group((row("b"),)), Group((row("a"),))])
    with pytest.raises(ValueError, match="rows of group 'a' are not consecutive"):
        from_arrow(table)


@pytest.mark.parametrize(("ids", "needle"), [
    ([], "at least one trajectory"),
    ([("", "q")], "has no group_id"),
    ([("g", "q"), ("h", "q")], "group 'g' .* mixes in a trajectory of group 'h'"),
    ([("g", "q"), ("g", "r")], "question 'q'.* mixes in .*question 'r'"),
])
def test_a_group_is_one_question_under_one_id(ids, needle):
    with pytest.raises(ValueError, match=needle):
        Group(tuple(Trajectory(question_id=q, question="?", answers=["a"], group_id=g) for g, q in ids))


def test_a_group_names_its_id_question_and_oldest_version():
    g = Group(tuple(Trajectory(question_id="q", question="?", answers=["a"], group_id="g", policy_version=v)
                    for v in (3, 2, 3)))
    assert (g.id, g.question_id, g.version, len(g)) == ("g", "q", 2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.reward = 1.0  # a group is not a trajectory: setting a trajectory's field on it fails


def test_rollout_groups_forms_one_group_of_g_per_question(monkeypatch):
    """G comes from ``rollout.group_size``; the rollout's flat list (example by example) becomes one group each."""
    asked = {}

    def played(engine, make_env, examples, sampling, group_size, seed):
        asked.update(group_size=group_size, seed=seed, tokens=sampling.max_new_tokens)
        return [Trajectory(question_id=ex.id, question=ex.question, answers=ex.answers, group_id=f"{ex.id}#{i}",
                           sample_index=s) for i, ex in enumerate(examples) for s in range(group_size)]

    monkeypatch.setattr(rollout_module, "rollout", played)
    examples = [QAExample(id=f"q{i}", question="?", answers=["a"]) for i in range(3)]
    cfg = load_config(None, ["rollout.group_size=3", "sampling.max_new_tokens=17"])
    groups = rollout_module.rollout_groups(None, None, examples, cfg, seed=9)
    assert asked == {"group_size": 3, "seed": 9, "tokens": 17}
    assert [(g.question_id, [t.sample_index for t in g]) for g in groups] == [(e.id, [0, 1, 2]) for e in examples]


def modules() -> dict[str, ast.Module]:
    return {p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}


def attribute_reads(tree: ast.Module, name: str) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == name]


def test_group_size_is_read_only_where_groups_are_formed():
    """Any ``<...>.group_size`` read (``cfg.rollout.group_size``, or through an alias) in ziprl/ is in one of the
    modules of READS_GROUP_SIZE; no other module re-slices trajectories by G."""
    readers = {rel: lines for rel, tree in modules().items() if (lines := attribute_reads(tree, "group_size"))}
    assert set(readers) <= set(READS_GROUP_SIZE), {k: v for k, v in readers.items() if k not in READS_GROUP_SIZE}
    assert "policy/rollout.py" in readers


def test_only_the_arrow_boundary_flattens_groups_or_tells_them_apart_by_id():
    """Outside env/group.py (and the record module it builds on) no module reads a trajectory's ``group_id`` (to
    regroup by it) or imports the flat row codec (``to_table`` / ``from_table``)."""
    boundary = {"env/group.py", "env/trajectory.py"}
    for rel, tree in modules().items():
        if rel in boundary:
            continue
        assert not attribute_reads(tree, "group_id"), rel
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not imported & {"to_table", "from_table"}, rel
