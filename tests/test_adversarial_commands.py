"""Adversarial command lines (issue 46): a second table, none of its rows in ``test_bad_commands``, run the way a
careless or hostile user would, each in a fresh directory of the user's own files.

Every row must exit 2 with one ``error:`` line whose text names what is wrong (a ``needle``), with no traceback and
no "internal error"; and every file and folder that was there before keeps its bytes, with nothing added beside
them: a refused command writes nothing. A row that runs past ``HANG_S`` seconds fails as a hang. The table lives
in ``ziprl/testing/adversarial_commands.py``; ``python -m tests.test_bad_commands`` writes both tables into
docs/bad-commands.md.
"""

from __future__ import annotations

import pytest

from ziprl.testing.adversarial_commands import ROWS, make_tree, run_row, snapshot
from ziprl.testing.commands import CASES, COMMANDS


def test_the_table_is_large_new_and_covers_every_command():
    old = {(c, tuple(a)) for c, _, a in CASES}
    assert len(ROWS) >= 200
    assert len({(r.cmd, r.argv) for r in ROWS}) == len(ROWS)
    assert not [r for r in ROWS if (r.cmd, r.argv) in old]
    assert {r.cmd for r in ROWS} >= set(COMMANDS) - {"ziprl.watch_teacher"}


@pytest.mark.parametrize("r", ROWS, ids=[f"{r.cmd} {r.what} {i}" for i, r in enumerate(ROWS)])
def test_adversarial_command_line(r, tmp_path, no_work):
    make_tree(tmp_path)
    before = snapshot(tmp_path)
    code, err = run_row(r, tmp_path)
    assert snapshot(tmp_path) == before, f"files changed: {err}"
    assert code == 2, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    assert r.needle.lower() in lines[0].lower(), f"the message does not name {r.needle!r}: {lines[0]}"
    assert len(lines[0]) <= 600, f"message too long ({len(lines[0])} chars)"
