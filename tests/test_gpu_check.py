"""scripts/gpu_check.sh on a machine without a visible CUDA GPU: says it has nothing to do, exits 0; every test it
runs on a GPU is there. Its report, log and JUnit XML go only where nothing is or where an earlier check wrote them,
which it checks before the GPU; a stand-in interpreter that sees a GPU shows the files it writes pass that check."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from ziprl.testing.outputs import digests

CHECK = REPO / "scripts" / "gpu_check.sh"
OURS = {"report.md": "# GPU check\n", "pytest.log": "# gpu_check.sh: pytest log\n",
        "gpu_check.xml": '<?xml version="1.0"?><testsuites><testsuite name="gpu_check" tests="0"/></testsuites>'}


def check(*args: str, cwd: Path | None = None, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU
    return subprocess.run(["bash", str(CHECK), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_gpu_check_without_a_gpu_has_nothing_to_do(tmp_path):
    out = check(str(tmp_path / "report.md"))
    assert out.returncode == 0, out.stderr
    assert "nothing to do" in out.stdout
    assert not (tmp_path / "report.md").exists()


def test_help_prints_the_usage_and_an_option_or_a_second_argument_is_refused(tmp_path):
    """Only one argument, the report's path: ``--help`` is not taken for a report (nothing written in the caller's
    directory), an unknown option or a second path exits 2 with one line."""
    done = check("--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("scripts/gpu_check.sh [REPORT.md]"), done.stdout
    for args, message in ((["--frobnicate"], "unknown option --frobnicate"),
                          ([str(tmp_path / "a.md"), str(tmp_path / "b.md")], "one argument at most")):
        done = check(*args, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted(OURS))
def test_a_file_the_check_did_not_write_is_refused_and_kept(tmp_path, name):
    """A user's report.md, or pytest.log or gpu_check.xml beside it: exit 2, one line, every file as it was."""
    for other, text in OURS.items():
        (tmp_path / other).write_text("the user's notes\n" if other == name else text)
    before = digests(tmp_path)
    done = check(str(tmp_path / "report.md"))
    assert done.returncode == 2, done.stdout
    assert done.stderr.count("\n") == 1 and f"{tmp_path / name} exists and is not" in done.stderr
    assert digests(tmp_path) == before


def test_a_relative_report_is_the_callers(tmp_path):
    (tmp_path / "report.md").write_text("the user's notes\n")
    done = check("report.md", cwd=tmp_path)
    assert done.returncode == 2 and str(tmp_path / "report.md") in done.stderr, done.stderr
    assert (tmp_path / "report.md").read_text() == "the user's notes\n"


def test_what_the_check_writes_passes_its_own_check(tmp_path):
    """With an interpreter that reports a GPU (the tests themselves still see none and skip), it writes the report,
    the log and the XML, and a second run over them is let through."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import torch\ntorch.cuda.get_device_name = lambda i=0: 'stand-in'\n"
                                           "torch.cuda.device_count = lambda: 1\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/bash\n[[ ${{2:-}} == *cuda.is_available* ]] && exit 0\n'
                      f'PYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    for _ in range(2):
        done = check(str(out / "report.md"), python=str(python))
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(OURS)
    assert (out / "report.md").read_text().startswith(OURS["report.md"])
    assert (out / "pytest.log").read_text().startswith(OURS["pytest.log"])
    assert '<testsuite name="gpu_check"' in (out / "gpu_check.xml").read_text()


def test_every_test_the_check_runs_exists():
    """The tests it names (``tests/<path>.py`` or ``tests/<path>.py::<test>``) are where it looks for them."""
    named = re.findall(r"\btests/[\w/]+\.py(?:::\w+)?", CHECK.read_text(encoding="utf-8"))
    assert len(named) >= 3
    for name in named:
        path, _, test = name.partition("::")
        assert (REPO / path).is_file(), name
        if test:
            tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
            assert test in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name
