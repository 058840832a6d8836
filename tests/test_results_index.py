"""benchmarks/README.md indexes every file in benchmarks/results/, and names no file that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INDEX = REPO / "benchmarks" / "README.md"
RESULTS = REPO / "benchmarks" / "results"
COLUMN = "result files"
# measurements in progress when the index was written: only their files may be listed before they exist
PENDING_PREFIXES = ("learning_invented", "base_rate", "engine_throughput_h200", "learning_gate")
ENTRY = re.compile(r"`([^`\s]+)`( \(pending\))?")


def expand(name: str) -> list[str]:
    """``a.{json,md}`` -> ``a.json``, ``a.md``; a name without braces stays itself."""
    m = re.fullmatch(r"([^{}]*)\{([^{}]+)\}([^{}]*)", name)
    return [m.group(1) + alt + m.group(3) for alt in m.group(2).split(",")] if m else [name]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def index_entries(text: str) -> dict[str, bool]:
    """Every file the index's tables name in their ``result files`` column -> whether it is marked pending."""
    entries: dict[str, bool] = {}
    column = width = None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("|"):
            column = None
            continue
        row = cells(line)
        if column is None:
            column, width = (row.index(COLUMN), len(row)) if COLUMN in row else (None, None)
            continue
        if set(line) <= set("|-: "):
            continue
        assert len(row) == width, f"benchmarks/README.md:{n}: {len(row)} cells, the header has {width} (a '|' in a cell?)"
        for name, pending in ENTRY.findall(row[column]):
            for file in expand(name):
                entries[file] = bool(pending)
    return entries


@pytest.fixture(scope="module")
def entries() -> dict[str, bool]:
    return index_entries(INDEX.read_text(encoding="utf-8"))


def test_every_result_file_is_named_by_an_index_entry(entries):
    unindexed = sorted(p.name for p in RESULTS.iterdir() if p.name not in entries)
    assert not unindexed, (f"benchmarks/results/ holds files benchmarks/README.md does not index: {unindexed}; add "
                           "each to its claim's row (or remove a superseded run: git keeps it)")


def test_every_index_entry_names_a_file(entries):
    missing = sorted(name for name, pending in entries.items() if not pending and not (RESULTS / name).is_file())
    assert not missing, f"benchmarks/README.md names files benchmarks/results/ does not hold: {missing}"


def test_only_measurements_in_progress_are_pending(entries):
    pending = [name for name, is_pending in entries.items() if is_pending]
    assert [n for n in pending if not n.startswith(PENDING_PREFIXES)] == []
    done = [n for n in pending if (RESULTS / n).is_file()]
    assert not done, f"these files now exist: drop '(pending)' after them in benchmarks/README.md: {done}"


def test_the_index_parser_reads_files_braces_and_pending_marks():
    text = ("intro `not_in_a_table.md`\n\n| claim | command | result files | shows |\n|---|---|---|---|\n"
            "| a | `python x.py --out y` | `a.{json,md}`, `b.png` (pending) | `c.md` in prose |\n\nafter\n")
    assert index_entries(text) == {"a.json": False, "a.md": False, "b.png": True}
