"""A table of bad command lines across every command: each exits 2 with exactly one ``error:`` line, no traceback,
no "internal error", before any model loads (issue 23, item 5).

The table lives in ``ziprl/testing/commands.py``; ``python -m tests.test_bad_commands`` writes docs/bad-commands.md
(input, exit code, message) from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ziprl.paths import atomic_write_text
from ziprl.testing.adversarial_commands import ROWS, doc_rows
from ziprl.testing.commands import CASES, COMMANDS, make_files, run_case, shown

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "bad-commands.md"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    make_files(d)
    return d


def test_the_table_is_large_and_unique():
    assert len(CASES) >= 150
    assert len({(c, tuple(a)) for c, _, a in CASES}) == len(CASES)
    assert {c for c, _, _ in CASES} == set(COMMANDS)


@pytest.mark.parametrize(("cmd", "what", "argv"), CASES, ids=[f"{c} {w}" for c, w, _ in CASES])
def test_bad_command_line(cmd, what, argv, files, monkeypatch, no_work):
    """``no_work`` fails the row if a model, an encoder, a Ray launch or an episode starts before the refusal."""
    monkeypatch.chdir(files)
    code, err = run_case(cmd, argv, files)
    assert code == 2, err
    assert err.count("error:") == 1, err
    assert "Traceback" not in err, err
    assert "internal error" not in err, err


def test_the_doc_lists_every_case():
    doc = DOC.read_text(encoding="utf-8")
    missing = [(c, a) for c, _, a in CASES if shown(c, a).replace("|", "\\|") not in doc]
    assert not missing, f"{len(missing)} cases missing from {DOC}: run python -m tests.test_bad_commands"


def write_doc() -> None:
    """docs/bad-commands.md: every table row, its exit code and its message (the fixture directory is DIR)."""
    import contextlib
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        d = Path(tmp)
        make_files(d)
        for cmd, what, argv in CASES:
            code, err = run_case(cmd, argv, d)
            message = next((line for line in err.splitlines() if "error:" in line), err.strip())
            cells = (what, shown(cmd, argv), str(code), message)
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    head = ["# Bad command lines", "",
            f"Each row is one bad command line from `ziprl/testing/commands.py` ({len(CASES)} rows), its exit code "
            "and the one `error:` line it prints (argparse's own usage errors print their usage first). DIR is a "
            "directory of small bad files the test writes. Regenerate with `python -m tests.test_bad_commands`.", "",
            "| input | command | exit | message |", "|---|---|---|---|"]
    second = ["", "## Adversarial command lines", "",
              f"Each row is one of `ziprl/testing/adversarial_commands.py`'s {len(ROWS)} rows (issue 46), run in a fresh "
              "directory DIR of the user's own files (a foreign folder `user/`, a FIFO, symbolic links, a folder whose "
              "run marker is a directory, datasets with a JSON array, a lone surrogate or a one-megabyte question, ...). "
              "Each exits 2 with one `error:` line, and every file that was there keeps its bytes, with nothing added.",
              "", "| input | command | exit | message |", "|---|---|---|---|"]
    atomic_write_text(DOC, "\n".join(head + rows + second + doc_rows()) + "\n")


if __name__ == "__main__":
    write_doc()
