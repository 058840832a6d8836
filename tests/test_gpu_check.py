"""scripts/gpu_check.sh on a machine without a visible CUDA GPU: says it has nothing to do, exits 0; every test it
runs on a GPU is there."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from tests.conftest import REPO


def test_gpu_check_without_a_gpu_has_nothing_to_do(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU
    out = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "report.md")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nothing to do" in out.stdout
    assert not (tmp_path / "report.md").exists()


def test_every_test_the_check_runs_exists():
    """The tests it names (``tests/<path>.py`` or ``tests/<path>.py::<test>``) are where it looks for them."""
    named = re.findall(r"\btests/[\w/]+\.py(?:::\w+)?", (REPO / "scripts" / "gpu_check.sh").read_text(encoding="utf-8"))
    assert len(named) >= 3
    for name in named:
        path, _, test = name.partition("::")
        assert (REPO / path).is_file(), name
        if test:
            tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
            assert test in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name
