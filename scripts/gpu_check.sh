#!/usr/bin/env bash
# Every GPU-only test on a random-initialised tiny model (nothing downloaded), then a short markdown report:
# HFEngine on CUDA, a DeepSpeed bf16 ZeRO-2/3 step, the collective weight push over NCCL between two processes,
# vLLM (generation, weight loading, its NCCL weight transfer) where it is installed. Runs in under 10 minutes.
#
#   scripts/gpu_check.sh [REPORT.md]        (default runs/gpu_check/report.md; PYTHON=... picks the interpreter)
#
# On a machine without a CUDA GPU it says there is nothing to do and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  echo "gpu_check: no CUDA GPU visible to PyTorch ($PY): nothing to do"
  exit 0
fi
REPORT=${1:-runs/gpu_check/report.md}
OUT=$(dirname "$REPORT")
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
TESTS=(tests/test_gpu.py)
# The older GPU tests use the packaged default model's tokenizer: added when it resolves offline.
if timeout 120 "$PY" -c "from ziprl.config import ModelConfig; from ziprl.policy.models import resolve_model_path; resolve_model_path(ModelConfig())" >/dev/null 2>&1; then
  TESTS+=(tests/learner/test_trainer.py::test_bf16_zero_on_gpu tests/policy/engines/vllm/test_engine.py)
fi
start=$(date +%s)
timeout 540 "$PY" -m pytest -q -rs -p no:cacheprovider "${TESTS[@]}" --junitxml "$OUT/gpu_check.xml" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
"$PY" - "$OUT/gpu_check.xml" "$REPORT" "$rc" "$(( $(date +%s) - start ))" <<'PYEOF'
"""Markdown report from pytest's JUnit XML: the machine, then one line per test."""
import importlib.metadata as md
import sys
import xml.etree.ElementTree as ET

import torch

junit, report, rc, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]


def version(pkg):
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


lines = ["# GPU check", "",
         f"- device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, CUDA {torch.version.cuda}",
         f"- torch {torch.__version__}, deepspeed {version('deepspeed')}, vllm {version('vllm')}, "
         f"transformers {version('transformers')}",
         f"- pytest exit code {rc}{' (timed out)' if rc == 124 else ''}, {seconds} s", "",
         "| test | result | detail |", "|---|---|---|"]
try:
    cases = list(ET.parse(junit).getroot().iter("testcase"))
except (OSError, ET.ParseError) as exc:
    cases = []
    lines.append(f"| (no results) | error | {exc} |")
for case in cases:
    result, detail = "passed", ""
    for tag in ("failure", "error", "skipped"):
        node = case.find(tag)
        if node is not None:
            result = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
            detail = (node.get("message") or "").replace("|", "/").replace("\n", " ")[:300]
    lines.append(f"| {case.get('classname')}::{case.get('name')} | {result} | {detail} |")
open(report, "w").write("\n".join(lines) + "\n")
PYEOF
echo "gpu_check: report written to $REPORT (pytest log: $OUT/pytest.log)"
exit "$rc"
