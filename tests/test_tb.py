"""MetricsLogger: one metrics row per step, also for a run resumed from a checkpoint older than its last row."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ziprl.tb import MetricsLogger


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _scalars(out, tag):
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _run(out, steps, value):
    logger = MetricsLogger(out)
    for step in steps:
        logger.log(step, {"rollout/reward": value + step, "skipped": float("nan"), "name": "x"})
    logger.close()


def test_rows_are_logged_per_step_with_finite_numbers_only(tmp_path):
    _run(tmp_path, [1, 2], 0.0)
    assert _rows(tmp_path) == [{"step": 1, "rollout/reward": 1.0}, {"step": 2, "rollout/reward": 2.0}]
    assert _scalars(tmp_path, "rollout/reward") == [(1, 1.0), (2, 2.0)]


def test_a_resumed_run_replaces_the_rows_after_its_checkpoint(tmp_path):
    _run(tmp_path, [1, 2, 3], 0.0)  # killed after logging step 3, its last checkpoint at step 2
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rollout/rew')  # and torn mid-row
    _run(tmp_path, [3, 4], 10.0)
    assert [(r["step"], r["rollout/reward"]) for r in _rows(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
    assert _scalars(tmp_path, "rollout/reward") == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]


def test_a_logger_that_logged_nothing_leaves_the_run_as_it_was(tmp_path):
    _run(tmp_path, [1, 2], 0.0)
    before = (tmp_path / "metrics.jsonl").read_text()
    MetricsLogger(tmp_path).close()  # a resumed run that failed before its first step
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_rows_that_are_not_utf8_are_dropped_as_torn(tmp_path):
    _run(tmp_path, [1, 2], 0.0)
    with (tmp_path / "metrics.jsonl").open("ab") as f:
        f.write(b'\xff\xfe x\n{"step": 1.5, "k": "\xff"}\n')  # the first reading failed mid-resume, after a step ran
    _run(tmp_path, [3], 10.0)
    assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]


def test_an_output_that_cannot_be_written_fails_when_opened_before_any_step(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    logger = MetricsLogger(tmp_path)
    with pytest.raises(IsADirectoryError):
        logger.open(3)
    logger.close()  # nothing was opened: closing names no other error
    assert not (tmp_path / "tb").exists()
