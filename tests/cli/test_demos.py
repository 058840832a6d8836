"""`python -m ziprl.demos` as a process: a second command on an ``--out`` another one is writing is refused at
once, and the first finishes with its own file (the library side: tests/env/test_demos_concurrency.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from ziprl.env.demos import is_demos_file
from ziprl.outputs import hold, lock_path


def demos(*args: str, **kw) -> subprocess.CompletedProcess | subprocess.Popen:
    """``python -m ziprl.demos`` on the sample questions: run to its end, or started (``popen=True``)."""
    command = [sys.executable, "-m", "ziprl.demos", "--datasets", "sample", *args]
    if kw.pop("popen", False):
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_a_command_on_an_out_in_use_exits_2_with_one_line_naming_the_holder(tmp_path):
    out = tmp_path / "d.parquet"
    with hold(out):
        refused = demos("--limit", "2", "--out", str(out))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and f"is in use by process {os.getpid()}" in refused.stderr
        assert sorted(os.listdir(tmp_path)) == [lock_path(out).name]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_the_audits_reproduction_two_commands_on_one_new_out(tmp_path):
    """The first run (40 questions) keeps its file; the second (2 questions), started while it runs, is refused."""
    out = tmp_path / "d.parquet"
    first = demos("--limit", "40", "--out", str(out), popen=True)
    deadline = time.monotonic() + 600
    while not lock_path(out).is_file() or not lock_path(out).read_text().strip():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = demos("--limit", "2", "--out", str(out))
    assert second.returncode == 2 and f"in use by process {first.pid}" in second.stderr, second.stderr
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    transitions = int(stdout.split(" transitions -> ")[0].rsplit(" ", 1)[1])
    assert is_demos_file(out) and pq.read_metadata(out).num_rows == transitions > 10
    assert sorted(os.listdir(tmp_path)) == ["d.parquet"]
