#!/usr/bin/env bash
# Every GPU-only test on a random-initialised tiny model (nothing downloaded), then a short markdown report:
# HFEngine on CUDA, a DeepSpeed bf16 ZeRO-2/3 step, the collective weight push over NCCL between two processes,
# vLLM (generation, weight loading, its NCCL weight transfer) where it is installed. Runs in under 10 minutes.
#
#   scripts/gpu_check.sh [REPORT.md]        (default runs/gpu_check/report.md; PYTHON=... picks the interpreter)
#
# A relative REPORT is taken from the caller's directory. REPORT, and pytest.log and gpu_check.xml beside it, are new
# or written by an earlier check (checked first: anything else is refused, exit 2, nothing written). On a machine
# without a CUDA GPU it then says there is nothing to do and exits 0.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
  -h|--help) grep -m1 '^#   scripts/gpu_check.sh' "$0" | sed 's/^#  *//'; exit 0 ;;
  -*) echo "gpu_check: unknown option $1; the one argument is the report's path (REPORT.md)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "gpu_check: one argument at most, the report's path; got $#" >&2; exit 2; }
REPORT=${1:-$REPO/runs/gpu_check/report.md}
[[ $REPORT = /* ]] || REPORT=$PWD/$REPORT
cd "$REPO" || exit 1
OUT=$(dirname "$REPORT")
LOG=$OUT/pytest.log
XML=$OUT/gpu_check.xml
HEADER="# GPU check" LOG_HEADER="# gpu_check.sh: pytest log" SUITE=gpu_check  # how this script's files begin

refuse() { echo "gpu_check: $*; nothing was written: choose another REPORT" >&2; exit 2; }
free() { [ ! -e "$1" ] && [ ! -L "$1" ]; }
plain() { [ -f "$1" ] && [ ! -L "$1" ]; }
starts() { plain "$1" && [[ $(head -c 200 "$1") == "$2"* ]]; }
[ ! -e "$OUT" ] || [ -d "$OUT" ] || refuse "$OUT is not a directory"
free "$REPORT" || starts "$REPORT" "$HEADER" \
  || refuse "$REPORT exists and is not a report of this script (its first line is not '$HEADER')"
free "$LOG" || starts "$LOG" "$LOG_HEADER" \
  || refuse "$LOG exists and is not a log of this script (its first line is not '$LOG_HEADER')"
free "$XML" || { plain "$XML" && grep -qF "<testsuite name=\"$SUITE\"" "$XML"; } \
  || refuse "$XML exists and is not JUnit XML of this script (no test suite named $SUITE)"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  echo "gpu_check: no CUDA GPU visible to PyTorch ($PY): nothing to do"
  exit 0
fi
mkdir -p "$OUT" || refuse "cannot create $OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
TESTS=(tests/test_gpu.py)
# The older GPU tests use the packaged default model's tokenizer: added when it resolves offline.
if timeout 120 "$PY" -c "from ziprl.config import ModelConfig; from ziprl.policy.models import resolve_model_path; resolve_model_path(ModelConfig())" >/dev/null 2>&1; then
  TESTS+=(tests/learner/test_trainer.py::test_bf16_zero_on_gpu tests/policy/engines/vllm/test_engine.py)
fi
start=$(date +%s)
echo "$LOG_HEADER" > "$LOG"
timeout 540 "$PY" -m pytest -q -rs -p no:cacheprovider "${TESTS[@]}" -o junit_suite_name="$SUITE" --junitxml "$XML" 2>&1 \
  | tee -a "$LOG"
rc=${PIPESTATUS[0]}
"$PY" - "$XML" "$REPORT" "$rc" "$(( $(date +%s) - start ))" "$HEADER" <<'PYEOF'
"""Markdown report from pytest's JUnit XML: the machine, then one line per test."""
import importlib.metadata as md
import sys
import xml.etree.ElementTree as ET

import torch

junit, report, rc, seconds, header = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]


def version(pkg):
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


lines = [header, "",
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
echo "gpu_check: report written to $REPORT (pytest log: $LOG)"
exit "$rc"
