"""scripts/gpu_check.sh on a machine without a visible CUDA GPU: says it has nothing to do, exits 0."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def test_gpu_check_without_a_gpu_has_nothing_to_do(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU
    out = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "report.md")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nothing to do" in out.stdout and not (tmp_path / "report.md").exists()
