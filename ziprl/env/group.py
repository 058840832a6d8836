"""GRPO's group: the G trajectories of one question, formed once by the rollout and carried intact to the advantages.

A list of groups crosses a process boundary (rollout actor -> driver -> learner ranks) as one Arrow table, one row
per trajectory (:func:`to_arrow`), and :func:`from_arrow` undoes that: the rows of one group are consecutive and
share its ``group_id``. The same table is what a step's trajectory file holds (:func:`save_groups`, :func:`load_groups`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import pyarrow as pa

from ziprl.env.trajectory import Trajectory, from_table, read_trajectory_table, save_trajectories, to_table


@dataclass(frozen=True)
class Group:
    """G >= 1 trajectories of one question sharing a ``group_id`` (the baseline of Eq. GRPO advantage is theirs)."""

    trajectories: tuple[Trajectory, ...]

    def __post_init__(self) -> None:
        if not self.trajectories:
            raise ValueError("a group holds at least one trajectory")
        first = self.trajectories[0]
        if not first.group_id:
            raise ValueError(f"a trajectory of question {first.question_id!r} has no group_id")
        for t in self.trajectories[1:]:
            if (t.group_id, t.question_id) != (first.group_id, first.question_id):
                raise ValueError(f"group {first.group_id!r} (question {first.question_id!r}) mixes in a trajectory "
                                 f"of group {t.group_id!r} (question {t.question_id!r})")

    @property
    def id(self) -> str:
        return self.trajectories[0].group_id

    @property
    def question_id(self) -> str:
        return self.trajectories[0].question_id

    @property
    def version(self) -> int:
        """The oldest policy version among its trajectories (a rollout never mixes versions within a batch)."""
        return min(t.policy_version for t in self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)


def to_arrow(groups: Sequence[Group]) -> pa.Table:
    """One row per trajectory, group after group (the trajectory file schema)."""
    return to_table([t for g in groups for t in g])


def from_arrow(table: pa.Table) -> list[Group]:
    """The groups of a :func:`to_arrow` table, in order; ValueError when two groups share a ``group_id``."""
    groups = [Group(tuple(rows)) for _, rows in groupby(from_table(table), key=lambda t: t.group_id)]
    ids = [g.id for g in groups]
    if len(set(ids)) != len(ids):
        raise ValueError(f"the table's rows of group {next(i for i in ids if ids.count(i) > 1)!r} are not consecutive")
    return groups


def save_groups(groups: Sequence[Group], path: str | Path) -> Path:
    """Write :func:`to_arrow`'s table to Parquet atomically (``load_trajectories`` reads it back, one row each)."""
    return save_trajectories([t for g in groups for t in g], path)


def load_groups(path: str | Path) -> list[Group]:
    """The groups of a file :func:`save_groups` wrote."""
    return from_arrow(read_trajectory_table(path))
